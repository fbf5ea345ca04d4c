"""Tiny random-weight Qwen-Image / Qwen-Image-Edit / Qwen-Image-Edit-Plus (2509) pipelines
(diffusers), saved with ``save_pretrained``.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from omni_triton.checkpoints.common import MANIFEST, build_once


def image_only_processor_class():
    """``Qwen2VLProcessor`` without its video processor.

    transformers 5 builds ``Qwen2VLProcessor`` with a ``Qwen2VLVideoProcessor``, which needs
    torchvision; torchvision wheels do not import beside torch 2.13 CPU here (docs/running.md, "Pins"), and
    the edit pipeline only ever passes images. Text and image handling are the parent's.
    """
    from transformers import Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class Qwen2VLImageOnlyProcessor(Qwen2VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            self.image_token = getattr(tokenizer, "image_token", "<|image_pad|>")
            self.video_token = getattr(tokenizer, "video_token", "<|video_pad|>")
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    return Qwen2VLImageOnlyProcessor


BUILDER_VERSION = 1
KIND_T2I = "t2i"
KIND_EDIT = "edit"
#: ``QwenImageEditPlusPipeline`` (Qwen-Image-Edit-2509: 1..3 condition images). The same components
#: as the edit pipeline (Qwen/Qwen-Image-Edit-2509 ships the same text encoder, processor, DiT and
#: VAE architectures), so the tiny one has the edit one's weights; its own folder because
#: ``model_index.json`` names the pipeline class the stages load.
KIND_EDIT_PLUS = "edit_plus"

# Small English text the tiny byte-level BPE tokenizer is trained on (byte-level BPE encodes every
# string; merges only make common words shorter).
_TRAIN_TEXT = """\
A photo of a red fox sitting in the snow, golden hour, highly detailed.
Describe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships.
A cat wearing a hat. A blue sky over green hills. A bowl of fruit on a wooden table.
Make the sky purple. Add a rainbow. Remove the person. Turn it into a watercolor painting.
Describe the key features of the input image (color, shape, size, texture, objects, background),
then explain how the user's text instruction should alter or modify the image.
Generate a new image that meets the user's requirements while maintaining consistency.
"""

# Qwen2 / Qwen2.5-VL special tokens the pipelines' prompt templates use (single tokens).
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


@dataclass(frozen=True)
class TinyQwenImageSpec:
    """Sizes of the tiny random Qwen-Image. Real Qwen-Image: Qwen2.5-VL-7B text encoder (hidden
    3584), DiT 60 layers x 24 heads x 128, VAE base_dim 96 with z_dim 16."""

    text_hidden: int = 32
    text_layers: int = 2
    text_heads: int = 4  # head_dim 8: mrope_section [1, 1, 2] sums to head_dim / 2
    vision_hidden: int = 32
    vision_layers: int = 2
    dit_layers: int = 2
    dit_heads: int = 2
    dit_head_dim: int = 16  # axes_dims_rope (4, 6, 6) sums to it
    z_dim: int = 4
    vae_base_dim: int = 8
    vocab_size: int = 600
    default_steps: int = 2

    def config_hash(self, seed: int, kind: str) -> str:
        text = json.dumps({**self.__dict__, "seed": seed, "kind": kind, "v": BUILDER_VERSION},
                          sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _train_tokenizer(vocab_size: int):
    """Byte-level BPE with Qwen2's pre-tokenizer behaviour, specials as single tokens, wrapped as
    ``Qwen2TokenizerFast`` (what ``Qwen2Tokenizer`` loads as). Right padding, like Qwen's own."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_TRAIN_TEXT.splitlines(), trainer=trainer)
    return Qwen2TokenizerFast(tokenizer_object=tok, unk_token=None, bos_token=None,
                              eos_token="<|im_end|>", pad_token="<|endoftext|>",
                              model_max_length=2048, padding_side="right")


def build_tiny_qwen_image(out_dir: Path, kind: str = KIND_T2I, seed: int = 0,
                          spec: TinyQwenImageSpec | None = None) -> Path:
    """Build and save a tiny random-weight Qwen-Image pipeline folder; return ``out_dir``.

    ``kind="t2i"`` saves a ``QwenImagePipeline``; ``kind="edit"`` a ``QwenImageEditPipeline``
    (adds the ``Qwen2VLProcessor`` the edit prompt template needs: its image processor feeds the
    Qwen2.5-VL vision tower); ``kind="edit_plus"`` a ``QwenImageEditPlusPipeline`` of the same
    components. All are built from the same seed, so their weights are equal.
    Writes ``manifest.json`` (seed, config hash, defaults) last; idempotent (returns at once when
    the manifest's hash matches). Several processes may call it at once: one builds under a lock.
    """
    spec = spec or TinyQwenImageSpec()
    return build_once(Path(out_dir), spec.config_hash(seed, kind), lambda d, h: _build(d, kind, seed, spec, h))


def _build(out_dir: Path, kind: str, seed: int, spec: TinyQwenImageSpec, h: str) -> None:
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImageEditPipeline,
        QwenImageEditPlusPipeline,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessor

    (out_dir / MANIFEST).unlink(missing_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tokenizer = _train_tokenizer(spec.vocab_size)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text_head_dim = spec.text_hidden // spec.text_heads
    te_config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=spec.text_hidden,
            intermediate_size=2 * spec.text_hidden, num_hidden_layers=spec.text_layers,
            num_attention_heads=spec.text_heads, num_key_value_heads=2,
            max_position_embeddings=4096,
            # mrope sections (temporal, height, width) must sum to head_dim / 2
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                             "mrope_section": [1, 1, text_head_dim // 2 - 2]},
            bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(
            depth=spec.vision_layers, hidden_size=spec.vision_hidden,
            intermediate_size=2 * spec.vision_hidden, num_heads=2,
            out_hidden_size=spec.text_hidden, patch_size=14, spatial_merge_size=2,
            temporal_patch_size=2, window_size=112,
            fullatt_block_indexes=[spec.vision_layers - 1],
        ),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    text_encoder = Qwen2_5_VLForConditionalGeneration(te_config).eval()
    half = (spec.dit_head_dim - 4) // 2
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=4 * spec.z_dim, out_channels=spec.z_dim,
        num_layers=spec.dit_layers, attention_head_dim=spec.dit_head_dim,
        num_attention_heads=spec.dit_heads, joint_attention_dim=spec.text_hidden,
        axes_dims_rope=(4, half, spec.dit_head_dim - 4 - half),
    ).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    vae = AutoencoderKLQwenImage(
        base_dim=spec.vae_base_dim, z_dim=spec.z_dim, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=torch.randn(spec.z_dim, generator=gen).mul(0.5).tolist(),
        latents_std=torch.rand(spec.z_dim, generator=gen).add(0.5).tolist(),
    ).eval()
    # Qwen-Image's scheduler config (model card's scheduler/scheduler_config.json): dynamic shifting.
    scheduler = FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256, base_shift=math.log(3), max_image_seq_len=8192,
        max_shift=math.log(3), num_train_timesteps=1000, shift=1.0, shift_terminal=0.02,
        time_shift_type="exponential", use_dynamic_shifting=True)
    components = dict(scheduler=scheduler, vae=vae, text_encoder=text_encoder,
                      tokenizer=tokenizer, transformer=transformer)
    if kind in (KIND_EDIT, KIND_EDIT_PLUS):
        # Small max_pixels: the condition image becomes at most 4x4 merged vision tokens.
        image_processor = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=112 * 112,
                                                patch_size=14, merge_size=2, temporal_patch_size=2)
        processor = image_only_processor_class()(image_processor=image_processor, tokenizer=tokenizer)
        cls = QwenImageEditPipeline if kind == KIND_EDIT else QwenImageEditPlusPipeline
        pipe = cls(processor=processor, **components)
    elif kind == KIND_T2I:
        pipe = QwenImagePipeline(**components)
    else:
        raise ValueError(f"unknown pipeline kind {kind!r}")
    pipe.save_pretrained(out_dir)
    if kind in (KIND_EDIT, KIND_EDIT_PLUS):
        _name_processor_as_upstream(out_dir)
    manifest = {"config_hash": h, "seed": seed, "kind": kind, "builder_version": BUILDER_VERSION,
                "pipeline": type(pipe).__name__, "default_steps": spec.default_steps,
                "spec": spec.__dict__}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2))


def _name_processor_as_upstream(out_dir: Path) -> None:
    """Make the saved folder name ``transformers.Qwen2VLProcessor`` as Qwen/Qwen-Image-Edit does
    (``save_pretrained`` recorded the image-only subclass)."""
    index_path = out_dir / "model_index.json"
    index = json.loads(index_path.read_text())
    index["processor"] = ["transformers", "Qwen2VLProcessor"]
    index_path.write_text(json.dumps(index, indent=2))
    for cfg in (out_dir / "processor").glob("*.json"):
        data = json.loads(cfg.read_text())
        if data.get("processor_class") == "Qwen2VLImageOnlyProcessor":
            data["processor_class"] = "Qwen2VLProcessor"
            cfg.write_text(json.dumps(data, indent=2))


# --------------------------------------------------------------------------- serving helpers
_BUILD_KIND = {"qwen-image-tiny": KIND_T2I, "qwen-image-edit-tiny": KIND_EDIT,
               "qwen-image-edit-plus-tiny": KIND_EDIT_PLUS}


def checkpoint_dir(name: str) -> Path:
    """Folder of the pipeline ``name`` in the cache (``omni_triton.paths.model_dir``).

    The tiny assets (``qwen-image-tiny``, ``qwen-image-edit-tiny``, ``qwen-image-edit-plus-tiny``)
    are (re)built here if missing (idempotent, about a second); any other name must already be there (e.g. a real
    ``Qwen/Qwen-Image`` folder copied into the cache).
    """
    from omni_triton.paths import model_dir

    path = model_dir(name)
    if name in _BUILD_KIND:
        build_tiny_qwen_image(path, _BUILD_KIND[name])
    elif not (path / "model_index.json").exists():
        raise FileNotFoundError(f"no diffusers pipeline at {path}")
    return path

"""Diffusion stages (diffusers ``QwenImagePipeline`` / ``QwenImageEditPipeline``) split for Triton.

The pipeline is cut where diffusers itself allows it (``prompt_embeds`` in, ``output_type="latent"``
out), so each cut is a Triton model with its own instances and dynamic batching:

    text encoder (Qwen2.5-VL)  -> prompt embeddings (+ negative embeddings for true CFG)
    [edit only] VAE encode     -> condition-image latents
    denoiser (DiT, QwenImageTransformer2DModel + FlowMatchEulerDiscreteScheduler): the pipeline's
                                  own ``__call__`` with ``prompt_embeds`` and ``output_type="latent"``
    VAE decode (AutoencoderKLQwenImage) -> uint8 RGB image

Data contract per request (one image; what ``model_repository/qwen_image_*`` carry, see
``docs/image_contracts.md``):

- prompt embeddings: ``float32 [L, D]`` (``D`` = text encoder hidden size, ``L`` = prompt tokens
  after the pipeline's template prefix is dropped; no padding: the stage strips it);
- negative prompt embeddings: ``float32 [L', D]``, ``L' = 0`` when true CFG is off;
- latents: ``float32 [S, 4 * z_dim]``, packed 2x2 patches as the pipeline's ``_pack_latents``
  makes them (``S = (H / 16) * (W / 16)`` for the 8x VAE);
- condition-image latents (edit): ``float32 [z_dim, 1, h, w]``, normalised like the pipeline's
  ``_encode_vae_image`` (``(x - latents_mean) / latents_std``);
- images: ``uint8 [H, W, 3]`` RGB, ``round(x * 255)`` of the pipeline's ``postprocess`` output.

Batching: requests are compatible when :func:`denoise_key` is equal (same size, steps, CFG scale,
guidance, condition-image size); a Triton batch holding several groups runs one pipeline call
per group. Seeds are per request inside a batch: the pipeline gets a list of
``torch.Generator``, one per item, and ``randn_tensor`` draws each item's noise from its own
generator, so an item's noise never depends on its batch neighbours.

No checkpoint can be downloaded here, so :func:`build_tiny_qwen_image` makes tiny random-weight
pipelines of the real architectures (locally trained byte-level BPE tokenizer with Qwen2's
special tokens) and saves them with ``save_pretrained``; the stages load them with
``from_pretrained`` exactly as they would load ``Qwen/Qwen-Image`` / ``Qwen/Qwen-Image-Edit``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

LOGGER = logging.getLogger("omni_triton.diffusion")

MANIFEST = "manifest.json"
BUILDER_VERSION = 1
KIND_T2I = "t2i"
KIND_EDIT = "edit"

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


#: Fewest denoising steps served: diffusers' QwenImagePipeline with one step gives NaN latents (its
#: flow-match sigma schedule divides by zero: "invalid value encountered in divide"), which decode
#: to an all-black image. Measured with diffusers 0.42.1 on the tiny checkpoints.
MIN_INFERENCE_STEPS = 2


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
    Qwen2.5-VL vision tower). Both are built from the same seed, so their weights are equal.
    Writes ``manifest.json`` (seed, config hash, defaults) last; idempotent (returns at once when
    the manifest's hash matches). Several processes may call it at once: one builds under a lock.
    """
    import fcntl

    spec = spec or TinyQwenImageSpec()
    out_dir = Path(out_dir)
    h = spec.config_hash(seed, kind)
    if _manifest_hash(out_dir) == h:
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _manifest_hash(out_dir) != h:
            _build(out_dir, kind, seed, spec, h)
    return out_dir


def _manifest_hash(out_dir: Path) -> str | None:
    try:
        return json.loads((out_dir / MANIFEST).read_text()).get("config_hash")
    except (OSError, ValueError):
        return None


def _build(out_dir: Path, kind: str, seed: int, spec: TinyQwenImageSpec, h: str) -> None:
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler,
                           QwenImageEditPipeline, QwenImagePipeline, QwenImageTransformer2DModel)
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                              Qwen2VLImageProcessor)

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
    if kind == KIND_EDIT:
        # Small max_pixels: the condition image becomes at most 4x4 merged vision tokens.
        image_processor = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=112 * 112,
                                                patch_size=14, merge_size=2, temporal_patch_size=2)
        processor = image_only_processor_class()(image_processor=image_processor, tokenizer=tokenizer)
        pipe = QwenImageEditPipeline(processor=processor, **components)
    elif kind == KIND_T2I:
        pipe = QwenImagePipeline(**components)
    else:
        raise ValueError(f"unknown pipeline kind {kind!r}")
    pipe.save_pretrained(out_dir)
    if kind == KIND_EDIT:
        _name_processor_as_upstream(out_dir)
    manifest = {"config_hash": h, "seed": seed, "kind": kind, "builder_version": BUILDER_VERSION,
                "pipeline": type(pipe).__name__, "default_steps": spec.default_steps,
                "spec": spec.__dict__}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2))


def image_only_processor_class():
    """``Qwen2VLProcessor`` without its video processor.

    transformers 5 builds ``Qwen2VLProcessor`` with a ``Qwen2VLVideoProcessor``, which needs
    torchvision; torchvision wheels do not import beside torch 2.13 CPU here (README, Pins), and
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


# --------------------------------------------------------------------------- loading
def load_pipeline(path: Path | str):
    """``DiffusionPipeline.from_pretrained`` on a prepared folder (float32, CPU), progress bars off.

    Returns a ``QwenImagePipeline`` or ``QwenImageEditPipeline`` (what ``model_index.json`` names).
    Without torchvision the edit pipeline's processor is loaded image-only
    (:func:`image_only_processor_class`) and passed in; with it, the folder loads unchanged.
    """
    import importlib.util

    from diffusers import DiffusionPipeline

    path = Path(path)
    kwargs = {}
    index = json.loads((path / "model_index.json").read_text())
    if "processor" in index and importlib.util.find_spec("torchvision") is None:
        kwargs["processor"] = image_only_processor_class().from_pretrained(str(path / "processor"))
    pipe = DiffusionPipeline.from_pretrained(str(path), dtype=torch.float32, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def is_edit_pipeline(pipe) -> bool:
    """True for pipelines that condition on an input image (``QwenImageEditPipeline``)."""
    return hasattr(pipe, "processor") and getattr(pipe, "processor", None) is not None


def size_multiple(pipe) -> int:
    """Height/width must be multiples of this (VAE 8x times the DiT's 2x2 patch = 16); the
    pipeline itself would silently round other sizes down."""
    return pipe.vae_scale_factor * 2


def edit_condition_size(pipe, image_size: tuple[int, int]) -> tuple[int, int]:
    """(width, height) the edit pipeline resizes a condition image of ``image_size`` (w, h) to:
    ``calculate_dimensions(1024 * 1024, w / h)`` as in ``QwenImageEditPipeline.__call__``."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

    w, h, _ = calculate_dimensions(1024 * 1024, image_size[0] / image_size[1])
    return int(w), int(h)


# --------------------------------------------------------------------------- text encoder
def encode_prompts(pipe, prompts: Sequence[str], images: Sequence | None = None) -> list[np.ndarray]:
    """Prompt embeddings for each prompt, through the pipeline's own ``encode_prompt``.

    Args:
        pipe: a loaded pipeline (text encoder + tokenizer [+ processor]).
        prompts: texts (the pipeline wraps each in its prompt template).
        images: edit pipelines only: one PIL condition image per prompt, already resized to
            :func:`edit_condition_size` as ``__call__`` does before encoding.

    Returns:
        one ``float32 [L_i, D]`` array per prompt (padding removed: the pipeline pads a batch to
        its longest prompt and returns the mask; the rows the mask marks valid are kept).

    Prompts of equal token length are encoded together in one forward pass; different lengths
    in separate passes, so no prompt is ever padded (a padded forward differs from an unpadded one
    in float rounding, which would break bit-exact parity with ``__call__``).
    """
    out: list[np.ndarray | None] = [None] * len(prompts)
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(prompts):
        key = (_token_length(pipe, p), None if images is None else images[i].size)
        groups.setdefault(key, []).append(i)
    with torch.no_grad():
        for idx in groups.values():
            kwargs = {}
            if images is not None:
                kwargs["image"] = [images[i] for i in idx]
            embeds, mask = pipe.encode_prompt(prompt=[prompts[i] for i in idx], device="cpu", **kwargs)
            for j, i in enumerate(idx):
                e = embeds[j] if mask is None else embeds[j][mask[j].bool()]
                out[i] = e.float().numpy()
    return out  # type: ignore[return-value]


def _token_length(pipe, prompt: str) -> int:
    return len(pipe.tokenizer(pipe.prompt_template_encode.format(prompt)).input_ids)


# --------------------------------------------------------------------------- VAE encode (edit)
def condition_image(pipe, image) -> "tuple":
    """PIL image -> (resized PIL image for the text encoder, ``float32 [3, 1, h, w]`` VAE input),
    both exactly as ``QwenImageEditPipeline.__call__`` prepares them."""
    w, h = edit_condition_size(pipe, image.size)
    resized = pipe.image_processor.resize(image, h, w)
    tensor = pipe.image_processor.preprocess(resized, h, w).unsqueeze(2)[0]
    return resized, tensor


def vae_encode(pipe, images: Sequence) -> list[np.ndarray]:
    """Condition-image latents for edits: ``float32 [z_dim, 1, h/8, w/8]`` per PIL image.

    Uses the pipeline's ``_encode_vae_image`` (``sample_mode="argmax"``: the posterior's mode,
    so no randomness) one image at a time, as the pipeline itself does when given a list of
    generators (one per request), so each latent is exactly what ``__call__`` computes.
    """
    out = []
    with torch.no_grad():
        for image in images:
            _, tensor = condition_image(pipe, image)
            latents = pipe._encode_vae_image(image=tensor[None], generator=None)
            out.append(latents[0].float().numpy())
    return out


# --------------------------------------------------------------------------- denoiser
@dataclass
class DenoiseItem:
    """One image to denoise (one Triton request).

    Attributes:
        prompt_embeds: ``float32 [L, D]``.
        negative_prompt_embeds: ``float32 [L', D]``; ``None``/empty disables true CFG.
        height, width: output size in pixels (multiples of :func:`size_multiple`).
        steps: number of denoising steps.
        seed: seed of this item's ``torch.Generator`` (initial noise).
        true_cfg_scale: CFG scale ``w`` (``noise = neg + w * (cond - neg)``, renormalised as in
            the pipeline); used only with negative embeddings and ``w > 1``.
        guidance_scale: guidance-distilled models only (``None`` otherwise).
        image: edit only: the condition image (PIL) as the client sent it.
        image_latents: edit only: its :func:`vae_encode` latents ``[z, 1, h, w]``.
    """

    prompt_embeds: np.ndarray
    height: int
    width: int
    steps: int
    seed: int
    negative_prompt_embeds: np.ndarray | None = None
    true_cfg_scale: float = 4.0
    guidance_scale: float | None = None
    image: object | None = None
    image_latents: np.ndarray | None = None

    @property
    def cfg(self) -> bool:
        neg = self.negative_prompt_embeds
        return neg is not None and neg.shape[0] > 0 and self.true_cfg_scale > 1


@dataclass
class DenoiseResult:
    """Latents ``float32 [S, C]`` of one item, the steps it ran and the wall time (seconds) of the
    pipeline call it was part of (shared by its batch)."""

    latents: np.ndarray
    steps: int
    seconds: float


def denoise_key(item: DenoiseItem) -> tuple:
    """Items with equal keys can share one pipeline call (one batch)."""
    cond = None
    if item.image is not None:
        cond = item.image.size
    return (item.height, item.width, item.steps, item.cfg,
            item.true_cfg_scale if item.cfg else None, item.guidance_scale, cond)


def _pad(arrays: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad ``[L_i, D]`` arrays to ``[B, max L, D]`` plus the ``[B, max L]`` int64 mask."""
    longest = max(a.shape[0] for a in arrays)
    dim = arrays[0].shape[1]
    embeds = torch.zeros(len(arrays), longest, dim, dtype=torch.float32)
    mask = torch.zeros(len(arrays), longest, dtype=torch.int64)
    for i, a in enumerate(arrays):
        embeds[i, : a.shape[0]] = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
        mask[i, : a.shape[0]] = 1
    return embeds, mask


class _ProgressLog:
    """``callback_on_step_end`` that logs per-step progress of long generations.

    Every step is logged at DEBUG; at INFO when at least ``interval_s`` passed since the last
    INFO line (so a 50-step generation shows progress, a 2-step one stays quiet) and at the end.
    """

    def __init__(self, label: str, total: int, interval_s: float = 2.0):
        self.label, self.total, self.interval_s = label, total, interval_s
        self.start = self.last = time.perf_counter()
        self.steps = 0

    def __call__(self, pipe, i, t, kwargs):
        self.steps = i + 1
        now = time.perf_counter()
        msg = "%s: step %d/%d (%.2f s)"
        args = (self.label, i + 1, self.total, now - self.start)
        if now - self.last >= self.interval_s or (i + 1 == self.total and now - self.start >= self.interval_s):
            LOGGER.info(msg, *args)
            self.last = now
        else:
            LOGGER.debug(msg, *args)
        return {}


def denoise(pipe, items: Sequence[DenoiseItem], label: str = "denoise",
            progress_interval_s: float = 2.0) -> list[DenoiseResult]:
    """Run the diffusion loop for ``items``: one ``pipe(...)`` call per compatible group.

    Each call is the pipeline's own ``__call__`` with ``prompt_embeds`` (+ mask),
    ``negative_prompt_embeds`` (true CFG), ``generator=[torch.Generator().manual_seed(seed_i)]``
    and ``output_type="latent"``; for edits ``image`` is the condition images and the
    VAE-encode stage's latents replace the pipeline's own ``_encode_vae_image`` call (the only
    hook: diffusers has no ``image_latents`` argument).

    Returns:
        one :class:`DenoiseResult` per item, in order.
    """
    groups: dict[tuple, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(denoise_key(item), []).append(i)
    results: list[DenoiseResult | None] = [None] * len(items)
    for idx in groups.values():
        group = [items[i] for i in idx]
        first = group[0]
        embeds, mask = _pad([g.prompt_embeds for g in group])
        kwargs = dict(prompt_embeds=embeds, prompt_embeds_mask=mask,
                      height=first.height, width=first.width, num_inference_steps=first.steps,
                      guidance_scale=first.guidance_scale, output_type="latent",
                      generator=[torch.Generator().manual_seed(int(g.seed)) for g in group])
        if first.cfg:
            neg, neg_mask = _pad([g.negative_prompt_embeds for g in group])
            kwargs.update(negative_prompt_embeds=neg, negative_prompt_embeds_mask=neg_mask,
                          true_cfg_scale=first.true_cfg_scale)
        else:
            kwargs.update(true_cfg_scale=1.0)
        progress = _ProgressLog(f"{label} batch of {len(group)} ({first.width}x{first.height})",
                                first.steps, progress_interval_s)
        kwargs["callback_on_step_end"] = progress
        start = time.perf_counter()
        with torch.no_grad():
            if first.image is not None:
                kwargs["image"] = [g.image for g in group]
                latents = _with_image_latents(pipe, [g.image_latents for g in group], kwargs)
            else:
                latents = pipe(**kwargs).images
        seconds = time.perf_counter() - start
        for j, i in enumerate(idx):
            results[i] = DenoiseResult(latents[j].float().numpy(), progress.steps, seconds)
    return results  # type: ignore[return-value]


def _with_image_latents(pipe, image_latents: list[np.ndarray], kwargs: dict):
    """Call the edit pipeline with the VAE-encode stage's latents in place of its own VAE encode."""
    stacked = torch.from_numpy(np.stack(image_latents).astype(np.float32))

    def precomputed(image, generator):
        if image.shape[0] != stacked.shape[0]:
            raise ValueError(f"{image.shape[0]} images but {stacked.shape[0]} image latents")
        return stacked

    pipe._encode_vae_image = precomputed
    try:
        return pipe(**kwargs).images
    finally:
        del pipe._encode_vae_image


# --------------------------------------------------------------------------- VAE decode
def vae_decode(pipe, latents: Sequence[np.ndarray], sizes: Sequence[tuple[int, int]]) -> list[np.ndarray]:
    """Packed latents ``[S, C]`` + (height, width) -> ``uint8 [H, W, 3]`` images.

    The tail of ``__call__`` after the loop: ``_unpack_latents``, ``x / (1 / latents_std) +
    latents_mean``, ``vae.decode``, ``image_processor.postprocess(output_type="np")`` and
    ``numpy_to_pil``'s ``(x * 255).round()``. Items of equal size are decoded in one batch.
    """
    groups: dict[tuple[int, int], list[int]] = {}
    for i, s in enumerate(sizes):
        groups.setdefault(tuple(s), []).append(i)
    out: list[np.ndarray | None] = [None] * len(latents)
    vae = pipe.vae
    z = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1)
    with torch.no_grad():
        for (height, width), idx in groups.items():
            x = torch.from_numpy(np.stack([latents[i] for i in idx]).astype(np.float32))
            x = pipe._unpack_latents(x, height, width, pipe.vae_scale_factor).to(vae.dtype)
            x = x / inv_std.to(x.dtype) + mean.to(x.dtype)
            image = vae.decode(x, return_dict=False)[0][:, :, 0]
            arr = pipe.image_processor.postprocess(image, output_type="np")
            for j, i in enumerate(idx):
                out[i] = (arr[j] * 255).round().astype(np.uint8)
    return out  # type: ignore[return-value]


# --------------------------------------------------------------------------- reference
def reference_images(pipe, prompt: str, *, height: int, width: int, steps: int, seed: int,
                     negative_prompt: str | None = None, true_cfg_scale: float = 4.0,
                     guidance_scale: float | None = None, image=None) -> np.ndarray:
    """The plain diffusers ``__call__`` (what the Triton stages must equal): ``uint8 [H, W, 3]``."""
    kwargs = dict(prompt=prompt, height=height, width=width, num_inference_steps=steps,
                  negative_prompt=negative_prompt, true_cfg_scale=true_cfg_scale,
                  guidance_scale=guidance_scale, generator=torch.Generator().manual_seed(seed),
                  output_type="pil")
    if image is not None:
        kwargs["image"] = image
    with torch.no_grad():
        return np.asarray(pipe(**kwargs).images[0], dtype=np.uint8)


def staged_images(pipe, prompt: str, *, height: int, width: int, steps: int, seed: int,
                  negative_prompt: str | None = None, true_cfg_scale: float = 4.0,
                  guidance_scale: float | None = None, image=None) -> np.ndarray:
    """The Triton stage split run in-process for one request (same order as the ensemble)."""
    cond = resized = None
    if image is not None:
        resized, _ = condition_image(pipe, image)
        cond = [resized]
    embeds = encode_prompts(pipe, [prompt], cond)[0]
    cfg = negative_prompt is not None and true_cfg_scale > 1
    neg = encode_prompts(pipe, [negative_prompt], cond)[0] if cfg else None
    item = DenoiseItem(embeds, height, width, steps, seed, neg, true_cfg_scale, guidance_scale)
    if image is not None:
        item.image = image
        item.image_latents = vae_encode(pipe, [image])[0]
    result = denoise(pipe, [item])[0]
    return vae_decode(pipe, [result.latents], [(height, width)])[0]


# --------------------------------------------------------------------------- serving helpers
_BUILD_KIND = {"qwen-image-tiny": KIND_T2I, "qwen-image-edit-tiny": KIND_EDIT}


def checkpoint_dir(name: str) -> Path:
    """Folder of the pipeline ``name`` in the cache (``omni_triton.paths.model_dir``).

    The tiny assets (``qwen-image-tiny``, ``qwen-image-edit-tiny``) are (re)built here if missing
    (idempotent, about a second); any other name must already be there (e.g. a real
    ``Qwen/Qwen-Image`` folder copied into the cache).
    """
    from omni_triton.paths import model_dir

    path = model_dir(name)
    if name in _BUILD_KIND:
        build_tiny_qwen_image(path, _BUILD_KIND[name])
    elif not (path / "model_index.json").exists():
        raise FileNotFoundError(f"no diffusers pipeline at {path}")
    return path


@dataclass(frozen=True)
class Limits:
    """What one served pipeline accepts (config.pbtxt parameters ``max_size``, ``max_steps``).

    ``multiple`` is :func:`size_multiple` of the pipeline (16 for Qwen-Image).
    """

    multiple: int = 16
    max_size: int = 1024
    max_steps: int = 50

    def check(self, height: int, width: int, steps: int | None = None) -> None:
        """Raise ``ValueError`` naming the first out-of-range value (``steps=None``: a stage
        without a denoising loop checks the size only)."""
        for name, v in (("height", height), ("width", width)):
            if v < self.multiple or v > self.max_size or v % self.multiple:
                raise ValueError(f"{name}={v}: must be a multiple of {self.multiple} "
                                 f"in [{self.multiple}, {self.max_size}]")
        if steps is not None and not MIN_INFERENCE_STEPS <= steps <= self.max_steps:
            raise ValueError(f"num_inference_steps={steps}: must be in [{MIN_INFERENCE_STEPS}, {self.max_steps}]")


#: Qwen2.5-VL's image processor (``smart_resize``) refuses images more elongated than this; the
#: edit pipeline hands it the condition image resized by :func:`edit_condition_size`.
MAX_CONDITION_ASPECT_RATIO = 200
#: Upper bound of ``true_cfg_scale`` / ``guidance_scale`` (1e308 or Infinity gave an all-black
#: image; the default is 4.0). The OpenAI frontend applies the same bound.
MAX_GUIDANCE_SCALE = 100.0


def check_condition_image(pipe, image) -> None:
    """Raise ``ValueError`` when the edit pipeline cannot encode the condition ``image`` (PIL):
    resized to :func:`edit_condition_size`, it must be at least 1 pixel each way and at most
    :data:`MAX_CONDITION_ASPECT_RATIO` times longer than wide (either way). Checked per request
    while parsing, so one such image is answered alone instead of failing its whole batch (a 4096x4
    upload failed the 11 good edits batched with it)."""
    w, h = edit_condition_size(pipe, image.size)
    if min(w, h) < 1 or max(w, h) > MAX_CONDITION_ASPECT_RATIO * min(w, h):
        raise ValueError(f"condition image {image.size[0]}x{image.size[1]} is too elongated "
                         f"(resized to {w}x{h}; the aspect ratio must be at most "
                         f"{MAX_CONDITION_ASPECT_RATIO}:1)")


def check_guidance(true_cfg_scale: float | None, guidance_scale: float | None) -> None:
    """Raise ``ValueError`` unless each given scale is finite and in [0, MAX_GUIDANCE_SCALE]
    (``guidance_scale`` <= 0 means none)."""
    if true_cfg_scale is not None and not 0.0 <= true_cfg_scale <= MAX_GUIDANCE_SCALE:
        raise ValueError(f"true_cfg_scale={true_cfg_scale}: must be in [0, {MAX_GUIDANCE_SCALE}]")
    if guidance_scale is not None and not guidance_scale <= MAX_GUIDANCE_SCALE:
        raise ValueError(f"guidance_scale={guidance_scale}: must be at most {MAX_GUIDANCE_SCALE}")


def image_from_array(array: np.ndarray):
    """``uint8 [H, W, 3]`` RGB -> PIL image (``ValueError`` for any other shape/dtype)."""
    from PIL import Image

    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3 or min(array.shape[:2]) < 1:
        raise ValueError(f"IMAGE must be uint8 [H, W, 3], got {array.dtype} {list(array.shape)}")
    return Image.fromarray(np.ascontiguousarray(array), "RGB")

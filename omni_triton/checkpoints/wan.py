"""Tiny random-weight Wan2.2 pipelines (diffusers ``WanPipeline`` / ``WanImageToVideoPipeline``),
saved with ``save_pretrained``, reloadable with ``DiffusionPipeline.from_pretrained``.

The architecture is Wan2.2-T2V-A14B / I2V-A14B's: a UMT5 text encoder, the Wan VAE (8x spatial,
4x temporal), two ``WanTransformer3DModel`` experts (``transformer`` for high noise,
``transformer_2`` for low noise, switched at ``boundary_ratio``) and the flow-matching
``UniPCMultistepScheduler``. I2V has no image encoder (Wan2.2 conditions on the VAE latents of
the first frame only: the transformer takes 16 noise + 4 mask + 16 condition channels).

The I2V folder shares the T2V folder's tokenizer, UMT5 text encoder and VAE (loaded from it, so
byte-identical), as Wan2.2-I2V-A14B shares umt5-xxl and the Wan2.1 VAE with Wan2.2-T2V-A14B:
the served ``wan_i2v`` reuses the ``wan_t2v_text_encoder`` and ``wan_t2v_vae_decoder`` stages.
(Re-training the tokenizer is not bit-reproducible: the Unigram trainer's scores differ in the
last digit between runs, which reorders a few pieces.)
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from omni_triton.checkpoints.common import MANIFEST, build_once

BUILDER_VERSION = 1
KIND_T2V = "t2v"
KIND_I2V = "i2v"

_TRAIN_TEXT = """\
A cat walks on the grass, realistic style. A red fox runs through the snow at golden hour.
Waves crash on a rocky shore at sunset. A timelapse of clouds over green hills.
A dog catches a frisbee in the park. Fireworks over a city skyline at night.
Bright tones, overexposed, static, blurred details, subtitles, worst quality, low quality.
"""


@dataclass(frozen=True)
class TinyWanSpec:
    """Sizes of the tiny random Wan2.2. Real Wan2.2-A14B: UMT5-XXL (d_model 4096), two 40-layer
    DiTs of 40 heads x 128, VAE z_dim 16; boundary_ratio 0.875 (T2V) / 0.9 (I2V)."""

    text_dim: int = 32
    text_layers: int = 2
    text_heads: int = 4
    vocab_size: int = 400
    dit_layers: int = 2
    dit_heads: int = 2
    dit_head_dim: int = 12
    ffn_dim: int = 32
    z_dim: int = 16  # the transformer's patch embedding and the I2V channel layout assume 16
    vae_base_dim: int = 4
    boundary_ratio_t2v: float = 0.875
    boundary_ratio_i2v: float = 0.9
    flow_shift: float = 3.0
    default_steps: int = 4

    def config_hash(self, seed: int, kind: str) -> str:
        text = json.dumps({**self.__dict__, "seed": seed, "kind": kind, "v": BUILDER_VERSION},
                          sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _train_tokenizer(vocab_size: int):
    """A SentencePiece-style Unigram tokenizer (Metaspace pre-tokenizer, ``</s>`` appended) wrapped
    as ``T5TokenizerFast``: what ``AutoTokenizer`` loads for google/umt5-xxl."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import T5TokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "</s>", "<unk>"],
                                      unk_token="<unk>", show_progress=False)
    tok.train_from_iterator(_TRAIN_TEXT.splitlines(), trainer=trainer)
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", eos)])
    return T5TokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                           extra_ids=0, model_max_length=512)


def build_tiny_wan(out_dir: Path, kind: str = KIND_T2V, seed: int = 0, spec: TinyWanSpec | None = None,
                   shared: Path | None = None) -> Path:
    """Build and save a tiny random-weight Wan2.2 pipeline folder; return ``out_dir``.

    ``kind="t2v"``: ``WanPipeline`` with both experts and ``boundary_ratio``; ``kind="i2v"``:
    ``WanImageToVideoPipeline`` (no image encoder, 36-channel transformer input) whose tokenizer,
    text encoder and VAE are loaded from the T2V folder ``shared`` (default: the sibling
    ``wan2.2-t2v-tiny``, built first if missing). Writes ``manifest.json`` last; idempotent
    (returns at once when its hash matches, which for I2V includes the T2V folder's hash); one
    builder at a time under a file lock (:func:`omni_triton.checkpoints.common.build_once`).
    A few MB, ~1 s.
    """
    from omni_triton.checkpoints.common import read_manifest

    spec = spec or TinyWanSpec()
    h = spec.config_hash(seed, kind)
    if kind == KIND_I2V:
        shared = build_tiny_wan(Path(shared) if shared else Path(out_dir).parent / "wan2.2-t2v-tiny", KIND_T2V,
                                seed, spec)
        h = hashlib.sha256(f"{h}:{read_manifest(shared)['config_hash']}".encode()).hexdigest()[:16]
    return build_once(Path(out_dir), h, lambda d, hh: _build(d, kind, seed, spec, hh, shared))


def _build(out_dir: Path, kind: str, seed: int, spec: TinyWanSpec, h: str, shared: Path | None = None) -> None:
    from diffusers import (
        AutoencoderKLWan,
        UniPCMultistepScheduler,
        WanImageToVideoPipeline,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import UMT5Config, UMT5EncoderModel

    if kind not in (KIND_T2V, KIND_I2V):
        raise ValueError(f"unknown pipeline kind {kind!r}")
    torch.manual_seed(seed)
    tokenizer = _train_tokenizer(spec.vocab_size)
    te_config = UMT5Config(vocab_size=len(tokenizer), d_model=spec.text_dim, d_kv=spec.text_dim // spec.text_heads,
                           d_ff=2 * spec.text_dim, num_layers=spec.text_layers, num_heads=spec.text_heads,
                           relative_attention_num_buckets=8, pad_token_id=tokenizer.pad_token_id,
                           eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id)
    text_encoder = UMT5EncoderModel(te_config).eval()
    vae = AutoencoderKLWan(base_dim=spec.vae_base_dim, z_dim=spec.z_dim, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True]).eval()
    if shared is not None:  # I2V: the T2V folder's tokenizer, UMT5 and VAE (the RNG state above is unchanged)
        from transformers import T5TokenizerFast

        tokenizer = T5TokenizerFast.from_pretrained(shared / "tokenizer")
        text_encoder = UMT5EncoderModel.from_pretrained(shared / "text_encoder").eval()
        vae = AutoencoderKLWan.from_pretrained(shared / "vae").eval()
    in_channels = spec.z_dim if kind == KIND_T2V else 2 * spec.z_dim + 4

    def expert():
        return WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=spec.dit_heads, attention_head_dim=spec.dit_head_dim,
            in_channels=in_channels, out_channels=spec.z_dim, text_dim=spec.text_dim, freq_dim=32,
            ffn_dim=spec.ffn_dim, num_layers=spec.dit_layers, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", rope_max_seq_len=32).eval()

    transformer, transformer_2 = expert(), expert()
    # Wan2.2's scheduler config: UniPC on flow sigmas with a flow shift.
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        num_train_timesteps=1000, flow_shift=spec.flow_shift)
    components = dict(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler,
                      transformer=transformer, transformer_2=transformer_2)
    if kind == KIND_T2V:
        pipe = WanPipeline(boundary_ratio=spec.boundary_ratio_t2v, **components)
    else:
        pipe = WanImageToVideoPipeline(image_encoder=None, image_processor=None,
                                       boundary_ratio=spec.boundary_ratio_i2v, **components)
    pipe.save_pretrained(out_dir)
    manifest = {"config_hash": h, "seed": seed, "kind": kind, "builder_version": BUILDER_VERSION,
                "pipeline": type(pipe).__name__, "default_steps": spec.default_steps, "spec": spec.__dict__}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2))


# --------------------------------------------------------------------------- serving helpers
_BUILD_KIND = {"wan2.2-t2v-tiny": KIND_T2V, "wan2.2-i2v-tiny": KIND_I2V}


def checkpoint_dir(name: str) -> Path:
    """Folder of the Wan pipeline ``name`` in the cache; the tiny assets (``wan2.2-t2v-tiny``,
    ``wan2.2-i2v-tiny``) are (re)built if missing, any other name must already be there (e.g. a
    real ``Wan-AI/Wan2.2-T2V-A14B-Diffusers`` folder).

    Raises:
        FileNotFoundError: a non-tiny name without a ``model_index.json``.
    """
    from omni_triton.paths import model_dir

    path = model_dir(name)
    if name in _BUILD_KIND:
        build_tiny_wan(path, _BUILD_KIND[name])
    elif not (path / "model_index.json").exists():
        raise FileNotFoundError(f"no diffusers pipeline at {path}")
    return path

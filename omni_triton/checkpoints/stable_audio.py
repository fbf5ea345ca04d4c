"""Tiny random-weight Stable Audio Open pipeline (diffusers ``StableAudioPipeline``), saved with
``save_pretrained``, reloadable with ``DiffusionPipeline.from_pretrained``.

The architecture is stabilityai/stable-audio-open-1.0's: a T5 encoder (``T5EncoderModel``) with a
T5 tokenizer, the ``StableAudioProjectionModel`` (text projection + the seconds start / end
number conditioners), the ``StableAudioDiTModel`` denoiser, the ``AutoencoderOobleck`` VAE and
the ``CosineDPMSolverMultistepScheduler`` (its Brownian-tree SDE noise needs ``torchsde``).

Sizes are shrunk so one clip takes well under a second on CPU: 16 kHz stereo, a VAE hop of 256
samples (real: 44.1 kHz, hop 2048) and ``sample_size`` 256 latent frames, so the model's longest
clip is ``256 * 256 / 16000 = 4.096`` s (real: ``1024 * 2048 / 44100 = 47.55`` s); the seconds
conditioners span ``[0, 8]`` s (real: ``[0, 512]``). The tokenizer is a SentencePiece-style
Unigram trained here on a few lines (no hub), wrapped as ``T5TokenizerFast`` with
``model_max_length`` 64 (real: 128).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from omni_triton.checkpoints.common import MANIFEST, build_once

BUILDER_VERSION = 1
NAME = "stable-audio-open-tiny"

_TRAIN_TEXT = """\
The sound of a cat purring. A dog barking in the distance. Rain on a tin roof at night.
Ocean waves crash on a rocky shore. A techno beat at 128 BPM with warm pads and a deep bass line.
Birds singing in a forest at dawn. Footsteps on gravel. A crowd cheering in a stadium.
Low quality, distorted, noisy, muffled, clipping, silence, worst quality.
"""


@dataclass(frozen=True)
class TinyStableAudioSpec:
    """Sizes of the tiny random Stable Audio Open. Real stable-audio-open-1.0: T5-base (d_model
    768, 12 layers), conditioning 768, DiT 24 layers of 24 heads x 64 (12 KV heads), 64 latent
    channels, sample_size 1024, Oobleck VAE (hop 2048, 44.1 kHz stereo), seconds in [0, 512]."""

    text_dim: int = 32
    text_layers: int = 2
    text_heads: int = 4
    vocab_size: int = 300
    model_max_length: int = 64
    conditioning_dim: int = 32
    dit_layers: int = 2
    dit_heads: int = 4
    dit_kv_heads: int = 2
    dit_head_dim: int = 8
    latent_channels: int = 16
    sample_size: int = 256
    time_proj_dim: int = 32
    vae_hidden: int = 8
    vae_ratios: tuple[int, ...] = (4, 8, 8)
    vae_multiples: tuple[int, ...] = (1, 2, 4)
    sampling_rate: int = 16000
    audio_channels: int = 2
    seconds_max: int = 8

    def config_hash(self, seed: int) -> str:
        text = json.dumps({**self.__dict__, "seed": seed, "v": BUILDER_VERSION}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _train_tokenizer(vocab_size: int, model_max_length: int):
    """A SentencePiece-style Unigram tokenizer (Metaspace pre-tokenizer, ``</s>`` appended) wrapped
    as ``T5TokenizerFast``: what ``AutoTokenizer`` loads for google-t5/t5-base."""
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
                           extra_ids=0, model_max_length=model_max_length)


def build_tiny_stable_audio(out_dir: Path, seed: int = 0, spec: TinyStableAudioSpec | None = None) -> Path:
    """Build and save the tiny random-weight ``StableAudioPipeline`` folder; return ``out_dir``.

    Writes ``manifest.json`` last; idempotent (returns at once when its hash matches); one
    builder at a time under a file lock (:func:`omni_triton.checkpoints.common.build_once`).
    About 1 MB, ~1 s.
    """
    spec = spec or TinyStableAudioSpec()
    return build_once(Path(out_dir), spec.config_hash(seed), lambda d, h: _build(d, seed, spec, h))


def _build(out_dir: Path, seed: int, spec: TinyStableAudioSpec, h: str) -> None:
    from diffusers import (
        AutoencoderOobleck,
        CosineDPMSolverMultistepScheduler,
        StableAudioDiTModel,
        StableAudioPipeline,
    )
    from diffusers.pipelines.stable_audio import StableAudioProjectionModel
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    tokenizer = _train_tokenizer(spec.vocab_size, spec.model_max_length)
    te_config = T5Config(vocab_size=len(tokenizer), d_model=spec.text_dim, d_kv=spec.text_dim // spec.text_heads,
                         d_ff=2 * spec.text_dim, num_layers=spec.text_layers, num_heads=spec.text_heads,
                         relative_attention_num_buckets=8, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id)
    text_encoder = T5EncoderModel(te_config).eval()
    projection = StableAudioProjectionModel(text_encoder_dim=spec.text_dim, conditioning_dim=spec.conditioning_dim,
                                            min_value=0, max_value=spec.seconds_max).eval()
    transformer = StableAudioDiTModel(
        sample_size=spec.sample_size, in_channels=spec.latent_channels, num_layers=spec.dit_layers,
        attention_head_dim=spec.dit_head_dim, num_attention_heads=spec.dit_heads,
        num_key_value_attention_heads=spec.dit_kv_heads, out_channels=spec.latent_channels,
        cross_attention_dim=spec.dit_heads * spec.dit_head_dim, time_proj_dim=spec.time_proj_dim,
        global_states_input_dim=2 * spec.conditioning_dim, cross_attention_input_dim=spec.conditioning_dim).eval()
    vae = AutoencoderOobleck(encoder_hidden_size=spec.vae_hidden, downsampling_ratios=list(spec.vae_ratios),
                             channel_multiples=list(spec.vae_multiples), decoder_channels=spec.vae_hidden,
                             decoder_input_channels=spec.latent_channels, audio_channels=spec.audio_channels,
                             sampling_rate=spec.sampling_rate).eval()
    # stable-audio-open-1.0's scheduler config
    scheduler = CosineDPMSolverMultistepScheduler(sigma_min=0.3, sigma_max=500, sigma_data=1.0,
                                                  sigma_schedule="exponential", solver_order=2,
                                                  prediction_type="v_prediction", final_sigmas_type="zero")
    pipe = StableAudioPipeline(vae=vae, text_encoder=text_encoder, projection_model=projection, tokenizer=tokenizer,
                               transformer=transformer, scheduler=scheduler)
    pipe.save_pretrained(out_dir)
    manifest = {"config_hash": h, "seed": seed, "builder_version": BUILDER_VERSION,
                "pipeline": type(pipe).__name__, "spec": {**spec.__dict__, "vae_ratios": list(spec.vae_ratios),
                                                           "vae_multiples": list(spec.vae_multiples)}}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2))


def checkpoint_dir(name: str) -> Path:
    """Folder of the Stable Audio pipeline ``name`` in the cache; the tiny asset
    (``stable-audio-open-tiny``) is (re)built if missing, any other name must already be there
    (e.g. a real ``stabilityai/stable-audio-open-1.0`` folder).

    Raises:
        FileNotFoundError: a non-tiny name without a ``model_index.json``.
    """
    from omni_triton.paths import model_dir

    path = model_dir(name)
    if name == NAME:
        build_tiny_stable_audio(path)
    elif not (path / "model_index.json").exists():
        raise FileNotFoundError(f"no diffusers pipeline at {path}")
    return path

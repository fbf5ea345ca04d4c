"""Stable Audio Open text-to-audio stages (diffusers ``StableAudioPipeline``) split for Triton.

The pipeline is cut where diffusers allows it (``prompt_embeds`` + ``attention_mask`` in,
``output_type="latent"`` out), as the image and video families are:

    text encoder (T5)  -> the T5 last hidden state of the prompt (and of the negative prompt,
              its padding rows zeroed as ``encode_prompt`` does) with its attention mask
    denoiser (StableAudioDiTModel + CosineDPMSolverMultistepScheduler): the pipeline's own
              ``__call__`` with those embeddings, ``audio_start_in_s`` / ``audio_end_in_s`` and
              ``output_type="latent"``; inside that call the ``StableAudioProjectionModel``
              projects the text states and encodes the seconds start / end conditioning (diffusers
              takes no precomputed projection or duration states, so that conditioning runs here:
              a few linear layers). It reports each finished step and stops at the next step
              boundary when every request of its call is cancelled.
    VAE decode (AutoencoderOobleck) -> ``float32 [channels, samples]`` cut to
              ``[int(start * sr), int(end * sr))``, as ``__call__`` cuts it

Data contract per request (``docs/audio_generation.md``):

- prompt embeddings: ``float32 [L, D]`` with ``L`` the tokenizer's ``model_max_length`` (every
  row, padding included: the pipeline masks them after the projection) and an ``int64 [L]``
  attention mask; the negative prompt's likewise (absent: the pipeline's zero unconditional
  embeddings when ``guidance_scale > 1``);
- latents: ``float32 [C, sample_size]`` (the DiT always denoises the model's full window; the
  requested seconds are conditioning plus the final cut);
- audio: ``float32 [channels, samples]`` at the VAE's ``sampling_rate``.

Batching: requests are compatible when :func:`denoise_key` is equal (steps, guidance scale,
negative prompt or not, start / end seconds); each request has its own ``torch.Generator``, and
diffusers gives each generator of a list its own Brownian tree (the SDE noise of the scheduler),
so a batched request differs from the same request alone only by float rounding.
"""
from omni_triton.stages.stable_audio.denoiser import (  # noqa: F401
    AudioDenoiseItem,
    AudioDenoiseResult,
    denoise,
    denoise_key,
)
from omni_triton.stages.stable_audio.loading import Limits, check_config_limits, limits, load_pipeline  # noqa: F401
from omni_triton.stages.stable_audio.reference import reference_audio, staged_audio  # noqa: F401
from omni_triton.stages.stable_audio.text_encoder import check_prompt_tokens, encode_prompts  # noqa: F401
from omni_triton.stages.stable_audio.vae import vae_decode  # noqa: F401

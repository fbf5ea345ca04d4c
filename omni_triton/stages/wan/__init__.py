"""Wan2.2 video stages (diffusers ``WanPipeline``, two-expert form) split for Triton.

The pipeline is cut where diffusers allows it (``prompt_embeds`` in, ``output_type="latent"``
out), exactly as the Qwen-Image stages (``omni_triton.stages.qwen_image``):

    text encoder (UMT5)  -> prompt / negative prompt embeddings
    denoiser (two WanTransformer3DModel experts switched at ``boundary_ratio`` + UniPC flow
              scheduler): the pipeline's own ``__call__`` with ``prompt_embeds`` and
              ``output_type="latent"``, reporting each finished step and stopping at the next
              step boundary when every request of its call is cancelled (``pipe._interrupt``)
    VAE decode (AutoencoderKLWan) -> ``uint8 [F, H, W, 3]`` frames

Data contract per request (``docs/video_contracts.md``):

- prompt embeddings: ``float32 [L, D]``: UMT5's last hidden state for the prompt's tokens (the
  pipeline pads them with zero rows to ``max_sequence_length``; the stage sends only the ``L``
  real rows and the denoiser pads them back, byte-identical);
- negative prompt embeddings: ``float32 [L', D]`` (used when ``guidance_scale > 1``);
- latents: ``float32 [z_dim, (F - 1) / 4 + 1, H / 8, W / 8]`` (unnormalised as the loop leaves them);
- frames: ``uint8 [F, H, W, 3]`` RGB, ``round(x * 255)`` of the pipeline's ``postprocess_video``.

Image-to-video (``WanImageToVideoPipeline``, Wan2.2 A14B form: no image encoder, the first
frame's VAE latents concatenated to the noise latents with a first-frame mask) adds one stage:

    VAE encode (AutoencoderKLWan) of ``[reference image, F - 1 black frames]`` -> condition
              latents ``float32 [z, (F - 1) / 4 + 1, H / 8, W / 8]`` (unnormalised), which the
              denoiser's ``WanImageToVideoPipeline.__call__`` uses in place of its own encode

and reuses the text encoder and VAE decoder (the same UMT5 and VAE weights as text-to-video).

Batching: requests are compatible when :func:`denoise_key` is equal (size, frames, steps, both
guidance scales, boundary ratio, flow shift); each request has its own ``torch.Generator``.
"""
from omni_triton.stages.wan.denoiser import (  # noqa: F401
    VideoDenoiseItem,
    VideoDenoiseResult,
    denoise,
    denoise_key,
)
from omni_triton.stages.wan.loading import is_i2v, load_pipeline, size_multiple  # noqa: F401
from omni_triton.stages.wan.reference import (  # noqa: F401
    reference_frames,
    reference_i2v_frames,
    staged_frames,
    staged_i2v_frames,
)
from omni_triton.stages.wan.text_encoder import encode_prompts  # noqa: F401
from omni_triton.stages.wan.vae import vae_decode, vae_encode_condition  # noqa: F401

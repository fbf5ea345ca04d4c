"""Diffusion stages (diffusers ``QwenImagePipeline`` / ``QwenImageEditPipeline`` /
``QwenImageEditPlusPipeline``) split for Triton.

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
  ``_encode_vae_image`` (``(x - latents_mean) / latents_std``); the multi-image edit exchanges a
  request's images' latents packed (``pack_image_latents``: ``float32 [S_c, 4 * z_dim]``);
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

Inpainting (``QwenImageInpaintPipeline`` on the Qwen-Image weights, ``inpaint``): the VAE-encode
stage returns the image's VAE posterior; the denoiser's pipeline call samples it with the
request's generator (see ``inpaint``'s docstring for why, and why the masked image is not encoded).

Layout: ``loading``, ``text_encoder``, ``vae``, ``inpaint``, ``denoiser``, ``reference``; the tiny checkpoint
builder is ``omni_triton.checkpoints.qwen_image``.
"""
from omni_triton.contracts.image import MAX_GUIDANCE_SCALE, check_guidance  # noqa: F401
from omni_triton.stages.qwen_image.denoiser import (  # noqa: F401
    DenoiseItem,
    DenoiseResult,
    denoise,
    denoise_key,
)
from omni_triton.stages.qwen_image.inpaint import (  # noqa: F401
    check_mask,
    image_posteriors,
    mask_from_array,
    masked_image_placeholder,
    precomputed_posteriors,
)
from omni_triton.stages.qwen_image.loading import (  # noqa: F401
    MAX_CONDITION_ASPECT_RATIO,
    check_condition_image,
    edit_condition_size,
    image_from_array,
    image_only_processor_class,
    is_edit_pipeline,
    is_inpaint_pipeline,
    is_multi_image_pipeline,
    load_pipeline,
    max_prompts_per_call,
    size_multiple,
    vae_condition_size,
)
from omni_triton.stages.qwen_image.lora import (  # noqa: F401
    LoraCache,
    LoraLoadError,
    LoraSpec,
    write_manifest,
)
from omni_triton.stages.qwen_image.reference import (  # noqa: F401
    reference_images,
    staged_images,
    staged_inpaint,
)
from omni_triton.stages.qwen_image.text_encoder import (  # noqa: F401
    encode_prompts,
)
from omni_triton.stages.qwen_image.vae import (  # noqa: F401
    condition_image,
    pack_image_latents,
    unpack_image_latents,
    vae_decode,
    vae_encode,
)

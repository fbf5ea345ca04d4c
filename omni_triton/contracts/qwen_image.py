"""The Qwen-Image family's stage contracts (``docs/image_contracts.md``): the ensembles
``qwen_image`` (text-to-image), ``qwen_image_edit``, ``qwen_image_edit_plus`` (1 to
``max_input_images`` condition images, packed by ``pack_images``) and ``qwen_image_inpaint``
(masked inpainting: ``QwenImageInpaintPipeline`` on the Qwen-Image weights; the image contract of
``omni_triton.contracts.image``) and their stages, text encoder -> (VAE encoder) -> denoiser ->
VAE decoder. ``qwen_image_inpaint`` shares ``qwen_image``'s text encoder and VAE decoder models
(same weights, same code) and adds its own VAE encoder and denoiser.

All stages are dynamically batched: dims exclude the batch dimension, and every request carries
its own ``[1, ...]`` tensors. The API tensor names, :class:`Limits` and the input-error class are
re-exported from ``contracts/image.py``, so the adapters name one module. Input problems are
:class:`~omni_triton.contracts.image.ImageInputError`.
"""
from __future__ import annotations

from collections.abc import Iterable

from omni_triton.contracts.image import (  # noqa: F401 (re-exported for the adapters)
    DENOISE_SECONDS,
    ENSEMBLE_IN,
    ENSEMBLE_OUT,
    GUIDANCE_SCALE,
    HEIGHT,
    IMAGE,
    INPUT_IMAGE,
    INPUT_IMAGE_SIZES,
    INPUT_IMAGES,
    MASK,
    MAX_GUIDANCE_SCALE,
    MIN_INFERENCE_STEPS,
    NEGATIVE_PROMPT,
    NUM_INFERENCE_STEPS,
    NUM_STEPS,
    PROMPT,
    SEED,
    STRENGTH,
    TRUE_CFG_SCALE,
    WIDTH,
    ImageInputError,
    Limits,
    check_guidance,
    check_strength,
    pack_images,
    unpack_images,
)
from omni_triton.contracts.lora import LORA_ID, LORA_SCALE
from omni_triton.contracts.tensors import StageContract, TensorSpec

PROMPT_EMBEDS = "PROMPT_EMBEDS"  #: FP32 [L, D]
NEGATIVE_PROMPT_EMBEDS = "NEGATIVE_PROMPT_EMBEDS"  #: FP32 [L', D] (L' = 0: no CFG)
IMAGE_LATENTS = "IMAGE_LATENTS"  #: FP32 [C, 1, h, w]: normalised VAE latents of the condition image
#: UINT8 [H, W, 3]: the edit VAE encoder's input image, passed on once it was checked; the edit
#: ensemble's text encoder reads it, so the two steps run one after the other (see
#: ``ensembles/qwen_image_edit/config.pbtxt``: Triton 2.51 never ends an ensemble request whose
#: step failed while another step of it was running)
CHECKED_IMAGE = "CHECKED_IMAGE"
LATENTS = "LATENTS"  #: FP32 [N, C]: packed latents
#: FP32 [2 * z, 1, h, w]: the inpaint VAE encoder's posterior parameters of the image (mean, then
#: log-variance; ``vae.encode(x).latent_dist.parameters``): the denoiser's pipeline call samples
#: them with the request's generator (``omni_triton.stages.qwen_image.inpaint``)
IMAGE_MOMENTS = "IMAGE_MOMENTS"
#: BYTES [1]: the inpaint VAE encoder's PROMPT, passed on once the image and mask were checked; the
#: inpaint ensemble's text encoder reads it, so the steps form a chain (as CHECKED_IMAGE above)
CHECKED_PROMPT = "CHECKED_PROMPT"
# Multi-image edit (``qwen_image_edit_plus``) stage tensors: the images as ``pack_images`` encodes them.
IMAGES = "IMAGES"  #: UINT8 [P, 3]: the condition images' pixels, one image after the other
IMAGE_SIZES = "IMAGE_SIZES"  #: INT32 [N, 2]: (height, width) of each image in IMAGES
#: UINT8 [P, 3]: the multi-image VAE encoder's IMAGES, passed on once every image was checked
#: (the text encoder reads them, so the two steps run one after the other, as CHECKED_IMAGE)
CHECKED_IMAGES = "CHECKED_IMAGES"


def _t(name: str, datatype: str, dims: Iterable[int] = (1,), optional: bool = False) -> TensorSpec:
    return TensorSpec(name, datatype, tuple(dims), optional)


_EMBEDS_OUT = (_t(PROMPT_EMBEDS, "FP32", (-1, -1)), _t(NEGATIVE_PROMPT_EMBEDS, "FP32", (-1, -1)))
_TEXT_IN = (_t(PROMPT, "BYTES"), _t(NEGATIVE_PROMPT, "BYTES", optional=True))
_DENOISE_IN = (_t(PROMPT_EMBEDS, "FP32", (-1, -1)), _t(NEGATIVE_PROMPT_EMBEDS, "FP32", (-1, -1), True),
               _t(HEIGHT, "INT32"), _t(WIDTH, "INT32"), _t(NUM_INFERENCE_STEPS, "INT32"),
               _t(TRUE_CFG_SCALE, "FP32", optional=True), _t(GUIDANCE_SCALE, "FP32", optional=True),
               _t(SEED, "INT64"))
#: per-request LoRA (``omni_triton.contracts.lora``, docs/lora.md): optional in the ensembles and
#: the denoisers; absent or LORA_ID "" = no adapter
LORA_IN = (_t(LORA_ID, "BYTES", optional=True), _t(LORA_SCALE, "FP32", optional=True))
_EDIT_DENOISE_IN = _DENOISE_IN + (_t(IMAGE, "UINT8", (-1, -1, 3)), _t(IMAGE_LATENTS, "FP32", (-1, 1, -1, -1)))
_INPAINT_DENOISE_IN = _DENOISE_IN + (_t(IMAGE, "UINT8", (-1, -1, 3)), _t(MASK, "UINT8", (-1, -1)),
                                     _t(IMAGE_MOMENTS, "FP32", (-1, 1, -1, -1)), _t(STRENGTH, "FP64"))
_IMAGES_IN = (_t(IMAGES, "UINT8", (-1, 3)), _t(IMAGE_SIZES, "INT32", (-1, 2)))
#: IMAGE_LATENTS of a multi-image edit: FP32 [S_c, 4z], each image's latents packed into 2x2 patches
#: (``_pack_latents``) and concatenated in image order: the condition tokens the DiT reads
_PLUS_LATENTS = _t(IMAGE_LATENTS, "FP32", (-1, -1))
_DENOISE_OUT = (_t(LATENTS, "FP32", (-1, -1)), _t(NUM_STEPS, "INT32"), _t(DENOISE_SECONDS, "FP32"))
_VAE_DECODER = StageContract((_t(LATENTS, "FP32", (-1, -1)), _t(HEIGHT, "INT32"), _t(WIDTH, "INT32")),
                             (_t(IMAGE, "UINT8", (-1, -1, 3)),), batched=True)

QWEN_IMAGE = StageContract(ENSEMBLE_IN + LORA_IN, ENSEMBLE_OUT, batched=True)
QWEN_IMAGE_EDIT = StageContract(ENSEMBLE_IN + (_t(INPUT_IMAGE, "UINT8", (-1, -1, 3)),) + LORA_IN, ENSEMBLE_OUT,
                                batched=True)
TEXT_ENCODER = StageContract(_TEXT_IN, _EMBEDS_OUT, batched=True)
EDIT_TEXT_ENCODER = StageContract(_TEXT_IN + (_t(IMAGE, "UINT8", (-1, -1, 3)),), _EMBEDS_OUT, batched=True)
EDIT_VAE_ENCODER = StageContract((_t(IMAGE, "UINT8", (-1, -1, 3)),),
                                 (_t(IMAGE_LATENTS, "FP32", (-1, 1, -1, -1)), _t(CHECKED_IMAGE, "UINT8", (-1, -1, 3))),
                                 batched=True)
DENOISER = StageContract(_DENOISE_IN + LORA_IN, _DENOISE_OUT, batched=True)
QWEN_IMAGE_INPAINT = StageContract(ENSEMBLE_IN + (_t(INPUT_IMAGE, "UINT8", (-1, -1, 3)), _t(MASK, "UINT8", (-1, -1)),
                                                  _t(STRENGTH, "FP64")) + LORA_IN, ENSEMBLE_OUT,
                                batched=True)
INPAINT_VAE_ENCODER = StageContract(
    (_t(IMAGE, "UINT8", (-1, -1, 3)), _t(MASK, "UINT8", (-1, -1)), _t(HEIGHT, "INT32"), _t(WIDTH, "INT32"),
     _t(PROMPT, "BYTES")),
    (_t(IMAGE_MOMENTS, "FP32", (-1, 1, -1, -1)), _t(CHECKED_PROMPT, "BYTES")), batched=True)
INPAINT_DENOISER = StageContract(_INPAINT_DENOISE_IN + LORA_IN, _DENOISE_OUT, batched=True)
QWEN_IMAGE_EDIT_PLUS = StageContract(
    ENSEMBLE_IN + (_t(INPUT_IMAGES, "UINT8", (-1, 3)), _t(INPUT_IMAGE_SIZES, "INT32", (-1, 2))) + LORA_IN,
    ENSEMBLE_OUT, batched=True)
EDIT_PLUS_TEXT_ENCODER = StageContract(_TEXT_IN + _IMAGES_IN, _EMBEDS_OUT, batched=True)
EDIT_PLUS_VAE_ENCODER = StageContract(_IMAGES_IN, (_PLUS_LATENTS, _t(CHECKED_IMAGES, "UINT8", (-1, 3))),
                                      batched=True)
EDIT_PLUS_DENOISER = StageContract(_DENOISE_IN + _IMAGES_IN + (_PLUS_LATENTS,) + LORA_IN, _DENOISE_OUT,
                                   batched=True)
EDIT_DENOISER = StageContract(_EDIT_DENOISE_IN + LORA_IN, _DENOISE_OUT, batched=True)
VAE_DECODER = _VAE_DECODER

#: model name -> contract (stages in ``model_repository/``, ensembles in ``ensembles/``).
CONTRACTS = {
    "qwen_image": QWEN_IMAGE, "qwen_image_edit": QWEN_IMAGE_EDIT,
    "qwen_image_text_encoder": TEXT_ENCODER, "qwen_image_denoiser": DENOISER,
    "qwen_image_vae_decoder": VAE_DECODER,
    "qwen_image_edit_text_encoder": EDIT_TEXT_ENCODER, "qwen_image_edit_vae_encoder": EDIT_VAE_ENCODER,
    "qwen_image_edit_denoiser": EDIT_DENOISER, "qwen_image_edit_vae_decoder": VAE_DECODER,
    "qwen_image_inpaint": QWEN_IMAGE_INPAINT, "qwen_image_inpaint_vae_encoder": INPAINT_VAE_ENCODER,
    "qwen_image_inpaint_denoiser": INPAINT_DENOISER,
    "qwen_image_edit_plus": QWEN_IMAGE_EDIT_PLUS,
    "qwen_image_edit_plus_text_encoder": EDIT_PLUS_TEXT_ENCODER,
    "qwen_image_edit_plus_vae_encoder": EDIT_PLUS_VAE_ENCODER,
    "qwen_image_edit_plus_denoiser": EDIT_PLUS_DENOISER, "qwen_image_edit_plus_vae_decoder": VAE_DECODER,
}

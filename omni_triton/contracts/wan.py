"""The Wan2.2 family's stage contracts (``docs/video_contracts.md``): the text-to-video pipeline
``wan_t2v`` (BLS, decoupled; the video contract of ``omni_triton.contracts.video``) and its stages
``wan_t2v_text_encoder`` -> ``wan_t2v_denoiser`` (decoupled, dynamically batched: one STEP
response per finished denoising step, then the latents) -> ``wan_t2v_vae_decoder``; the
image-to-video pipeline ``wan_i2v`` adds ``wan_i2v_vae_encoder`` and ``wan_i2v_denoiser``.

Responses of ``wan_t2v`` (one request = one video): ``STEP`` + ``TOTAL_STEPS`` after each
denoising step (progress), then one final response with ``VIDEO``, ``NUM_STEPS`` and
``DENOISE_SECONDS``. A cancelled request ends without ``VIDEO``. The API tensor names, limits,
checks and the input-error class are re-exported from ``contracts/video.py``, so the adapters name
one module. Input problems are :class:`~omni_triton.contracts.video.VideoInputError`.
"""
from __future__ import annotations

from collections.abc import Iterable

from omni_triton.contracts.tensors import REQUEST_ID, StageContract, TensorSpec
from omni_triton.contracts.video import (  # noqa: F401 (re-exported for the adapters)
    BOUNDARY_RATIO,
    DENOISE_SECONDS,
    DONE_OUT,
    FLOW_SHIFT,
    GUIDANCE_SCALE,
    GUIDANCE_SCALE_2,
    HEIGHT,
    INPUT_IMAGE,
    INPUT_IMAGE_IN,
    MAX_GUIDANCE_SCALE,
    MIN_INFERENCE_STEPS,
    NEGATIVE_PROMPT,
    NUM_FRAMES,
    NUM_INFERENCE_STEPS,
    NUM_STEPS,
    PROGRESS_OUT,
    PROMPT,
    PROMPTS_IN,
    REQUEST_IN,
    SEED,
    STEP,
    TOTAL_STEPS,
    VIDEO,
    VIDEO_OUT,
    WIDTH,
    VideoInputError,
    VideoLimits,
    check_input_image,
    check_scales,
)

PROMPT_EMBEDS = "PROMPT_EMBEDS"  #: FP32 [L, D]
NEGATIVE_PROMPT_EMBEDS = "NEGATIVE_PROMPT_EMBEDS"  #: FP32 [L', D]
LATENTS = "LATENTS"  #: FP32 [z, f, h, w]
#: the VAE posterior mode of ``[INPUT_IMAGE, F - 1 black frames]`` (unnormalised, as
#: ``vae.encode`` returns it; the denoiser's pipeline call normalises it)
CONDITION_LATENTS = "CONDITION_LATENTS"  #: FP32 [z, (F - 1) / 4 + 1, H / 8, W / 8]


def _t(name: str, datatype: str, dims: Iterable[int] = (1,), optional: bool = False) -> TensorSpec:
    return TensorSpec(name, datatype, tuple(dims), optional)


WAN_T2V = StageContract(PROMPTS_IN + REQUEST_IN, PROGRESS_OUT + (VIDEO_OUT,) + DONE_OUT, decoupled=True)
TEXT_ENCODER = StageContract(PROMPTS_IN,
                             (_t(PROMPT_EMBEDS, "FP32", (-1, -1)), _t(NEGATIVE_PROMPT_EMBEDS, "FP32", (-1, -1))),
                             batched=True)
DENOISER = StageContract((_t(PROMPT_EMBEDS, "FP32", (-1, -1)), _t(NEGATIVE_PROMPT_EMBEDS, "FP32", (-1, -1), True))
                         + REQUEST_IN + (_t(REQUEST_ID, "BYTES", optional=True),),
                         PROGRESS_OUT + (_t(LATENTS, "FP32", (-1, -1, -1, -1)),) + DONE_OUT,
                         decoupled=True, batched=True)
VAE_DECODER = StageContract((_t(LATENTS, "FP32", (-1, -1, -1, -1)),), (VIDEO_OUT,), batched=True)

_CONDITION = _t(CONDITION_LATENTS, "FP32", (-1, -1, -1, -1))
#: image-to-video (``WanImageToVideoPipeline``, Wan2.2 form): the T2V inputs + the reference image;
#: the text encoder and VAE decoder are the T2V stages (same UMT5 and VAE weights).
WAN_I2V = StageContract(WAN_T2V.inputs + (INPUT_IMAGE_IN,), WAN_T2V.outputs, decoupled=True)
VAE_ENCODER = StageContract((INPUT_IMAGE_IN, _t(NUM_FRAMES, "INT32")), (_CONDITION,), batched=True)
I2V_DENOISER = StageContract(DENOISER.inputs + (_CONDITION,), DENOISER.outputs, decoupled=True, batched=True)

#: model name -> contract (``model_repository/``).
CONTRACTS = {
    "wan_t2v": WAN_T2V, "wan_t2v_text_encoder": TEXT_ENCODER, "wan_t2v_denoiser": DENOISER,
    "wan_t2v_vae_decoder": VAE_DECODER,
    "wan_i2v": WAN_I2V, "wan_i2v_vae_encoder": VAE_ENCODER, "wan_i2v_denoiser": I2V_DENOISER,
}

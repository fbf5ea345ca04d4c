"""Loading a Qwen-Image(-Edit) pipeline folder and what the stages read from it.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from omni_triton.checkpoints.qwen_image import image_only_processor_class
from omni_triton.contracts.image import ImageInputError
from omni_triton.stages.diffusion_pipeline import load_float32_pipeline

LOGGER = logging.getLogger("omni_triton.diffusion")


# --------------------------------------------------------------------------- loading
def load_pipeline(path: Path | str, pipeline_class: str | None = None):
    """``DiffusionPipeline.from_pretrained`` on a prepared folder (float32, CPU), progress bars off.

    Returns a ``QwenImagePipeline``, ``QwenImageEditPipeline`` or ``QwenImageEditPlusPipeline``
    (what ``model_index.json`` names), or ``pipeline_class`` loaded from the same folder
    (``QwenImageInpaintPipeline`` on a Qwen-Image folder: the inpaint stages; config parameter
    ``pipeline``).
    Without torchvision the edit pipeline's processor is loaded image-only
    (:func:`image_only_processor_class`) and passed in; with it, the folder loads unchanged.
    """
    import importlib.util

    path = Path(path)
    kwargs = {}
    index = json.loads((path / "model_index.json").read_text())
    if "processor" in index and importlib.util.find_spec("torchvision") is None:
        kwargs["processor"] = image_only_processor_class().from_pretrained(str(path / "processor"))
    return load_float32_pipeline(path, pipeline_class, **kwargs)


def is_edit_pipeline(pipe) -> bool:
    """True for pipelines that condition on input images (``QwenImageEditPipeline``,
    ``QwenImageEditPlusPipeline``)."""
    return hasattr(pipe, "processor") and getattr(pipe, "processor", None) is not None


def is_inpaint_pipeline(pipe) -> bool:
    """True for the masked-inpainting pipelines (``QwenImageInpaintPipeline``: they have a
    ``mask_processor`` and take ``mask_image``/``strength``)."""
    return getattr(pipe, "mask_processor", None) is not None
def is_multi_image_pipeline(pipe) -> bool:
    """True for ``QwenImageEditPlusPipeline`` (Qwen-Image-Edit-2509): its ``image`` argument is a
    list of condition images of one prompt ("Picture 1: ... Picture 2: ..." in the prompt
    template), not one image per prompt as in ``QwenImageEditPipeline``."""
    from diffusers import QwenImageEditPlusPipeline

    return isinstance(pipe, QwenImageEditPlusPipeline)


def max_prompts_per_call(pipe) -> int | None:
    """Most prompts one ``__call__`` takes (None: no limit). ``QwenImageEditPlusPipeline.__call__``
    raises for ``batch_size > 1`` (diffusers 0.42.1: "currently only supports batch_size=1"), so
    its denoiser runs one pipeline call per request."""
    return 1 if is_multi_image_pipeline(pipe) else None


def size_multiple(pipe) -> int:
    """Height/width must be multiples of this (VAE 8x times the DiT's 2x2 patch = 16); the
    pipeline itself would silently round other sizes down."""
    return pipe.vae_scale_factor * 2


def edit_condition_size(pipe, image_size: tuple[int, int]) -> tuple[int, int]:
    """(width, height) the edit pipeline resizes a condition image of ``image_size`` (w, h) to
    for its text encoder: ``calculate_dimensions(1024 * 1024, w / h)`` as in
    ``QwenImageEditPipeline.__call__``; ``calculate_dimensions(CONDITION_IMAGE_SIZE = 384 * 384,
    w / h)`` as in ``QwenImageEditPlusPipeline.__call__``."""
    if is_multi_image_pipeline(pipe):
        from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus

        w, h = plus.calculate_dimensions(plus.CONDITION_IMAGE_SIZE, image_size[0] / image_size[1])
        return int(w), int(h)
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

    w, h, _ = calculate_dimensions(1024 * 1024, image_size[0] / image_size[1])
    return int(w), int(h)


def vae_condition_size(pipe, image_size: tuple[int, int]) -> tuple[int, int]:
    """(width, height) the pipeline VAE-encodes a condition image of ``image_size`` (w, h) at: the
    text encoder's size (:func:`edit_condition_size`) for ``QwenImageEditPipeline``;
    ``calculate_dimensions(VAE_IMAGE_SIZE = 1024 * 1024, w / h)`` for ``QwenImageEditPlusPipeline``
    (multiples of 32, so the latents pack into 2x2 patches)."""
    if is_multi_image_pipeline(pipe):
        from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus

        w, h = plus.calculate_dimensions(plus.VAE_IMAGE_SIZE, image_size[0] / image_size[1])
        return int(w), int(h)
    return edit_condition_size(pipe, image_size)


#: Qwen2.5-VL's image processor (``smart_resize``) refuses images more elongated than this; the
#: edit pipeline hands it the condition image resized by :func:`edit_condition_size`.
MAX_CONDITION_ASPECT_RATIO = 200


def check_condition_image(pipe, image) -> None:
    """Raise ``ValueError`` when the edit pipeline cannot encode the condition ``image`` (PIL):
    resized to :func:`edit_condition_size`, it must be at least 1 pixel each way and at most
    :data:`MAX_CONDITION_ASPECT_RATIO` times longer than wide (either way). Checked per request
    while parsing, so one such image is answered alone instead of failing its whole batch (a 4096x4
    upload failed the 11 good edits batched with it). The multi-image pipeline's VAE size
    (:func:`vae_condition_size`) must be at least 1 pixel each way too."""
    w, h = edit_condition_size(pipe, image.size)
    vw, vh = vae_condition_size(pipe, image.size)
    if min(w, h, vw, vh) < 1 or max(w, h) > MAX_CONDITION_ASPECT_RATIO * min(w, h):
        raise ValueError(f"condition image {image.size[0]}x{image.size[1]} is too elongated "
                         f"(resized to {w}x{h}; the aspect ratio must be at most "
                         f"{MAX_CONDITION_ASPECT_RATIO}:1)")


def image_from_array(array: np.ndarray):
    """``uint8 [H, W, 3]`` RGB -> PIL image.

    Raises:
        ImageInputError: any other shape/dtype.
    """
    from PIL import Image

    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3 or min(array.shape[:2]) < 1:
        raise ImageInputError(f"IMAGE must be uint8 [H, W, 3], got {array.dtype} {list(array.shape)}")
    return Image.fromarray(np.ascontiguousarray(array), "RGB")

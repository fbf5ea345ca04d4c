"""The image API contract (``docs/image_contracts.md``): what the Qwen-Image (text-to-image) and
Qwen-Image-Edit ensembles take and answer, request limits, the input-error class and the input
builder. The ensembles are dynamically batched: dims exclude the batch dimension, and every
request carries its own ``[1, ...]`` tensors. Every input problem is an :class:`ImageInputError`.

The stage tensors (text encoder -> (VAE encoder) -> denoiser -> VAE decoder) and every
``qwen_image*`` model's :class:`StageContract` live in ``omni_triton.contracts.qwen_image``.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from omni_triton.contracts.lora import LORA_ID, LORA_SCALE
from omni_triton.contracts.tensors import Array, InputError, TensorSpec

PROMPT = "PROMPT"
NEGATIVE_PROMPT = "NEGATIVE_PROMPT"
HEIGHT = "HEIGHT"
WIDTH = "WIDTH"
NUM_INFERENCE_STEPS = "NUM_INFERENCE_STEPS"
TRUE_CFG_SCALE = "TRUE_CFG_SCALE"
GUIDANCE_SCALE = "GUIDANCE_SCALE"
SEED = "SEED"
INPUT_IMAGE = "INPUT_IMAGE"  #: UINT8 [H, W, 3]: the edit ensemble's condition image
#: UINT8 [P, 3]: a multi-image edit ensemble's condition images (``qwen_image_edit_plus``), the RGB
#: pixels of each image row by row, one image after the other (:func:`pack_images`);
#: ``P = sum(h_k * w_k)``
INPUT_IMAGES = "INPUT_IMAGES"
#: INT32 [N, 2]: (height, width) of each image in INPUT_IMAGES, in order (N = number of images)
INPUT_IMAGE_SIZES = "INPUT_IMAGE_SIZES"
IMAGE = "IMAGE"  #: UINT8 [H, W, 3]: a stage's image (condition image in, result out)
#: UINT8 [H, W]: the inpaint ensemble's mask in diffusers' convention (255 = repaint, 0 = keep),
#: the size of INPUT_IMAGE (:func:`diffusers_mask_from_alpha` makes it from OpenAI's mask)
MASK = "MASK"
#: FP64 [1]: inpainting strength in (0, 1] (``QwenImageInpaintPipeline``'s ``strength``). FP64,
#: not FP32: the pipeline runs ``steps - int(steps - steps * strength)`` steps, and 0.6 as FP32
#: (0.6000000238) with 5 steps gives 5 - int(1.9999999) = 4 steps where Python's 0.6 gives 3
STRENGTH = "STRENGTH"
NUM_STEPS = "NUM_STEPS"  #: INT32 [1]
DENOISE_SECONDS = "DENOISE_SECONDS"  #: FP32 [1]

#: Fewest denoising steps served: diffusers' QwenImagePipeline with one step gives NaN latents (its
#: flow-match sigma schedule divides by zero: "invalid value encountered in divide"), which decode
#: to an all-black image. Measured with diffusers 0.42.1 on the tiny checkpoints.
MIN_INFERENCE_STEPS = 2


class ImageInputError(InputError):
    """The image request cannot be served as given (size, steps, empty prompt, bad image)."""


#: Upper bound of ``true_cfg_scale`` / ``guidance_scale`` (1e308 or Infinity gave an all-black
#: image; the default is 4.0). The OpenAI frontend applies the same bound.
MAX_GUIDANCE_SCALE = 100.0


def check_guidance(true_cfg_scale: float | None, guidance_scale: float | None) -> None:
    """Raise ``ValueError`` unless each given scale is finite and in [0, MAX_GUIDANCE_SCALE]
    (``guidance_scale`` <= 0 means none)."""
    if true_cfg_scale is not None and not 0.0 <= true_cfg_scale <= MAX_GUIDANCE_SCALE:
        raise ValueError(f"true_cfg_scale={true_cfg_scale}: must be in [0, {MAX_GUIDANCE_SCALE}]")
    if guidance_scale is not None and not guidance_scale <= MAX_GUIDANCE_SCALE:
        raise ValueError(f"guidance_scale={guidance_scale}: must be at most {MAX_GUIDANCE_SCALE}")


@dataclass(frozen=True)
class Limits:
    """What one served pipeline accepts (config.pbtxt parameters ``max_size``, ``max_steps``).

    ``multiple`` is the pipeline's size multiple (16 for Qwen-Image).
    """

    multiple: int = 16
    max_size: int = 1024
    max_steps: int = 50

    def check(self, height: int, width: int, steps: int | None = None) -> None:
        """Check a request's size (pixels) and steps (``steps=None``: a stage without a denoising
        loop checks the size only).

        Raises:
            ImageInputError: naming the first out-of-range value.
        """
        for name, v in (("height", height), ("width", width)):
            if v < self.multiple or v > self.max_size or v % self.multiple:
                raise ImageInputError(f"{name}={v}: must be a multiple of {self.multiple} "
                                      f"in [{self.multiple}, {self.max_size}]")
        if steps is not None and not MIN_INFERENCE_STEPS <= steps <= self.max_steps:
            raise ImageInputError(f"num_inference_steps={steps}: must be in [{MIN_INFERENCE_STEPS}, {self.max_steps}]")


def check_strength(strength: float) -> None:
    """Raise ``ValueError`` unless ``strength`` is a finite number in (0, 1] (0 would leave the
    inpaint pipeline no step: ``int(steps - steps * 0) == steps``; diffusers refuses > 1)."""
    if not 0.0 < strength <= 1.0:
        raise ValueError(f"strength={strength}: must be in (0, 1]")


def diffusers_mask_from_alpha(alpha: Array) -> Array:
    """OpenAI's edit mask -> diffusers' inpainting mask.

    OpenAI: the mask is a PNG with an alpha channel; its *fully transparent* pixels (alpha 0) mark
    where the image is edited, every other pixel is kept. diffusers (``mask_image`` of
    ``QwenImageInpaintPipeline``): white pixels are repainted, black ones kept (the pipeline
    binarises at 0.5 after resizing). So: 255 where ``alpha == 0``, else 0.

    Args:
        alpha: ``uint8 [H, W]``, the mask's alpha channel.

    Returns:
        ``uint8 [H, W]`` (the :data:`MASK` tensor).
    """
    a = np.asarray(alpha)
    if a.dtype != np.uint8 or a.ndim != 2:
        raise ValueError(f"alpha must be uint8 [H, W], got {a.dtype} {list(a.shape)}")
    return np.where(a == 0, np.uint8(255), np.uint8(0))
def pack_images(images: Sequence[Array]) -> tuple[Array, Array]:
    """Condition images ``uint8 [H_k, W_k, 3]`` -> (``uint8 [P, 3]`` pixels, ``int32 [N, 2]``
    (height, width) per image): the INPUT_IMAGES / INPUT_IMAGE_SIZES encoding (one tensor pair
    carries 1..N images of different sizes; Triton has no list-of-tensors type).

    Raises:
        ImageInputError: no image, or one that is not ``uint8 [H, W, 3]`` with H, W >= 1.
    """
    if not images:
        raise ImageInputError("no condition image")
    for im in images:
        if im.dtype != np.uint8 or im.ndim != 3 or im.shape[2] != 3 or min(im.shape[:2]) < 1:
            raise ImageInputError(f"a condition image must be uint8 [H, W, 3], got {im.dtype} {list(im.shape)}")
    pixels = np.concatenate([np.ascontiguousarray(im).reshape(-1, 3) for im in images])
    sizes = np.array([im.shape[:2] for im in images], dtype=np.int32)
    return pixels, sizes


def unpack_images(pixels: Array, sizes: Array, max_images: int) -> list[Array]:
    """Inverse of :func:`pack_images`: ``uint8 [P, 3]`` + ``int32 [N, 2]`` -> N views
    ``uint8 [h_k, w_k, 3]``, checked before any copy.

    Raises:
        ImageInputError: wrong dtypes/shapes, N outside [1, ``max_images``], a size below 1, or
            ``P != sum(h_k * w_k)``.
    """
    if pixels.dtype != np.uint8 or pixels.ndim != 2 or pixels.shape[1] != 3:
        raise ImageInputError(f"IMAGES must be uint8 [P, 3], got {pixels.dtype} {list(pixels.shape)}")
    if sizes.ndim != 2 or sizes.shape[1] != 2 or not np.issubdtype(sizes.dtype, np.integer):
        raise ImageInputError(f"IMAGE_SIZES must be int32 [N, 2], got {sizes.dtype} {list(sizes.shape)}")
    if not 1 <= sizes.shape[0] <= max_images:
        raise ImageInputError(f"{sizes.shape[0]} condition images; this model takes 1 to {max_images}")
    if (sizes < 1).any():
        raise ImageInputError(f"IMAGE_SIZES {sizes.tolist()}: every height and width must be at least 1")
    counts = [int(h) * int(w) for h, w in sizes.tolist()]
    if sum(counts) != pixels.shape[0]:
        raise ImageInputError(f"IMAGES holds {pixels.shape[0]} pixels but IMAGE_SIZES {sizes.tolist()} "
                              f"says {sum(counts)}")
    out, start = [], 0
    for (h, w), count in zip(sizes.tolist(), counts, strict=True):
        out.append(pixels[start:start + count].reshape(int(h), int(w), 3))
        start += count
    return out


def image_inputs(prompt: str, *, width: int, height: int, steps: int, seed: int, negative_prompt: str = "",
                 true_cfg_scale: float = 4.0, guidance_scale: float = 0.0,
                 image: Array | None = None, images: Sequence[Array] | None = None,
                 lora_id: str | None = None, lora_scale: float = 1.0, mask: Array | None = None,
                 strength: float | None = None) -> list[tuple[str, Array]]:
    """The inputs of one image of a diffusion ensemble as ``(name, array)`` pairs, each with the
    batch dimension 1; ``image`` (``uint8 [H, W, 3]`` RGB) is the edit ensemble's INPUT_IMAGE,
    ``images`` the multi-image edit ensemble's condition images (INPUT_IMAGES +
    INPUT_IMAGE_SIZES, :func:`pack_images`); ``mask`` (``uint8 [H, W]``, 255 = repaint) and
    ``strength`` are the inpaint ensemble's MASK and STRENGTH; ``lora_id`` (an adapter's hex
    SHA-256, ``omni_triton.contracts.lora``) adds the optional LORA_ID / LORA_SCALE inputs (left
    out without an adapter)."""
    pairs = [
        (PROMPT, np.array([[prompt.encode("utf-8")]], dtype=np.object_)),
        (NEGATIVE_PROMPT, np.array([[negative_prompt.encode("utf-8")]], dtype=np.object_)),
        (HEIGHT, np.array([[height]], np.int32)), (WIDTH, np.array([[width]], np.int32)),
        (NUM_INFERENCE_STEPS, np.array([[steps]], np.int32)),
        (TRUE_CFG_SCALE, np.array([[true_cfg_scale]], np.float32)),
        (GUIDANCE_SCALE, np.array([[guidance_scale]], np.float32)),
        (SEED, np.array([[seed]], np.int64)),
    ]
    if image is not None:
        pairs.append((INPUT_IMAGE, np.ascontiguousarray(image, dtype=np.uint8)[None]))
    if lora_id:
        pairs.append((LORA_ID, np.array([[lora_id.encode("ascii")]], dtype=np.object_)))
        pairs.append((LORA_SCALE, np.array([[lora_scale]], np.float32)))
    if mask is not None:
        pairs.append((MASK, np.ascontiguousarray(mask, dtype=np.uint8)[None]))
    if strength is not None:
        pairs.append((STRENGTH, np.array([[strength]], np.float64)))
    if images is not None:
        pixels, sizes = pack_images(images)
        pairs += [(INPUT_IMAGES, pixels[None]), (INPUT_IMAGE_SIZES, sizes[None])]
    return pairs


def _t(name: str, datatype: str, dims: Iterable[int] = (1,), optional: bool = False) -> TensorSpec:
    return TensorSpec(name, datatype, tuple(dims), optional)


#: The ensembles' inputs (``qwen_image``; ``qwen_image_edit`` adds INPUT_IMAGE) and outputs.
ENSEMBLE_IN = (_t(PROMPT, "BYTES"), _t(NEGATIVE_PROMPT, "BYTES"), _t(HEIGHT, "INT32"), _t(WIDTH, "INT32"),
               _t(NUM_INFERENCE_STEPS, "INT32"), _t(TRUE_CFG_SCALE, "FP32"), _t(GUIDANCE_SCALE, "FP32"),
               _t(SEED, "INT64"))
ENSEMBLE_OUT = (_t(IMAGE, "UINT8", (-1, -1, 3)), _t(NUM_STEPS, "INT32"), _t(DENOISE_SECONDS, "FP32"))

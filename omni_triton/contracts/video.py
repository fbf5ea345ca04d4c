"""The video API contract (``docs/video_contracts.md``): what the Wan2.2 pipelines ``wan_t2v`` /
``wan_i2v`` (BLS, decoupled) take and answer, request limits and checks, the input-error class
and the input builder. Every input problem is a :class:`VideoInputError`. The stage tensors and
every ``wan_*`` model's :class:`StageContract` live in ``omni_triton.contracts.wan``.

Responses of ``wan_t2v`` (one request = one video): ``STEP`` + ``TOTAL_STEPS`` after each
denoising step (progress), then one final response with ``VIDEO``, ``NUM_STEPS`` and
``DENOISE_SECONDS``. A cancelled request ends without ``VIDEO``.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from omni_triton.contracts.tensors import Array, InputError, TensorSpec

PROMPT = "PROMPT"
NEGATIVE_PROMPT = "NEGATIVE_PROMPT"
HEIGHT = "HEIGHT"
WIDTH = "WIDTH"
NUM_FRAMES = "NUM_FRAMES"
NUM_INFERENCE_STEPS = "NUM_INFERENCE_STEPS"
GUIDANCE_SCALE = "GUIDANCE_SCALE"  #: FP32 [1]: CFG scale of the high-noise expert (> 1: CFG on)
GUIDANCE_SCALE_2 = "GUIDANCE_SCALE_2"  #: FP32 [1]: low-noise expert's (< 0 or absent: GUIDANCE_SCALE)
BOUNDARY_RATIO = "BOUNDARY_RATIO"  #: FP32 [1]: expert switch (< 0 or absent: the pipeline's)
FLOW_SHIFT = "FLOW_SHIFT"  #: FP32 [1]: scheduler flow shift (<= 0 or absent: the pipeline's)
SEED = "SEED"
STEP = "STEP"  #: INT32 [1]: denoising steps finished so far
TOTAL_STEPS = "TOTAL_STEPS"  #: INT32 [1]
VIDEO = "VIDEO"  #: UINT8 [F, H, W, 3] RGB frames
NUM_STEPS = "NUM_STEPS"  #: INT32 [1]
DENOISE_SECONDS = "DENOISE_SECONDS"  #: FP32 [1]
#: image-to-video (``wan_i2v``): the reference (first) frame, already ``WIDTH`` x ``HEIGHT``
INPUT_IMAGE = "INPUT_IMAGE"  #: UINT8 [H, W, 3] RGB

#: Fewest steps served (UniPC's multistep update needs a previous step; one step is also what
#: diffusers' own Wan tests never use).
MIN_INFERENCE_STEPS = 2
#: Upper bound of the guidance scales (as the image contract's).
MAX_GUIDANCE_SCALE = 100.0


class VideoInputError(InputError):
    """The video request cannot be served as given (size, frames, steps, scales, empty prompt,
    an image-to-video reference image of the wrong shape)."""


def check_input_image(image: Array, height: int, width: int) -> None:
    """The reference image of an image-to-video request must be ``uint8 [height, width, 3]``
    (the frontend resizes it; ``docs/video_contracts.md``).

    Raises:
        VideoInputError: naming the shape or dtype that was sent.
    """
    if image.dtype != np.uint8 or image.shape != (height, width, 3):
        raise VideoInputError(f"INPUT_IMAGE must be uint8 [{height}, {width}, 3] (HEIGHT, WIDTH, RGB), got "
                              f"{image.dtype} {list(image.shape)}")


@dataclass(frozen=True)
class VideoLimits:
    """What one served video pipeline accepts (config.pbtxt parameters ``size_multiple``,
    ``max_size``, ``max_frames``, ``max_steps``; ``frame_multiple``: ``num_frames = k m + 1``)."""

    size_multiple: int = 16
    max_size: int = 1280
    frame_multiple: int = 4
    max_frames: int = 81
    max_steps: int = 50

    def check(self, height: int, width: int, num_frames: int | None = None, steps: int | None = None) -> None:
        """Raises:
            VideoInputError: naming the first out-of-range value."""
        m = self.size_multiple
        for name, v in (("height", height), ("width", width)):
            if v < m or v > self.max_size or v % m:
                raise VideoInputError(f"{name}={v}: must be a multiple of {m} in [{m}, {self.max_size}]")
        if num_frames is not None:
            f = self.frame_multiple
            if num_frames < 1 or num_frames > self.max_frames or (num_frames - 1) % f:
                raise VideoInputError(f"num_frames={num_frames}: must be {f}k+1 in [1, {self.max_frames}]")
        if steps is not None and not MIN_INFERENCE_STEPS <= steps <= self.max_steps:
            raise VideoInputError(f"num_inference_steps={steps}: must be in [{MIN_INFERENCE_STEPS}, {self.max_steps}]")


def check_scales(guidance_scale: float, guidance_scale_2: float | None, boundary_ratio: float | None,
                 flow_shift: float | None) -> None:
    """Raises:
        VideoInputError: a guidance scale outside [0, MAX_GUIDANCE_SCALE], a boundary ratio outside
            [0, 1], a flow shift outside (0, 100] (NaN fails every check)."""
    for name, v in (("guidance_scale", guidance_scale), ("guidance_scale_2", guidance_scale_2)):
        if v is not None and not 0.0 <= v <= MAX_GUIDANCE_SCALE:
            raise VideoInputError(f"{name}={v}: must be in [0, {MAX_GUIDANCE_SCALE}]")
    if boundary_ratio is not None and not 0.0 <= boundary_ratio <= 1.0:
        raise VideoInputError(f"boundary_ratio={boundary_ratio}: must be in [0, 1]")
    if flow_shift is not None and not 0.0 < flow_shift <= 100.0:
        raise VideoInputError(f"flow_shift={flow_shift}: must be in (0, 100]")


def video_inputs(prompt: str, *, width: int, height: int, num_frames: int, steps: int, seed: int,
                 negative_prompt: str = "", guidance_scale: float = 5.0, guidance_scale_2: float | None = None,
                 boundary_ratio: float | None = None, flow_shift: float | None = None,
                 image: Array | None = None) -> list[tuple[str, Array]]:
    """The inputs of one ``wan_t2v`` request as ``(name, array)`` pairs (no batch dimension:
    the BLS model has ``max_batch_size: 0``); unset optional scales are left out. ``image``
    (``uint8 [height, width, 3]``): the reference frame of a ``wan_i2v`` request."""
    pairs = [
        (PROMPT, np.array([prompt.encode("utf-8")], dtype=np.object_)),
        (NEGATIVE_PROMPT, np.array([negative_prompt.encode("utf-8")], dtype=np.object_)),
        (HEIGHT, np.array([height], np.int32)), (WIDTH, np.array([width], np.int32)),
        (NUM_FRAMES, np.array([num_frames], np.int32)), (NUM_INFERENCE_STEPS, np.array([steps], np.int32)),
        (GUIDANCE_SCALE, np.array([guidance_scale], np.float32)), (SEED, np.array([seed], np.int64)),
    ]
    for name, value in ((GUIDANCE_SCALE_2, guidance_scale_2), (BOUNDARY_RATIO, boundary_ratio),
                        (FLOW_SHIFT, flow_shift)):
        if value is not None:
            pairs.append((name, np.array([value], np.float32)))
    if image is not None:
        pairs.append((INPUT_IMAGE, np.ascontiguousarray(image, dtype=np.uint8)))
    return pairs


def _t(name: str, datatype: str, dims: Iterable[int] = (1,), optional: bool = False) -> TensorSpec:
    return TensorSpec(name, datatype, tuple(dims), optional)


_OPTIONAL_SCALES = (_t(GUIDANCE_SCALE_2, "FP32", optional=True), _t(BOUNDARY_RATIO, "FP32", optional=True),
                    _t(FLOW_SHIFT, "FP32", optional=True))
#: The request's sizes, steps, scales and seed (the BLS pipelines' and the denoisers' inputs).
REQUEST_IN = (_t(HEIGHT, "INT32"), _t(WIDTH, "INT32"), _t(NUM_FRAMES, "INT32"), _t(NUM_INFERENCE_STEPS, "INT32"),
              _t(GUIDANCE_SCALE, "FP32")) + _OPTIONAL_SCALES + (_t(SEED, "INT64"),)
PROMPTS_IN = (_t(PROMPT, "BYTES"), _t(NEGATIVE_PROMPT, "BYTES", optional=True))
VIDEO_OUT = _t(VIDEO, "UINT8", (-1, -1, -1, 3))
PROGRESS_OUT = (_t(STEP, "INT32"), _t(TOTAL_STEPS, "INT32"))
DONE_OUT = (_t(NUM_STEPS, "INT32"), _t(DENOISE_SECONDS, "FP32"))
INPUT_IMAGE_IN = _t(INPUT_IMAGE, "UINT8", (-1, -1, 3))

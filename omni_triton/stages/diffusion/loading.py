"""Loading a Qwen-Image(-Edit) pipeline folder and what the stages read from it.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

LOGGER = logging.getLogger("omni_triton.diffusion")


#: Fewest denoising steps served: diffusers' QwenImagePipeline with one step gives NaN latents (its
#: flow-match sigma schedule divides by zero: "invalid value encountered in divide"), which decode
#: to an all-black image. Measured with diffusers 0.42.1 on the tiny checkpoints.
MIN_INFERENCE_STEPS = 2


def image_only_processor_class():
    """``Qwen2VLProcessor`` without its video processor.

    transformers 5 builds ``Qwen2VLProcessor`` with a ``Qwen2VLVideoProcessor``, which needs
    torchvision; torchvision wheels do not import beside torch 2.13 CPU here (README, Pins), and
    the edit pipeline only ever passes images. Text and image handling are the parent's.
    """
    from transformers import Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class Qwen2VLImageOnlyProcessor(Qwen2VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            self.image_token = getattr(tokenizer, "image_token", "<|image_pad|>")
            self.video_token = getattr(tokenizer, "video_token", "<|video_pad|>")
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    return Qwen2VLImageOnlyProcessor


# --------------------------------------------------------------------------- loading
def load_pipeline(path: Path | str):
    """``DiffusionPipeline.from_pretrained`` on a prepared folder (float32, CPU), progress bars off.

    Returns a ``QwenImagePipeline`` or ``QwenImageEditPipeline`` (what ``model_index.json`` names).
    Without torchvision the edit pipeline's processor is loaded image-only
    (:func:`image_only_processor_class`) and passed in; with it, the folder loads unchanged.
    """
    import importlib.util

    from diffusers import DiffusionPipeline

    path = Path(path)
    kwargs = {}
    index = json.loads((path / "model_index.json").read_text())
    if "processor" in index and importlib.util.find_spec("torchvision") is None:
        kwargs["processor"] = image_only_processor_class().from_pretrained(str(path / "processor"))
    pipe = DiffusionPipeline.from_pretrained(str(path), dtype=torch.float32, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def is_edit_pipeline(pipe) -> bool:
    """True for pipelines that condition on an input image (``QwenImageEditPipeline``)."""
    return hasattr(pipe, "processor") and getattr(pipe, "processor", None) is not None


def size_multiple(pipe) -> int:
    """Height/width must be multiples of this (VAE 8x times the DiT's 2x2 patch = 16); the
    pipeline itself would silently round other sizes down."""
    return pipe.vae_scale_factor * 2


def edit_condition_size(pipe, image_size: tuple[int, int]) -> tuple[int, int]:
    """(width, height) the edit pipeline resizes a condition image of ``image_size`` (w, h) to:
    ``calculate_dimensions(1024 * 1024, w / h)`` as in ``QwenImageEditPipeline.__call__``."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

    w, h, _ = calculate_dimensions(1024 * 1024, image_size[0] / image_size[1])
    return int(w), int(h)


@dataclass(frozen=True)
class Limits:
    """What one served pipeline accepts (config.pbtxt parameters ``max_size``, ``max_steps``).

    ``multiple`` is :func:`size_multiple` of the pipeline (16 for Qwen-Image).
    """

    multiple: int = 16
    max_size: int = 1024
    max_steps: int = 50

    def check(self, height: int, width: int, steps: int | None = None) -> None:
        """Raise ``ValueError`` naming the first out-of-range value (``steps=None``: a stage
        without a denoising loop checks the size only)."""
        for name, v in (("height", height), ("width", width)):
            if v < self.multiple or v > self.max_size or v % self.multiple:
                raise ValueError(f"{name}={v}: must be a multiple of {self.multiple} "
                                 f"in [{self.multiple}, {self.max_size}]")
        if steps is not None and not MIN_INFERENCE_STEPS <= steps <= self.max_steps:
            raise ValueError(f"num_inference_steps={steps}: must be in [{MIN_INFERENCE_STEPS}, {self.max_steps}]")


def image_from_array(array: np.ndarray):
    """``uint8 [H, W, 3]`` RGB -> PIL image (``ValueError`` for any other shape/dtype)."""
    from PIL import Image

    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3 or min(array.shape[:2]) < 1:
        raise ValueError(f"IMAGE must be uint8 [H, W, 3], got {array.dtype} {list(array.shape)}")
    return Image.fromarray(np.ascontiguousarray(array), "RGB")

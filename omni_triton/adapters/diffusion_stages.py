"""The diffusion stage roles both diffusion families share (``qwen_image``: images, ``wan``:
videos): text encoder, denoiser, VAE encoder, VAE decoder. Each base holds what the role does the
same way in every family; a family subclass (``adapters/qwen_image.py``, ``adapters/wan.py``)
names its contract module, input error and pipeline loader, and adds only its differences.

Family hooks every role reads (class attributes and methods of :class:`DiffusionPipelineStage`):
``contract`` (``omni_triton.contracts.qwen_image`` or ``.wan``: the tensor names), ``input_error``
(the contract's ``ValueError`` subclass, answered INVALID_ARG), ``load_pipeline(params)`` and
``stage_limits(params)``. Importable only inside the Triton Python stub (the bases import
``triton_python_backend_utils`` through ``batched.py``/``triton_io.py``); the logic they call lives
in ``omni_triton.stages.<family>`` and is unit-tested without Triton.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from omni_triton.adapters.batched import BatchedStage, set_torch_threads
from omni_triton.adapters.triton_io import input_array, log, optional_str_input
from omni_triton.contracts.tensors import MAX_DIFFUSION_PROMPT_CHARS


class DiffusionPipelineStage:
    """Mixin: one diffusers pipeline per stage instance, loaded in ``setup``.

    After :meth:`setup_pipeline`: ``self.d`` is the family's stage module
    (``omni_triton.stages.qwen_image`` or ``.wan``), ``self.pipe`` the loaded float32 CPU
    pipeline, ``self.limits`` the family's request limits (``contract.Limits`` /
    ``contract.VideoLimits``).
    """

    contract: ModuleType
    input_error: type[ValueError]

    def load_pipeline(self, params: dict[str, str]) -> tuple[ModuleType, Any]:
        """(family stage module, pipeline) for the config ``parameters`` (``model_name``)."""
        raise NotImplementedError

    def stage_limits(self, params: dict[str, str]) -> Any:
        """The family's size/step limits (called after the pipeline is loaded)."""
        raise NotImplementedError

    def setup_pipeline(self, params: dict[str, str]) -> None:
        """One torch thread, then load the pipeline and the limits."""
        set_torch_threads()
        self.d, self.pipe = self.load_pipeline(params)
        self.limits = self.stage_limits(params)


class DiffusionTextEncoder(DiffusionPipelineStage, BatchedStage):
    """Text encoder role (dynamically batched): PROMPT (+ NEGATIVE_PROMPT, + the family's
    condition) -> PROMPT_EMBEDS ``float32 [1, L, D]`` and NEGATIVE_PROMPT_EMBEDS ``float32
    [1, L', D]`` (``L' = 0``: no negative prompt, no CFG). Every prompt and negative prompt of a
    batch go through one :meth:`encode` call, in request order (prompt, then its negative).

    Family hooks: :meth:`encode`, :meth:`condition`, ``empty_negative_is_absent``.

    Raises (``parse``): ``input_error`` for a missing or blank PROMPT or a prompt over
    ``MAX_DIFFUSION_PROMPT_CHARS``.
    """

    #: True: an empty NEGATIVE_PROMPT means none (no CFG); False: it is encoded like any text.
    empty_negative_is_absent = False

    def setup(self, args, params):
        self.setup_pipeline(params)

    def encode(self, texts: list[str], conditions: list) -> list[np.ndarray]:
        """``float32 [L_i, D]`` embeddings of each text; ``conditions[i]`` is what
        :meth:`condition` returned for the request ``texts[i]`` belongs to."""
        raise NotImplementedError

    def condition(self, request) -> Any:
        """The family's per-request condition beside the text (default: none)."""
        return None

    def parse(self, request):
        c, error = self.contract, self.input_error
        prompt = optional_str_input(request, c.PROMPT, MAX_DIFFUSION_PROMPT_CHARS, error)
        if prompt is None:
            raise error(f"missing input {c.PROMPT}")
        if not prompt.strip():
            raise error("PROMPT is empty")
        negative = optional_str_input(request, c.NEGATIVE_PROMPT, MAX_DIFFUSION_PROMPT_CHARS, error)
        if self.empty_negative_is_absent and not negative:
            negative = None
        return prompt, negative, self.condition(request)

    def run(self, items):
        texts, conditions, slots = [], [], []
        for prompt, negative, condition in items:
            has_negative = negative is not None
            slots.append((len(texts), len(texts) + 1 if has_negative else None))
            texts += [prompt] + ([negative] if has_negative else [])
            conditions += [condition] * (2 if has_negative else 1)
        embeds = self.encode(texts, conditions)
        dim = embeds[0].shape[1]
        return [(embeds[p], embeds[n] if n is not None else np.zeros((0, dim), np.float32)) for p, n in slots]

    def outputs(self, result):
        return {self.contract.PROMPT_EMBEDS: result[0][None], self.contract.NEGATIVE_PROMPT_EMBEDS: result[1][None]}


class DiffusionDenoiser(DiffusionPipelineStage):
    """Denoiser role mixin: the pipeline's own loop over batches of compatible requests. Put it
    before the execution policy of the family's denoiser (``BatchedStage`` for images,
    ``BatchedDecoupledStage`` for videos, which streams progress per step).

    ``setup`` loads the pipeline and applies the config's attention backend and step cache
    (``omni_triton/kernels.py``), logged to Triton. :meth:`embeds` reads PROMPT_EMBEDS and the
    optional NEGATIVE_PROMPT_EMBEDS; :meth:`final_outputs` builds the last response.
    """

    def setup(self, args, params):
        from omni_triton import kernels  # attention backend and step cache from config.pbtxt

        self.setup_pipeline(params)
        log("info", f"{args['model_name']}: {kernels.apply_from_params(self.pipe, params)}")

    def embeds(self, request) -> dict[str, np.ndarray | None]:
        """``prompt_embeds`` (float32 [L, D]) and ``negative_prompt_embeds`` (float32 [L', D] or
        None when absent) of one request, as keyword arguments of the family's denoise item."""
        c = self.contract
        return dict(prompt_embeds=input_array(request, c.PROMPT_EMBEDS),
                    negative_prompt_embeds=input_array(request, c.NEGATIVE_PROMPT_EMBEDS, required=False))

    def final_outputs(self, latents: np.ndarray, steps: int, seconds: float) -> Mapping[str, np.ndarray]:
        """LATENTS (float32, batch dim added), NUM_STEPS int32 [1, 1], DENOISE_SECONDS float32 [1, 1]."""
        c = self.contract
        return {c.LATENTS: latents[None], c.NUM_STEPS: np.array([[steps]], np.int32),
                c.DENOISE_SECONDS: np.array([[seconds]], np.float32)}


class DiffusionVaeEncoder(DiffusionPipelineStage, BatchedStage):
    """VAE encoder role (dynamically batched): a condition image -> its latents. The family
    implements ``parse``/``run``/``outputs`` (what it checks and encodes differs: the image edit's
    normalised latents vs the video's reference frame plus black frames)."""

    def setup(self, args, params):
        self.setup_pipeline(params)


class DiffusionVaeDecoder(DiffusionPipelineStage, BatchedStage):
    """VAE decoder role (dynamically batched): LATENTS -> uint8 pixels under the name
    ``output`` (IMAGE ``[H, W, 3]`` or VIDEO ``[F, H, W, 3]``). The family implements ``parse``
    (its latents checks) and ``run``."""

    output: str

    def setup(self, args, params):
        self.setup_pipeline(params)

    def outputs(self, pixels):
        return {self.output: pixels[None]}

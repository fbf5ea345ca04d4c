"""The text-to-audio contract (``docs/audio_generation.md``): what the Stable Audio Open pipeline
``stable_audio`` (BLS, decoupled) takes and answers, the request limits and checks, the
input-error class, the input builder, and every ``stable_audio*`` model's :class:`StageContract`:

    stable_audio_text_encoder (T5, dynamic batching)
      -> stable_audio_denoiser (StableAudioDiTModel + CosineDPMSolverMultistepScheduler, decoupled
         + dynamic batching: one STEP response per finished step, then the latents)
      -> stable_audio_vae_decoder (AutoencoderOobleck, dynamic batching)

Responses of ``stable_audio`` (one request = one clip): ``STEP`` + ``TOTAL_STEPS`` after each
denoising step (progress), then one final response with ``AUDIO`` (``float32 [channels,
samples]``), ``SAMPLE_RATE``, ``NUM_STEPS`` and ``DENOISE_SECONDS``. A cancelled request ends
without ``AUDIO``. Input problems are :class:`AudioGenerateInputError`.

Seconds travel as FP64: ``__call__`` takes Python floats and cuts the waveform at
``int(seconds * sampling_rate)``, so a float32 round trip could move the cut by a sample.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from omni_triton.contracts.tensors import REQUEST_ID, Array, InputError, StageContract, TensorSpec

PROMPT = "PROMPT"  #: BYTES [1]
#: BYTES [1]; absent: no negative prompt (with CFG the pipeline's zero unconditional embeddings)
NEGATIVE_PROMPT = "NEGATIVE_PROMPT"
AUDIO_START_S = "AUDIO_START_S"  #: FP64 [1]: ``audio_start_in_s``
AUDIO_END_S = "AUDIO_END_S"  #: FP64 [1]: ``audio_end_in_s`` (> start; end - start <= the model's max)
NUM_INFERENCE_STEPS = "NUM_INFERENCE_STEPS"  #: INT32 [1]
GUIDANCE_SCALE = "GUIDANCE_SCALE"  #: FP32 [1]: CFG scale (> 1: CFG on)
SEED = "SEED"  #: INT64 [1]
STEP = "STEP"  #: INT32 [1]: denoising steps finished so far
TOTAL_STEPS = "TOTAL_STEPS"  #: INT32 [1]
AUDIO = "AUDIO"  #: FP32 [channels, samples] in about [-1, 1]
SAMPLE_RATE = "SAMPLE_RATE"  #: INT32 [1]: Hz of AUDIO
NUM_STEPS = "NUM_STEPS"  #: INT32 [1]: steps the denoiser ran
DENOISE_SECONDS = "DENOISE_SECONDS"  #: FP32 [1]: the denoiser's wall time
# stage hand-offs
PROMPT_EMBEDS = "PROMPT_EMBEDS"  #: FP32 [L, D]: T5 last hidden state, L = the tokenizer's model_max_length
ATTENTION_MASK = "ATTENTION_MASK"  #: INT64 [L]
NEGATIVE_PROMPT_EMBEDS = "NEGATIVE_PROMPT_EMBEDS"  #: FP32 [L, D] (padding rows 0); [0, D] when absent
NEGATIVE_ATTENTION_MASK = "NEGATIVE_ATTENTION_MASK"  #: INT64 [L]; [0] when absent
LATENTS = "LATENTS"  #: FP32 [C, sample_size]

#: Fewest steps served (the second-order DPM-Solver needs a previous step).
MIN_INFERENCE_STEPS = 2
#: Upper bound of the guidance scale (as the image and video contracts').
MAX_GUIDANCE_SCALE = 100.0


class AudioGenerateInputError(InputError):
    """The text-to-audio request cannot be served as given (empty prompt, seconds, steps, scale)."""


@dataclass(frozen=True)
class AudioLimits:
    """What one served Stable Audio pipeline accepts (``config.pbtxt`` parameters, written from
    the checkpoint's configs: ``max_seconds`` = ``sample_size * hop_length / sampling_rate``,
    ``min_value`` / ``max_value`` of the projection model's seconds conditioners)."""

    max_seconds: float = 47.55
    min_value: float = 0.0
    max_value: float = 512.0
    max_steps: int = 200

    def check(self, start: float, end: float, steps: int | None = None, guidance_scale: float | None = None) -> None:
        """Raises:
            AudioGenerateInputError: naming the first out-of-range value (NaN fails every check)."""
        for name, v in (("audio_start_in_s", start), ("audio_end_in_s", end)):
            if not (math.isfinite(v) and self.min_value <= v <= self.max_value):
                raise AudioGenerateInputError(f"{name}={v}: must be in [{self.min_value:g}, {self.max_value:g}]")
        if not end > start:
            raise AudioGenerateInputError(f"audio_end_in_s={end:g} must be greater than audio_start_in_s={start:g}")
        if end - start > self.max_seconds + 1e-9:
            raise AudioGenerateInputError(f"audio length {end - start:g} s: the model makes at most "
                                          f"{self.max_seconds:g} s")
        if steps is not None and not MIN_INFERENCE_STEPS <= steps <= self.max_steps:
            raise AudioGenerateInputError(f"num_inference_steps={steps}: must be in [{MIN_INFERENCE_STEPS}, "
                                          f"{self.max_steps}]")
        if guidance_scale is not None and not 0.0 <= guidance_scale <= MAX_GUIDANCE_SCALE:
            raise AudioGenerateInputError(f"guidance_scale={guidance_scale}: must be in [0, {MAX_GUIDANCE_SCALE:g}]")


def audio_generate_inputs(prompt: str, *, audio_start_s: float, audio_end_s: float, steps: int, seed: int,
                          guidance_scale: float, negative_prompt: str | None = None) -> list[tuple[str, Array]]:
    """The inputs of one ``stable_audio`` request as ``(name, array)`` pairs (no batch dimension:
    the BLS model has ``max_batch_size: 0``); ``NEGATIVE_PROMPT`` only when given."""
    pairs = [(PROMPT, np.array([prompt.encode("utf-8")], dtype=np.object_)),
             (AUDIO_START_S, np.array([audio_start_s], np.float64)), (AUDIO_END_S, np.array([audio_end_s], np.float64)),
             (NUM_INFERENCE_STEPS, np.array([steps], np.int32)),
             (GUIDANCE_SCALE, np.array([guidance_scale], np.float32)),
             (SEED, np.array([seed], np.int64))]
    if negative_prompt is not None:
        pairs.insert(1, (NEGATIVE_PROMPT, np.array([negative_prompt.encode("utf-8")], dtype=np.object_)))
    return pairs


def _t(name: str, datatype: str, dims: Iterable[int] = (1,), optional: bool = False) -> TensorSpec:
    return TensorSpec(name, datatype, tuple(dims), optional)


PROMPTS_IN = (_t(PROMPT, "BYTES"), _t(NEGATIVE_PROMPT, "BYTES", optional=True))
SPAN_IN = (_t(AUDIO_START_S, "FP64"), _t(AUDIO_END_S, "FP64"))
REQUEST_IN = SPAN_IN + (_t(NUM_INFERENCE_STEPS, "INT32"), _t(GUIDANCE_SCALE, "FP32"), _t(SEED, "INT64"))
PROGRESS_OUT = (_t(STEP, "INT32"), _t(TOTAL_STEPS, "INT32"))
DONE_OUT = (_t(NUM_STEPS, "INT32"), _t(DENOISE_SECONDS, "FP32"))
AUDIO_OUT = (_t(AUDIO, "FP32", (-1, -1)), _t(SAMPLE_RATE, "INT32"))
_EMBEDS = (_t(PROMPT_EMBEDS, "FP32", (-1, -1)), _t(ATTENTION_MASK, "INT64", (-1,)))
_NEG_EMBEDS = (_t(NEGATIVE_PROMPT_EMBEDS, "FP32", (-1, -1)), _t(NEGATIVE_ATTENTION_MASK, "INT64", (-1,)))
_LATENTS = _t(LATENTS, "FP32", (-1, -1))

STABLE_AUDIO = StageContract(PROMPTS_IN + REQUEST_IN, PROGRESS_OUT + AUDIO_OUT + DONE_OUT, decoupled=True)
TEXT_ENCODER = StageContract(PROMPTS_IN, _EMBEDS + _NEG_EMBEDS, batched=True)
DENOISER = StageContract(_EMBEDS + tuple(_t(t.name, t.datatype, t.dims, True) for t in _NEG_EMBEDS) + REQUEST_IN
                         + (_t(REQUEST_ID, "BYTES", optional=True),),
                         PROGRESS_OUT + (_LATENTS,) + DONE_OUT, decoupled=True, batched=True)
VAE_DECODER = StageContract((_LATENTS,) + SPAN_IN, AUDIO_OUT, batched=True)

#: model name -> contract (``model_repository/``).
CONTRACTS = {"stable_audio": STABLE_AUDIO, "stable_audio_text_encoder": TEXT_ENCODER,
             "stable_audio_denoiser": DENOISER, "stable_audio_vae_decoder": VAE_DECODER}

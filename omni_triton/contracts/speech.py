"""The speech contract (``docs/speech_contracts.md``): ``piper`` and the codec-token TTS
pipeline ``csm`` (BLS) -> ``csm_talker`` (codec frames) -> ``csm_code2wav`` (PCM).

A speech model takes ``TEXT`` (BYTES [1]), optional ``VOICE`` (BYTES [1]), ``SPEED`` (FP32 [1]);
``csm`` also ``MAX_FRAMES`` (INT32 [1], cap on codec frames, 12.5 per second); all of them
``PACED`` (BOOL [1], optional: the client plays the stream in real time, so the stage may compute
it just ahead of playback, docs/scheduling.md "Pacing"; ``csm`` passes it to ``csm_talker``). Every streamed
response carries ``AUDIO`` (FP32 [-1], mono PCM in [-1, 1]) and ``SAMPLE_RATE`` (INT32 [1], Hz).
Every input problem is a :class:`SpeechInputError`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from omni_triton.contracts.tensors import (
    AUDIO, PACED, REQUEST_ID, SAMPLE_RATE, VOICE, InputError, StageContract, TensorSpec, scalar_array, utf8_array,
)

TEXT = "TEXT"
SPEED = "SPEED"  #: FP32 [1]: OpenAI ``speed``
MAX_FRAMES = "MAX_FRAMES"  #: INT32 [1]: cap on codec frames
MIN_FRAMES = "MIN_FRAMES"  #: INT32 [1]: floor on codec frames (talkers)
SPEAKER = "SPEAKER"  #: INT32 [1]: CSM speaker id
CODES = "CODES"  #: INT64 [T, K]: codec frames, frame-major
LEFT_CONTEXT = "LEFT_CONTEXT"  #: INT32 [1]: leading frames of CODES that are context only
#: FP32 [1]: milliseconds from now until a chunk's decoding is due (0 = now, a first chunk;
#: negative: overdue); a decoder with ``scheduling: "deadline"`` takes the most urgent first
DUE_MS = "DUE_MS"

#: OpenAI ``speed`` bounds (``/v1/audio/speech``).
MIN_SPEED, MAX_SPEED = 0.25, 4.0


class SpeechInputError(InputError):
    """The request cannot be synthesised as given (empty/oversize text, unknown voice, speed)."""


@dataclass(frozen=True)
class FrameBudget:
    """How many codec frames a ``csm`` request may generate when the client sets no MAX_FRAMES.

    A fixed cap cut every long input at the same length (100 frames = 8 s, whatever the text);
    the budget follows the input instead: ``max(floor, ceil(len(text) * frames_per_char))``.
    At 12.5 frames/s, 2.5 frames per character is 5 characters per second, slower than slow
    speech (~12-15 characters per second), so a real talker ends on its own end-of-audio first.

    Raises:
        ValueError: non-positive parameters.
    """

    frames_per_char: float = 2.5
    floor: int = 100

    def __post_init__(self):
        if self.frames_per_char <= 0 or self.floor < 1:
            raise ValueError(f"frame budget needs frames_per_char > 0 and floor >= 1, got {self}")

    def for_text(self, text: str) -> int:
        """The cap on codec frames for ``text``."""
        return max(self.floor, math.ceil(len(text) * self.frames_per_char))


def max_input_chars(params, default: str) -> int:
    """The model's ``max_input_chars`` parameter (``config.pbtxt``): the stage's own cap on TEXT
    (and INSTRUCTIONS/REF_TEXT), the same one the frontend applies to speech ``input``.

    Raises:
        ValueError: not a positive integer.
    """
    value = int(params.get("max_input_chars", default))
    if value < 1:
        raise ValueError(f"max_input_chars must be positive, got {value}")
    return value


def parse_tts_request(text: str | None, voice: str | None, speed, voices: Sequence[str], default_voice: str,
                      max_input_chars: int) -> tuple[str, int]:
    """Validate a ``csm`` request; return ``(text, speaker_id)``.

    ``voice`` is a speaker id as a string ("0".."N", one of ``voices``; None/"" -> default);
    ``speed`` must be None or 1.0 (CSM has no speaking-rate control, ``supports_speed=false``).

    Raises:
        SpeechInputError: empty or oversize text, unsupported speed, unknown voice.
    """
    text = text or ""
    if not text.strip():
        raise SpeechInputError("TEXT is empty")
    if len(text) > max_input_chars:
        raise SpeechInputError(f"TEXT has {len(text)} characters, more than max_input_chars={max_input_chars}")
    if speed is not None and abs(float(speed) - 1.0) > 1e-6:
        raise SpeechInputError(f"SPEED={float(speed):g} is not supported by this model (only 1.0)")
    voice = (voice or default_voice).strip()
    if voice not in voices:
        raise SpeechInputError(f"unknown VOICE {voice!r}; available: {', '.join(voices)}")
    return text, int(voice)


def check_speed(speed: float) -> float:
    """``speed`` if within [MIN_SPEED, MAX_SPEED].

    Raises:
        SpeechInputError: outside (or NaN).
    """
    if not (MIN_SPEED <= speed <= MAX_SPEED):
        raise SpeechInputError(f"speed must be within [{MIN_SPEED}, {MAX_SPEED}], got {speed}")
    return speed


def speech_inputs(text: str, voice: str | None = None, speed: float | None = None,
                  max_frames: int | None = None, paced: bool | None = None) -> list[tuple[str, np.ndarray]]:
    """The inputs of one speech request as ``(name, array)`` pairs: TEXT, VOICE?, SPEED?,
    MAX_FRAMES?, PACED?."""
    pairs = [(TEXT, utf8_array(text))]
    if voice is not None:
        pairs.append((VOICE, utf8_array(voice)))
    if speed is not None:
        pairs.append((SPEED, scalar_array(speed, "FP32")))
    if max_frames is not None:
        pairs.append((MAX_FRAMES, scalar_array(int(max_frames), "INT32")))
    if paced is not None:
        pairs.append((PACED, scalar_array(bool(paced), "BOOL")))
    return pairs


def code2wav_inputs(codes: np.ndarray, left_context: int, due_s: float | None = None) -> list[tuple[str, np.ndarray]]:
    """The inputs of one code2wav (codec decoder) request: CODES ``int64 [1, T, K]`` (batch dim
    added), LEFT_CONTEXT ``int32 [1, 1]``, and DUE_MS ``fp32 [1, 1]`` when ``due_s`` (seconds
    until the chunk's decoding is due, negative when overdue) is given (decoders that declare
    it only)."""
    inputs = [(CODES, np.ascontiguousarray(codes[None], dtype=np.int64)),
              (LEFT_CONTEXT, np.array([[left_context]], dtype=np.int32))]
    if due_s is not None:
        inputs.append((DUE_MS, np.array([[float(due_s) * 1000.0]], dtype=np.float32)))
    return inputs


_AUDIO_OUT = (TensorSpec(AUDIO, "FP32", (-1,)), TensorSpec(SAMPLE_RATE, "INT32"))
_CODE2WAV = StageContract((TensorSpec(CODES, "INT64", (-1, -1)), TensorSpec(LEFT_CONTEXT, "INT32")),
                          (TensorSpec(AUDIO, "FP32", (-1,)),), batched=True)

PIPER_TTS = StageContract((TensorSpec(TEXT, "BYTES"), TensorSpec(VOICE, "BYTES", optional=True),
                           TensorSpec(SPEED, "FP32", optional=True), TensorSpec(PACED, "BOOL", optional=True)),
                          _AUDIO_OUT, decoupled=True)
TTS = StageContract(PIPER_TTS.inputs + (TensorSpec(MAX_FRAMES, "INT32", optional=True),), _AUDIO_OUT, decoupled=True)
TTS_TALKER = StageContract(
    (TensorSpec(TEXT, "BYTES"), TensorSpec(SPEAKER, "INT32", optional=True),
     TensorSpec(MAX_FRAMES, "INT32", optional=True), TensorSpec(MIN_FRAMES, "INT32", optional=True),
     TensorSpec(REQUEST_ID, "BYTES", optional=True), TensorSpec(PACED, "BOOL", optional=True)),
    (TensorSpec(CODES, "INT64", (-1, -1)),), decoupled=True)
TTS_CODE2WAV = _CODE2WAV

#: model name -> contract, for the models of this pipeline in ``model_repository/``.
CONTRACTS = {"piper": PIPER_TTS, "csm": TTS, "csm_talker": TTS_TALKER, "csm_code2wav": TTS_CODE2WAV}

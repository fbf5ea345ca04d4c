"""The speech contract (``docs/speech_contracts.md``): what every speech model takes and streams
(``piper``, ``csm``, ``qwen3_tts``); the csm pipeline's stage tensors (``csm_talker``,
``csm_code2wav``) are in ``contracts/csm.py`` and ``contracts/codec.py``.

A speech model takes ``TEXT`` (BYTES [1]), optional ``VOICE`` (BYTES [1]), ``SPEED`` (FP32 [1]);
``csm`` also ``MAX_FRAMES`` (INT32 [1], cap on codec frames, 12.5 per second); all of them
``PACED`` (BOOL [1], optional: the client plays the stream in real time, so the stage may compute
it just ahead of playback, docs/scheduling.md "Pacing"; ``csm`` passes it to ``csm_talker``). Every streamed
response carries ``AUDIO`` (FP32 [-1], mono PCM in [-1, 1]) and ``SAMPLE_RATE`` (INT32 [1], Hz).
Every input problem is a :class:`SpeechInputError`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from omni_triton.contracts.tensors import (
    AUDIO,
    PACED,
    SAMPLE_RATE,
    VOICE,
    Array,
    InputError,
    StageContract,
    TensorSpec,
    scalar_array,
    utf8_array,
)

TEXT = "TEXT"
SPEED = "SPEED"  #: FP32 [1]: OpenAI ``speed``
MAX_FRAMES = "MAX_FRAMES"  #: INT32 [1]: cap on codec frames

#: OpenAI ``speed`` bounds (``/v1/audio/speech``).
MIN_SPEED, MAX_SPEED = 0.25, 4.0


class SpeechInputError(InputError):
    """The request cannot be synthesised as given (empty/oversize text, unknown voice, speed)."""


def max_input_chars(params: Mapping[str, str], default: str) -> int:
    """The model's ``max_input_chars`` parameter (``config.pbtxt``): the stage's own cap on TEXT
    (and INSTRUCTIONS/REF_TEXT), the same one the frontend applies to speech ``input``.

    Raises:
        ValueError: not a positive integer.
    """
    value = int(params.get("max_input_chars", default))
    if value < 1:
        raise ValueError(f"max_input_chars must be positive, got {value}")
    return value


def parse_tts_request(text: str | None, voice: str | None, speed: float | None, voices: Sequence[str],
                      default_voice: str, max_input_chars: int) -> tuple[str, int]:
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
                  max_frames: int | None = None, paced: bool | None = None) -> list[tuple[str, Array]]:
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


#: a speech model's streamed outputs
AUDIO_OUT = (TensorSpec(AUDIO, "FP32", (-1,)), TensorSpec(SAMPLE_RATE, "INT32"))
PIPER_TTS = StageContract((TensorSpec(TEXT, "BYTES"), TensorSpec(VOICE, "BYTES", optional=True),
                           TensorSpec(SPEED, "FP32", optional=True), TensorSpec(PACED, "BOOL", optional=True)),
                          AUDIO_OUT, decoupled=True)

#: model name -> contract: ``piper`` (the csm family's are in ``contracts/csm.py``).
CONTRACTS = {"piper": PIPER_TTS}

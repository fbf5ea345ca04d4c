"""Request validation of the ``tts`` pipeline.
"""
from __future__ import annotations

from typing import Sequence

# ------------------------------------------------------------------------- request validation


class TtsInputError(ValueError):
    """The request cannot be synthesised as given (empty/oversize text, unknown voice, speed)."""


def parse_tts_request(text, voice, speed, voices: Sequence[str], default_voice: str,
                      max_input_chars: int) -> tuple[str, int]:
    """Validate a ``tts`` request; return ``(text, speaker_id)``.

    ``voice`` is a speaker id as a string ("0".."N", one of ``voices``; None/"" -> default);
    ``speed`` must be None or 1.0 (CSM has no speaking-rate control, ``supports_speed=false``).
    """
    text = text.decode("utf-8") if isinstance(text, bytes) else str(text or "")
    if not text.strip():
        raise TtsInputError("TEXT is empty")
    if len(text) > max_input_chars:
        raise TtsInputError(f"TEXT has {len(text)} characters, more than max_input_chars={max_input_chars}")
    if speed is not None and abs(float(speed) - 1.0) > 1e-6:
        raise TtsInputError(f"SPEED={float(speed):g} is not supported by this model (only 1.0)")
    voice = voice.decode("utf-8") if isinstance(voice, bytes) else voice
    voice = (voice or default_voice).strip()
    if voice not in voices:
        raise TtsInputError(f"unknown VOICE {voice!r}; available: {', '.join(voices)}")
    return text, int(voice)

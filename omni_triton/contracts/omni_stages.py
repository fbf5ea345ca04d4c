"""The thinker -> talker stage tensors shared by both omni families (``qwen3_omni``,
``qwen2_5_omni``; by role, like ``adapters/omni_stages.py``). ``docs/omni_pipeline.md``.

A thinker asked for them (``TALKER_INPUTS``) ends its stream with the talker's inputs, under the
same names: ``SEQUENCE`` (INT64 [L]: prompt + generated ids), ``PROMPT_LEN`` (INT32 [1]),
``THINKER_EMBEDS`` / ``THINKER_HIDDEN`` (FP32 [L-1, H]: input embedding, and hidden state at the
talker's accept layer, of every token fed to the thinker) and ``TTS_EMBEDS`` (FP32 [3, H]:
embeddings of tts_bos, tts_eos, tts_pad).
"""
from __future__ import annotations

from omni_triton.contracts.tensors import TensorSpec

TALKER_INPUTS = "TALKER_INPUTS"  #: BOOL [1]: ask the thinker for the talker's inputs
SEQUENCE = "SEQUENCE"  #: INT64 [L]: prompt + generated ids
PROMPT_LEN = "PROMPT_LEN"  #: INT32 [1]
THINKER_EMBEDS = "THINKER_EMBEDS"  #: FP32 [L-1, H]: input embedding of every token fed to the thinker
THINKER_HIDDEN = "THINKER_HIDDEN"  #: FP32 [L-1, H]: hidden state at the talker's accept layer
TTS_EMBEDS = "TTS_EMBEDS"  #: FP32 [3, H]: embeddings of tts_bos, tts_eos, tts_pad

TALKER_TENSORS = (SEQUENCE, PROMPT_LEN, THINKER_EMBEDS, THINKER_HIDDEN, TTS_EMBEDS)
#: the thinker's outputs that are the talker's inputs
TALKER_IN = (TensorSpec(SEQUENCE, "INT64", (-1,)), TensorSpec(PROMPT_LEN, "INT32"),
             TensorSpec(THINKER_EMBEDS, "FP32", (-1, -1)), TensorSpec(THINKER_HIDDEN, "FP32", (-1, -1)),
             TensorSpec(TTS_EMBEDS, "FP32", (3, -1)))

"""The llm family's stage contracts (``docs/chat_contracts.md``): ``llm`` (the chat model, text
out) and ``llm_tts`` (BLS: llm -> sentences -> piper; text and audio out).

Both are single decoupled models that take the chat contract of ``omni_triton.contracts.chat``
(``CHAT_IN``); ``llm`` adds the optional ``REQUEST_ID`` (vLLM's request id, for cancellation),
``llm_tts`` the optional ``MODALITIES`` and ``VOICE``. Input problems are
:class:`~omni_triton.contracts.chat.ChatInputError`.
"""
from __future__ import annotations

from omni_triton.contracts.chat import CHAT_IN, MODALITIES, SPEECH_OUT, TEXT_OUT
from omni_triton.contracts.tensors import REQUEST_ID, VOICE, StageContract, TensorSpec

LLM = StageContract(CHAT_IN + (TensorSpec(REQUEST_ID, "BYTES", (1,), True),), TEXT_OUT, decoupled=True)
LLM_TTS = StageContract(CHAT_IN + (TensorSpec(MODALITIES, "BYTES", (1,), True), TensorSpec(VOICE, "BYTES", (1,), True)),
                        TEXT_OUT + SPEECH_OUT, decoupled=True)

#: model name -> contract, for the llm family's models in ``model_repository/`` (the omni families'
#: are in ``contracts/qwen3_omni.py`` and ``contracts/qwen2_5_omni.py``).
CONTRACTS = {"llm": LLM, "llm_tts": LLM_TTS}

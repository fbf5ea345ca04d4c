"""The Qwen2.5-Omni pipeline's contracts (``docs/qwen2_5_omni.md``): ``qwen25_omni`` (BLS) ->
``qwen25_omni_thinker`` -> ``qwen25_omni_talker`` -> ``qwen25_omni_token2wav``.

The client contract is the chat contract (``omni_triton.contracts.chat``, as ``omni``); the
thinker and talker stages have exactly the Qwen3-Omni stages' tensors (the thinker's last
response carries ``SEQUENCE``, ``PROMPT_LEN``, ``THINKER_EMBEDS``, ``THINKER_HIDDEN`` =
last-layer hidden states, ``TTS_EMBEDS``; the talker streams ``CODES`` INT64 [n, 1], one
codebook). Only token2wav is new: ``CODES`` INT64 [T] (the whole utterance; ragged batches),
``VOICE`` BYTES [1], ``SEED`` INT64 [1] (the DiT's noise) -> ``AUDIO`` FP32 [480 * T] at 24 kHz.
Input problems are :class:`~omni_triton.contracts.chat.ChatInputError`.
"""
from __future__ import annotations

from omni_triton.contracts import chat
from omni_triton.contracts.image import SEED
from omni_triton.contracts.speech import CODES
from omni_triton.contracts.tensors import AUDIO, VOICE, StageContract, TensorSpec

QWEN25_OMNI_TOKEN2WAV = StageContract(
    (TensorSpec(CODES, "INT64", (-1,)), TensorSpec(VOICE, "BYTES"), TensorSpec(SEED, "INT64")),
    (TensorSpec(AUDIO, "FP32", (-1,)),), batched=True)

#: model name -> contract, for the models of this pipeline in ``model_repository/``.
CONTRACTS = {"qwen25_omni": chat.OMNI, "qwen25_omni_thinker": chat.OMNI_THINKER,
             "qwen25_omni_talker": chat.OMNI_TALKER, "qwen25_omni_token2wav": QWEN25_OMNI_TOKEN2WAV}

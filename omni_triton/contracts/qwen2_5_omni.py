"""The Qwen2.5-Omni pipeline's contracts (``docs/qwen2_5_omni.md``): ``qwen2_5_omni`` (BLS) ->
``qwen2_5_omni_thinker`` -> ``qwen2_5_omni_talker`` -> ``qwen2_5_omni_token2wav``.

The client contract is the chat contract (``omni_triton.contracts.chat``, as ``qwen3_omni``); the
thinker and talker stages have the tensors of the Qwen3-Omni stages before speaking-while-thinking (the thinker's last
response carries ``SEQUENCE``, ``PROMPT_LEN``, ``THINKER_EMBEDS``, ``THINKER_HIDDEN`` =
last-layer hidden states, ``TTS_EMBEDS``; the talker streams ``CODES`` INT64 [n, 1], one
codebook). Only token2wav is new: ``CODES`` INT64 [T] (the whole utterance; ragged batches),
``VOICE`` BYTES [1], ``SEED`` INT64 [1] (the DiT's noise) -> ``AUDIO`` FP32 [480 * T] at 24 kHz.
Input problems are :class:`~omni_triton.contracts.chat.ChatInputError`.
"""
from __future__ import annotations

from omni_triton.contracts import chat as ch
from omni_triton.contracts.image import SEED
from omni_triton.contracts.speech import CODES, MAX_FRAMES, MIN_FRAMES
from omni_triton.contracts.tensors import AUDIO, REQUEST_ID, SAMPLE_RATE, VOICE, StageContract, TensorSpec


def _s(name: str, optional: bool = False) -> TensorSpec:
    return TensorSpec(name, "BYTES", (1,), optional)


# Spelled out here (not chat.OMNI*): the Qwen3-Omni contracts grow with that pipeline's features
# (speaking while thinking), which these stages do not have.
_CHAT_IN = (_s(ch.PROMPT, True), _s(ch.MESSAGES, True), _s(ch.SAMPLING_PARAMETERS, True))
_TEXT_OUT = (_s(ch.TEXT_DELTA), _s(ch.FINISH_REASON), TensorSpec(ch.PROMPT_TOKENS, "INT32"),
             TensorSpec(ch.COMPLETION_TOKENS, "INT32"))
_TALKER_IN = (TensorSpec(ch.SEQUENCE, "INT64", (-1,)), TensorSpec(ch.PROMPT_LEN, "INT32"),
              TensorSpec(ch.THINKER_EMBEDS, "FP32", (-1, -1)), TensorSpec(ch.THINKER_HIDDEN, "FP32", (-1, -1)),
              TensorSpec(ch.TTS_EMBEDS, "FP32", (3, -1)))

QWEN25_OMNI = StageContract(
    _CHAT_IN + (_s(ch.MODALITIES, True), _s(VOICE, True), TensorSpec(ch.MAX_AUDIO_FRAMES, "INT32", optional=True)),
    _TEXT_OUT + (TensorSpec(AUDIO, "FP32", (-1,)), TensorSpec(SAMPLE_RATE, "INT32")), decoupled=True)
QWEN25_OMNI_THINKER = StageContract(
    _CHAT_IN + (TensorSpec(ch.TALKER_INPUTS, "BOOL", optional=True), _s(REQUEST_ID, True)),
    _TEXT_OUT + _TALKER_IN, decoupled=True)
QWEN25_OMNI_TALKER = StageContract(
    _TALKER_IN + (_s(VOICE, True), TensorSpec(MAX_FRAMES, "INT32", optional=True),
                  TensorSpec(MIN_FRAMES, "INT32", optional=True), _s(REQUEST_ID, True)),
    (TensorSpec(CODES, "INT64", (-1, -1)),), decoupled=True)
QWEN25_OMNI_TOKEN2WAV = StageContract(
    (TensorSpec(CODES, "INT64", (-1,)), TensorSpec(VOICE, "BYTES"), TensorSpec(SEED, "INT64")),
    (TensorSpec(AUDIO, "FP32", (-1,)),), batched=True)

#: model name -> contract, for the models of this pipeline in ``model_repository/``.
CONTRACTS = {"qwen2_5_omni": QWEN25_OMNI, "qwen2_5_omni_thinker": QWEN25_OMNI_THINKER,
             "qwen2_5_omni_talker": QWEN25_OMNI_TALKER, "qwen2_5_omni_token2wav": QWEN25_OMNI_TOKEN2WAV}

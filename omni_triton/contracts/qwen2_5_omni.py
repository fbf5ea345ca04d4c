"""The Qwen2.5-Omni pipeline's contracts (``docs/qwen2_5_omni.md``): ``qwen2_5_omni`` (BLS) ->
``qwen2_5_omni_thinker`` -> ``qwen2_5_omni_talker`` -> ``qwen2_5_omni_token2wav``.

The client contract is the chat contract (``omni_triton.contracts.chat``, as ``qwen3_omni``); the
thinker and talker stages have the thinker -> talker tensors of ``contracts/omni_stages.py``,
shared with Qwen3-Omni before speaking-while-thinking (the thinker's last response carries
``SEQUENCE``, ``PROMPT_LEN``, ``THINKER_EMBEDS``, ``THINKER_HIDDEN`` = last-layer hidden states,
``TTS_EMBEDS``; the talker streams ``CODES`` INT64 [n, 1], one codebook). Only token2wav is new:
``CODES`` INT64 [T] (the whole utterance; ragged batches), ``VOICE`` BYTES [1], ``SEED`` INT64 [1]
(the DiT's noise) -> ``AUDIO`` FP32 [480 * T] at 24 kHz.
Input problems are :class:`~omni_triton.contracts.chat.ChatInputError`.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from omni_triton.contracts import chat as ch
from omni_triton.contracts.chat import CHAT_IN, SPEECH_OUT, TEXT_OUT
from omni_triton.contracts.codec import CODES, MIN_FRAMES
from omni_triton.contracts.image import SEED
from omni_triton.contracts.omni_stages import TALKER_IN, TALKER_INPUTS
from omni_triton.contracts.speech import MAX_FRAMES
from omni_triton.contracts.tensors import (
    AUDIO,
    REQUEST_ID,
    VOICE,
    Array,
    StageContract,
    TensorSpec,
    first_str,
    scalar_int,
    utf8_array,
)


def _s(name: str, optional: bool = False) -> TensorSpec:
    return TensorSpec(name, "BYTES", (1,), optional)


# The chat API's tensors and the thinker -> talker tensors shared with Qwen3-Omni
# (contracts/omni_stages.py), not contracts/qwen3_omni.py: that family's stage contracts grow with
# its features (speaking while thinking, media), which these stages do not have.
QWEN25_OMNI = StageContract(
    CHAT_IN + (_s(ch.MODALITIES, True), _s(VOICE, True), TensorSpec(ch.MAX_AUDIO_FRAMES, "INT32", optional=True)),
    TEXT_OUT + SPEECH_OUT, decoupled=True)
QWEN25_OMNI_THINKER = StageContract(
    CHAT_IN + (TensorSpec(TALKER_INPUTS, "BOOL", optional=True), _s(REQUEST_ID, True)),
    TEXT_OUT + TALKER_IN, decoupled=True)
QWEN25_OMNI_TALKER = StageContract(
    TALKER_IN + (_s(VOICE, True), TensorSpec(MAX_FRAMES, "INT32", optional=True),
                  TensorSpec(MIN_FRAMES, "INT32", optional=True), _s(REQUEST_ID, True)),
    (TensorSpec(CODES, "INT64", (-1, -1)),), decoupled=True)
QWEN25_OMNI_TOKEN2WAV = StageContract(
    (TensorSpec(CODES, "INT64", (-1,)), TensorSpec(VOICE, "BYTES"), TensorSpec(SEED, "INT64")),
    (TensorSpec(AUDIO, "FP32", (-1,)),), batched=True)



@dataclass(frozen=True)
class TalkerToToken2Wav:
    """The ``qwen2_5_omni_talker`` -> ``qwen2_5_omni_token2wav`` hand-off: the whole utterance.

    Attributes:
        codes: INT64 [T], the talker's codec tokens (one codebook), all of them.
        voice: ``VOICE``, the speaker whose reference conditions the DiT.
        seed: ``SEED`` (INT64), the DiT's noise seed.
    """

    codes: Array
    voice: str
    seed: int

    def to_tensors(self) -> list[tuple[str, Array]]:
        """token2wav's inputs, batch dim added (it is dynamically batched): CODES ``int64 [1, T]``,
        VOICE ``BYTES [1, 1]``, SEED ``int64 [1, 1]``."""
        return [(CODES, np.asarray(self.codes, np.int64).reshape(-1)[None, :]),
                (VOICE, utf8_array(self.voice)[None, :]),
                (SEED, np.array([[self.seed]], np.int64))]

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Array]) -> TalkerToToken2Wav:
        """One request's hand-off from its inputs (the batch dim of 1 dropped).

        Raises:
            KeyError: CODES, VOICE or SEED missing.
            ChatInputError: SEED empty.
        """
        return cls(np.asarray(tensors[CODES]).reshape(-1).astype(np.int64, copy=False),
                   first_str(tensors[VOICE]) or "", scalar_int(tensors[SEED], SEED, ch.ChatInputError))


#: model name -> contract, for the models of this pipeline in ``model_repository/``.
CONTRACTS = {"qwen2_5_omni": QWEN25_OMNI, "qwen2_5_omni_thinker": QWEN25_OMNI_THINKER,
             "qwen2_5_omni_talker": QWEN25_OMNI_TALKER, "qwen2_5_omni_token2wav": QWEN25_OMNI_TOKEN2WAV}

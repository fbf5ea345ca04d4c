"""The codec-token stage tensors shared by role (like ``adapters/codec.py``): a talker streams codec
frames (``CODES``), a code2wav decoder turns chunks of them into PCM. Used by ``csm``,
``qwen3_omni``, ``qwen3_tts`` (and ``qwen2_5_omni``'s talker, whose token2wav takes whole utterances).

A code2wav decoder (dynamically batched) takes ``CODES`` (INT64 [T, K], frame-major; [1, T, K]
with the batch dim), ``LEFT_CONTEXT`` (INT32 [1]: leading frames that are context only) and,
where declared, ``DUE_MS`` (FP32 [1]); it answers ``AUDIO`` (FP32 [-1], the PCM of the frames after
the context).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from omni_triton.contracts.tensors import AUDIO, Array, StageContract, TensorSpec, first_float, scalar_int

CODES = "CODES"  #: INT64 [T, K]: codec frames, frame-major
LEFT_CONTEXT = "LEFT_CONTEXT"  #: INT32 [1]: leading frames of CODES that are context only
MIN_FRAMES = "MIN_FRAMES"  #: INT32 [1]: floor on codec frames (talkers)
#: INT32 [1]: frames of the consumer's first chunk for this request (a talker's optional input: its
#: first CODES response holds that many frames and its frame deadlines follow that chunk; absent:
#: the talker's config ``first_chunk_frames``). The BLS picks it from load
#: (``omni_triton.stages.chunking.dynamic_initial_chunk_frames``).
FIRST_CHUNK_FRAMES = "FIRST_CHUNK_FRAMES"
#: FP32 [1]: milliseconds from now until a chunk's decoding is due (0 = now, a first chunk;
#: negative: overdue); a decoder with ``scheduling: "deadline"`` takes the most urgent first
DUE_MS = "DUE_MS"


@dataclass(frozen=True)
class TalkerToCode2Wav:
    """The talker -> code2wav hand-off (one chunk of a chunked codec decoder).

    Attributes:
        codes: INT64 [T, K], frame-major codec frames, the first ``left_context`` of them context only.
        left_context: frames of ``codes`` decoded for context, their audio dropped.
        due_s: seconds until the chunk's decoding is due (negative: overdue); sent as ``DUE_MS`` to
            decoders that declare it (scheduled ones), left out when ``None``.
    """

    codes: Array
    left_context: int
    due_s: float | None = None

    def to_tensors(self) -> list[tuple[str, Array]]:
        """The decoder's inputs, batch dim added (it is dynamically batched): CODES ``int64
        [1, T, K]``, LEFT_CONTEXT ``int32 [1, 1]``, DUE_MS ``fp32 [1, 1]`` (milliseconds) when
        ``due_s`` is given."""
        inputs: list[tuple[str, Array]] = [(CODES, np.ascontiguousarray(np.asarray(self.codes)[None], dtype=np.int64)),
                  (LEFT_CONTEXT, np.array([[self.left_context]], dtype=np.int32))]
        if self.due_s is not None:
            inputs.append((DUE_MS, np.array([[float(self.due_s) * 1000.0]], dtype=np.float32)))
        return inputs

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Array]) -> TalkerToCode2Wav:
        """One request's hand-off from its inputs (batch dim of 1 dropped where present).

        Raises:
            KeyError: CODES or LEFT_CONTEXT missing.
            InputError: LEFT_CONTEXT empty.
        """
        codes = np.asarray(tensors[CODES])
        due_ms = first_float(tensors.get(DUE_MS))
        return cls(codes[0] if codes.ndim == 3 else codes, scalar_int(tensors[LEFT_CONTEXT], LEFT_CONTEXT),
                   None if due_ms is None else due_ms / 1000.0)


def talker_to_code2wav(codes: Array, left_context: int, due_s: float | None = None) -> list[tuple[str, Array]]:
    """:meth:`TalkerToCode2Wav.to_tensors` of one chunk: the inputs of one code2wav request."""
    return TalkerToCode2Wav(codes, left_context, due_s).to_tensors()


#: a chunked codec decoder (``csm_code2wav``, ``qwen3_omni_code2wav``)
CODE2WAV = StageContract((TensorSpec(CODES, "INT64", (-1, -1)), TensorSpec(LEFT_CONTEXT, "INT32")),
                         (TensorSpec(AUDIO, "FP32", (-1,)),), batched=True)

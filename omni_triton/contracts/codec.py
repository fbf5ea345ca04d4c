"""The codec-token stage tensors shared by role (like ``adapters/codec.py``): a talker streams codec
frames (``CODES``), a code2wav decoder turns chunks of them into PCM. Used by ``csm``,
``qwen3_omni``, ``qwen3_tts`` (and ``qwen2_5_omni``'s talker, whose token2wav takes whole utterances).

A code2wav decoder (dynamically batched) takes ``CODES`` (INT64 [T, K], frame-major; [1, T, K]
with the batch dim), ``LEFT_CONTEXT`` (INT32 [1]: leading frames that are context only) and,
where declared, ``DUE_MS`` (FP32 [1]); it answers ``AUDIO`` (FP32 [-1], the PCM of the frames after
the context).
"""
from __future__ import annotations

import numpy as np

from omni_triton.contracts.tensors import AUDIO, StageContract, TensorSpec

CODES = "CODES"  #: INT64 [T, K]: codec frames, frame-major
LEFT_CONTEXT = "LEFT_CONTEXT"  #: INT32 [1]: leading frames of CODES that are context only
MIN_FRAMES = "MIN_FRAMES"  #: INT32 [1]: floor on codec frames (talkers)
#: FP32 [1]: milliseconds from now until a chunk's decoding is due (0 = now, a first chunk;
#: negative: overdue); a decoder with ``scheduling: "deadline"`` takes the most urgent first
DUE_MS = "DUE_MS"


def code2wav_inputs(codes: np.ndarray, left_context: int, due_s: float | None = None) -> list[tuple[str, np.ndarray]]:
    """The inputs of one code2wav (codec decoder) request: CODES ``int64 [1, T, K]`` (batch dim
    added), LEFT_CONTEXT ``int32 [1, 1]``, and DUE_MS ``fp32 [1, 1]`` when ``due_s`` (seconds
    until the chunk's decoding is due, negative when overdue) is given (decoders that declare
    it only)."""
    inputs = [(CODES, np.ascontiguousarray(codes[None], dtype=np.int64)),
              (LEFT_CONTEXT, np.array([[left_context]], dtype=np.int32))]
    if due_s is not None:
        inputs.append((DUE_MS, np.array([[float(due_s) * 1000.0]], dtype=np.float32)))
    return inputs


#: a chunked codec decoder (``csm_code2wav``, ``qwen3_omni_code2wav``)
CODE2WAV = StageContract((TensorSpec(CODES, "INT64", (-1, -1)), TensorSpec(LEFT_CONTEXT, "INT32")),
                         (TensorSpec(AUDIO, "FP32", (-1,)),), batched=True)

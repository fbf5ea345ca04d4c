"""Contracts of the two diagnostic models in ``clients/probe_repository/`` (not served by default).

They exist to reproduce, on any Triton version, the Python-backend defect behind the ``llm_tts``
heap corruption of issue 9: a decoupled BLS stream whose responses carry BYTES and FP32 tensors,
read by several threads of one stub at once (``clients/repro_crash.py --model probe_bls``).
"""
from __future__ import annotations

from omni_triton.contracts.tensors import StageContract, TensorSpec

COUNT = "COUNT"  #: INT32 [1]: responses per stream (probe_source) / streams per request (probe_bls)
RESPONSES = "RESPONSES"  #: INT32 [1]: probe_source responses per stream (probe_bls input)
WORDS = "WORDS"  #: BYTES [-1]: a few short strings per response (object arrays, like TEXT_DELTA)
VALUES = "VALUES"  #: FP32 [-1]: a few floats per response (like AUDIO)
READ = "READ"  #: INT32 [1]: responses probe_bls read from its streams

PROBE_SOURCE = StageContract((TensorSpec(COUNT, "INT32"),),
                             (TensorSpec(WORDS, "BYTES", (-1,)), TensorSpec(VALUES, "FP32", (-1,))),
                             decoupled=True)
PROBE_BLS = StageContract((TensorSpec(COUNT, "INT32"), TensorSpec(RESPONSES, "INT32")),
                          (TensorSpec(READ, "INT32"),), decoupled=True)

#: model name -> contract, for ``clients/probe_repository/``.
CONTRACTS = {"probe_source": PROBE_SOURCE, "probe_bls": PROBE_BLS}

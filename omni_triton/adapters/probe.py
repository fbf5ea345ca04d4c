"""Diagnostic ``TritonPythonModel`` classes of ``clients/probe_repository/`` (not served by
default; contract: ``omni_triton.contracts.probe``).

``probe_bls`` reads ``COUNT`` decoupled BLS streams of ``probe_source`` per request, one after
the other, on a pool of threads, the way ``llm_tts`` reads its llm and piper streams: the
smallest load that reproduces the 2.51 response-iterator defects described in
``omni_triton.adapters.bls`` (``clients/repro_crash.py --model probe_bls --probe-workers 8``).
"""
from __future__ import annotations

import numpy as np

from omni_triton.adapters.bls import stream_stage
from omni_triton.adapters.stream import DecoupledStage, Final
from omni_triton.adapters.triton_io import scalar_input
from omni_triton.contracts import probe as pr
from omni_triton.contracts.tensors import InputError, scalar_array

#: probe_source's per-response outputs: 8 short strings (an object array of bytes, as the llm's
#: TEXT_DELTA) and 64 floats (as an audio chunk).
_WORDS = np.array([f"word-{i}".encode() for i in range(8)], dtype=np.object_)
_VALUES = np.linspace(-1.0, 1.0, 64, dtype=np.float32)


def _count(request, name: str, upper: int) -> int:
    value = scalar_input(request, name, int)
    if not 0 < value <= upper:
        raise InputError(f"{name} must be in 1..{upper}")
    return value


class ProbeSource(DecoupledStage):
    """``probe_source``: COUNT responses of WORDS + VALUES, then FINAL (no compute)."""

    stage = "probe_source"
    workers = 4

    def parse(self, request):
        return _count(request, pr.COUNT, 10_000)

    def generate(self, count, stream):
        for _ in range(count):
            if stream.cancelled():
                return
            yield {pr.WORDS: _WORDS, pr.VALUES: _VALUES}


class ProbeBls(DecoupledStage):
    """``probe_bls``: COUNT streams of RESPONSES probe_source responses each, read in turn; one
    response with READ (responses read) and FINAL. As shipped it follows the project's rule (one
    thread per stub, two instances); ``clients/repro_crash.py --probe-workers 8`` runs it on 8
    threads of one stub, as ``llm_tts`` did, to reproduce the defects."""

    stage = "probe_bls"
    reads_bls_streams = True  # workers > 0 only with OMNI_TRITON_BLS_THREADS=any (the repro)

    def parse(self, request):
        return _count(request, pr.COUNT, 1_000), _count(request, pr.RESPONSES, 10_000)

    def generate(self, job, stream):
        streams, responses = job
        read = 0
        for _ in range(streams):
            for out in stream_stage("probe_source", [(pr.COUNT, scalar_array(responses, "INT32"))],
                                    [pr.WORDS, pr.VALUES], stream.cancelled, parent=stream):
                # What llm_tts does with each response: decode text, build small arrays.
                text = " ".join(w.decode("utf-8") for w in out[pr.WORDS].reshape(-1))
                chunk = np.asarray(out[pr.VALUES], dtype=np.float32) * 0.5
                read += int(bool(text) and chunk.size > 0)
        yield Final({pr.READ: scalar_array(read, "INT32")})

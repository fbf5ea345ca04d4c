"""The omni_stage_* / omni_audio_* / omni_bls_* metrics (``omni_triton.adapters.telemetry``)
without Triton: the real-time playback model, what the stage bases record per request, per batch
and per BLS call, and that ``docs/metrics.md`` documents every metric."""
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.unit import fake_pb_utils as pb

sys.modules.setdefault("triton_python_backend_utils", pb)

from omni_triton.adapters import bls  # noqa: E402
from omni_triton.adapters.batched import BatchedStage  # noqa: E402
from omni_triton.adapters.stream import DecoupledStage  # noqa: E402
from omni_triton.adapters.telemetry import METRICS, nbytes  # noqa: E402
from omni_triton.contracts.speech import SpeechInputError  # noqa: E402
from omni_triton.contracts.tensors import AUDIO, SAMPLE_RATE, InputError  # noqa: E402
from omni_triton.runtime.playback import CONTINUITY_STALL_S, PlaybackClock  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SR = 1000


def _args(name):
    return {"model_name": name, "model_instance_name": f"{name}_0", "model_config": json.dumps({"parameters": {}})}


@pytest.fixture(autouse=True)
def _fresh():
    pb.MetricFamily.every.clear()
    pb.CALLS.clear()
    yield
    bls.report_to(None)


def _values(name, **labels):
    return [m for m in pb.MetricFamily.find(name, **labels)]


def _total(name, **labels):
    return sum(m.total for m in _values(name, **labels))


def _observed(name, **labels):
    return [v for m in _values(name, **labels) for v in m.observed]


# ------------------------------------------------------------------ playback model

def test_a_stream_faster_than_real_time_never_stalls():
    clock = PlaybackClock(start=0.0)
    for k in range(5):  # 0.5 s chunks every 0.1 s
        clock.add(0.2 + 0.1 * k, 500, SR)
    assert clock.ttfp_s == pytest.approx(0.2) and clock.audio_s == pytest.approx(2.5)
    assert clock.underrun_s == 0 and clock.continuous
    assert clock.rtf(end=0.6) == pytest.approx(0.6 / 2.5)


def test_a_late_chunk_stalls_the_player_by_its_lateness():
    clock = PlaybackClock(start=0.0)
    clock.add(1.0, 500, SR)   # plays 1.0 .. 1.5
    clock.add(1.2, 500, SR)   # on time: plays 1.5 .. 2.0
    clock.add(2.3, 500, SR)   # due at 2.0: 0.3 s stall, plays 2.3 .. 2.8
    clock.add(2.85, 100, SR)  # due at 2.8: 0.05 s stall
    assert clock.underrun_s == pytest.approx(0.35)
    assert clock.longest_stall_s == pytest.approx(0.3) and not clock.continuous
    short = PlaybackClock(start=0.0)
    short.add(0.0, 100, SR)
    short.add(0.1 + CONTINUITY_STALL_S, 100, SR)  # exactly the threshold: still continuous
    assert short.continuous


def test_playback_rejects_a_bad_rate():
    with pytest.raises(ValueError):
        PlaybackClock(0.0).add(0.0, 10, 0)


# ------------------------------------------------------------------ decoupled stage

class Speaker(DecoupledStage):
    stage = "speaker"
    input_error = SpeechInputError
    workers = 2

    def parse(self, request):
        n = int(request.inputs["N"].as_numpy()[0])
        if n < 0:
            raise SpeechInputError("N must be >= 0")
        return n

    def generate(self, n, stream):
        for _ in range(n):
            time.sleep(0.01)
            yield {AUDIO: np.zeros(500, np.float32), SAMPLE_RATE: np.array([SR], np.int32)}


def _run(stage, *ns):
    stage.execute([pb.FakeRequest({"N": np.array([n])}) for n in ns])
    stage.pool.shutdown(wait=True)


def test_a_stage_reports_duration_reason_and_its_audio():
    stage = Speaker()
    stage.initialize(_args("speaker"))
    _run(stage, 3, -1)
    assert _total("omni_stage_requests_finished_total", model="speaker", reason="stop") == 1
    assert _total("omni_stage_requests_finished_total", model="speaker", reason="invalid") == 1
    assert len(_observed("omni_stage_request_duration_seconds", model="speaker")) == 2
    assert _observed("omni_audio_duration_seconds", model="speaker") == [pytest.approx(1.5)]
    (ttfp,) = _observed("omni_audio_ttfp_seconds", model="speaker")
    (rtf,) = _observed("omni_audio_rtf", model="speaker")
    assert 0 < ttfp < 1.5 and 0 < rtf < 1  # 1.5 s of audio in ~30 ms
    assert _total("omni_audio_streams_total", model="speaker", continuous="true") == 1
    assert _total("omni_stage_requests_running", model="speaker") == 0
    assert _total("omni_stage_requests_waiting", model="speaker") == 0
    every_label = {k for _, _, m in pb.MetricFamily.every for k in m.labels}
    assert {"model", "instance"} <= every_label
    assert all(held for what, held in pb.CALLS if what == "metric")  # under the call lock


def test_a_cancelled_stream_is_counted_as_abort():
    stage = Speaker()
    stage.initialize(_args("speaker"))
    request = pb.FakeRequest({"N": np.array([50])}, cancel_after=0)

    class Polling(Speaker):
        def generate(self, n, stream):
            for _ in range(n):
                if stream.cancelled():
                    return
                yield {AUDIO: np.zeros(10, np.float32), SAMPLE_RATE: np.array([SR], np.int32)}

    stage = Polling()
    stage.initialize(_args("polling"))
    stage.execute([request])
    stage.pool.shutdown(wait=True)
    assert _total("omni_stage_requests_finished_total", model="polling", reason="abort") == 1


# ------------------------------------------------------------------ batched stage

class Doubler(BatchedStage):
    def parse(self, request):
        x = int(request.inputs["X"].as_numpy()[0])
        if x < 0:
            raise InputError("X must be >= 0")
        return x

    def run(self, items):
        return [2 * x for x in items]

    def outputs(self, result):
        return {"Y": np.array([result], np.int64)}


def test_a_batched_stage_reports_batch_size_and_reasons():
    stage = Doubler()
    stage.initialize(_args("doubler"))
    stage.execute([pb.FakeRequest({"X": np.array([x])}) for x in (1, 2, -3)])
    assert _observed("omni_stage_batch_size", model="doubler") == [3]
    assert _total("omni_stage_requests_finished_total", model="doubler", reason="stop") == 2
    assert _total("omni_stage_requests_finished_total", model="doubler", reason="invalid") == 1
    assert len(_observed("omni_stage_request_duration_seconds", model="doubler")) == 3


# ------------------------------------------------------------------ BLS transfers

def test_bls_calls_count_the_bytes_both_ways():
    stage = Doubler()
    stage.initialize(_args("caller"))  # report_to(its telemetry)
    pb.InferenceRequest.handler = lambda req, decoupled: pb.InferenceResponse(
        [pb.Tensor("Y", np.zeros(8, np.float32))])
    bls.call_stage("callee", [("X", np.zeros(4, np.int64)), ("T", np.array([b"hello"], dtype=object))], ["Y"])
    assert _total("omni_bls_calls_total", model="caller", target="callee") == 1
    assert _total("omni_bls_transfer_bytes_total", target="callee", direction="sent") == 32 + 5
    assert _total("omni_bls_transfer_bytes_total", target="callee", direction="received") == 32
    assert _total("omni_bls_transfer_seconds_total", target="callee") >= 0


def test_nbytes_of_bytes_tensors_is_the_payload():
    assert nbytes(np.array([b"ab", b"cde"], dtype=object)) == 5
    assert nbytes(np.zeros((2, 3), np.float32)) == 24


# ------------------------------------------------------------------ docs

def test_every_metric_is_documented_with_its_unit_and_labels():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    for name, spec in METRICS.items():
        row = next((line for line in doc.splitlines() if line.startswith(f"| `{name}`")), None)
        assert row is not None, f"{name} missing from docs/metrics.md"
        assert spec.kind in row and spec.unit in row, row
        for label in spec.labels:
            assert re.search(rf"\b{label}\b", row), (name, label)


def test_a_counter_that_stays_at_zero_is_still_exported():
    """No underrun on an unloaded machine must read 0, not a missing series (the e2e metrics test
    failed on an idle CI machine before)."""
    stage = Speaker()
    stage.initialize(_args("quiet"))
    _run(stage, 1)
    (metric,) = _values("omni_audio_underrun_seconds_total", model="quiet")
    assert metric.total == 0

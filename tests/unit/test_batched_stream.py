"""The decoupled-and-batched base (``omni_triton.adapters.batched_stream``) without Triton: one
``run_batch`` call for the valid requests of Triton's batch, an invalid request answered alone,
progress responses then exactly one FINAL per request, a cancelled request closed, a failing batch
answering every request with its error, the cancel flags lowered, and the ``omni_stage_*``
telemetry every stage reports (running back to 0, finish reasons, batch size), all under the lock."""
import json
import sys

import numpy as np
import pytest

from tests.unit import fake_pb_utils as pb

sys.modules.setdefault("triton_python_backend_utils", pb)

from omni_triton.adapters.batched_stream import BatchedDecoupledStage  # noqa: E402
from omni_triton.contracts.tensors import InputError  # noqa: E402

ARGS = {"model_name": "steps", "model_instance_name": "steps_0", "model_config": json.dumps({"parameters": {}})}


class Steps(BatchedDecoupledStage):
    """N steps for every request of a batch: one STEP response each, then OUT (FINAL)."""

    stage = "steps"
    metric_specs = dict(requests=("steps_requests", "", "counter"), cancelled=("steps_cancelled", "", "counter"),
                        invalid=("steps_invalid", "", "counter"))
    batches: list = []
    fail = False

    def parse(self, request):
        n = int(request.inputs["N"].as_numpy().reshape(-1)[0])
        if n <= 0:
            raise InputError("N must be > 0")
        return n

    def run_batch(self, jobs, streams):
        self.batches.append(list(jobs))
        for step in range(max(jobs)):
            if self.fail and step == 1:
                raise RuntimeError("pipeline broke")
            for n, stream in zip(jobs, streams, strict=True):
                if step < n and not stream.final_sent and not stream.cancelled():
                    stream.send({"STEP": np.array([step], np.int32)})
        for n, stream in zip(jobs, streams, strict=True):
            if not stream.cancel_seen:
                stream.send({"OUT": np.array([n], np.int32)}, final=True)


@pytest.fixture(autouse=True)
def _clear():
    pb.CALLS.clear()
    pb.MetricFamily.every.clear()
    Steps.batches = []


def _finished(reason):
    return sum(m.total for m in pb.MetricFamily.find("omni_stage_requests_finished_total", reason=reason))


def _stage(cls=Steps):
    stage = cls()
    stage.initialize(ARGS)
    return stage


def test_one_batch_for_the_valid_requests_each_with_progress_then_one_final():
    stage = _stage()
    a, bad, b = (pb.FakeRequest({"N": np.array([[2]])}), pb.FakeRequest({"N": np.array([[0]])}),
                 pb.FakeRequest({"N": np.array([[3]])}))
    assert stage.execute([a, bad, b]) is None
    assert Steps.batches == [[2, 3]]
    assert [list(o) for o in a.sender.outputs()] == [["STEP"], ["STEP"], ["OUT"]] and a.sender.finals == 1
    assert len(b.sender.outputs()) == 4 and b.sender.finals == 1
    [err] = bad.sender.errors()
    assert err.code() == pb.TritonError.INVALID_ARG and bad.sender.finals == 1
    m = pb.MetricFamily.created
    assert (m["steps_requests"].total, m["steps_invalid"].total) == (2, 1)
    assert m["omni_stage_requests_running"].total == 0
    assert (_finished("stop"), _finished("invalid")) == (2, 1)
    assert m["omni_stage_batch_size"].observed == [2]
    assert all(locked for _, locked in pb.CALLS)  # every Triton call under the stub's one lock
    stage.finalize()


def test_a_cancelled_request_gets_its_final_without_results_and_counts_as_abort():
    stage = _stage()
    cancelled, kept = pb.FakeRequest({"N": np.array([[5]])}, cancel_after=1), pb.FakeRequest({"N": np.array([[2]])})
    stage.execute([cancelled, kept])
    assert cancelled.sender.finals == 1 and "OUT" not in {k for o in cancelled.sender.outputs() for k in o}
    assert kept.sender.finals == 1 and kept.sender.outputs()[-1]["OUT"][0] == 2
    assert pb.MetricFamily.created["steps_cancelled"].total == 1
    assert (_finished("abort"), _finished("stop")) == (1, 1)


def test_a_failing_batch_answers_every_request_with_its_error_once():
    class Broken(Steps):
        fail = True

    stage = _stage(Broken)
    requests = [pb.FakeRequest({"N": np.array([[3]])}) for _ in range(2)]
    stage.execute(requests)
    for r in requests:
        [err] = r.sender.errors()
        assert err.code() == pb.TritonError.INTERNAL and "pipeline broke" in err.message()
        assert r.sender.finals == 1
    assert _finished("error") == 2 and pb.MetricFamily.created["omni_stage_requests_running"].total == 0

"""Per-request stage metrics inside the pipeline, without Triton (``fake_pb_utils``): a BLS times
its own stage calls per request (``omni_triton.adapters.bls.StageLedger``), the stages' own
``STAGE_COMPUTE_MS`` is requested, taken out of their outputs and summed per stage, the stage
base sends the request's own compute on each response and the ledger as ``STAGE_METRICS`` on its
last, and requests run at once (threads, or one thread interleaving their steps as the deadline
scheduler does) never mix. docs/metrics.md "Per-request stage metrics"."""
import json
import sys
import threading
import time

import numpy as np
import pytest

from tests.unit import fake_pb_utils as pb

sys.modules.setdefault("triton_python_backend_utils", pb)

from omni_triton.adapters import bls  # noqa: E402
from omni_triton.adapters.batched import BatchedStage  # noqa: E402
from omni_triton.adapters.stream import DecoupledStage, Final  # noqa: E402
from omni_triton.contracts import CONTRACTS  # noqa: E402
from omni_triton.contracts.tensors import STAGE_COMPUTE_MS, STAGE_METRICS, first_float, first_str  # noqa: E402

SLEEP_S = 0.004  # the fake talker's wall time per frame


def _args(name: str, outputs: list[str]) -> dict:
    config = {"parameters": {}, "output": [{"name": n} for n in outputs]}
    return {"model_name": name, "model_instance_name": f"{name}_0", "model_config": json.dumps(config)}


class _Talker:
    """A decoupled callee: ``n`` frames, each after SLEEP_S, each with its cumulative compute
    (10 ms per frame, so a request of n frames reports 10 * n), then an empty FINAL that
    carries only STAGE_COMPUTE_MS (as the stage base sends it)."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            time.sleep(SLEEP_S)
            yield pb.InferenceResponse([pb.Tensor("CODES", np.full((1, 2), i, np.int64)),
                                        pb.Tensor(STAGE_COMPUTE_MS, np.array([10.0 * (i + 1)], np.float32))])
        yield pb.InferenceResponse([pb.Tensor(STAGE_COMPUTE_MS, np.array([10.0 * self.n], np.float32))])


def _handler(request, decoupled):
    """csm_talker streams N frames; csm_code2wav answers at once with compute 1.5 ms."""
    assert STAGE_COMPUTE_MS in request.outputs  # requested: both contracts declare it
    if decoupled:
        return _Talker(int(request.inputs["N"][0]))
    return pb.InferenceResponse([pb.Tensor("AUDIO", np.zeros((1, 4), np.float32)),
                                 pb.Tensor(STAGE_COMPUTE_MS, np.array([[1.5]], np.float32))])


class _Pipeline(DecoupledStage):
    """A toy BLS: streams csm_talker for N frames and decodes each frame with csm_code2wav."""

    stage = "toy_bls"
    reads_bls_streams = True
    seen: list[dict] = []

    def parse(self, request):
        return int(request.inputs["N"].as_numpy()[0])

    def generate(self, n, stream):
        for out in bls.stream_stage("csm_talker", [("N", np.array([n], np.int32))], ["CODES"], stream.cancelled,
                                    parent=stream):
            _Pipeline.seen.append(out)
            audio = bls.call_stage("csm_code2wav", [("CODES", out["CODES"])], ["AUDIO"])
            _Pipeline.seen.append(audio)
            yield {"AUDIO": audio["AUDIO"].reshape(-1)}


@pytest.fixture
def pipeline(monkeypatch):
    monkeypatch.setenv("OMNI_TRITON_BLS_THREADS", "any")  # two requests on two threads of one "stub"
    pb.InferenceRequest.handler = _handler
    _Pipeline.seen = []
    stage = _Pipeline()
    stage.initialize(_args("csm", ["AUDIO", STAGE_COMPUTE_MS, STAGE_METRICS]))
    yield stage
    stage.finalize()


def _metrics(request) -> dict:
    outs = request.sender.outputs()
    return json.loads(first_str(outs[-1][STAGE_METRICS]))


def _check(request, n: int, wall_s: float) -> None:
    m = _metrics(request)
    talker, code2wav = m["stages"]
    assert talker == {"stage": "csm_talker", "compute_ms": 10.0 * n, "wall_ms": pytest.approx(talker["wall_ms"]),
                      "calls": 1}
    assert code2wav["stage"] == "csm_code2wav" and code2wav["calls"] == n
    assert code2wav["compute_ms"] == pytest.approx(1.5 * n)
    assert n * SLEEP_S * 1000 <= talker["wall_ms"]  # it waited at least for its own frames
    total = talker["wall_ms"] + code2wav["wall_ms"] + m["own_compute_ms"]
    assert total <= wall_s * 1000 + 1  # the parts of one request fit in its wall time
    computes = [first_float(o[STAGE_COMPUTE_MS]) for o in request.sender.outputs()]
    assert computes == sorted(computes) and computes[-1] == pytest.approx(m["own_compute_ms"], abs=0.01)


def test_contracts_declare_the_metric_outputs():
    assert STAGE_COMPUTE_MS in CONTRACTS["csm_talker"].output_names
    assert STAGE_METRICS in CONTRACTS["csm"].output_names and STAGE_METRICS not in CONTRACTS["piper"].output_names
    assert STAGE_COMPUTE_MS not in CONTRACTS["qwen_image"].output_names  # an ensemble: no Python code
    assert STAGE_METRICS in CONTRACTS["qwen3_omni_talker"].output_names  # it streams the thinker
    bls.ask_stage_metrics(True)  # a model of this repository calls
    assert bls.metric_outputs("csm_code2wav") == [STAGE_COMPUTE_MS]
    assert bls.metric_outputs("qwen3_omni_talker") == [STAGE_COMPUTE_MS, STAGE_METRICS]
    bls.ask_stage_metrics(False)  # a diagnostic model (clients/probe_repository) asks its callees for nothing
    assert bls.metric_outputs("probe_source") == []


def test_one_request_is_timed_per_stage(pipeline):
    request = pb.FakeRequest({"N": np.array([3], np.int32)})
    start = time.monotonic()
    pipeline.execute([request])
    _check(request, 3, time.monotonic() - start)
    # the callees' STAGE_COMPUTE_MS never reaches the BLS code, and the compute-only FINAL is not yielded
    assert all(STAGE_COMPUTE_MS not in out for out in _Pipeline.seen) and len(_Pipeline.seen) == 6
    assert request.sender.finals == 1


def test_concurrent_requests_of_different_sizes_do_not_mix(pipeline):
    small, large = pb.FakeRequest({"N": np.array([2], np.int32)}), pb.FakeRequest({"N": np.array([9], np.int32)})
    walls = {}

    def run(request):
        start = time.monotonic()
        pipeline.execute([request])
        walls[id(request)] = time.monotonic() - start

    threads = [threading.Thread(target=run, args=(r,)) for r in (small, large)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _check(small, 2, walls[id(small)])
    _check(large, 9, walls[id(large)])
    assert _metrics(large)["stages"][0]["wall_ms"] > _metrics(small)["stages"][0]["wall_ms"]


def test_one_thread_interleaving_requests_keeps_them_apart(pipeline):
    """The deadline scheduler steps several requests' generators on one thread, one output at a
    time: each step runs under its own request's ledger."""
    requests = [pb.FakeRequest({"N": np.array([n], np.int32)}) for n in (1, 4)]
    accepted = [pipeline.accept(r) for r in requests]
    gens = [pipeline.timed_generate(a.job, a.stream) for a in accepted]
    start = time.monotonic()
    live = list(zip(gens, accepted, strict=True))
    while live:
        for gen, a in list(live):
            try:
                out = next(gen)
            except StopIteration:
                live.remove((gen, a))
                pipeline.finish(a.job, a.stream)
                continue
            a.stream.send(out, final=isinstance(out, Final))
    wall = time.monotonic() - start
    for request, n in zip(requests, (1, 4), strict=True):
        _check(request, n, wall)


def test_no_ledger_without_the_declared_output():
    stage = _Pipeline()
    stage.initialize(_args("csm", ["AUDIO"]))  # an older config: nothing is added to its responses
    pb.InferenceRequest.handler = lambda request, decoupled: (
        _Talker(int(request.inputs["N"][0])) if decoupled else pb.InferenceResponse(
            [pb.Tensor("AUDIO", np.zeros((1, 4), np.float32))]))
    request = pb.FakeRequest({"N": np.array([2], np.int32)})
    stage.execute([request])
    assert all(set(o) == {"AUDIO"} for o in request.sender.outputs())
    stage.finalize()


class _Batched(BatchedStage):
    def parse(self, request):
        return int(request.inputs["N"].as_numpy()[0])

    def run(self, items):
        time.sleep(0.02)
        return items

    def outputs(self, n):
        return {"Y": np.array([[n]], np.int32)}


def test_a_batch_splits_its_time_equally():
    stage = _Batched()
    stage.initialize(_args("csm_code2wav", ["Y", STAGE_COMPUTE_MS]))
    requests = [pb.FakeRequest({"N": np.array([n], np.int32)}) for n in (1, 2, 3, 4)]
    responses = stage.execute(requests)
    shares = [first_float(pb.get_output_tensor_by_name(r, STAGE_COMPUTE_MS).as_numpy()) for r in responses]
    assert len(set(shares)) == 1 and 20 / 4 <= shares[0] < 40 / 4  # the batch's ~20 ms, a quarter each
    assert pb.get_output_tensor_by_name(responses[0], STAGE_COMPUTE_MS).as_numpy().shape == (1, 1)
    stage.finalize()


@pytest.mark.parametrize("ensemble", ["qwen_image", "qwen_image_edit"])
def test_each_ensemble_step_maps_its_compute_to_its_own_output(ensemble):
    """The ensemble returns every step's STAGE_COMPUTE_MS under ``<STEP>_COMPUTE_MS``, the names
    the frontend reads (``contracts.tensors.step_compute_output``)."""
    from pathlib import Path

    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from omni_triton.contracts import ENSEMBLES
    from omni_triton.contracts.tensors import step_compute_output

    path = Path(__file__).resolve().parents[2] / "ensembles" / ensemble / "config.pbtxt"
    config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    steps = config.ensemble_scheduling.step
    assert tuple(s.model_name for s in steps) == ENSEMBLES[ensemble]
    for step in steps:
        assert step.output_map[STAGE_COMPUTE_MS] == step_compute_output(step.model_name)


def test_a_stage_that_calls_stages_reports_them_as_its_own_callees():
    """qwen3_omni_talker streams the thinker and sends its own STAGE_METRICS: the BLS files the
    thinker under ``called_by`` and does not count that wait as its own."""
    inner = {"stages": [{"stage": "qwen3_omni_thinker", "compute_ms": 40.0, "wall_ms": 50.0, "calls": 1}],
             "own_compute_ms": 5.0}

    def handler(request, decoupled):
        assert STAGE_METRICS in request.outputs  # the talker's contract declares it
        return iter([pb.InferenceResponse([pb.Tensor("CODES", np.zeros((1, 2), np.int64)),
                                           pb.Tensor(STAGE_COMPUTE_MS, np.array([7.0], np.float32))]),
                     pb.InferenceResponse([pb.Tensor(STAGE_METRICS, np.array([json.dumps(inner).encode()], object)),
                                           pb.Tensor(STAGE_COMPUTE_MS, np.array([9.0], np.float32))])])

    pb.InferenceRequest.handler = handler
    bls.ask_stage_metrics(True)
    ledger = bls.StageLedger()
    with bls.active(ledger):
        got = list(bls.stream_stage("qwen3_omni_talker", [], ["CODES"], lambda: False))
    assert len(got) == 1 and set(got[0]) == {"CODES"}
    report = json.loads(ledger.as_json())["stages"]
    assert report[0]["stage"] == "qwen3_omni_talker" and report[0]["compute_ms"] == 9.0 and "called_by" not in report[0]
    assert report[1] == {"stage": "qwen3_omni_thinker", "compute_ms": 40.0, "wall_ms": 50.0, "calls": 1,
                         "called_by": "qwen3_omni_talker"}
    assert ledger.waited_ms == pytest.approx(report[0]["wall_ms"], abs=1e-3) and ledger.waited_ms < 50  # its own waits


def test_the_frontend_moves_a_nested_stage_out_of_its_callers_share():
    from types import SimpleNamespace

    from openai_frontend.engine.protocol import GenerationChunk
    from openai_frontend.serving.stage_metrics import RequestStages

    info = SimpleNamespace(name="qwen3_omni", stage_models=("qwen3_omni", "qwen3_omni_thinker", "qwen3_omni_talker",
                                                            "qwen3_omni_code2wav"))
    clock = RequestStages(info)  # type: ignore[arg-type]
    report = {"stages": [{"stage": "qwen3_omni_talker", "compute_ms": 90.0, "wall_ms": 100.0, "calls": 1},
                         {"stage": "qwen3_omni_code2wav", "compute_ms": 8.0, "wall_ms": 10.0, "calls": 3},
                         {"stage": "qwen3_omni_thinker", "compute_ms": 35.0, "wall_ms": 40.0, "calls": 1,
                          "called_by": "qwen3_omni_talker"}], "own_compute_ms": 2.0}
    clock.observe(0, GenerationChunk(text="hi"))
    time.sleep(0.2)
    clock.observe(0, GenerationChunk(stage_compute_ms=2.0, stage_metrics=report))
    m = clock.metrics()
    by_name = {e["stage_name"]: e for e in m["stage_metrics"].values()}
    assert [e["stage_name"] for e in m["stage_metrics"].values()] == list(info.stage_models)  # depends_on order
    assert by_name["qwen3_omni_thinker"]["stage_gen_time_ms"] == 40.0
    assert by_name["qwen3_omni_thinker"]["called_by"] == "qwen3_omni_talker"
    assert by_name["qwen3_omni_talker"]["stage_gen_time_ms"] == 60.0  # 100 waited, 40 of it on the thinker
    assert by_name["qwen3_omni"]["stage_gen_time_ms"] == by_name["qwen3_omni"]["compute_ms"] == 2.0
    assert m["stage_total_ms"] == 2.0 + 40.0 + 60.0 + 10.0 <= m["request_wall_ms"]


def test_a_stage_can_attribute_unequal_work_per_item():
    """The image denoiser runs one pipeline call per group of compatible requests: each request
    gets its own call's time / the call's requests, not an equal share of the whole batch."""
    from types import SimpleNamespace

    from omni_triton.adapters.qwen_image import QwenImageDenoiser

    short, long = 0.010, 0.080  # two calls in one batch: 2 steps for two requests, 8 steps for one
    results = [SimpleNamespace(seconds=short, steps=2), SimpleNamespace(seconds=long, steps=8)]
    results.insert(1, SimpleNamespace(seconds=results[0].seconds, steps=2))  # shares the first call
    assert QwenImageDenoiser.item_compute_ms(None, results) == pytest.approx([5.0, 5.0, 80.0])

    class Unequal(_Batched):
        def item_compute_ms(self, results):
            return [float(n) for n in results]

    stage = Unequal()
    stage.initialize(_args("csm_code2wav", ["Y", STAGE_COMPUTE_MS]))
    responses = stage.execute([pb.FakeRequest({"N": np.array([n], np.int32)}) for n in (3, 7)])
    assert [first_float(pb.get_output_tensor_by_name(r, STAGE_COMPUTE_MS).as_numpy()) for r in responses] == [3.0, 7.0]
    stage.finalize()


def test_a_batched_decoupled_stage_sends_each_request_its_share_so_far():
    """The Wan denoisers: every response carries the request's share of the batch's time so far
    (elapsed / requests), with the batch dimension."""
    from omni_triton.adapters.batched_stream import BatchedDecoupledStage

    class Steps(BatchedDecoupledStage):
        stage = "steps"

        def parse(self, request):
            return int(request.inputs["N"].as_numpy().reshape(-1)[0])

        def run_batch(self, jobs, streams):
            for step in range(2):
                time.sleep(0.01)
                for stream in streams:
                    stream.send({"STEP": np.array([[step]], np.int32)}, final=step == 1)

    stage = Steps()
    stage.initialize(_args("wan_t2v_denoiser", ["STEP", STAGE_COMPUTE_MS]))
    requests = [pb.FakeRequest({"N": np.array([[2]], np.int32)}) for _ in range(2)]
    stage.execute(requests)
    for request in requests:
        computes = [o[STAGE_COMPUTE_MS] for o in request.sender.outputs()]
        assert all(c.shape == (1, 1) for c in computes)
        first, last = (first_float(c) for c in (computes[0], computes[-1]))
        assert 10 / 2 <= first < last and 20 / 2 <= last < 40 / 2  # ~10 then ~20 ms of batch, half each
    stage.finalize()

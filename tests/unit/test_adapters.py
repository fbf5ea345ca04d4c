"""The adapter bases without Triton (``fake_pb_utils`` stands in for the stub's module): one
FINAL per request and never a send after it, INVALID_ARG for the pipeline's input error, a
failure response for anything else, cancellation counted only when seen, the running gauge back
to 0, and THE THREADING DISCIPLINE: every stub -> server call, from any thread, under the one lock.
The BLS stream helper cancels (iterator ``cancel()`` where it exists, else the REQUEST_ID flag)
and drains to the end; the chunked decoder equals a one-shot decode."""
import json
import sys
import threading
import time

import numpy as np
import pytest

from tests.unit import fake_pb_utils as pb

sys.modules.setdefault("triton_python_backend_utils", pb)

from omni_triton.adapters import bls, triton_io  # noqa: E402
from omni_triton.adapters.stream import DecoupledStage, Final  # noqa: E402
from omni_triton.contracts.speech import SpeechInputError  # noqa: E402
from omni_triton.contracts.tensors import first_str  # noqa: E402
from omni_triton.stages.chunking import ChunkedDecoder, ChunkSchedule  # noqa: E402

ARGS = {"model_name": "toy", "model_instance_name": "toy_0", "model_config": json.dumps({"parameters": {}})}


class Toy(DecoupledStage):
    stage = "toy"
    input_error = SpeechInputError
    metric_specs = dict(requests=("toy_requests", "", "counter"), cancelled=("toy_cancelled", "", "counter"),
                        invalid=("toy_invalid", "", "counter"))

    def parse(self, request):
        n = int(request.inputs["N"].as_numpy()[0])
        if n < 0:
            raise SpeechInputError("N must be >= 0")
        return n

    def generate(self, n, stream):
        for i in range(n):
            if stream.cancelled():
                return
            if i == 99:
                raise RuntimeError("boom")
            time.sleep(0.001)
            yield {"X": np.array([i], np.int32)}


class ToyFinal(Toy):
    def generate(self, n, stream):
        yield Final({"X": np.array([0], np.int32)})
        yield {"X": np.array([1], np.int32)}  # after FINAL: must be dropped


def _stage(cls=Toy, workers=0):
    stage = cls()
    stage.workers = workers
    stage.initialize(ARGS)
    return stage


def _wait(stage):
    if stage.pool is not None:
        stage.pool.shutdown(wait=True)


@pytest.fixture(autouse=True)
def _clear_calls():
    pb.CALLS.clear()
    yield


@pytest.mark.parametrize("workers", [0, 3])
def test_one_final_errors_and_metrics(workers):
    stage = _stage(workers=workers)
    ok, bad, broken = (pb.FakeRequest({"N": np.array([3])}), pb.FakeRequest({"N": np.array([-1])}),
                       pb.FakeRequest({"N": np.array([100])}))
    stage.execute([ok, bad, broken])
    _wait(stage)
    assert [o["X"][0] for o in ok.sender.outputs()] == [0, 1, 2] and ok.sender.finals == 1
    [err] = bad.sender.errors()
    assert err.code() == pb.TritonError.INVALID_ARG and err.message().startswith("invalid input: N must be")
    assert bad.sender.finals == 1
    [err] = broken.sender.errors()
    assert err.code() == pb.TritonError.INTERNAL and "toy failed: boom" in err.message()
    assert broken.sender.finals == 1 and len(broken.sender.outputs()) == 99
    m = pb.MetricFamily.created
    assert (m["toy_requests"].total, m["toy_invalid"].total, m["toy_cancelled"].total) == (2, 1, 0)
    for gauge in ("omni_stage_requests_running", "omni_stage_requests_waiting"):  # requests in progress
        assert sum(g.total for g in pb.MetricFamily.find(gauge, model="toy")) == 0


def test_never_a_send_after_final():
    stage = _stage(ToyFinal)
    request = pb.FakeRequest({"N": np.array([1])})
    stage.execute([request])
    assert request.sender.finals == 1 and len(request.sender.sent) == 1


def test_cancel_stops_and_is_counted_only_when_seen():
    stage = _stage()
    cancelled = pb.FakeRequest({"N": np.array([50])}, cancel_after=2)
    finished = pb.FakeRequest({"N": np.array([2])}, cancel_after=2)  # cancelled after its last check
    stage.execute([cancelled, finished])
    assert len(cancelled.sender.outputs()) == 2 and cancelled.sender.finals == 1
    assert len(finished.sender.outputs()) == 2 and finished.sender.finals == 1
    assert pb.MetricFamily.created["toy_cancelled"].total == 1


def test_every_triton_call_is_made_under_the_one_lock():
    """The crash fix of issue 9: from the worker threads, the engine-style callback threads and
    the main thread, sends, is_cancelled, metric updates and logging all hold the call lock."""
    stage = _stage(workers=4)
    requests = [pb.FakeRequest({"N": np.array([20])}, cancel_after=None if i % 2 else 5) for i in range(8)]
    stage.execute(requests)
    # a thread of its own, as vLLM's loop thread calls the llm stage's callbacks
    thread = threading.Thread(target=lambda: triton_io.log("info", "from another thread"))
    thread.start()
    thread.join()
    _wait(stage)
    assert pb.CALLS and {what for what, _ in pb.CALLS} >= {"send", "is_cancelled", "metric", "log"}
    unlocked = [what for what, held in pb.CALLS if not held]
    assert not unlocked, f"Triton calls outside the lock: {sorted(set(unlocked))}"


def test_the_lock_check_notices_an_unlocked_call(monkeypatch):
    """The discipline test above fails if a path bypasses the lock (experiment switch off)."""
    monkeypatch.setattr(triton_io, "_LOCKED", set())
    stage = _stage()
    stage.execute([pb.FakeRequest({"N": np.array([2])})])
    assert any(not held for _, held in pb.CALLS)


class _Iterator:
    def __init__(self, responses, with_cancel):
        self.responses, self.drained, self.cancelled = list(responses), 0, False
        if with_cancel:
            self.cancel = lambda: setattr(self, "cancelled", True)

    def __iter__(self):
        while self.responses:
            self.drained += 1
            yield self.responses.pop(0)


def _frames(n):
    return [pb.InferenceResponse([pb.Tensor("CODES", np.full((1, 2), i, np.int64))]) for i in range(n)]


class _Flags:
    def __init__(self):
        self.raised, self.discarded = [], []

    def cancel(self, request_id):
        self.raised.append(request_id)

    def discard(self, request_id):
        self.discarded.append(request_id)


@pytest.mark.parametrize("with_cancel", [True, False])
def test_stream_stage_cancels_and_drains(with_cancel):
    it = _Iterator(_frames(10), with_cancel)
    seen = {}
    pb.InferenceRequest.handler = lambda req, decoupled: seen.update(req.inputs) or it
    flags, polls = _Flags(), iter([False, False, True])
    got = list(bls.stream_stage("talker", [], ["CODES"], lambda: next(polls), flags, "rid-1"))
    assert len(got) == 3 and it.drained == 10  # nothing more after the cancel, drained to the end
    assert first_str(seen["REQUEST_ID"]) == "rid-1"
    if with_cancel:
        assert it.cancelled and flags.raised == []  # 2.57+: the iterator's cancel()
    else:
        assert flags.raised == ["rid-1"]  # 2.51: the stage's cancel flag
    assert flags.discarded == ["rid-1"]


def test_stream_stage_error_after_drain_and_early_close():
    responses = _frames(2) + [pb.InferenceResponse(error=pb.TritonError("invalid input: bad", 3))] + _frames(3)
    it = _Iterator(responses, with_cancel=True)
    pb.InferenceRequest.handler = lambda req, decoupled: it
    gen = bls.stream_stage("s", [], ["CODES"], lambda: False)
    assert len([next(gen), next(gen)]) == 2
    with pytest.raises(bls.StageError) as info:
        next(gen)
    assert info.value.invalid and it.drained == 6
    it2 = _Iterator(_frames(5), with_cancel=True)
    pb.InferenceRequest.handler = lambda req, decoupled: it2
    gen = bls.stream_stage("s", [], ["CODES"], lambda: False)
    next(gen)
    gen.close()  # the caller failed: the stage is cancelled and drained
    assert it2.cancelled and it2.drained == 5


def test_chunked_decoder_matches_a_one_shot_decode():
    codes = np.arange(2 * 63, dtype=np.int64).reshape(63, 2)

    def decode(c, left):  # "audio": one sample per new frame, its first code
        return c[left:, 0].astype(np.float32)

    chunked = ChunkedDecoder(ChunkSchedule(5, 25, 25), decode)
    out = []
    for i in range(0, 63, 4):
        out += chunked.push(codes[i:i + 4])
    out += chunked.flush()
    assert [len(o) for o in out] == [5, 25, 25, 8]
    np.testing.assert_array_equal(np.concatenate(out), codes[:, 0].astype(np.float32))
    np.testing.assert_array_equal(chunked.codes, codes)


def test_tts_talker_cap_follows_the_input_length(tmp_path, monkeypatch):
    """issue 9: ``csm`` cut all speech at the talker's fixed 100 frames (8 s). Without MAX_FRAMES
    the BLS now asks for a cap that grows with the text; a client's MAX_FRAMES still wins."""
    from omni_triton.adapters.csm import CsmPipeline
    from omni_triton.contracts import speech

    monkeypatch.setenv("OMNI_TRITON_CACHE", str(tmp_path))
    params = {"voices": "0,1", "max_input_chars": "4000", "max_frames_per_char": "2.5", "min_max_frames": "100"}
    stage = CsmPipeline()
    stage.initialize({**ARGS, "model_config": json.dumps(
        {"parameters": {k: {"string_value": v} for k, v in params.items()}})})
    long_text = "This sentence is about three seconds of speech. " * 20  # ~1 minute, 960 characters
    job = stage.parse(pb.FakeRequest({speech.TEXT: np.array([long_text.encode()], dtype=object)}))
    assert job.max_frames == 2400 > 100 * 9  # far more than 8 s (12.5 frames/s)
    short = stage.parse(pb.FakeRequest({speech.TEXT: np.array([b"Hi."], dtype=object)}))
    assert short.max_frames == 100
    capped = stage.parse(pb.FakeRequest({speech.TEXT: np.array([long_text.encode()], dtype=object),
                                         speech.MAX_FRAMES: np.array([7], np.int32)}))
    assert capped.max_frames == 7
    stage.finalize()


# ------------------------------------------------------------------ who frees a finished BLS stream


class _Watched(_Iterator):
    """A response iterator that records on which thread, and after how many utility-queue round
    trips (is_cancelled calls of the parent request), its last reference went away."""

    freed: list = []

    def __init__(self, responses, parent_request):
        super().__init__(responses, with_cancel=False)
        self.parent_request = parent_request

    def __del__(self):
        _Watched.freed.append((threading.get_ident(), self.parent_request.polls))


def _stream_with_parent(final_sent=False):
    from omni_triton.adapters.stream import ResponseStream

    request = pb.FakeRequest({})
    stream = ResponseStream(request, "s")
    if final_sent:
        stream.close()
    _Watched.freed.clear()
    pb.InferenceRequest.handler = lambda req, decoupled: _Watched(_frames(3), request)
    return request, stream


def test_a_finished_stream_is_freed_here_after_the_barrier():
    """The iterator goes after one is_cancelled() round trip of the open parent request, on this
    thread: the stub's utility thread has erased its map entry by then (bls module docstring)."""
    request, stream = _stream_with_parent()
    polls_before = request.polls
    got = list(bls.stream_stage("s", [], ["CODES"], lambda: False, parent=stream))
    assert len(got) == 3
    assert _Watched.freed == [(threading.get_ident(), polls_before + 1)]


def test_without_an_open_parent_the_stream_goes_to_the_graveyard(monkeypatch):
    """After FINAL the parent cannot be asked (a freed response factory): no is_cancelled call,
    the iterator is kept and dropped later by a timer thread."""
    monkeypatch.setattr(bls, "GRAVEYARD_S", 0.05)
    request, stream = _stream_with_parent(final_sent=True)
    polls_before = request.polls
    list(bls.stream_stage("s", [], ["CODES"], lambda: False, parent=stream))
    assert _Watched.freed == [] and request.polls == polls_before  # still held, nobody asked
    deadline = time.monotonic() + 5
    while not _Watched.freed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(_Watched.freed) == 1 and _Watched.freed[0][0] != threading.get_ident()


def test_the_barrier_switch_drops_the_stream_at_once(monkeypatch):
    """OMNI_TRITON_BLS_BARRIER=0 (the reproduction's 'before' state): freed without a round trip."""
    monkeypatch.setattr(bls, "BARRIER", False)
    request, stream = _stream_with_parent()
    polls_before = request.polls
    list(bls.stream_stage("s", [], ["CODES"], lambda: False, parent=stream))
    assert _Watched.freed == [(threading.get_ident(), polls_before)]


def test_a_second_thread_reading_bls_streams_is_refused(monkeypatch):
    """Two threads of one stub reading decoupled BLS streams deadlock python_backend 2.51."""
    monkeypatch.setattr(bls, "_STREAM_THREAD", [])
    pb.InferenceRequest.handler = lambda req, decoupled: _Iterator(_frames(1), False)
    assert len(list(bls.stream_stage("s", [], ["CODES"], lambda: False))) == 1
    errors = []

    def other():
        try:
            list(bls.stream_stage("s", [], ["CODES"], lambda: False))
        except RuntimeError as exc:
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(errors) == 1 and "two threads" in str(errors[0])
    monkeypatch.setenv("OMNI_TRITON_BLS_THREADS", "any")
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(errors) == 1  # lifted for the reproduction


def test_a_bls_stream_reader_with_workers_is_refused_at_load():
    class Reader(Toy):
        reads_bls_streams = True

    with pytest.raises(RuntimeError, match="one thread"):
        _stage(Reader, workers=2)
    assert _stage(Reader, workers=0).pool is None


def test_every_stage_that_reads_bls_streams_runs_on_one_thread_per_instance():
    """The configs agree: no ``workers`` > 0 for llm_tts, tts, omni; their concurrency is their
    instance count."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from omni_triton.adapters.csm import CsmPipeline
    from omni_triton.adapters.llm import LlmTtsPipeline
    from omni_triton.adapters.qwen3_omni import Qwen3OmniPipeline
    from omni_triton.adapters.wan import WanT2VPipeline

    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    for name, cls in [("llm_tts", LlmTtsPipeline), ("csm", CsmPipeline), ("qwen3_omni", Qwen3OmniPipeline),
                      ("wan_t2v", WanT2VPipeline)]:
        assert cls.reads_bls_streams and cls.workers == 0, name
        config = text_format.Parse((root / "model_repository" / name / "config.pbtxt").read_text(),
                                   model_config_pb2.ModelConfig())
        workers = config.parameters["workers"].string_value if "workers" in config.parameters else "0"
        assert int(workers) == 0 and sum(g.count for g in config.instance_group) >= 2, name


# ------------------------------------------------- a stage's refusal stays INVALID_ARG in a BLS


@pytest.mark.parametrize("adapter", ["llm.LlmTtsPipeline", "qwen3_omni.Qwen3OmniPipeline",
                                     "qwen2_5_omni.Qwen25OmniPipeline"])
def test_a_stages_refusal_is_the_bls_models_invalid_arg(monkeypatch, tmp_path, adapter):
    """issue 28: the chat BLS models have no tokenizer (no torch); the stage they call first
    tokenizes and refuses (e.g. a prompt over the context) with ``invalid input: ...``, which 2.51
    delivers to a BLS with code INTERNAL. The BLS must still end the request with INVALID_ARG
    (HTTP 400), the stage's message in it (llm_tts also counts it as invalid)."""
    import importlib

    from omni_triton.contracts import chat as ch
    from omni_triton.contracts.tensors import INVALID_INPUT_PREFIX
    from omni_triton.serve.repository import available_models, model_parameters

    module, name = adapter.split(".")
    mod = importlib.import_module(f"omni_triton.adapters.{module}")
    model = {"llm": "llm_tts", "qwen3_omni": "qwen3_omni", "qwen2_5_omni": "qwen2_5_omni"}[module]
    refusal = "the prompt has 5000 tokens; this model's context is 2048 tokens"

    def refusing_stage(callee, *args, **kwargs):  # the stage's error response, code lost (2.51)
        raise bls.StageError(callee, pb.TritonError(INVALID_INPUT_PREFIX + refusal, pb.TritonError.INTERNAL))
        yield  # a generator, as stream_stage

    for loaded in (mod, importlib.import_module("omni_triton.adapters.omni_stages")):
        monkeypatch.setattr(loaded, "stream_stage", refusing_stage, raising=False)
    monkeypatch.setenv("OMNI_TRITON_CACHE", str(tmp_path))
    params = model_parameters(available_models()[model])
    stage = getattr(mod, name)()
    stage.initialize({**ARGS, "model_name": model, "model_config": json.dumps(
        {"parameters": {k: {"string_value": v} for k, v in params.items()}})})
    request = pb.FakeRequest({ch.MESSAGES: np.array([b'[{"role": "user", "content": "hi"}]'], dtype=object),
                              ch.MODALITIES: np.array([b'["text", "audio"]'], dtype=object)})
    stage.execute([request])
    _wait(stage)
    [error] = request.sender.errors()
    assert error.code() == pb.TritonError.INVALID_ARG, error.message()
    assert INVALID_INPUT_PREFIX in error.message() and refusal in error.message()
    assert request.sender.finals == 1
    if model == "llm_tts":  # the BLS's own invalid counter (test_llm_stage.py reads it served)
        assert pb.MetricFamily.find("omni_llm_tts_invalid_requests_total", model="llm_tts")[-1].total == 1
    stage.finalize()

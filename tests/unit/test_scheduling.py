"""The playback-deadline scheduler (omni_triton.runtime.scheduling): its ordering, deadlines and
the stage integration. No timing: clocks are fixed numbers, threads are sequenced with events."""
from __future__ import annotations

import json
import sys
import threading

import numpy as np
import pytest

from tests.unit import fake_pb_utils as pb

sys.modules.setdefault("triton_python_backend_utils", pb)

from omni_triton.adapters.stream import DecoupledStage, Final  # noqa: E402
from omni_triton.contracts.tensors import AUDIO, SAMPLE_RATE  # noqa: E402
from omni_triton.runtime.scheduling import (  # noqa: E402
    SCHEDULING_ENV,
    AudioDeadline,
    FrameDeadline,
    Policy,
    RunQueue,
    StepScheduler,
    TokenDeadline,
    scheduling_policy,
)


def _playing(arrival, first_audio, seconds):
    d = AudioDeadline(arrival)
    d.observe(first_audio, seconds)
    return d


def test_a_new_streams_first_chunk_goes_before_a_running_streams_later_chunks():
    """Deadline order: stream A (arrived first, 5 s of audio delivered at t=0.1, so due at 5.1)
    yields to B, which arrived at t=1 and has no audio yet (due now). FIFO would run A first:
    this test is red when the deadline order is replaced by arrival order."""
    q = RunQueue(Policy.DEADLINE)
    a = q.ticket(_playing(0.0, 0.1, 5.0), "A")
    b = q.ticket(AudioDeadline(1.0), "B")
    q.push(a)
    q.push(b)
    assert [q.pop().payload, q.pop().payload] == ["B", "A"]


def test_the_nearest_playback_deadline_goes_first_and_a_stream_far_ahead_yields():
    q = RunQueue(Policy.DEADLINE)
    far_ahead = q.ticket(_playing(0.0, 0.1, 30.0), "far")  # due 30.1
    about_to_stall = q.ticket(_playing(0.5, 0.6, 0.5), "near")  # due 1.1
    new = q.ticket(AudioDeadline(2.0), "new")  # due 2.0
    for t in (far_ahead, new, about_to_stall):
        q.push(t)
    assert [q.pop().payload for _ in range(3)] == ["near", "new", "far"]
    assert q.pop() is None


def test_fifo_is_arrival_order_whatever_the_deadlines():
    q = RunQueue(Policy.FIFO)
    a = q.ticket(_playing(0.0, 0.1, 30.0), "A")
    b = q.ticket(AudioDeadline(1.0), "B")
    q.push(b)
    q.push(a)
    assert [q.pop().payload, q.pop().payload] == ["A", "B"]


def test_a_paced_stream_far_ahead_is_parked_until_its_lead_and_an_unpaced_one_never_is():
    """Pacing: with max_lead_s=2, a paced stream due at 5.1 is not eligible before 3.1, while an
    unpaced stream with the same deadline is (it would run at once). Red when pacing is dropped
    (pop(now) returning the heap top) or applied to unpaced streams."""
    q = RunQueue(Policy.DEADLINE, max_lead_s=2.0)
    paced = q.ticket(_playing(0.0, 0.1, 5.0), "paced", paced=True)  # due 5.1
    q.push(paced)
    assert q.pop(now=1.0) is None and len(q) == 1  # parked, still queued
    assert q.next_eligible() == pytest.approx(3.1)
    unpaced = q.ticket(_playing(0.0, 0.1, 5.0), "unpaced")
    q.push(unpaced)
    assert q.next_eligible() == float("-inf")
    assert q.pop(now=1.0).payload == "unpaced"
    assert q.pop(now=3.0) is None
    assert q.pop(now=3.1).payload == "paced"
    # a paced stream with no audio yet is due at its arrival: never parked
    q.push(q.ticket(AudioDeadline(1.0), "new", paced=True))
    assert q.pop(now=1.0).payload == "new"
    # FIFO ignores pacing (the plain dispatch); a negative lead is refused
    fifo = RunQueue(Policy.FIFO, max_lead_s=2.0)
    fifo.push(fifo.ticket(_playing(0.0, 0.1, 5.0), "A", paced=True))
    assert fifo.pop(now=0.0).payload == "A"
    with pytest.raises(ValueError):
        RunQueue(Policy.DEADLINE, max_lead_s=-1.0)


def test_the_scheduler_holds_a_paced_stream_until_its_lead_and_runs_a_new_one_meanwhile():
    """A worker leaves a paced stream parked while it is more than max_lead_s ahead: with the
    clock at 0, A (1 s per step, lead 1.5 s) runs A0, A1 (due 1, eligible at -0.5), then is
    parked (A1 brought it to 2 s delivered: due 2, eligible 0.5); B, submitted then, runs at
    once; A2 only after the clock reaches 0.5. Red when parked streams are stepped anyway
    (A2 before the clock moves) or a parked stream blocks the worker for B."""
    now = [0.0]
    order, lock = [], threading.Lock()
    parked, b_done, a_done = threading.Event(), threading.Event(), threading.Event()

    def steps(name, n):
        for i in range(n):
            with lock:
                order.append(f"{name}{i}")
            if name == "A" and i == 1:
                parked.set()
            yield 1.0

    sched = StepScheduler(1, Policy.DEADLINE, clock=lambda: now[0], max_lead_s=1.5)
    try:
        sched.submit(steps("A", 3), AudioDeadline(0.0), float, lambda e: a_done.set(), paced=True)
        assert parked.wait(5)
        sched.submit(steps("B", 1), AudioDeadline(0.0), float, lambda e: b_done.set(), paced=True)
        assert b_done.wait(5)
        assert not a_done.wait(0.3)  # still parked: the clock has not moved
        with lock:
            assert order == ["A0", "A1", "B0"]
        now[0] = 0.5
        for _ in range(500):  # A2 runs once the clock reaches its eligibility (not a timing test)
            with lock:
                if "A2" in order:
                    break
            b_done.wait(0.01)
        now[0] = 10.0  # A's end (the step after A2) is parked until 3 - 1.5 as well
        assert a_done.wait(5)
    finally:
        sched.close()
    assert order == ["A0", "A1", "B0", "A2"]


def test_audio_deadline_follows_the_playback_clock_with_stalls():
    d = AudioDeadline(arrival=1.0, first_audio_budget_s=0.2, guard_s=0.1)
    assert d.due() == pytest.approx(1.2)  # no audio yet: the first chunk is due
    d.observe(1.5, 2.0)  # first audio at 1.5, plays until 3.5
    assert d.due() == pytest.approx(3.4)
    d.observe(4.0, 1.0)  # late: the player stalled 0.5 s, resumes at 4.0 and plays until 5.0
    assert d.due() == pytest.approx(4.9)
    d.observe(4.5, 0.0)  # empty chunk: nothing changes
    assert d.due() == pytest.approx(4.9)


def test_frame_deadline_is_the_start_of_the_chunk_being_generated():
    d = FrameDeadline(arrival=10.0, first_chunk_frames=5, chunk_frames=25, frame_rate_hz=12.5)
    d.observe(10.1, 4)
    assert d.due() == 10.0  # first chunk incomplete: due at arrival
    d.observe(10.2, 1)  # first chunk (0.4 s) complete: first audio at 10.2
    assert d.due() == pytest.approx(10.2 + 5 / 12.5)  # chunk 2 (frames 5..29) due when chunk 1 ends
    d.observe(10.3, 24)
    assert d.due() == pytest.approx(10.2 + 5 / 12.5)  # frame 29 still belongs to chunk 2
    d.observe(10.4, 1)
    assert d.due() == pytest.approx(10.2 + 30 / 12.5)  # chunk 3 starts at frame 30
    with pytest.raises(ValueError):
        FrameDeadline(0.0, chunk_frames=0)


def test_token_deadline_is_the_deadline_of_the_frame_each_token_feeds():
    """Thinker tokens for a talker that speaks one token per frame (lead 1: frame k needs k + 2
    tokens): the first chunk's tokens (5 frames + lead = 6) are due at arrival, then each token
    is due with its frame's chunk."""
    d = TokenDeadline(arrival=10.0, first_chunk_frames=5, chunk_frames=25, frame_rate_hz=12.5, lead_tokens=1)
    d.observe(10.05, 5)
    assert d.due() == 10.0  # tokens 0..4 sent: the first chunk still needs token 5
    d.observe(10.1, 1)  # token 5: the talker can finish its first chunk (frames 0..4)
    assert d.due() == pytest.approx(10.1 + 5 / 12.5)  # the tokens of chunk 2 are due when chunk 1 ends
    d.observe(10.2, 25)  # tokens of frames 5..29
    assert d.due() == pytest.approx(10.1 + 30 / 12.5)
    d.observe(10.3, 0)
    assert d.due() == pytest.approx(10.1 + 30 / 12.5)  # a step without a token changes nothing
    # a new request's first tokens go before a running stream's later ones
    q = RunQueue(Policy.DEADLINE)
    q.push(q.ticket(d, "running"))
    q.push(q.ticket(TokenDeadline(arrival=11.0), "new"))
    assert [q.pop().payload, q.pop().payload] == ["new", "running"]
    every_token_now = TokenDeadline(arrival=1.0, lead_tokens=33)  # a talker that waits for the whole answer
    every_token_now.observe(1.5, 32)
    assert every_token_now.due() == 1.0
    with pytest.raises(ValueError):
        TokenDeadline(0.0, lead_tokens=-1)


def test_policy_switch_env_forces_fifo_params_decide_otherwise():
    assert scheduling_policy({}, env={}) is Policy.FIFO  # stages that never opted in
    assert scheduling_policy({"scheduling": "deadline"}, env={}) is Policy.DEADLINE
    assert scheduling_policy({"scheduling": "deadline"}, env={SCHEDULING_ENV: "fifo"}) is Policy.FIFO
    assert scheduling_policy({"scheduling": "deadline"}, env={SCHEDULING_ENV: "deadline"}) is Policy.DEADLINE
    assert scheduling_policy({}, env={SCHEDULING_ENV: "deadline"}) is Policy.FIFO  # env cannot opt a stage in
    with pytest.raises(ValueError):
        scheduling_policy({"scheduling": "lifo"}, env={})
    with pytest.raises(ValueError):
        scheduling_policy({}, env={SCHEDULING_ENV: "fast"})


def _run_two_streams(policy, max_lead_s=None):
    """One worker; stream A starts first and is held in its first step until B is queued.
    Every step delivers 1 s of audio at clock 0. Returns the order of the steps. ``max_lead_s``:
    the scheduler paces PACED streams (these two are not)."""
    order, lock = [], threading.Lock()
    a_started, b_queued, done = threading.Event(), threading.Event(), threading.Event()
    ends = []

    def steps(name, n, gate=False):
        for i in range(n):
            if gate and i == 0:
                a_started.set()
                b_queued.wait(5)
            with lock:
                order.append(f"{name}{i}")
            yield 1.0

    def on_end(error):
        ends.append(error)
        if len(ends) == 2:
            done.set()

    sched = StepScheduler(1, policy, clock=lambda: 0.0, max_lead_s=max_lead_s)
    try:
        sched.submit(steps("A", 4, gate=True), AudioDeadline(0.0), float, on_end)
        assert a_started.wait(5)
        sched.submit(steps("B", 2), AudioDeadline(0.0), float, on_end)
        b_queued.set()
        assert done.wait(5)
    finally:
        sched.close()
    assert ends == [None, None]
    return order


def test_the_scheduler_interleaves_a_new_stream_before_a_running_one_continues():
    # after A0, A is due at 1.0 (1 s delivered at 0) and B at 0.0: B0 runs before A1
    assert _run_two_streams(Policy.DEADLINE) == ["A0", "B0", "A1", "B1", "A2", "A3"]


def _run_alone(paced, steps=8, max_lead_s=0.5):
    """One stream of ``steps`` steps (1 s of audio each) on an otherwise idle scheduler whose
    clock never moves (0.0): returns (steps run, whether it ended) once it ended or was held."""
    ran, ended = [], threading.Event()

    def gen():
        for i in range(steps):
            ran.append(i)
            yield 1.0

    sched = StepScheduler(1, Policy.DEADLINE, clock=lambda: 0.0, max_lead_s=max_lead_s)
    try:
        sched.submit(gen(), AudioDeadline(0.0), float, lambda e: ended.set(), paced=paced)
        finished = ended.wait(5 if not paced else 0.3)  # a bound, not a timing assertion
        return list(ran), finished
    finally:
        sched.close()


def test_an_unpaced_stream_on_an_idle_scheduler_is_never_held():
    """Work-conserving (issue 29): with nothing more urgent queued, an unpaced stream is stepped
    to its end although it runs 8 s ahead of its listener and the clock never moves, on a
    scheduler that paces (max_lead_s 0.5). The same stream with PACED (the realtime opt-in) is
    held after its lead: step 0 runs (due at its arrival), then it is due at 1.0 and eligible
    only from 1.0 - 0.5 = 0.5, so it waits for the clock. Red when unpaced streams are parked
    too (pacing by default)."""
    assert _run_alone(paced=False) == (list(range(8)), True)
    ran, finished = _run_alone(paced=True)
    assert not finished and ran == [0]


def test_edf_still_decides_among_unpaced_streams_on_a_pacing_scheduler():
    """Unpaced is not arrival order: a new stream's first chunk (due at its arrival) goes before
    a running unpaced stream's later chunks (due when its delivered audio ends), with a pacing
    scheduler too; and neither waits for the clock (it never moves). Red when the order becomes
    FIFO (A would run to its end first) or unpaced streams get parked (the run would not end)."""
    assert _run_two_streams(Policy.DEADLINE, max_lead_s=0.5) == ["A0", "B0", "A1", "B1", "A2", "A3"]
    assert _run_two_streams(Policy.FIFO) == ["A0", "A1", "A2", "A3", "B0", "B1"]


def test_a_failing_step_ends_only_its_stream():
    done, ends = threading.Event(), []

    def bad():
        yield 1.0
        raise RuntimeError("boom")

    def on_end(error):
        ends.append(error)
        done.set()

    sched = StepScheduler(1, Policy.DEADLINE, clock=lambda: 0.0)
    try:
        sched.submit(bad(), AudioDeadline(0.0), float, on_end)
        assert done.wait(5)
    finally:
        sched.close()
    assert isinstance(ends[0], RuntimeError)
    with pytest.raises(RuntimeError):
        sched.submit(iter(()), AudioDeadline(0.0), float, on_end)
    with pytest.raises(ValueError):
        StepScheduler(0)


class Speaker(DecoupledStage):
    """A stage whose config opts into deadline scheduling; N sentences of 1 s at 10 Hz each."""

    stage = "speaker"
    workers = 2
    frames_output = "CODES"  # a family's hook (deadline_unit frames)

    def parse(self, request):
        return int(request.inputs["N"].as_numpy()[0])

    def generate(self, n, stream):
        for i in range(n):
            yield {AUDIO: np.full(10, i, np.float32), SAMPLE_RATE: np.array([10], np.int32)}


def _wait_finals(requests, limit_s=10.0):
    """Wait (not a timing assertion) until every request got its FINAL."""
    ended = threading.Event()
    for _ in range(int(limit_s / 0.01)):
        if all(r.sender.finals for r in requests):
            return
        ended.wait(0.01)
    raise AssertionError("a scheduled request never ended")


def _args(**params):
    return {"model_name": "speaker", "model_instance_name": "speaker_0",
            "model_config": json.dumps({"parameters": {k: {"string_value": v} for k, v in params.items()}})}


def test_a_stage_with_scheduling_deadline_runs_its_jobs_on_the_scheduler(monkeypatch):
    monkeypatch.delenv(SCHEDULING_ENV, raising=False)
    stage = Speaker()
    stage.initialize(_args(scheduling="deadline", scheduler_workers="1"))
    assert stage.step_scheduler is not None and stage.pool is None
    assert stage.playback_amount({AUDIO: np.zeros(25, np.float32), SAMPLE_RATE: np.array([10])}) == 2.5
    requests = [pb.FakeRequest({"N": np.array([n])}) for n in (3, 2)]
    stage.execute(requests)
    _wait_finals(requests)
    stage.finalize()
    for req, n in zip(requests, (3, 2), strict=True):
        assert [int(o[AUDIO][0]) for o in req.sender.outputs()] == list(range(n))
        assert req.sender.finals == 1
    assert all(locked for _, locked in pb.CALLS)  # every Triton call under the stub's one lock


def test_fifo_env_gives_the_previous_dispatch_and_frames_unit_is_validated(monkeypatch):
    monkeypatch.setenv(SCHEDULING_ENV, "fifo")
    stage = Speaker()
    stage.initialize(_args(scheduling="deadline"))
    assert stage.step_scheduler is None and stage.pool is not None  # the old pool of `workers`
    stage.finalize()
    monkeypatch.delenv(SCHEDULING_ENV)
    stage = Speaker()
    stage.initialize(_args(scheduling="deadline", deadline_unit="frames", first_chunk_frames="5"))
    assert stage.playback_amount({"CODES": np.zeros((3, 8), np.int64)}) == 3.0
    stage.finalize()
    with pytest.raises(ValueError):
        Speaker().initialize(_args(scheduling="deadline", deadline_unit="bytes"))
    stage = Speaker()
    stage.initialize(_args(scheduling="deadline", deadline_unit="tokens", first_chunk_frames="5"))
    assert isinstance(stage.playback_deadline(0.0), TokenDeadline)
    assert stage.playback_amount(None) == 1.0 and stage.playback_amount(Final({})) == 0.0  # a token per step
    stage.finalize()


def test_a_paced_request_to_a_low_water_consumer_is_due_in_groups_of_the_first_chunk():
    """Frames of a PACED request whose consumer has low water are due 5 at a time, each group when
    the audio before it ends: the consumer cuts >= 5-frame chunks when its listener runs low. An
    unpaced one (fixed 25-frame chunks) and a consumer without low water keep the 25-frame chunks."""
    stage = Speaker()
    stage.initialize(_args(scheduling="deadline", deadline_unit="frames", first_chunk_frames="5",
                           chunk_frames="25", frame_rate_hz="12.5", low_water_ms="300"))

    def due_after(deadline, frames):  # 5 frames at t=1 (first audio), then more at t=1
        deadline.observe(1.0, 5)
        deadline.observe(1.0, frames - 5)
        return deadline.due()

    # frames 0-9 sent: the next (frame 10) is due when 10 frames of audio (0.8 s) have played
    assert due_after(stage.playback_deadline(0.0, paced=True), 10) == pytest.approx(1.8)
    assert due_after(stage.playback_deadline(0.0, paced=False), 10) == pytest.approx(1.4)  # all of 5..29 at once
    stage.finalize()
    stage = Speaker()
    stage.initialize(_args(scheduling="deadline", deadline_unit="frames", first_chunk_frames="5",
                           chunk_frames="25", frame_rate_hz="12.5"))
    assert due_after(stage.playback_deadline(0.0, paced=True), 10) == pytest.approx(1.4)
    stage.finalize()


class StreamReader(Speaker):
    """A stage that reads decoupled BLS streams (``qwen3_omni_talker``), scheduled."""

    reads_bls_streams = True
    workers = 0


def test_a_stage_reading_bls_streams_is_scheduled_on_one_worker_only(monkeypatch):
    """The one-thread rule (bls.py): only ``scheduler_workers`` 1 for a stage that reads BLS
    streams; 2 is a load error (not a warning and FIFO)."""
    monkeypatch.delenv(SCHEDULING_ENV, raising=False)
    monkeypatch.delenv("OMNI_TRITON_BLS_THREADS", raising=False)
    stage = StreamReader()
    stage.initialize(_args(scheduling="deadline", scheduler_workers="1", deadline_unit="frames"))
    assert stage.step_scheduler is not None and stage.pool is None
    requests = [pb.FakeRequest({"N": np.array([2])})]
    stage.execute(requests)
    _wait_finals(requests)
    stage.finalize()
    with pytest.raises(RuntimeError, match="one thread"):
        StreamReader().initialize(_args(scheduling="deadline", scheduler_workers="2", deadline_unit="frames"))


def _config(name):
    from pathlib import Path

    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    path = Path(__file__).resolve().parents[2] / "model_repository" / name / "config.pbtxt"
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def _params(config):
    return {k: v.string_value for k, v in config.parameters.items()}


@pytest.mark.parametrize("talker,bls,gets_paced",
                         [("csm_talker", "csm", True), ("qwen3_omni_talker", "qwen3_omni", True)])
def test_talkers_schedule_by_their_consumers_chunk_schedule(talker, bls, gets_paced):
    """A talker's frame deadlines use the chunk schedule of the BLS that decodes its frames, its
    low water included where the BLS passes PACED on (``csm`` and ``qwen3_omni``); the BLS admits more
    requests at once than the talker has instances (else they queue whole)."""
    t, b = _params(_config(talker)), _params(_config(bls))
    assert scheduling_policy(t, env={}) is Policy.DEADLINE and t["deadline_unit"] == "frames"
    assert (t["first_chunk_frames"], t["chunk_frames"]) == (b["first_chunk_frames"], b["chunk_frames"])
    assert float(t["frame_rate_hz"]) == 12.5
    # paced frames due in groups (test_a_paced_request_to_a_low_water_consumer_is_due_in_groups...)
    assert t.get("low_water_ms", "0") == (b.get("low_water_ms", "0") if gets_paced else "0")
    assert ("PACED" in {i.name for i in _config(talker).input}) == gets_paced
    assert sum(g.count for g in _config(bls).instance_group) > sum(g.count for g in _config(talker).instance_group)


def test_the_omni_thinker_schedules_tokens_by_the_omni_chunk_schedule():
    """``qwen3_omni_thinker``'s token deadlines are the frames' of the talker it feeds (TokenDeadline),
    with omni's chunk schedule; one worker (one request's tokens at a time)."""
    t, b = _params(_config("qwen3_omni_thinker")), _params(_config("qwen3_omni"))
    assert scheduling_policy(t, env={}) is Policy.DEADLINE and t["deadline_unit"] == "tokens"
    assert (t["first_chunk_frames"], t["chunk_frames"]) == (b["first_chunk_frames"], b["chunk_frames"])
    assert float(t["frame_rate_hz"]) == 12.5 and t.get("scheduler_workers", "1") == "1"
    # it reads qwen3_omni_thinker's streams
    assert _params(_config("qwen3_omni_talker")).get("scheduler_workers") == "1"
    # qwen3_omni_talker passes omni's PACED on: the tokens of a paced answer are due in low-water groups
    assert t["low_water_ms"] == b["low_water_ms"] and "PACED" in {i.name for i in _config("qwen3_omni_thinker").input}


def test_piper_schedules_by_audio():
    p = _params(_config("piper"))
    assert scheduling_policy(p, env={}) is Policy.DEADLINE and p.get("deadline_unit", "audio") == "audio"


@pytest.mark.parametrize("name", ["piper", "csm_talker"])
def test_scheduled_speech_stages_pace_paced_requests(name):
    """The stages the frontend streams declare PACED and keep a lead (max_lead_ms) of at least
    one second, so pacing is on and cannot starve a stream of its next chunk."""
    config = _config(name)
    assert "PACED" in {i.name for i in config.input}
    assert float(_params(config)["max_lead_ms"]) >= 1000


def test_a_stage_reads_paced_and_its_max_lead(monkeypatch):
    monkeypatch.delenv(SCHEDULING_ENV, raising=False)
    stage = Speaker()
    stage.initialize(_args(scheduling="deadline", max_lead_ms="1500"))
    assert stage.step_scheduler.queue.max_lead_s == 1.5
    assert stage.paced(pb.FakeRequest({"PACED": np.array([True])})) is True
    assert stage.paced(pb.FakeRequest({"N": np.array([1])})) is False
    stage.finalize()
    stage = Speaker()
    stage.initialize(_args(scheduling="deadline"))
    assert stage.step_scheduler.queue.max_lead_s is None  # no max_lead_ms: never parked
    stage.finalize()
    with pytest.raises(ValueError):
        Speaker().initialize(_args(scheduling="deadline", max_lead_ms="-5"))


def test_a_stage_holds_only_the_requests_that_send_paced(monkeypatch):
    """Through the stage base (issue 29): on a stage that paces (max_lead_ms 500) whose clock
    never moves, a request without PACED (what the frontend now sends by default) gets all 8
    responses (8 s of audio) and its FINAL at once; one with PACED true (``stream_pacing:
    "realtime"``) gets its first response and waits for its listener. Red when the stage paces
    every request under the scheduler."""
    monkeypatch.delenv(SCHEDULING_ENV, raising=False)
    stage = Speaker()
    stage.initialize(_args(scheduling="deadline", scheduler_workers="1", max_lead_ms="500"))
    stage.step_scheduler.clock = lambda: 0.0
    unpaced = pb.FakeRequest({"N": np.array([8])})
    paced = pb.FakeRequest({"N": np.array([8]), "PACED": np.array([True])})
    try:
        stage.execute([paced, unpaced])
        _wait_finals([unpaced])
        assert len(unpaced.sender.outputs()) == 8
        held = threading.Event()
        assert not held.wait(0.3)  # (not a timing assertion: the clock it waits for never moves)
        assert len(paced.sender.outputs()) == 1 and paced.sender.finals == 0
    finally:
        stage.finalize()
    assert paced.sender.finals == 1  # the unload answers it


def test_qwen3_tts_admits_as_many_requests_as_its_talker_batches():
    """The Qwen3-TTS talker admits a new request at its next decode step (continuous batching,
    up to max_num_seqs); the BLS in front must admit that many at once, or the rest wait whole
    in Triton's queue (the first-chunk-behind-whole-requests wait of issue 13 item 4)."""
    bls = sum(g.count for g in _config("qwen3_tts").instance_group)
    assert bls >= int(_params(_config("qwen3_tts_talker"))["max_num_seqs"])


@pytest.mark.parametrize("talker, bls", [("qwen3_tts_talker", "qwen3_tts"), ("csm_talker", "csm"),
                                         ("qwen3_omni_talker", "qwen3_omni")])
def test_talker_groups_divide_every_chunk_of_its_bls(talker, bls):
    """A talker sends emit_frames frames at a time; a group that does not divide the BLS's first
    and later chunk sizes would hold a chunk's last frames back until the group fills (first
    audio later by up to emit_frames - 1 talker steps)."""
    group = int(_params(_config(talker)).get("emit_frames", "1"))
    params = _params(_config(bls))
    assert group >= 1
    for key in ("first_chunk_frames", "chunk_frames"):
        assert int(params[key]) % group == 0, (key, params[key], group)


def test_frame_groups_hold_frames_until_full_and_lose_none():
    from omni_triton.stages.chunking import FrameGroups

    frames = [np.full(4, i, np.int64) for i in range(12)]
    groups = FrameGroups(5)
    sent = [g for g in (groups.push(f) for f in frames) if g is not None]
    assert [len(g) for g in sent] == [5, 5]  # a response only when a group is full
    tail = groups.flush()
    assert tail.shape == (2, 4) and groups.flush() is None
    assert np.array_equal(np.concatenate(sent + [tail]), np.stack(frames))
    one = FrameGroups(1)
    assert one.push(frames[3]).shape == (1, 4)  # size 1: one response per frame, as before
    with pytest.raises(ValueError):
        FrameGroups(0)


def test_a_grouping_codec_talker_still_takes_one_frame_per_scheduler_step():
    """csm_talker with emit_frames 5: the held frames are steps without a response (None), so the
    scheduler still interleaves open requests frame by frame; without them one step would run a
    whole group (5 frames of talker compute) while the other streams wait."""
    from omni_triton.contracts.codec import CODES
    from tests.helpers.fake_csm_talker import OpenStream, fake_csm_talker_stage

    stage = fake_csm_talker_stage(7, 3)
    steps = list(stage.generate(("Hi.", 0, 0, 7), OpenStream()))
    assert [None if s is None else len(s[CODES]) for s in steps] == [None, None, 3, None, None, 3, None, 1]
    assert isinstance(steps[-1], Final)
    assert np.array_equal(np.concatenate([s[CODES] for s in steps if s is not None])[:, 0], np.arange(7))


def test_omni_talker_groups_frames_and_sends_the_rest_unless_cancelled():
    from omni_triton.adapters.omni_stages import FrameGroupResponses as _FrameGroups
    from omni_triton.contracts.codec import CODES

    class Stream:
        cancel_seen = False

    groups = _FrameGroups(5)
    steps = [groups.outputs(np.full((1, 16), i, np.int64)) for i in range(7)]
    assert [None if s is None else len(s[CODES]) for s in steps] == [None] * 4 + [5, None, None]
    assert np.array_equal(steps[4][CODES][:, 0], np.arange(5))
    assert groups.tail(Stream())[CODES][:, 0].tolist() == [5, 6] and groups.tail(Stream()) is None
    groups.outputs(np.zeros((3, 16), np.int64))  # a step of several frames is split into the groups
    cancelled = Stream()
    cancelled.cancel_seen = True
    assert groups.tail(cancelled) is None  # a cancelled stream's partial group is not sent


# ------------------------------------------------------------------ a decoder's work queue


def test_the_most_urgent_chunk_leads_a_batch_of_its_length_and_other_lengths_wait():
    """DueBatchQueue: the earliest-due item leads; queued items of its key join it (one decoder
    pass per chunk length); other keys wait for later batches, most urgent first."""
    from omni_triton.runtime.scheduling import DueBatchQueue

    q = DueBatchQueue()
    q.put("later-50a", due=10.0, key=50)
    q.put("later-30", due=10.5, key=30)
    q.put("first-5a", due=1.0, key=5)  # a new stream's first chunk: due at its arrival
    q.put("later-50b", due=12.0, key=50)
    q.put("first-5b", due=1.0, key=5)
    q.put("overdue-30", due=0.5, key=30)  # a listener about to run dry goes before both
    assert q.take(8) == ["overdue-30", "later-30"]
    assert q.take(8) == ["first-5a", "first-5b"]  # equal dues: arrival order
    assert q.take(8) == ["later-50a", "later-50b"]
    assert q.take(8, timeout=0) == [] and len(q) == 0


def test_a_due_batch_is_capped_and_fifo_ignores_dues():
    from omni_triton.runtime.scheduling import DueBatchQueue

    q = DueBatchQueue()
    for i in range(5):
        q.put(i, due=5.0 - i, key="k")
    assert q.take(2) == [4, 3] and q.take(8) == [2, 1, 0]
    fifo = DueBatchQueue(Policy.FIFO)
    fifo.put("old", due=9.0, key=1)
    fifo.put("urgent", due=0.0, key=2)
    assert fifo.take(8) == ["old"]
    assert fifo.close() == ["urgent"] and fifo.closed
    with pytest.raises(RuntimeError):
        fifo.put("late", due=0.0)


def test_the_chunk_schedule_says_when_each_chunk_is_due():
    """A first chunk is due now; a later one when the audio scheduled before it ends playing,
    minus the guard (negative: overdue); without a playback clock (low water off) None."""
    from omni_triton.stages.chunking import ChunkSchedule

    now = [100.0]
    s = ChunkSchedule(5, 25, 25, low_water_s=0.6, frame_rate_hz=12.5, clock=lambda: now[0], due_guard_s=0.3)
    (first,) = s.push(5)
    assert s.due_in_s(first) == 0.0 and s.due_in_s(first) is None  # read once
    now[0] = 100.1  # 0.4 s of audio scheduled at 100.0: it ends at 100.4, 0.3 s from now
    (second,) = s.push(30)
    assert second == (0, 30, 5) and s.due_in_s(second) == pytest.approx(0.3 - 0.3)
    now[0] = 102.0  # the scheduled audio ends playing at 102.4
    early = s.push(40)  # 10 pending frames, 0.4 s left <= low water: an early chunk
    assert early == [(5, 40, 25)] and s.due_in_s(early[0]) == pytest.approx(0.4 - 0.3)
    fixed = ChunkSchedule(5, 25, 25)
    (chunk,) = fixed.push(5)
    assert fixed.due_in_s(chunk) is None



def _decoder_args(**params):
    return {"model_name": "decoder", "model_instance_name": "decoder_0",
            "model_config": json.dumps({"max_batch_size": 8,
                                        "parameters": {k: {"string_value": v} for k, v in params.items()}})}


def test_a_deadline_batched_stage_answers_the_most_urgent_pass_first_each_as_soon_as_it_is_done(monkeypatch):
    """``scheduling: "deadline"`` on a BatchedStage: execute queues and returns None; the worker
    runs the most urgent chunk with the queued chunks of its length, and answers each pass
    through the requests' senders (one response + FINAL) before running the next. A bad
    request is answered at once and does not fail the others."""
    from omni_triton.adapters.batched import BatchedStage
    from omni_triton.contracts.codec import DUE_MS

    monkeypatch.delenv(SCHEDULING_ENV, raising=False)
    gate, passes, answered_before = threading.Event(), [], []

    class Decoder(BatchedStage):
        due_input = DUE_MS  # the family's hook

        def parse(self, request):
            n = int(request.inputs["N"].as_numpy().reshape(-1)[0])
            if n <= 0:
                raise ValueError("N must be > 0")
            return n

        def batch_key(self, item):
            return item

        def run(self, items):
            gate.wait(5)
            answered_before.append(sum(r.sender.finals for r in reqs))
            passes.append(list(items))
            return [n * 10 for n in items]

        def outputs(self, result):
            return {"Y": np.array([result], np.int64)}

    stage = Decoder()
    stage.initialize(_decoder_args(scheduling="deadline"))
    reqs = [pb.FakeRequest({"N": np.array([[50]]), DUE_MS: np.array([[900.0]], np.float32)}),
            pb.FakeRequest({"N": np.array([[30]]), DUE_MS: np.array([[400.0]], np.float32)}),
            pb.FakeRequest({"N": np.array([[5]])}),  # no DUE_MS: due now (a first chunk)
            pb.FakeRequest({"N": np.array([[5]]), DUE_MS: np.array([[0.0]], np.float32)}),
            pb.FakeRequest({"N": np.array([[0]])}),  # invalid: answered alone, at once
            pb.FakeRequest({"N": np.array([[50]]), DUE_MS: np.array([[-100.0]], np.float32)})]  # overdue
    assert stage.execute(reqs) is None
    assert reqs[4].sender.finals == 1 and reqs[4].sender.errors()[0].code() == pb.TritonError.INVALID_ARG
    gate.set()
    for _ in range(500):
        if all(r.sender.finals for r in reqs):
            break
        threading.Event().wait(0.01)
    stage.finalize()
    assert passes == [[50, 50], [5, 5], [30]]  # the overdue 50 leads and takes the other 50 along
    assert answered_before == [1, 3, 5]  # each pass answered before the next ran
    for r, want in zip(reqs, (500, 300, 50, 50, None, 500), strict=True):
        assert r.sender.finals == 1
        if want is not None:
            assert r.sender.outputs()[0]["Y"].tolist() == [want]
    assert all(locked for what, locked in pb.CALLS if what == "send")


def test_a_deadline_batched_stage_answers_what_is_queued_when_it_unloads(monkeypatch):
    from omni_triton.adapters.batched import BatchedStage

    monkeypatch.delenv(SCHEDULING_ENV, raising=False)
    started, release = threading.Event(), threading.Event()

    class Slow(BatchedStage):
        def parse(self, request):
            return int(request.inputs["N"].as_numpy().reshape(-1)[0])

        def batch_key(self, item):
            return item

        def run(self, items):
            started.set()
            release.wait(5)
            return items

        def outputs(self, result):
            return {"Y": np.array([result], np.int64)}

    stage = Slow()
    stage.initialize(_decoder_args(scheduling="deadline"))
    reqs = [pb.FakeRequest({"N": np.array([[n]])}) for n in (1, 2)]
    stage.execute(reqs[:1])
    assert started.wait(5)
    stage.execute(reqs[1:])  # queued behind the running pass
    threading.Timer(0.2, release.set).start()
    stage.finalize()
    assert reqs[0].sender.outputs()[0]["Y"].tolist() == [1]
    assert reqs[1].sender.finals == 1 and reqs[1].sender.errors()[0].code() == pb.TritonError.UNAVAILABLE


def test_the_fifo_switch_gives_a_batched_stage_its_plain_execute(monkeypatch):
    from omni_triton.adapters.batched import BatchedStage

    monkeypatch.setenv(SCHEDULING_ENV, "fifo")

    class Plain(BatchedStage):
        def parse(self, request):
            return 1

        def run(self, items):
            return items

        def outputs(self, result):
            return {"Y": np.array([result], np.int64)}

    stage = Plain()
    stage.initialize(_decoder_args(scheduling="deadline"))
    responses = stage.execute([pb.FakeRequest({})])
    assert len(responses) == 1 and not responses[0].has_error()
    stage.finalize()


def test_the_qwen3_tts_decoder_takes_the_most_urgent_chunk_first_and_its_bls_says_when():
    c2w, bls = _params(_config("qwen3_tts_code2wav")), _params(_config("qwen3_tts"))
    assert c2w.get("scheduling") == "deadline"
    assert "DUE_MS" in {i.name for i in _config("qwen3_tts_code2wav").input}
    assert float(bls["deadline_guard_ms"]) > 0 and float(bls["low_water_ms"]) > float(bls["deadline_guard_ms"])


def test_the_qwen3_omni_thinker_dues_every_token_at_arrival_only_for_a_talker_that_waits_for_the_whole_answer():
    """A typed thinker job: TALKER_INPUTS without ASYNC_CHUNK (the multimodal path: the talker
    starts after the whole answer) makes all ``max_tokens`` due at arrival; a streamed talker or a
    text reader keeps ``lead_tokens`` 1."""
    from types import SimpleNamespace

    from omni_triton.adapters.omni_stages import ThinkerJob as _ThinkerJob
    from omni_triton.adapters.qwen3_omni import Qwen3OmniThinkerStage
    from omni_triton.runtime.stage_policy import PlaybackPolicy

    stage = Qwen3OmniThinkerStage()
    stage.playback = PlaybackPolicy("qwen3_omni_thinker", {"deadline_unit": "tokens"})
    sampling = SimpleNamespace(max_tokens=32)
    whole = _ThinkerJob(np.zeros(3, np.int64), sampling, talker_inputs=True, streamed=False, media=None)
    streamed = _ThinkerJob(np.zeros(3, np.int64), sampling, talker_inputs=True, streamed=True, media=None)
    text = _ThinkerJob(np.zeros(3, np.int64), sampling, talker_inputs=False, streamed=False, media=None)
    assert stage.playback_deadline(0.0, whole).lead_tokens == 33
    assert stage.playback_deadline(0.0, streamed).lead_tokens == 1
    assert stage.playback_deadline(0.0, text).lead_tokens == 1 and stage.playback_deadline(0.0).lead_tokens == 1


def test_closing_the_scheduler_ends_every_queued_stream_parked_ones_too():
    """A model unload answers every stream still queued, also a paced one parked until its
    playback deadline comes near (its request would otherwise never get its FINAL)."""
    ends = []
    sched = StepScheduler(1, Policy.DEADLINE, clock=lambda: 0.0, max_lead_s=0.0)
    sched.submit(iter([1.0]), AudioDeadline(100.0), float, ends.append, paced=True)  # due at 100 s: parked
    sched.close()
    assert len(ends) == 1 and isinstance(ends[0], RuntimeError), ends


def test_every_bls_that_takes_paced_keeps_instances_free_of_paced_streams():
    """A BLS pipeline serves one request per instance for the stream's whole life, a PACED one for
    its playback: every BLS model that declares ``PACED`` sets ``max_paced_streams`` below its
    instance count, so paced listeners never take every instance (docs/scheduling.md "What a
    paced stream holds"; the frontend serves a paced request above the bound unpaced). Red when
    a BLS config drops the parameter or sets it to its instance count."""
    import re

    from omni_triton.serve.repository import available_models, model_parameters

    checked = []
    for name, path in available_models().items():
        params = model_parameters(path)
        text = (path / "config.pbtxt").read_text()
        if not params.get("depends_on") or 'name: "PACED"' not in text or params.get("scheduling"):
            continue  # not a BLS, no PACED, or a scheduled stage interleaving its requests (a talker)
        count = int(re.search(r"instance_group\s*\[\s*\{\s*count:\s*(\d+)", text).group(1))
        assert "max_paced_streams" in params, name
        assert 0 < int(params["max_paced_streams"]) < count, (name, params["max_paced_streams"], count)
        checked.append(name)
    assert {"csm", "qwen3_omni", "qwen3_tts"} <= set(checked)

"""The execution policies of ``omni_triton.runtime.stage_policy``, without Triton: where a decoupled
stage runs its requests, the BLS one-thread rule, pacing, instance balance, the playback-deadline
model and the due input of a batched stage, each read from config parameters and checked at load."""
import numpy as np
import pytest

from omni_triton.runtime.scheduling import SCHEDULING_ENV, AudioDeadline, FrameDeadline, TokenDeadline
from omni_triton.runtime.stage_policy import ExecutionPolicy, PlaybackPolicy, due_in_s, max_lead_s


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(SCHEDULING_ENV, raising=False)


def _policy(reads_bls=False, own=False, unchecked=False, default_workers=0, **params):
    warned = []
    policy = ExecutionPolicy.from_params("m", params, default_workers=default_workers, reads_bls_streams=reads_bls,
                                         bls_threads_unchecked=unchecked, own_dispatch=own, warn=warned.append)
    return policy, warned


def test_without_scheduling_a_stage_runs_in_execute_or_on_its_pool():
    assert _policy()[0] == ExecutionPolicy() and not ExecutionPolicy().queued
    policy, _ = _policy(default_workers=3)
    assert policy.pool_workers == 3 and policy.queued and not policy.scheduled
    assert _policy(default_workers=3, workers="0")[0].pool_workers == 0  # the config wins


def test_deadline_scheduling_replaces_the_pool_and_defaults_to_its_size():
    policy, _ = _policy(default_workers=2, scheduling="deadline", max_lead_ms="1500")
    assert (policy.pool_workers, policy.scheduler_workers, policy.max_lead_s) == (0, 2, 1.5)
    assert _policy(scheduling="deadline")[0].scheduler_workers == 1
    sched = policy.step_scheduler("t")
    try:
        assert sched is not None
    finally:
        sched.close()
    assert ExecutionPolicy().step_scheduler("t") is None


def test_the_fifo_switch_and_a_stage_that_dispatches_itself_keep_fifo(monkeypatch):
    policy, warned = _policy(own=True, scheduling="deadline")
    assert not policy.scheduled and warned and "ignored" in warned[0]
    monkeypatch.setenv(SCHEDULING_ENV, "fifo")
    assert not _policy(scheduling="deadline")[0].scheduled


def test_a_stage_reading_bls_streams_keeps_to_one_thread():
    with pytest.raises(RuntimeError, match="one thread"):
        _policy(reads_bls=True, workers="2")
    with pytest.raises(RuntimeError, match="scheduler_workers = 2"):
        _policy(reads_bls=True, scheduling="deadline", scheduler_workers="2")
    assert _policy(reads_bls=True, scheduling="deadline")[0].scheduler_workers == 1
    assert _policy(reads_bls=True, unchecked=True, workers="2")[0].pool_workers == 2  # reproductions only
    with pytest.raises(RuntimeError, match="balance_instances"):
        _policy(reads_bls=True, unchecked=True, scheduling="deadline", balance_instances="true")


def test_instance_balance_only_under_the_scheduler_and_with_a_valid_wait():
    assert _policy(balance_instances="true")[0].balance_max_wait_s is None
    assert _policy(scheduling="deadline", balance_instances="true")[0].balance_max_wait_s == 30.0
    assert _policy(scheduling="deadline", balance_instances="TRUE", balance_max_wait_ms="500")[0] \
        .balance_max_wait_s == 0.5
    with pytest.raises(ValueError):
        _policy(scheduling="deadline", balance_instances="true", balance_max_wait_ms="-1")
    with pytest.raises(ValueError):
        _policy(scheduling="deadline", balance_instances="true", balance_max_wait_ms="soon")


def test_max_lead_is_none_at_zero_and_refused_below():
    assert max_lead_s("m", {}) is None and max_lead_s("m", {"max_lead_ms": "250"}) == 0.25
    with pytest.raises(ValueError, match="max_lead_ms"):
        _policy(scheduling="deadline", max_lead_ms="-5")


def test_the_playback_model_by_unit_and_the_familys_frames_output():
    audio = PlaybackPolicy("m", {})
    assert isinstance(audio.deadline(0.0), AudioDeadline)
    assert audio.amount({"AUDIO": np.zeros(25, np.float32), "SAMPLE_RATE": np.array([10])}) == 2.5
    assert audio.amount(None) == 0.0 and audio.amount({"CODES": np.zeros((3, 8))}) == 0.0
    frames = PlaybackPolicy("m", {"deadline_unit": "frames"}, frames_output="CODES")
    assert isinstance(frames.deadline(0.0), FrameDeadline)
    assert frames.amount({"CODES": np.zeros((3, 8))}) == 3.0 and frames.amount({"X": np.zeros(3)}) == 0.0
    with pytest.raises(ValueError, match="frames output"):  # a family that emits no frames
        PlaybackPolicy("m", {"deadline_unit": "frames"}).deadline(0.0)
    tokens = PlaybackPolicy("m", {"deadline_unit": "tokens"})
    assert isinstance(tokens.deadline(0.0), TokenDeadline)
    assert tokens.amount(None) == 1.0 and tokens.amount({}, final=True) == 0.0
    with pytest.raises(ValueError, match="deadline_unit"):
        PlaybackPolicy("m", {"deadline_unit": "bytes"}).deadline(0.0)


def test_due_input_in_seconds():
    assert due_in_s(None, "DUE_MS") == 0.0 and due_in_s(np.float32(-250.0), "DUE_MS") == -0.25
    with pytest.raises(ValueError, match="DUE_MS must be finite"):
        due_in_s(np.float32("nan"), "DUE_MS")

"""Instance balance (omni_triton.runtime.instance_balance): a scheduled stage's ``execute``
returns only once its instance has no more open streams than its least loaded sibling, so
Triton hands the next request to the sibling (a burst of 8 ``tts`` streams went 5/3 on
``csm_talker``'s two instances, and the busier one set the run's length). Siblings are other
instances of the same server whose process lives; two objects in one process stand for two
stub processes here (same parent pid)."""
from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np
import pytest

from tests.unit import fake_pb_utils as pb

sys.modules.setdefault("triton_python_backend_utils", pb)

from omni_triton.adapters.stream import DecoupledStage  # noqa: E402
from omni_triton.runtime.instance_balance import InstanceBalance  # noqa: E402
from omni_triton.runtime.scheduling import SCHEDULING_ENV  # noqa: E402


def _in_thread(fn):
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def test_an_instance_ahead_of_its_sibling_waits_until_the_sibling_catches_up(tmp_path):
    a, b = InstanceBalance(tmp_path, "talker_0_0"), InstanceBalance(tmp_path, "talker_0_1")
    a.opened()
    assert a.should_wait() and not b.should_wait()
    waiter = _in_thread(a.wait_turn)
    waiter.join(0.2)
    assert waiter.is_alive(), "returned while it had more open streams than its sibling"
    b.opened()  # the next request went to the sibling
    waiter.join(5)
    # 1 and 1: only the lower name takes the next request (two free at a tie leave it to chance)
    assert not waiter.is_alive() and not a.should_wait() and b.should_wait()
    a.opened()
    waiter = _in_thread(a.wait_turn)
    a.closed()  # or one of its own streams ends
    waiter.join(5)
    assert not waiter.is_alive()


def test_alone_or_beside_a_dead_or_foreign_sibling_it_never_waits(tmp_path):
    a = InstanceBalance(tmp_path, "talker_0_0")
    a.opened()
    assert not a.should_wait()  # no sibling: nobody else could take the request
    (tmp_path / "talker_0_1").write_text("999999999 0")  # its process is gone
    (tmp_path / "talker_0_2").write_text("1 0")  # alive (init), but not a stub of this server
    (tmp_path / "talker_0_3").write_text("garbage")
    assert a.others() == {} and not a.should_wait()
    a.close()
    assert not (tmp_path / "talker_0_0").exists()


class Talker(DecoupledStage):
    """A scheduled stage whose jobs run until released."""

    stage = "talker"
    release = threading.Event()

    def parse(self, request):
        return int(request.inputs["N"].as_numpy()[0])

    def generate(self, n, stream):
        for i in range(n):
            while not self.release.is_set():
                yield None
                time.sleep(0.005)
            yield {"X": np.array([i], np.int32)}


def _talker(instance, **params):
    stage = Talker()
    stage.initialize({"model_name": "talker", "model_instance_name": instance,
                      "model_config": json.dumps({"parameters": {k: {"string_value": v} for k, v in params.items()}})})
    return stage


@pytest.mark.parametrize("balanced", [True, False])
def test_execute_returns_only_once_a_sibling_has_as_many_streams(monkeypatch, tmp_path, balanced):
    """Red without ``balance_instances``: execute returns at once, so Triton could stack every
    stream of a burst on one instance."""
    monkeypatch.delenv(SCHEDULING_ENV, raising=False)
    monkeypatch.setattr("omni_triton.paths.server_run_dir", lambda pid: tmp_path)
    Talker.release.clear()
    params = dict(scheduling="deadline", scheduler_workers="1", deadline_unit="audio")
    if balanced:
        params["balance_instances"] = "true"
    a, b = _talker("talker_0_0", **params), _talker("talker_0_1", **params)
    try:
        first = _in_thread(lambda: a.execute([pb.FakeRequest({"N": np.array([2])})]))
        first.join(0.3)
        assert first.is_alive() == balanced  # a has 1 stream, b none: the next request is b's
        second = _in_thread(lambda: b.execute([pb.FakeRequest({"N": np.array([2])})]))
        first.join(5)
        assert not first.is_alive()  # 1 and 1: a (the lower name) takes the next one
        second.join(0.3)
        assert second.is_alive() == balanced
        Talker.release.set()  # the streams end: b returns too
        second.join(5)
        assert not second.is_alive()
    finally:
        Talker.release.set()
        for stage in (a, b):
            stage.finalize()


def test_a_negative_max_wait_is_a_load_error(monkeypatch, tmp_path):
    monkeypatch.delenv(SCHEDULING_ENV, raising=False)
    monkeypatch.setattr("omni_triton.paths.server_run_dir", lambda pid: tmp_path)
    with pytest.raises(ValueError, match="balance_max_wait_ms"):
        _talker("talker_0_0", scheduling="deadline", balance_instances="true", balance_max_wait_ms="-1")


class BlsReader(Talker):
    reads_bls_streams = True


def test_balance_on_a_stage_that_reads_bls_streams_is_a_load_error(monkeypatch, tmp_path):
    """Holding execute slowed qwen3_omni_talker, which reads qwen3_omni_thinker's BLS stream (docs/scheduling.md)."""
    monkeypatch.delenv(SCHEDULING_ENV, raising=False)
    monkeypatch.setattr("omni_triton.paths.server_run_dir", lambda pid: tmp_path)
    stage = BlsReader()
    with pytest.raises(RuntimeError, match="reads decoupled BLS streams"):
        stage.initialize({"model_name": "reader", "model_instance_name": "reader_0_0", "model_config": json.dumps(
            {"parameters": {k: {"string_value": v} for k, v in dict(scheduling="deadline", scheduler_workers="1",
                                                                      balance_instances="true").items()}})})

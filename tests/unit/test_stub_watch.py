"""serve's StubWatch (omni_triton/serve/supervisor.py) on a fake server (tests/helpers/fake_serve.py):
the models it watches are the ones Triton reports READY, not serve's start list. A model
unloaded on purpose is never reloaded (nor reported dead), one loaded after start is watched,
a death is reported once and before its reload, and the index is read only when the stubs
changed (an idle server costs nothing, issue 28 item 4)."""
from __future__ import annotations

import pytest

from omni_triton.serve import supervisor as sv
from omni_triton.serve.supervisor import CONFIRM_S, ServeStatus, StubWatch
from tests.helpers.fake_serve import Clock, FakeServer


@pytest.fixture
def status(tmp_path):
    return ServeStatus(tmp_path / "status.json")


def _watch(server, status):
    clock = Clock()
    watch = StubWatch(server, status, clock=clock)
    watch.tick()  # the first tick: reads the index once
    return watch, clock


def _ticks(watch, clock, n=3, step=CONFIRM_S):
    for _ in range(n):
        clock.advance(step)
        watch.tick()


def _reloads(server):
    return [c[1] for c in server.calls if c[0] == "reload"]


def test_a_killed_stub_is_reported_once_then_its_model_reloaded(status, capsys):
    server = FakeServer(models={"piper": 1, "llm": 1})
    watch, clock = _watch(server, status)
    server.kill("piper")
    watch.tick()  # seen at once, but not acted on before the confirmation
    assert status.last_stub_death is None and _reloads(server) == []
    _ticks(watch, clock)
    assert _reloads(server) == ["piper"]
    death = status.last_stub_death
    assert death["model"] == "piper" and death["killed_children"] == [4242] and death["shm_removed"] == 1
    assert status.stub_reloads == {"piper": 1}
    log = capsys.readouterr().err
    assert log.index("the stub process of piper died") < log.index("reloading piper"), log


def test_a_model_unloaded_on_purpose_is_not_reloaded(status, capsys):
    """The frontend's keep-alive unloads llm: its stubs exit, Triton says UNLOADING, then
    UNAVAILABLE. Not a death: no report (it would end other requests), no reload."""
    server = FakeServer(models={"piper": 1, "llm": 1})
    watch, clock = _watch(server, status)
    server.unload("llm", state="UNLOADING")
    watch.tick()
    server.states["llm"] = "UNAVAILABLE"
    _ticks(watch, clock, n=5)
    assert _reloads(server) == [] and status.last_stub_death is None, server.calls
    log = capsys.readouterr().err
    assert "stub process of llm died" not in log and "stubs of llm exited as it unloaded" in log, log


def test_stubs_exiting_while_the_index_still_says_ready_are_confirmed_first(status):
    """The race: the index read right after the exit still says READY; the next check says
    UNAVAILABLE, so the model is not reloaded."""
    server = FakeServer(models={"piper": 1, "llm": 1})
    watch, clock = _watch(server, status)
    server.unload("llm", state="READY")  # stubs gone, index not updated yet
    watch.tick()
    server.states["llm"] = "UNAVAILABLE"
    _ticks(watch, clock)
    assert _reloads(server) == [] and status.last_stub_death is None


def test_a_model_loaded_after_start_is_watched(status):
    server = FakeServer(models={"piper": 1})
    watch, clock = _watch(server, status)
    server.load("llm")
    watch.tick()
    assert "llm" in watch.ready
    server.kill("llm")
    _ticks(watch, clock)
    assert _reloads(server) == ["llm"] and status.last_stub_death["model"] == "llm"


def test_a_stub_no_scan_saw_is_reported_unseen_before_its_reload(status, capsys):
    server = FakeServer(models={"piper": 1})
    watch, clock = _watch(server, status)
    server.kill("piper", seen=False)
    server.events.add("piper")  # e.g. a safety scan; the index is read again
    _ticks(watch, clock)
    assert status.last_stub_death["unseen"] and _reloads(server) == ["piper"]
    log = capsys.readouterr().err
    assert log.index("piper died before serve saw it") < log.index("reloading piper")


def test_affected_models_and_restarted_callees_are_the_ready_ones(status, capsys):
    """dependents/stream_callees read the READY set: llm_tts (loaded on demand, needs llm and
    piper) is affected by llm's death; when llm_tts dies, only the READY callees are restarted."""
    server = FakeServer(models={"piper": 1, "llm": 1})
    watch, clock = _watch(server, status)
    server.load("llm_tts", instances=4)
    watch.tick()
    server.kill("llm")
    _ticks(watch, clock)
    assert status.last_stub_death["affected"] == ["llm", "llm_tts"]
    server.unload("piper")
    _ticks(watch, clock)
    server.kill("llm_tts")
    _ticks(watch, clock)
    assert ("kill_stubs", "llm") in server.calls and ("kill_stubs", "piper") not in server.calls
    assert "restarting llm too (it streamed to llm_tts)" in capsys.readouterr().err


def test_an_idle_server_reads_no_index(status):
    server = FakeServer(models={"piper": 1, "llm": 1})
    watch, clock = _watch(server, status)
    server.calls.clear()
    _ticks(watch, clock, n=20)  # 10 s with nothing happening
    assert ("index",) not in server.calls, server.calls
    server.kill("piper")
    watch.tick()
    assert ("index",) in server.calls


def test_a_failed_reload_is_retried_unless_the_model_was_unloaded_meanwhile(status):
    server = FakeServer(models={"piper": 1, "llm": 1})
    server.fail_reload.add("llm")
    watch, clock = _watch(server, status)
    server.kill("llm")
    _ticks(watch, clock)
    assert _reloads(server) == ["llm"] and status.stub_reloads == {}
    _ticks(watch, clock, n=20)  # its first retry is RELOAD_RETRY_S (5 s) later
    assert _reloads(server) == ["llm", "llm"]
    server.fail_reload.clear()
    _ticks(watch, clock, n=60)
    assert _reloads(server) == ["llm"] * 3 and status.stub_reloads == {"llm": 1}
    assert [d["model"] for d in [status.last_stub_death]] == ["llm"]  # reported once
    # failing again, then unloaded on purpose: no more tries
    server.fail_reload.add("piper")
    server.kill("piper")
    _ticks(watch, clock)
    server.reasons["piper"] = "unloaded"
    _ticks(watch, clock, n=200)
    assert _reloads(server).count("piper") == 1


def test_a_death_is_reported_once(status, monkeypatch):
    """The families of a model's other stubs that exit during serve's own reload are not a
    second death, and a kill seen by a scan is never reported a second time as unseen."""
    server = FakeServer(models={"llm_tts": 4})
    watch, clock = _watch(server, status)
    deaths = []
    monkeypatch.setattr(sv.StubWatch, "_report", lambda self, model, **kw: deaths.append(model))
    server.kill("llm_tts")
    _ticks(watch, clock)
    for _ in range(3):  # its 3 other stubs exit with the reload
        server.exits.append({"model": "llm_tts", "stub_pid": 1, "killed": [], "shm_removed": []})
    _ticks(watch, clock, n=5)
    assert deaths == ["llm_tts"] and _reloads(server) == ["llm_tts"]


def test_a_model_still_missing_after_a_failed_reload_is_reloaded_again_but_reported_once(status):
    """serve's unload timed out: the model is still READY without its stub. It is reloaded again
    at the next checks, and its death stays one report (a second would end the requests of the
    models depending on it again)."""
    server = FakeServer(models={"piper": 1, "llm": 1})
    server.fail_unload.add("llm")
    watch, clock = _watch(server, status)
    writes = []
    status.listeners.append(lambda: writes.append(status.last_stub_death))
    server.kill("llm")
    _ticks(watch, clock, n=12)  # the first reload and its retry 5 s later fail
    assert _reloads(server) == ["llm", "llm"], server.calls
    server.fail_unload.clear()
    _ticks(watch, clock, n=30)  # the next retry, 10 s later, succeeds
    assert _reloads(server) == ["llm"] * 3 and status.stub_reloads == {"llm": 1}
    assert len({d["at"] for d in writes if d}) == 1, "the death was reported more than once"


def test_a_lifecycle_line_of_triton_s_log_is_one_event(tmp_path):
    """serve re-reads the last 64 bytes of the log (a line split across two reads); a load line
    in them must not come back on every tick (each event costs a scan of the machine's processes
    and an index read: 0.95% of a core on the idle piper,csm,llm stack when it did)."""
    from omni_triton.serve.server import TritonServer

    server = object.__new__(TritonServer)  # only the log reading is under test
    server.log_path = tmp_path / "tritonserver.log"
    server._log_offset, server._fatal_signal, server._model_events = 0, None, set()
    server.log_path.write_bytes(b'I1203 model_lifecycle.cc:839] "successfully loaded \'csm\'"\n')
    assert server.model_events() == {"csm"}
    assert server.model_events() == set() and server.model_events() == set()
    with open(server.log_path, "ab") as log:
        log.write(b"I1203 model_lifecycle.cc:624] \"successfully unloaded 'piper' version 1\"\n")
    assert server.model_events() == {"piper"} and server.model_events() == set()
    with open(server.log_path, "ab") as log:
        log.write(b"Signal (11) received.\n")
    assert server.fatal_signal() == "Signal (11) received." and server.model_events() == set()

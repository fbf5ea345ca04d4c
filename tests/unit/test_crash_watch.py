"""The e2e crash detection (tests/helpers/crash_watch.py) against the lines ``omni-triton serve``
really writes: each test makes serve's own supervision code (omni_triton/serve/supervisor.py) log a stub death,
a callee restart or a tritonserver restart through a fake server, and feeds that log to the
detector. A change of serve's wording fails here, not silently in every e2e run."""
from __future__ import annotations

import argparse
import subprocess
import sys
import threading

import pytest

from omni_triton.serve import supervisor as sv
from omni_triton.serve.process import ServerStartError
from omni_triton.serve.supervisor import ServeStatus, crash_reason
from tests.helpers.crash_watch import (
    CrashWatch,
    process_evidence,
    serve_log_evidence,
    triton_log_evidence,
)
from tests.helpers.fake_serve import Clock, FakeServer

#: tritonserver's fatal-signal handler line, as it writes it (and as serve.supervisor.crash_reason reads it)
TRITON_SIGNAL_LINE = "Signal (11) received."


@pytest.fixture
def status(tmp_path):
    return ServeStatus(tmp_path / "status.json")


def _watch_deaths(server, status, *deaths: tuple[str, bool]) -> None:
    """Make serve's StubWatch see each ``(model, seen)`` stub death and act on it."""
    clock = Clock()
    watch = sv.StubWatch(server, status, clock=clock)
    watch.tick()
    for model, seen in deaths:
        server.kill(model, seen=seen)
        server.events.add(model)
        for _ in range(3):
            clock.advance(sv.CONFIRM_S)
            watch.tick()


def test_serve_stub_death_reports_are_found_and_excused_only_for_the_named_model(tmp_path, status, capsys):
    _watch_deaths(FakeServer(tmp_path), status, ("piper", True), ("llm", False))  # llm: "died before serve saw it"
    log = capsys.readouterr().err
    assert [ln for ln in log.splitlines() if "died" in ln], log
    assert len(serve_log_evidence(log)) == 2, log
    # a test that kills piper excuses piper's death, never llm's
    assert serve_log_evidence(log, excused_stubs=["piper"]) == [
        f"serve log: {ln.strip()}" for ln in log.splitlines() if "stub process of llm died" in ln]
    assert serve_log_evidence(log, excused_stubs=["piper", "llm"]) == []
    assert serve_log_evidence(log, check_stubs=False) == []


def test_a_callee_restart_is_excused_only_with_the_bls_model_that_caused_it(tmp_path, status, capsys, monkeypatch):
    monkeypatch.setattr(sv, "stream_callees", lambda model, *a: ["piper"] if model == "llm_tts" else [])
    monkeypatch.setattr(sv, "dependents", lambda model, *a: [model])
    _watch_deaths(FakeServer(tmp_path), status, ("llm_tts", True), ("piper", True))  # piper: serve's kill, seen
    log = capsys.readouterr().err
    assert "restarting piper too (it streamed to llm_tts)" in log, log
    assert serve_log_evidence(log, excused_stubs=["llm_tts"]) == []
    assert len(serve_log_evidence(log, excused_stubs=["piper"])) == 2  # llm_tts's death + the restart


def test_serve_tritonserver_restart_lines_are_found_even_with_stubs_excused(tmp_path, capsys):
    server = FakeServer(tmp_path)
    sv.restart_server(server, 1.0, 1, tmp_path / "tritonserver-1.log.crash-1", threading.Event())
    args = argparse.Namespace(max_restarts=0)
    with pytest.raises(ServerStartError):
        sv.supervise(FakeServer(tmp_path, exit_code=-11), None, args, threading.Event(),
                       ServeStatus(tmp_path / "status.json"))
    log = capsys.readouterr().err
    evidence = serve_log_evidence(log, excused_stubs=["piper", "llm"], check_stubs=False)
    assert any("restarting tritonserver" in e for e in evidence), log
    assert any("Triton READY again" in e for e in evidence), log
    assert any("tritonserver exited" in e for e in evidence), log


def test_tritonserver_fatal_signal_line_is_found():
    log = f"I1203 10:00:00.000 1 server.cc:1] started\n{TRITON_SIGNAL_LINE}\n"
    assert crash_reason(log, -11) == TRITON_SIGNAL_LINE  # serve's reading of the same line
    assert triton_log_evidence(log) == [f"tritonserver log: {TRITON_SIGNAL_LINE}"]
    assert triton_log_evidence("I1203 server.cc:1] started\n") == []


def test_a_missing_tritonserver_child_is_a_crash():
    # this process has no tritonserver child: the session's server is gone (serve is between a
    # death and a restart)
    assert process_evidence(__import__("os").getpid(), 12345) == [
        "tritonserver is now not running, the session started pid 12345"]
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert process_evidence(gone.pid, 12345) == [f"omni-triton serve (pid {gone.pid}) is gone"]


def test_each_check_reads_on_from_the_previous_one(tmp_path, monkeypatch):
    """A death between two tests (a module-scoped fixture's setup: all the vLLM-Omni bench runs)
    fails the next test's check; it is never skipped, and never reported twice."""
    monkeypatch.setattr("tests.helpers.crash_watch.process_evidence", lambda *a: [])
    serve_log, triton_log = tmp_path / "serve.log", tmp_path / "tritonserver-1.log"
    serve_log.write_text("omni-triton: serving; Ctrl-C stops\n")
    triton_log.write_text("I1203 started\n")
    watch = CrashWatch(str(serve_log), str(triton_log), 1, 2)
    assert watch.check() == []  # test 1
    with open(serve_log, "a") as f:  # a module fixture's setup, before test 2 starts
        f.write("omni-triton: the stub process of llm died; killed its children [], removed 0 /dev/shm files\n")
    with open(triton_log, "a") as f:
        f.write(TRITON_SIGNAL_LINE + "\n")
    evidence = watch.check()  # test 2
    assert len(evidence) == 2 and "llm died" in evidence[0] and TRITON_SIGNAL_LINE in evidence[1], evidence
    assert watch.check() == []  # test 3
    # a new crash log is reported once, with the signal line it holds
    (tmp_path / "tritonserver-1.log.crash-1").write_text(TRITON_SIGNAL_LINE + "\n")
    assert len(watch.check()) == 2 and watch.check() == []
    assert len(watch.whole_session()) == 2  # the signal line, the crash log


def test_a_crash_log_never_overwrites_an_earlier_one(tmp_path):
    """serve names each crash log one above the highest there: a second serve run on the same port
    (its restart count back at 1) keeps the first run's crash logs."""
    log = tmp_path / "tritonserver-8000.log"
    assert sv.next_crash_log(log) == tmp_path / "tritonserver-8000.log.crash-1"
    (tmp_path / "tritonserver-8000.log.crash-1").write_text("first run's crash\n")
    (tmp_path / "tritonserver-8000.log.crash-3").write_text("a later one\n")
    (tmp_path / "tritonserver-8000.log.crash-x").write_text("not ours\n")
    (tmp_path / "tritonserver-18000.log.crash-9").write_text("another port\n")
    assert sv.next_crash_log(log) == tmp_path / "tritonserver-8000.log.crash-4"

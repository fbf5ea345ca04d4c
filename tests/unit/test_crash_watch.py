"""The e2e crash detection (tests/helpers/crash_watch.py) against the lines ``omni-triton serve``
really writes: each test makes serve's own supervision code (omni_triton/serve/supervisor.py) log a stub death,
a callee restart or a tritonserver restart through a fake server, and feeds that log to the
detector. A change of serve's wording fails here, not silently in every e2e run."""
from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from pathlib import Path

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

#: tritonserver's fatal-signal handler line, as it writes it (and as serve.supervisor.crash_reason reads it)
TRITON_SIGNAL_LINE = "Signal (11) received."


class _Proc:
    def __init__(self, code):
        self.returncode = code

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        return self.returncode


class _FakeServer:
    """What sv.StubWatch, sv.restart_server and sv.supervise call on a TritonServer."""

    def __init__(self, tmp_path: Path, dead: list[str] = (), missing: list[str] = (), exit_code=None):
        self.models, self.repositories = ["piper", "llm", "llm_tts"], []
        self.log_path = tmp_path / "tritonserver-1.log"
        self.proc = _Proc(exit_code)
        self._dead, self._missing = list(dead), list(missing)

    def track_stub_families(self):
        dead, self._dead = self._dead, []
        return [{"model": m, "killed": [], "shm_removed": []} for m in dead]

    def models_without_stub(self):
        missing, self._missing = self._missing, []
        return missing

    def reload(self, model):
        pass

    def kill_stubs(self, model):
        return [4242]

    def stop(self):
        pass

    def start(self):
        pass

    def wait_ready(self, timeout=None, should_stop=None):
        pass

    def log_text(self):
        return TRITON_SIGNAL_LINE + "\n"

    def failure_report(self):
        return ""

    def fatal_signal(self):
        return None


@pytest.fixture
def status(tmp_path):
    return ServeStatus(tmp_path / "status.json")


def test_serve_stub_death_reports_are_found_and_excused_only_for_the_named_model(tmp_path, status, capsys):
    sv.StubWatch(_FakeServer(tmp_path, dead=["piper"]), status).scan()
    sv.StubWatch(_FakeServer(tmp_path, missing=["llm"]), status).tick()  # "died before serve saw it"
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
    sv.StubWatch(_FakeServer(tmp_path, dead=["llm_tts"]), status).scan()
    sv.StubWatch(_FakeServer(tmp_path, dead=["piper"]), status).scan()  # serve's kill, seen
    log = capsys.readouterr().err
    assert "restarting piper too (it streamed to llm_tts)" in log, log
    assert serve_log_evidence(log, excused_stubs=["llm_tts"]) == []
    assert len(serve_log_evidence(log, excused_stubs=["piper"])) == 2  # llm_tts's death + the restart


def test_serve_tritonserver_restart_lines_are_found_even_with_stubs_excused(tmp_path, capsys):
    server = _FakeServer(tmp_path)
    sv.restart_server(server, 1.0, 1, tmp_path / "tritonserver-1.log.crash-1", threading.Event())
    args = argparse.Namespace(max_restarts=0)
    with pytest.raises(ServerStartError):
        sv.supervise(_FakeServer(tmp_path, exit_code=-11), None, args, threading.Event(),
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

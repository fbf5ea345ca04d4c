"""Crash detection for the e2e session stack (``tests/e2e/conftest.py``), kept free of pytest so
that ``tests/unit/test_crash_watch.py`` can feed it the lines ``omni-triton serve`` really logs.

A crash must fail the run even though ``serve`` hides it from later requests (it restarts a
tritonserver that died and reloads a model whose stub died). The traces looked for:

- the process: ``serve``'s tritonserver child must still be the one the session started (a
  missing child is a crash too: serve is between a death and a restart);
- ``serve``'s log: its restart lines (:data:`SERVER_CRASH_LINES`) and its stub death reports
  (:data:`STUB_DEATH`, and :data:`CALLEE_RESTART` for the stages serve restarts because of one);
- tritonserver's own log: its fatal ``Signal (N) received.`` line (:data:`FATAL_SIGNAL`), which a
  wedged server writes before serve notices anything;
- ``<triton log>.crash-<n>`` files: serve keeps a crashed server's log so.

A test that kills stubs on purpose names the models it kills (``@pytest.mark.kills_stub("m")``):
only their deaths, and the restarts of the stages serve restarts because of them, are excused.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import psutil

#: ``serve`` log lines (omni_triton/serve/supervisor.py) that mean tritonserver died and was restarted
SERVER_CRASH_LINES = ("tritonserver exited", "restarting tritonserver", "Triton READY again")
#: ``serve``'s report of a stub death (``StubWatch``): "the stub process of <model> died; ..." and
#: "the stub process of <model> died before serve saw it; ..."
STUB_DEATH = re.compile(r"the stub process of (?P<model>\S+) died")
#: ``serve`` killing a decoupled callee's stubs because the BLS model streaming from it died
CALLEE_RESTART = re.compile(r"restarting (?P<callee>\S+) too \(it streamed to (?P<model>[^)\s]+)\)")
#: tritonserver's own SIGSEGV/SIGABRT handler line (the one ``serve.supervisor.crash_reason`` reports)
FATAL_SIGNAL = re.compile(r"Signal \(\d+\) received")


def read_from(path: str | os.PathLike, offset: int) -> tuple[str, int]:
    """Text of ``path`` from byte ``offset`` (from 0 when the file is now shorter: it was replaced),
    and its size. A missing file reads as ``("", 0)``."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(offset if offset <= size else 0)
            return f.read().decode(errors="replace"), size
    except FileNotFoundError:
        return "", 0


def serve_log_evidence(text: str, excused_stubs: Iterable[str] = (), check_stubs: bool = True) -> list[str]:
    """Crash and stub-death lines in a piece of ``serve``'s log.

    Args:
        text: log text (one window: a test, or what no test checked yet).
        excused_stubs: models whose stubs the test killed or unloaded on purpose; their death
            reports, serve's restarts of the callees they streamed from, and those callees' own
            death reports are not evidence.
        check_stubs: False: report tritonserver crashes only.

    Returns:
        ``"serve log: <line>"`` per trace, in log order.
    """
    excused = set(excused_stubs)
    found = []
    for line in text.splitlines():
        if any(n in line for n in SERVER_CRASH_LINES):
            found.append(line)
            continue
        if not check_stubs:
            continue
        restart = CALLEE_RESTART.search(line)
        if restart:
            if restart["model"] in excused:
                excused.add(restart["callee"])  # its stubs die next, by serve's own hand
            else:
                found.append(line)
            continue
        death = STUB_DEATH.search(line)
        if death and death["model"] not in excused:
            found.append(line)
    return [f"serve log: {ln.strip()}" for ln in found]


def triton_log_evidence(text: str) -> list[str]:
    """tritonserver's fatal-signal lines in a piece of its log."""
    return [f"tritonserver log: {ln.strip()}" for ln in text.splitlines() if FATAL_SIGNAL.search(ln)]


def process_evidence(serve_pid: int, triton_pid: int) -> list[str]:
    """A trace when ``serve`` is gone or its tritonserver child is not (only) ``triton_pid``."""
    try:
        tritons = [p.pid for p in psutil.Process(serve_pid).children() if p.name() == "tritonserver"]
    except psutil.NoSuchProcess:
        return [f"omni-triton serve (pid {serve_pid}) is gone"]
    if tritons != [triton_pid]:
        return [f"tritonserver is now {tritons or 'not running'}, the session started pid {triton_pid}"]
    return []


def crash_logs(triton_log: Path) -> dict[str, int]:
    """``<triton_log>.crash-<n>`` files -> mtime (ns): ``serve`` renames a crashed server's log so."""
    if not triton_log.parent.is_dir():
        return {}
    return {str(p): p.stat().st_mtime_ns for p in triton_log.parent.glob(triton_log.name + ".crash-*")}


class CrashWatch:
    """Reads the session's logs window by window, so that no byte goes unchecked.

    Each :meth:`check` reads from where the previous one stopped, not from the start of the test
    it runs for: what happened in between (a module-scoped fixture's setup, such as all the
    vLLM-Omni bench runs, or a fixture's teardown) is checked with the next test.

    Args:
        serve_log: ``serve``'s log (stdout and stderr).
        triton_log: tritonserver's log (``<cache>/logs/tritonserver-<http port>.log``).
        serve_pid, triton_pid: the processes the session started.
        old_crash_logs: crash-log files (path -> mtime ns) of other runs that once used the same
            port; only new or rewritten ones count.
    """

    def __init__(self, serve_log: str, triton_log: str, serve_pid: int, triton_pid: int,
                 old_crash_logs: dict[str, int] | None = None):
        self.serve_log, self.triton_log = serve_log, triton_log
        self.serve_pid, self.triton_pid = serve_pid, triton_pid
        self.old_crash_logs = dict(old_crash_logs or {})
        self.reported_crash_logs: dict[str, int] = {}  # reported by a check already
        self.serve_from = 0  # bytes of serve's log already checked
        self.triton_from = 0  # bytes of tritonserver's (current) log already checked

    def check(self, excused_stubs: Iterable[str] = (), check_stubs: bool = True) -> list[str]:
        """Every trace since the last check (see :meth:`serve_log_evidence` for the arguments);
        moves the window on. Returns one line per trace; empty when there is none."""
        found = process_evidence(self.serve_pid, self.triton_pid)
        text, self.serve_from = read_from(self.serve_log, self.serve_from)
        found += serve_log_evidence(text, excused_stubs, check_stubs)
        text, self.triton_from = read_from(self.triton_log, self.triton_from)
        found += triton_log_evidence(text)
        for path, mtime in crash_logs(Path(self.triton_log)).items():
            if mtime not in (self.old_crash_logs.get(path), self.reported_crash_logs.get(path)):
                self.reported_crash_logs[path] = mtime
                found.append(f"crash log of this session's server: {path}")
                found += triton_log_evidence(read_from(path, 0)[0])
        return found

    def whole_session(self) -> list[str]:
        """tritonserver crashes anywhere in the session (stub deaths were checked per window);
        the process check is :meth:`check`'s."""
        found = serve_log_evidence(read_from(self.serve_log, 0)[0], check_stubs=False)
        found += triton_log_evidence(read_from(self.triton_log, 0)[0])
        found += [f"crash log of this session's server: {path}"
                  for path, mtime in crash_logs(Path(self.triton_log)).items()
                  if self.old_crash_logs.get(path) != mtime]
        return found

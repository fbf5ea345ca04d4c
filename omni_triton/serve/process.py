"""Process plumbing shared by the server and the frontend child: process groups, ports, logs.

Children start in their own process group (:func:`child_setup`) and get SIGTERM when ``serve``
dies; :func:`stop_process_group` ends the whole group, so stubs and engine workers never outlive
the child that started them.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import BinaryIO

_PR_SET_PDEATHSIG = 1


class ServerStartError(RuntimeError):
    """tritonserver (or the frontend) did not become ready; the message names the failing model."""


def stop_on_signals(stop: threading.Event, prog: str) -> None:
    """Make SIGINT and SIGTERM set ``stop`` (the supervising loop then stops what it started),
    printing ``<prog>: got SIGxxx, stopping ...``. Call it from the main thread.
    """

    def on_signal(signum: int, _frame: object) -> None:
        print(f"\n{prog}: got {signal.Signals(signum).name}, stopping ...", flush=True)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)


def child_setup() -> None:
    """In the child: new process group, and SIGTERM when the launcher dies (Linux prctl)."""
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def stop_process_group(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM a child started with :func:`child_setup`, wait, then SIGKILL its whole group.

    The group holds everything the child started (Triton stubs, engine workers), so the final
    SIGKILL leaves no orphan even when the child exits before its children do.
    """
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def kill_process_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s whole process group now, without the SIGTERM and wait of
    :func:`stop_process_group` (for a server that is wedged after a fatal signal); the caller
    sees the exit at its next ``poll()``."""
    try:
        os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
    except ProcessLookupError:
        pass


def check_ports_free(ports: dict[str, int]) -> None:
    """Raise :class:`ServerStartError` naming every port (by role) that something already uses.

    Without this check a second server would fail to bind while the launcher's readiness probe
    talked to whatever already listens there.
    """
    import socket

    busy = []
    for role, port in ports.items():
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                busy.append(f"{role} port {port}")
    if busy:
        raise ServerStartError(f"already in use: {', '.join(busy)} (another server running? "
                               "pick other ports with the --*-port options)")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def open_run_log(path: Path, what: str) -> BinaryIO:
    """``path`` opened for appending (folders made), after a start marker line
    ``===== omni-triton: <what> started <UTC time> =====``: a later start never truncates an
    earlier run's output (the evidence of a crash), and each run's lines begin at a marker.
    The caller closes it (a child given it as stdout keeps its own copy)."""
    import datetime

    path.parent.mkdir(parents=True, exist_ok=True)
    log = open(path, "ab")
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    log.write(f"\n===== omni-triton: {what} started {now} =====\n".encode())
    log.flush()
    return log

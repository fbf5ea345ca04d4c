"""Triton's Python-backend stub processes of one tritonserver, watched at (almost) no idle cost.

A stub is a direct child of tritonserver whose ``argv`` is ``.../triton_python_backend_stub
<repo>/<model>/<version>/model.py <shm region> ...``. :class:`StubTracker` knows each live stub
and its *family*: the processes it started (vLLM's EngineCore and workers) and the /dev/shm
files they all map (vLLM's ``psm_*`` message queues). A stub killed with SIGKILL leaves that
family orphaned in the server's process group (~3 GB for vLLM) until the server stops;
:meth:`StubTracker.reap` kills it and removes the files.

What it costs (measured on the 2-core dev box, ~185 processes on the machine; issue 28 item 4):

- a death costs nothing until it happens: each stub has a pidfd (``os.pidfd_open``), readable
  when the process has exited; ``serve``'s supervision loop waits on them (``select.poll``), so
  it wakes at the death, not at a polling tick;
- finding stubs and their families means listing every process of the machine (a process's
  children are not listed anywhere cheaper: this kernel has no ``/proc/<pid>/task/*/children``).
  :meth:`StubTracker.scan` does it in one pass (one ``/proc/<pid>/stat`` read per process,
  6.6 ms for 185 processes; 19 ms the first time) and only when something changed (a model loaded or unloaded,
  a stub died) or at :data:`SAFETY_SCAN_S`; the old watch did it 1 + (number of stubs) times
  a second;
- ``/proc/<pid>/maps`` (the /dev/shm files a process maps; 0.5-3 ms for a torch process) is
  read for new processes only, and again for a model's family when Triton reports that model
  loaded (its engine maps its queues during the load).
"""
from __future__ import annotations

import os
import select
from dataclasses import dataclass, field
from pathlib import Path

import psutil

#: argv[0] of a Python-backend stub process ends with this
STUB_BINARY = "triton_python_backend_stub"


def shm_files(pid: int) -> set[str]:
    """Files under /dev/shm that process ``pid`` maps (from /proc/<pid>/maps); empty if gone."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return {line.split(None, 5)[5].strip() for line in maps
                    if " /dev/shm/" in line and len(line.split(None, 5)) == 6}
    except OSError:
        return set()


def stub_model(cmdline: list[str]) -> str | None:
    """The model of a stub's command line (``<repo>/<model>/<version>/model.py`` is argv[1]), or
    None when the command line is not a stub's."""
    if len(cmdline) > 2 and cmdline[0].endswith(STUB_BINARY):
        return Path(cmdline[1]).parent.parent.name
    return None


def _pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (readable once it exited), or None where pidfds are unsupported
    (Linux < 5.3) or the process is already gone."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


@dataclass(eq=False)
class Stub:
    """One live stub process and its family.

    Attributes:
        pid, created: the process (``created``: psutil's create time, so a reused pid is never
            taken for it).
        model: the Triton model it runs an instance of.
        region: its shared-memory region (argv[2]; a file in /dev/shm the stub never removes
            when it is killed).
        pidfd: readable once the process exited; None without pidfd support (then
            :meth:`StubTracker.exited` checks the pid on each call).
        children: ``(pid, create time)`` of every descendant seen.
        shm: /dev/shm paths the stub and its descendants were seen to map.
    """

    pid: int
    created: float
    model: str
    region: str
    pidfd: int | None = None
    children: set[tuple[int, float]] = field(default_factory=set)
    shm: set[str] = field(default_factory=set)

    def fileno(self) -> int:
        """The pidfd (for ``select``); only valid when :attr:`pidfd` is not None."""
        assert self.pidfd is not None
        return self.pidfd

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


#: seconds between two scans when nothing changed: a safety net for a load whose log line was
#: missed (Triton's logging turned off through its API) and for a process a stub starts after
#: its model loaded. One scan costs ~6.6 ms of serve's CPU (185 processes on the machine; it
#: scales with their number), so 0.02% of a core at 30 s.
SAFETY_SCAN_S = 30.0


class StubTracker:
    """The live stubs of tritonserver ``server_pid``, their families, and which of them exited.

    Not thread-safe: ``serve``'s supervision loop is its only user (and :meth:`close` at stop).
    """

    def __init__(self, server_pid: int):
        self.server_pid = server_pid
        self.stubs: dict[int, Stub] = {}  # pid -> live (as far as known) stub
        self.regions: set[str] = set()  # every stub region seen (stop() removes what is left)

    # -- discovery ---------------------------------------------------------------------------
    def scan(self, refresh: set[str] = frozenset()) -> list[Stub]:
        """List the machine's processes once; remember new stubs and new descendants of known
        stubs (reading the /dev/shm files each maps); re-read the files of the families of the
        models in ``refresh`` (Triton just loaded them). Returns the stubs new to this tracker.

        A stub that exited is not removed here (:meth:`exited` does that), so a death is
        reported by :meth:`exited` exactly once whatever the order of the calls.
        """
        children: dict[int, list[psutil.Process]] = {}
        for proc in psutil.process_iter(["ppid"]):
            ppid = proc.info["ppid"]
            if ppid is not None:
                children.setdefault(ppid, []).append(proc)
        new: list[Stub] = []
        for proc in children.get(self.server_pid, []):
            if proc.pid in self.stubs:
                continue
            stub = self._adopt(proc)
            if stub is not None:
                new.append(stub)
        for stub in self.stubs.values():
            refresh_all = stub in new or stub.model in refresh
            if refresh_all:
                stub.shm |= shm_files(stub.pid)
            stack = list(children.get(stub.pid, []))
            while stack:
                proc = stack.pop()
                stack += children.get(proc.pid, [])
                try:
                    key = (proc.pid, proc.create_time())
                except psutil.Error:
                    continue
                if key not in stub.children or refresh_all:
                    stub.children.add(key)
                    stub.shm |= shm_files(proc.pid)  # e.g. vLLM's psm_* message queues
        return new

    def _adopt(self, proc: psutil.Process) -> Stub | None:
        try:
            cmd = proc.cmdline()
            created = proc.create_time()
        except psutil.Error:
            return None  # gone, or a zombie (a stub killed before any scan: never adopted)
        model = stub_model(cmd)
        if model is None:
            return None
        pidfd = _pidfd(proc.pid)
        try:  # the pid may have been reused between the listing and pidfd_open
            same = psutil.Process(proc.pid).create_time() == created
        except psutil.Error:
            same = False
        if not same:
            if pidfd is not None:
                os.close(pidfd)
            return None
        stub = Stub(proc.pid, created, model, cmd[2], pidfd)
        self.stubs[proc.pid] = stub
        self.regions.add(stub.region)
        return stub

    # -- deaths ------------------------------------------------------------------------------
    def fds(self) -> list[int]:
        """The pidfds to wait on (readable when their stub exited)."""
        return [s.pidfd for s in self.stubs.values() if s.pidfd is not None]

    def exited(self) -> list[Stub]:
        """The known stubs that exited since the last call (removed from :attr:`stubs`; their
        pidfds closed). Without pidfds: those whose pid is gone, a zombie, or another process."""
        gone = []
        ready = set()
        fds = self.fds()
        if fds:
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            ready = {fd for fd, _ in poller.poll(0)}
        for stub in list(self.stubs.values()):
            if stub.pidfd is not None:
                dead = stub.pidfd in ready
            else:
                try:
                    proc = psutil.Process(stub.pid)
                    dead = proc.create_time() != stub.created or proc.status() == psutil.STATUS_ZOMBIE
                except psutil.Error:
                    dead = True
            if dead:
                del self.stubs[stub.pid]
                stub.close()
                gone.append(stub)
        return gone

    def alive(self) -> dict[str, int]:
        """Model -> number of its live stubs (as of the last :meth:`scan` and :meth:`exited`)."""
        counts: dict[str, int] = {}
        for stub in self.stubs.values():
            counts[stub.model] = counts.get(stub.model, 0) + 1
        return counts

    @staticmethod
    def reap(stub: Stub) -> dict:
        """Kill the remembered descendants of an exited stub that still run (same pid and start
        time: never a reused pid) and remove its family's /dev/shm files.

        Returns:
            ``{"model", "stub_pid", "killed": [pid], "shm_removed": [path]}``.
        """
        killed: list[psutil.Process] = []
        for pid, created in stub.children:
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created:
                    proc.kill()
                    killed.append(proc)
            except psutil.Error:
                continue
        psutil.wait_procs(killed, timeout=5)
        removed = []
        for path in stub.shm:
            try:
                Path(path).unlink()
                removed.append(path)
            except OSError:
                pass
        return {"model": stub.model, "stub_pid": stub.pid, "killed": [p.pid for p in killed],
                "shm_removed": removed}

    def pids(self, model: str) -> list[int]:
        """Pids of the live stubs of ``model``."""
        return [s.pid for s in self.stubs.values() if s.model == model]

    def shm_paths(self) -> set[str]:
        """Every /dev/shm file the live stubs' families were seen to map."""
        return {path for stub in self.stubs.values() for path in stub.shm}

    def close(self) -> None:
        """Close every pidfd (the server stopped)."""
        for stub in self.stubs.values():
            stub.close()
        self.stubs = {}

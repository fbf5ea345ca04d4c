"""``serve``'s lifetime: start tritonserver and the frontend, keep them running, stop them.

:func:`run_serve` is ``omni-triton serve``; :func:`supervise` is its loop, which restarts a dead
tritonserver (:class:`RestartBackoff`, reason from :func:`crash_reason`), reloads models whose
stub died (:class:`StubWatch`) and starts a dead frontend again, recording it all in
:class:`ServeStatus` for the frontend's ``/health``.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from omni_triton import triton_admin
from omni_triton.serve.process import ServerStartError, check_ports_free, kill_process_group, stop_on_signals
from omni_triton.serve.repository import dependents, frontend_models, on_demand_pipelines, stream_callees
from omni_triton.serve.server import Frontend, TritonServer
from omni_triton.serve.stubs import SAFETY_SCAN_S

#: seconds a server that wrote a fatal ``Signal (N) received.`` line may take to exit on its own
WEDGED_GRACE_S = 10.0


class RestartBackoff:
    """Delay before the next tritonserver restart: ``initial_s`` doubling per consecutive crash up
    to ``max_s``; back to ``initial_s`` once a server has run ``reset_after_s`` without dying.

    ``serve`` never gives up while the user has not stopped it: the delay keeps a server that
    crashes at start-up from spinning the CPU, nothing more.
    """

    def __init__(self, initial_s: float = 1.0, max_s: float = 30.0, reset_after_s: float = 300.0):
        self.initial_s, self.max_s, self.reset_after_s = initial_s, max_s, reset_after_s
        self._next = initial_s

    def delay(self, ran_for_s: float) -> float:
        """Seconds to wait before restarting a server that ran ``ran_for_s`` seconds."""
        if ran_for_s >= self.reset_after_s:
            self._next = self.initial_s
        delay, self._next = self._next, min(self._next * 2, self.max_s)
        return delay


@dataclass
class ServeStatus:
    """What ``serve`` knows about its tritonserver, written as JSON to :attr:`path` after every
    change (atomically: a temporary file renamed) so the OpenAI frontend's ``/health`` can show it
    (the frontend gets the path in ``OMNI_TRITON_SERVE_STATUS``).

    Attributes:
        state: ``starting``, ``ready`` or ``restarting``.
        restarts: tritonserver restarts since ``serve`` started.
        last_crash: ``{"at": unix seconds, "exit_code": int, "reason": str, "log": path}`` of the
            last tritonserver death, or ``None``.
        stub_reloads: model -> times its stub process died and the model was reloaded.
        last_stub_death: ``{"at", "model", "affected": [models whose in-flight requests hang on
            it], "killed_children": [pid], "shm_removed": n}`` or ``None``. The frontend fails
            the in-flight requests of the ``affected`` models when this changes (Triton 2.51
            never completes the requests of a dead stub).
    """

    path: Path
    state: str = "starting"
    restarts: int = 0
    last_crash: dict | None = None
    stub_reloads: dict = field(default_factory=dict)
    last_stub_death: dict | None = None
    #: called after each write (``Frontend.notify``: the frontend re-reads the file when told,
    #: instead of polling it)
    listeners: list = field(default_factory=list)

    def write(self, **changes) -> None:
        import json

        for key, value in changes.items():
            setattr(self, key, value)
        data = {k: getattr(self, k) for k in ("state", "restarts", "last_crash", "stub_reloads",
                                               "last_stub_death")}
        data["updated_at"] = time.time()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.path)
        for listener in self.listeners:
            listener()


def crash_reason(log_text: str, exit_code: int | None) -> str:
    """A one-line reason for a tritonserver death: its ``Signal (N) received.`` line, else the
    signal name of a negative exit code, else the exit code."""
    for line in log_text.splitlines():
        if re.search(r"Signal \(\d+\) received", line):
            return line.strip()
    if exit_code is not None and exit_code < 0:
        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            pass
    return f"exited with code {exit_code}"


def run_serve(args: argparse.Namespace) -> int:
    """``omni-triton serve``: prepare, start tritonserver and the frontend, supervise both until
    SIGINT/SIGTERM, then stop both process groups.

    Args:
        args: the parsed ``serve`` arguments (:func:`omni_triton.cli.build_parser`); ``models``
            is a comma separated list of Triton model names.

    Returns:
        the exit status: 0 after a requested stop, 1 when tritonserver or the frontend did not
        start (or died past ``--max-restarts``), 2 for an unusable admin key.

    Raises:
        KeyError: a requested model (or one it needs) is in no model repository.
    """
    from omni_triton.cli import PIPELINES
    from omni_triton.prepare import prepare

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    on_demand = on_demand_pipelines(args.on_demand, models, PIPELINES.split(","))
    stop = threading.Event()
    stop_on_signals(stop, "omni-triton")

    if not args.skip_prepare:
        prepare(models + on_demand)
    try:
        admin_key = triton_admin.key_from_env()
    except (triton_admin.AdminKeyError, OSError) as exc:
        print(f"omni-triton: {triton_admin.ENV}/{triton_admin.ENV_FILE}: {exc}", file=sys.stderr)
        return 2
    server = TritonServer(models, http_port=args.triton_http_port, grpc_port=args.triton_grpc_port,
                          metrics_port=args.triton_metrics_port, host=args.triton_host,
                          metrics_host=args.triton_metrics_host, admin_key=admin_key)
    frontend = None
    status = ServeStatus(server.log_path.with_name(f"serve-status-{server.http_port}.json"))
    status.write(state="starting")
    try:
        print(f"omni-triton: starting tritonserver with {', '.join(server.models)} "
              f"(log: {server.log_path})"
              + (f"; on demand: {', '.join(on_demand)}" if on_demand and not args.no_frontend else ""),
              flush=True)
        if not args.no_frontend:
            check_ports_free({"frontend": args.port})  # fail before the slow model loading
        server.start()
        server.wait_ready(timeout=args.ready_timeout, should_stop=stop.is_set)
        server.scan_stubs()  # know every stub before a client can reach it (StubWatch)
        print(f"omni-triton: Triton READY (HTTP {server.http_url}, gRPC {server.grpc_url}, "
              f"metrics http://127.0.0.1:{server.metrics_port}/metrics); its admin APIs "
              f"({', '.join(triton_admin.RESTRICTED_APIS)}) need the header "
              f"'{triton_admin.HEADER}' with the key in {server.admin_key_path}", flush=True)
        if not args.no_frontend:
            if args.api_key:  # the frontend reads it from its environment (not argv: ps shows that)
                os.environ["OMNI_TRITON_API_KEY"] = args.api_key
            frontend = Frontend(server.grpc_url, host=args.host, port=args.port,
                                models=frontend_models(models, server.repositories),
                                extra_args=[*on_demand_args(args, on_demand, server.repositories),
                                            *args.frontend_arg,
                                            *(["--strict-params"] if args.strict_params else [])],
                                env={"OMNI_TRITON_SERVE_STATUS": str(status.path)},
                                admin_key=server.admin_key)
            status.listeners.append(frontend.notify)
            frontend.start()
            frontend.wait_ready()
            print(f"omni-triton: OpenAI API at {frontend.url}/v1  (try: curl {frontend.url}/v1/models)",
                  flush=True)
            print(f"omni-triton: playground at {frontend.url}/playground/  (open it in a browser: "
                  "docs/playground.md)", flush=True)
        print("omni-triton: serving; Ctrl-C to stop", flush=True)
        status.write(state="ready")
        supervise(server, frontend, args, stop, status)
        return 0
    except ServerStartError as exc:
        print(f"omni-triton: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if frontend is not None:
            frontend.stop()
        server.stop()
        print("omni-triton: stopped", flush=True)


def on_demand_args(args: argparse.Namespace, on_demand: list[str], repositories: list[Path]) -> list[str]:
    """The frontend flags of on-demand loading (docs/running.md "On-demand models"): the
    pipelines it may load (``--on-demand``; its ``--models`` stay the pinned ones, loaded at
    start), ``--keep-alive``, ``--memory-budget``, ``--load-timeout`` as ``serve`` got them, and
    the model repositories it reads the pipelines' graph from. ``[]`` when nothing is on demand."""
    if not on_demand:
        return []
    out = ["--on-demand", ",".join(on_demand), "--keep-alive", str(args.keep_alive),
           "--load-timeout", str(args.load_timeout)]
    if args.memory_budget:
        out += ["--memory-budget", str(args.memory_budget)]  # bytes
    for repo in repositories:
        out += ["--model-repository", str(repo)]
    return out


def _log(message: str) -> None:
    print(f"omni-triton: {message}", file=sys.stderr, flush=True)


#: seconds between two supervision ticks when nothing happens. A quiet tick (waitpid of
#: tritonserver and the frontend, a poll of the pidfds, one read of the server log's new bytes)
#: costs ~40 us of Python plus ~150 us for the wake-up itself on the 2-core dev VM: ~0.04% of a
#: core at this rate. The whole loop, safety scans included, measured 0.17-0.23% of a core
#: against a fake server with 13 stubs (issue 28 item 4). A stub, tritonserver or frontend death
#: wakes the loop at once (pidfds); the tick bounds how late a stop request or a fatal-signal log
#: line is seen.
TICK_S = 0.5
#: seconds a model must stay READY with a stub missing before serve reports and reloads it: a
#: stub that exits while Triton unloads its model (the frontend's keep-alive) is not a death,
#: and the index read right after the exit might still say READY.
CONFIRM_S = 0.5
#: reload attempts of a model whose reload failed: first after this many seconds, doubling up to
#: RELOAD_RETRY_MAX_S, while Triton keeps it UNAVAILABLE with a load error
RELOAD_RETRY_S, RELOAD_RETRY_MAX_S = 5.0, 120.0


class _Waiter:
    """Sleep until a watched process exits (its pidfd is readable) or ``timeout`` passes.

    A process that already exited is never waited on (its pidfd would stay readable and spin the
    loop): the caller deals with it first. Without pidfd support (Linux < 5.3) it just sleeps.
    """

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}  # pid -> pidfd of the server / frontend processes

    def _pidfd(self, pid: int) -> int | None:
        if pid not in self._fds:
            try:
                self._fds[pid] = os.pidfd_open(pid)
            except (AttributeError, OSError):
                return None
        return self._fds[pid]

    def wait(self, procs, stub_fds: list[int], timeout: float) -> None:
        import select

        poller = select.poll()
        watched = set()
        for proc in procs:
            pid = getattr(proc, "pid", None)
            if pid is None or proc.poll() is not None:
                continue
            fd = self._pidfd(pid)
            if fd is not None:
                poller.register(fd, select.POLLIN)
                watched.add(pid)
        for pid in [p for p in self._fds if p not in watched]:
            os.close(self._fds.pop(pid))
        for fd in stub_fds:
            poller.register(fd, select.POLLIN)
        poller.poll(timeout * 1000)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}


def supervise(server: TritonServer, frontend: Frontend | None, args, stop: threading.Event,
              status: ServeStatus) -> None:
    """Keep tritonserver, its stubs and the frontend running until ``stop`` is set.

    Event-driven: the loop sleeps on the pidfds of tritonserver, the frontend and every stub
    (``TICK_S`` at most). A stub process that died is reported in the status file (the frontend
    then ends its in-flight requests), has its orphaned children (vLLM engine processes) and
    their /dev/shm files removed, and its model is reloaded (also when only some of its
    instances' stubs died); when it was a BLS model's, the decoupled stages it reads are
    restarted too (:func:`~omni_triton.serve.repository.stream_callees`). Which models are
    watched is what Triton reports READY (:class:`StubWatch`): a model unloaded on purpose is
    not reloaded, one loaded later is watched. A tritonserver that died is restarted
    after a backoff (1 s doubling to 30 s; ``--max-restarts`` bounds the count, -1: never give
    up), its log kept as ``<log>.crash-<n>``; a restart that fails is retried the same way. A
    server that wrote a fatal ``Signal (N) received.`` line but is still running
    ``WEDGED_GRACE_S`` later (seen once after a SIGSEGV: ports closed, stubs dead, process
    alive) is killed, and so restarted and counted like one that exited. A
    frontend that died is started again. :class:`ServeStatus` records all of it for ``/health``.
    """
    backoff = RestartBackoff()
    wedged_since = None  # when a still-running server was first seen to have had a fatal signal
    started_at = time.monotonic()
    stubs = StubWatch(server, status)
    waiter = _Waiter()
    if server.proc.poll() is None:
        stubs.tick()  # the stubs' families now, not a tick later (run_serve scanned them too)
    try:
        while not stop.is_set():
            waiter.wait([server.proc, frontend.proc if frontend is not None else None],
                        stubs.fds(), TICK_S)
            if stop.is_set():
                return
            if server.proc.poll() is None:
                stubs.tick()
            if server.proc.poll() is None and server.fatal_signal():
                wedged_since = wedged_since or time.monotonic()
                if time.monotonic() - wedged_since >= WEDGED_GRACE_S:
                    _log(f"tritonserver wrote '{server.fatal_signal()}' {WEDGED_GRACE_S:.0f} s ago and is still "
                         "running; killing it (it no longer serves)")
                    kill_process_group(server.proc)
                    server.proc.wait()
            if server.proc.poll() is not None:
                wedged_since = None
                code = server.proc.returncode
                reason = crash_reason(server.log_text(), code)
                _log(f"tritonserver exited ({code}: {reason})\n{server.failure_report()}")
                if 0 <= args.max_restarts <= status.restarts:
                    _log(f"not restarting tritonserver again ({status.restarts} restarts, "
                         f"--max-restarts {args.max_restarts})")
                    raise ServerStartError("tritonserver died and --max-restarts is reached")
                restarts = status.restarts + 1
                crash_log = next_crash_log(server.log_path)
                status.write(state="restarting", restarts=restarts, last_crash={
                    "at": time.time(), "exit_code": code, "reason": reason, "log": str(crash_log)})
                delay = backoff.delay(time.monotonic() - started_at)
                if stop.wait(delay):
                    return
                try:
                    restart_server(server, args.ready_timeout, restarts, crash_log, stop)
                    stubs.restarted()
                    started_at = time.monotonic()
                    status.write(state="ready")
                except ServerStartError as exc:
                    _log(f"restart {restarts} failed: {exc}")  # the next tick restarts it again
                    started_at = time.monotonic()
                    if server.proc is not None and server.proc.poll() is None:
                        server.stop()
            if frontend is not None and frontend.proc.poll() is not None and not stop.is_set():
                _log(f"frontend exited ({frontend.proc.returncode}); starting it again")
                try:
                    frontend.start()
                    frontend.wait_ready()
                except ServerStartError as exc:
                    _log(str(exc))
    finally:
        waiter.close()


class StubWatch:
    """Stub deaths of a running tritonserver, for the models Triton reports READY: report each
    death, then reload its model.

    Which models to watch comes from Triton's repository index (the models READY), not from
    ``serve``'s start list: the frontend loads and unloads models on demand, so a model loaded
    later is watched (its stubs' deaths reported and reloaded), and one unloaded on purpose is
    never reloaded (its stubs exit while its state is UNLOADING, then UNAVAILABLE). The index
    is read only when the stubs changed: a stub exited, new stubs were found, or Triton logged a
    model load or unload (:meth:`TritonServer.model_events`).

    A model is *missing* a stub when it is READY with fewer live stubs than instances. It is
    acted on only when it is still missing at a check ``CONFIRM_S`` or more later (the index
    read right after a stub exits may still say READY while the model unloads); then its death
    is written to ``status`` (``last_stub_death``) *before* the model's reload: the frontend
    reads it and ends the dead stub's in-flight requests, which Triton 2.51 never ends (and
    which keep the old instance from unloading, its /dev/shm region with it).

    Every stub that exits has its family reaped at once (orphaned children killed, /dev/shm
    files removed), death or unload. A model missing a stub no scan saw (CI: test_chaos killed
    piper ~2 s after READY) is still reported, as ``"unseen": True`` with no children killed.
    Each death is reported once: a model whose reload failed is tried again at its backoff
    (``RELOAD_RETRY_S`` doubling), not confirmed and reported again.
    """

    def __init__(self, server: TritonServer, status: ServeStatus, clock=time.monotonic):
        self.server = server
        self.status = status
        self.clock = clock
        self.callee_restarts: dict[str, float] = {}  # decoupled callee -> when serve last restarted it
        self.ready: set[str] = set()  # the models Triton reported READY at the last index read
        self.dead: dict[str, list[dict]] = {}  # model -> reaped families of its exited stubs, not yet judged
        self.suspects: dict[str, float] = {}  # model -> when it was first seen missing a stub
        self.retries: dict[str, tuple[float, float]] = {}  # model -> (next reload try, delay) after a failed reload
        self._next_scan = 0.0
        self._stale = True  # the index must be read at the next tick

    def fds(self) -> list[int]:
        """The stubs' pidfds (readable once a stub exited): the supervision loop waits on them."""
        return self.server.stub_fds()

    def tick(self) -> None:
        """One supervision step (cheap when nothing changed: one read of the server log's new
        bytes and a poll of the pidfds): find new stubs, reap the exited ones, and when the stubs
        changed read the index, then report and reload the models confirmed missing a stub."""
        server, now = self.server, self.clock()
        events = server.model_events()
        scanned = bool(events or self.suspects or self._stale or now >= self._next_scan)
        new = server.scan_stubs(refresh=events) if scanned else []
        if scanned:
            self._next_scan = now + SAFETY_SCAN_S
        for family in server.reap_exited_stubs():
            self.dead.setdefault(family["model"], []).append(family)
        due = [m for m, (at, _) in self.retries.items() if at <= now]
        if not (events or new or self.dead or self.suspects or self._stale or due):
            return
        try:
            states = server.model_states()
        except (httpx.HTTPError, ValueError):
            self._stale = True  # busy or going away: the next tick tries again
            return
        self._stale = False
        self.ready = {m for m, (state, _) in states.items() if state == "READY"}
        missing = set(server.models_without_stub(self.ready))
        self.suspects = {m: self.suspects.get(m, now) for m in missing}
        for model in [m for m in self.dead if m not in missing]:
            families = self.dead.pop(model)
            if model not in self.ready:  # unloaded on purpose (or failing): not a death
                state = states.get(model, ("gone",))[0]
                if state == "LOADING":  # python_backend's short-lived stub of a load (not a death)
                    _log(f"a stub of {model} exited while it was LOADING (python_backend's load-time "
                         "stub, or the stubs of an unload just before this load); killed its children "
                         f"{_killed(families)}, removed {_removed(families)} /dev/shm files")
                    continue
                _log(f"stubs of {model} exited as it unloaded ({state}); killed "
                     f"their children {_killed(families)}, removed {_removed(families)} /dev/shm files")
        for model in due:
            state, reason = states.get(model, ("", ""))
            if model in missing or (state == "UNAVAILABLE" and reason != "unloaded"):
                self.suspects.pop(model, None)
                self._reload(model, retry=True)
            else:
                del self.retries[model]  # loaded again, or unloaded on purpose meanwhile
        for model in sorted(m for m, since in self.suspects.items() if now - since >= CONFIRM_S):
            if model in self.retries:
                continue  # its reload failed: tried again at its backoff time (above)
            del self.suspects[model]
            families = self.dead.pop(model, [])
            if families:
                _log(f"the stub process of {model} died; killed its children {_killed(families)}, "
                     f"removed {_removed(families)} /dev/shm files")
                self._report(model, killed_children=_killed(families), shm_removed=_removed(families))
            else:
                _log(f"the stub process of {model} died before serve saw it; its children and "
                     "/dev/shm files are unknown")
                self._report(model, killed_children=[], shm_removed=0, unseen=True)
            self._reload(model)

    def _reload(self, model: str, retry: bool = False) -> None:
        _log(f"reloading {model}" + (" (again: its last reload failed)" if retry else ""))
        try:
            self.server.reload(model)
        except ServerStartError as exc:
            _log(str(exc))
            delay = min(self.retries.get(model, (0.0, RELOAD_RETRY_S / 2))[1] * 2, RELOAD_RETRY_MAX_S)
            self.retries[model] = (self.clock() + delay, delay)
            return
        self.retries.pop(model, None)
        reloads = dict(self.status.stub_reloads)
        reloads[model] = reloads.get(model, 0) + 1
        self.status.write(stub_reloads=reloads)
        _log(f"{model} reloaded")
        self.server.scan_stubs(refresh={model})  # the new stubs' families, before a request can reach them
        self._stale = True

    def _report(self, model: str, **detail) -> None:
        server = self.server
        ready = sorted(self.ready | {model})
        self.status.write(last_stub_death={"at": time.time(), "model": model,
                                           "affected": dependents(model, ready, server.repositories),
                                           **detail})
        # A dead BLS stub leaves the decoupled stages it was reading wedged (their next
        # response to it blocks forever in the server): restart them too.
        # Once per minute at most: serve's own reload of a model ends its other stubs too.
        for callee in stream_callees(model, ready, server.repositories):
            if time.monotonic() - self.callee_restarts.get(callee, -1e9) < 60:
                continue
            pids = server.kill_stubs(callee)
            if pids:
                self.callee_restarts[callee] = time.monotonic()
                _log(f"restarting {callee} too (it streamed to {model}): killed {pids}")

    def restarted(self) -> None:
        """tritonserver was restarted: its old stubs' reports and suspicions are moot."""
        self.dead.clear()
        self.suspects.clear()
        self.retries.clear()
        self._stale, self._next_scan = True, 0.0


def _killed(families: list[dict]) -> list[int]:
    return [pid for family in families for pid in family["killed"]]


def _removed(families: list[dict]) -> int:
    return sum(len(family["shm_removed"]) for family in families)


def next_crash_log(log_path: Path) -> Path:
    """``<log>.crash-<n>`` with ``n`` one above the highest already there (1 when none): each
    crash's log is kept, also across ``serve`` runs on the same port (a restart count that starts
    at 1 again in every run would overwrite an earlier run's crash log)."""
    taken = [int(m.group(1)) for p in log_path.parent.glob(f"{log_path.name}.crash-*")
             if (m := re.fullmatch(re.escape(log_path.name) + r"\.crash-(\d+)", p.name))]
    return log_path.with_name(f"{log_path.name}.crash-{max(taken, default=0) + 1}")


def restart_server(server: TritonServer, ready_timeout: float, restarts: int, crash_log,
                   stop: threading.Event) -> None:
    """Bring a tritonserver that died back on the same ports.

    The frontend keeps running and answers 503 (Triton unavailable) meanwhile. The dead server's
    process group (stubs, vLLM engine children) is killed first and its log is kept as
    ``crash_log``. Raises ``ServerStartError`` if the new server does not become READY (or
    ``stop`` is set meanwhile).
    """
    server.stop()
    if server.log_path.exists():
        server.log_path.replace(crash_log)
    print(f"omni-triton: restarting tritonserver (restart {restarts}; the crashed server's log: "
          f"{crash_log})", file=sys.stderr, flush=True)
    server.start()
    server.wait_ready(timeout=ready_timeout, should_stop=stop.is_set)
    server.scan_stubs()
    print("omni-triton: Triton READY again", file=sys.stderr, flush=True)

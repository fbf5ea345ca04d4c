"""``omni-triton``: prepare the embedded default models and serve them on tritonserver.

Commands:
    omni-triton prepare [--models piper_tts,tts]
    omni-triton serve   [--models piper_tts,tts] [--port 9000] [--triton-http-port 8000] ...
    omni-triton models  (lists the models of the repositories and what they depend on)

``serve`` prepares what the models need, starts tritonserver with only those models, waits for
READY (printing the failing model and its errors instead of hanging), starts the OpenAI frontend,
and on SIGINT/SIGTERM (or when either process dies) stops both process groups.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from omni_triton import triton_admin
from omni_triton.serve.process import ServerStartError, check_ports_free, kill_process_group
from omni_triton.serve.repository import (
    available_models,
    dependencies,
    dependents,
    frontend_models,
    stream_callees,
)
from omni_triton.serve.server import Frontend, TritonServer
from omni_triton.serve.supervisor import RestartBackoff, ServeStatus, crash_reason

#: seconds a server that wrote a fatal ``Signal (N) received.`` line may take to exit on its own
WEDGED_GRACE_S = 10.0

DEFAULT_MODELS = "piper_tts,tts,llm,llm_tts,omni,qwen_image,qwen_image_edit,wan_t2v,wan_i2v,qwen3_tts"


def _model_list(text: str) -> list[str]:
    return [m.strip() for m in text.split(",") if m.strip()]


def cmd_prepare(args: argparse.Namespace) -> int:
    from omni_triton.prepare import prepare

    prepare(_model_list(args.models))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    for name, path in available_models().items():
        deps = dependencies(path)
        print(f"{name:16s} {path}" + (f"  (needs {', '.join(deps)})" if deps else ""))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from omni_triton.prepare import prepare

    models = _model_list(args.models)
    stop = threading.Event()

    def on_signal(signum, _frame):
        print(f"\nomni-triton: got {signal.Signals(signum).name}, stopping ...", flush=True)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    if not args.skip_prepare:
        prepare(models)
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
              f"(log: {server.log_path})", flush=True)
        if not args.no_frontend:
            check_ports_free({"frontend": args.port})  # fail before the slow model loading
        server.start()
        server.wait_ready(timeout=args.ready_timeout, should_stop=stop.is_set)
        server.track_stub_families()  # know every stub before a client can reach it (_StubWatch)
        print(f"omni-triton: Triton READY (HTTP {server.http_url}, gRPC {server.grpc_url}, "
              f"metrics http://127.0.0.1:{server.metrics_port}/metrics); its admin APIs "
              f"({', '.join(triton_admin.RESTRICTED_APIS)}) need the header "
              f"'{triton_admin.HEADER}' with the key in {server.admin_key_path}", flush=True)
        if not args.no_frontend:
            if args.api_key:  # the frontend reads it from its environment (not argv: ps shows that)
                os.environ["OMNI_TRITON_API_KEY"] = args.api_key
            frontend = Frontend(server.grpc_url, host=args.host, port=args.port,
                                models=frontend_models(models, server.repositories),
                                extra_args=[*args.frontend_arg,
                                            *(["--strict-params"] if args.strict_params else [])],
                                env={"OMNI_TRITON_SERVE_STATUS": str(status.path)},
                                admin_key=server.admin_key)
            frontend.start()
            frontend.wait_ready()
            print(f"omni-triton: OpenAI API at {frontend.url}/v1  (try: curl {frontend.url}/v1/models)",
                  flush=True)
        print("omni-triton: serving; Ctrl-C to stop", flush=True)
        status.write(state="ready")
        _supervise(server, frontend, args, stop, status)
        return 0
    except ServerStartError as exc:
        print(f"omni-triton: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if frontend is not None:
            frontend.stop()
        server.stop()
        print("omni-triton: stopped", flush=True)


def _log(message: str) -> None:
    print(f"omni-triton: {message}", file=sys.stderr, flush=True)


def _supervise(server: TritonServer, frontend: Frontend | None, args, stop: threading.Event,
               status: ServeStatus) -> None:
    """Keep tritonserver, its stubs and the frontend running until ``stop`` is set.

    Every second (:class:`_StubWatch`): a stub process that died is reported in the status file
    (the frontend then ends its in-flight requests), has its orphaned children (vLLM engine
    processes) and their /dev/shm files removed, and its model is reloaded (also when only some
    of its instances' stubs died); when it was a BLS model's, the decoupled stages it reads are restarted too
    (:func:`~omni_triton.serve.repository.stream_callees`). A tritonserver that died is restarted
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
    ticks = 0
    stubs = _StubWatch(server, status)
    stubs.scan()  # remember the stubs' families now, not a tick later (cmd_serve did so too)
    while not stop.wait(0.5):
        ticks += 1
        if server.proc.poll() is None and ticks % 2 == 0:
            stubs.tick()
        if server.proc.poll() is None and ticks % 2 == 0 and server.fatal_signal():
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
            crash_log = server.log_path.with_name(f"{server.log_path.name}.crash-{restarts}")
            status.write(state="restarting", restarts=restarts, last_crash={
                "at": time.time(), "exit_code": code, "reason": reason, "log": str(crash_log)})
            delay = backoff.delay(time.monotonic() - started_at)
            if stop.wait(delay):
                return
            try:
                _restart_server(server, args.ready_timeout, restarts, crash_log, stop)
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


class _StubWatch:
    """Stub deaths of a running tritonserver: report each one, then reload its model.

    Every report is written to ``status`` (``last_stub_death``) *before* the model's reload: the
    frontend reads it and ends the dead stub's in-flight requests, which Triton 2.51 never ends
    (and which keep the old instance from unloading, its /dev/shm region with it).

    A stub is known from :meth:`TritonServer.track_stub_families` scans (every tick, at start and
    right after each reload). One that dies before any scan saw it (CI: test_chaos killed
    piper_tts ~2 s after READY, before the first tick) has no family to report; its model is
    still reported, as ``"unseen": True`` with no children killed, when
    :meth:`TritonServer.models_without_stub` finds it missing. Missing stubs are listed *before*
    the scan, so a stub seen once is always reported by the scan, never twice.
    """

    def __init__(self, server: TritonServer, status: ServeStatus):
        self.server = server
        self.status = status
        self.reported: set[str] = set()  # models reported dead since their last reload
        self.callee_restarts: dict[str, float] = {}  # decoupled callee -> when serve last restarted it

    def scan(self) -> None:
        """Scan the live stubs (remember their families) and report the ones that died."""
        for report in self.server.track_stub_families():
            _log(f"the stub process of {report['model']} died; killed its children "
                 f"{report['killed']}, removed {len(report['shm_removed'])} /dev/shm files")
            self._report(report["model"], killed_children=report["killed"],
                         shm_removed=len(report["shm_removed"]))

    def _report(self, model: str, **detail) -> None:
        server = self.server
        self.status.write(last_stub_death={"at": time.time(), "model": model,
                                           "affected": dependents(model, server.models, server.repositories),
                                           **detail})
        self.reported.add(model)
        # A dead BLS stub leaves the decoupled stages it was reading wedged (their next
        # response to it blocks forever in the server): restart them too.
        # Once per minute at most: serve's own reload of a model ends its other stubs too.
        for callee in stream_callees(model, server.models, server.repositories):
            if time.monotonic() - self.callee_restarts.get(callee, -1e9) < 60:
                continue
            pids = server.kill_stubs(callee)
            if pids:
                self.callee_restarts[callee] = time.monotonic()
                _log(f"restarting {callee} too (it streamed to {model}): killed {pids}")

    def tick(self) -> None:
        """One supervision step: report dead stubs, then reload the models that lack one."""
        missing = self.server.models_without_stub()
        self.scan()
        for model in missing:
            if model not in self.reported:
                _log(f"the stub process of {model} died before serve saw it; its children and "
                     "/dev/shm files are unknown")
                self._report(model, killed_children=[], shm_removed=0, unseen=True)
        for model in missing:
            _log(f"reloading {model}")
            try:
                self.server.reload(model)
            except ServerStartError as exc:
                _log(str(exc))
                continue
            self.reported.discard(model)
            reloads = dict(self.status.stub_reloads)
            reloads[model] = reloads.get(model, 0) + 1
            self.status.write(stub_reloads=reloads)
            _log(f"{model} reloaded")
            self.scan()  # the new stubs' families, before a request can reach them

    def restarted(self) -> None:
        """tritonserver was restarted: its old stubs' reports are moot."""
        self.reported.clear()


def _restart_server(server: TritonServer, ready_timeout: float, restarts: int, crash_log,
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
    server.track_stub_families()
    print("omni-triton: Triton READY again", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omni-triton", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="write the embedded default model folders into the cache")
    p.add_argument("--models", default=DEFAULT_MODELS, help="comma separated Triton model names")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("models", help="list the models of the repositories")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("serve", help="start tritonserver and the OpenAI frontend")
    p.add_argument("--models", default=DEFAULT_MODELS, help="comma separated Triton model names")
    p.add_argument("--host", default="127.0.0.1", help="frontend bind address")
    p.add_argument("--port", type=int, default=9000, help="frontend port")
    p.add_argument("--triton-host", default="127.0.0.1",
                   help="address Triton's HTTP and gRPC endpoints bind to (default loopback; "
                        "0.0.0.0: all). Inference, health, metadata and statistics are open to "
                        "whoever reaches them; the admin APIs (model repository load/unload, model "
                        "config, shared memory, trace, logging) need the key of env "
                        "OMNI_TRITON_ADMIN_KEY or the file named by OMNI_TRITON_ADMIN_KEY_FILE "
                        "(default: a random key per serve, written 0600 to <cache>/run/)")
    p.add_argument("--triton-metrics-host", default=None,
                   help="address Triton's metrics endpoint binds to (default: --triton-host)")
    p.add_argument("--triton-http-port", type=int, default=8000)
    p.add_argument("--triton-grpc-port", type=int, default=8001)
    p.add_argument("--triton-metrics-port", type=int, default=8002)
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for READY")
    p.add_argument("--max-restarts", type=int, default=-1,
                   help="restart tritonserver at most this many times if it dies (0: exit "
                        "instead; default -1: always, with a backoff of 1 s doubling to 30 s)")
    p.add_argument("--no-frontend", action="store_true", help="serve Triton only")
    p.add_argument("--skip-prepare", action="store_true", help="do not run prepare first")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer <key>' on the OpenAI API (default: env "
                        "OMNI_TRITON_API_KEY, preferred: arguments show in ps; /health answers its "
                        "status only without the key, /metrics stays open)")
    p.add_argument("--strict-params", action="store_true",
                   help="unknown request fields are a 400 (OpenAI's API) instead of being ignored "
                        "and named in the X-Ignored-Fields header (vLLM's server, the default)")
    p.add_argument("--frontend-arg", action="append", default=[],
                   help="extra argument for python -m openai_frontend (repeatable)")
    p.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyError as exc:
        print(f"omni-triton: {exc.args[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

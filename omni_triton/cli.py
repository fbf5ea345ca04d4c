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

from omni_triton.launcher import (
    Frontend,
    ServerStartError,
    TritonServer,
    available_models,
    check_ports_free,
    dependencies,
)

DEFAULT_MODELS = "piper_tts,tts,llm,llm_tts,omni,qwen_image,qwen_image_edit"


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
    server = TritonServer(models, http_port=args.triton_http_port, grpc_port=args.triton_grpc_port,
                          metrics_port=args.triton_metrics_port, host=args.triton_host)
    frontend = None
    try:
        print(f"omni-triton: starting tritonserver with {', '.join(server.models)} "
              f"(log: {server.log_path})", flush=True)
        if not args.no_frontend:
            check_ports_free({"frontend": args.port})  # fail before the slow model loading
        server.start()
        server.wait_ready(timeout=args.ready_timeout)
        print(f"omni-triton: Triton READY (HTTP {server.http_url}, gRPC {server.grpc_url}, "
              f"metrics http://127.0.0.1:{server.metrics_port}/metrics)", flush=True)
        if not args.no_frontend:
            if args.api_key:  # the frontend reads it from its environment (not argv: ps shows that)
                os.environ["OMNI_TRITON_API_KEY"] = args.api_key
            frontend = Frontend(server.grpc_url, host=args.host, port=args.port, models=models,
                                extra_args=args.frontend_arg)
            frontend.start()
            frontend.wait_ready()
            print(f"omni-triton: OpenAI API at {frontend.url}/v1  (try: curl {frontend.url}/v1/models)",
                  flush=True)
        print("omni-triton: serving; Ctrl-C to stop", flush=True)
        ticks = 0
        restarts = 0
        while not stop.wait(0.5):
            ticks += 1
            if ticks % 10 == 0:  # every 5 s: a stub that died is restarted, not left failing
                for model in server.models_without_stub():
                    print(f"omni-triton: the stub process of {model} died; reloading {model}",
                          file=sys.stderr, flush=True)
                    try:
                        server.reload(model)
                        print(f"omni-triton: {model} reloaded", file=sys.stderr, flush=True)
                    except ServerStartError as exc:
                        print(f"omni-triton: {exc}", file=sys.stderr, flush=True)
            if server.proc.poll() is not None:
                print(f"omni-triton: tritonserver exited ({server.proc.returncode})\n"
                      f"{server.failure_report()}", file=sys.stderr, flush=True)
                if restarts >= args.max_restarts:
                    print(f"omni-triton: not restarting tritonserver again ({restarts} restarts)",
                          file=sys.stderr, flush=True)
                    return 1
                restarts += 1
                _restart_server(server, args.ready_timeout, restarts)
            if frontend is not None and frontend.proc.poll() is not None:
                print(f"omni-triton: frontend exited ({frontend.proc.returncode})", file=sys.stderr, flush=True)
                return 1
        return 0
    except ServerStartError as exc:
        print(f"omni-triton: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if frontend is not None:
            frontend.stop()
        server.stop()
        print("omni-triton: stopped", flush=True)


def _restart_server(server: TritonServer, ready_timeout: float, restarts: int) -> None:
    """Bring a tritonserver that died (e.g. the SIGSEGV tritonserver 2.51 can hit in its Python
    backend under concurrent error responses; see docs/chat_contracts.md) back on the same ports.

    The frontend keeps running and answers 503 (Triton unavailable) meanwhile. The dead server's
    process group (stubs, vLLM engine children) is killed first and its log is kept as
    ``<log>.crash-<n>``. Raises ``ServerStartError`` if the new server does not become READY.
    """
    server.stop()
    crash_log = server.log_path.with_name(f"{server.log_path.name}.crash-{restarts}")
    if server.log_path.exists():
        server.log_path.replace(crash_log)
    print(f"omni-triton: restarting tritonserver (restart {restarts}; the crashed server's log: "
          f"{crash_log})", file=sys.stderr, flush=True)
    server.start()
    server.wait_ready(timeout=ready_timeout)
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
                   help="address Triton's HTTP/gRPC/metrics endpoints bind to (0.0.0.0: all; "
                        "note anyone reaching it can load/unload models)")
    p.add_argument("--triton-http-port", type=int, default=8000)
    p.add_argument("--triton-grpc-port", type=int, default=8001)
    p.add_argument("--triton-metrics-port", type=int, default=8002)
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for READY")
    p.add_argument("--max-restarts", type=int, default=5,
                   help="restart tritonserver this many times if it dies (0: exit instead)")
    p.add_argument("--no-frontend", action="store_true", help="serve Triton only")
    p.add_argument("--skip-prepare", action="store_true", help="do not run prepare first")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer <key>' on the OpenAI API (default: env "
                        "OMNI_TRITON_API_KEY; /health and /metrics stay open)")
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

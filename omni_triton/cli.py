"""``omni-triton``: prepare the embedded default models and serve them on tritonserver.

Commands:
    omni-triton prepare [--models piper,csm]
    omni-triton serve   [--models piper,csm] [--port 9000] [--triton-http-port 8000] ...
    omni-triton cluster [--replicas 2] [--frontends 2] [--models piper]  (docs/scaling.md)
    omni-triton models  (lists the models of the repositories and what they depend on)

``serve`` prepares what the models need, starts tritonserver with only those models, waits for
READY (printing the failing model and its errors instead of hanging), starts the OpenAI frontend,
and on SIGINT/SIGTERM (or when either process dies) stops both process groups.
"""
from __future__ import annotations

import argparse
import sys

from omni_triton.serve import on_demand
from omni_triton.serve.repository import available_models, dependencies

#: Every pipeline a client can call (``prepare``'s default; ``serve --on-demand all``).
PIPELINES = ("piper,csm,llm,llm_tts,qwen3_omni,qwen2_5_omni,qwen_image,qwen_image_edit,qwen_image_edit_plus,"
             "qwen_image_inpaint,wan_t2v,wan_i2v,qwen3_tts,whisper,pocketsphinx,stable_audio")
#: What ``serve`` loads at start and keeps loaded: Piper (the README's first example answers at
#: once, ~0.13 GiB). Every other pipeline loads on its first request (``--on-demand``, issue 28):
#: pinning ``llm`` too would keep vLLM's ~2.9 GiB and its idle worker (~2% of a core) resident and
#: miss the idle target of 3 GB (docs/notes/footprint-2026-12.md).
DEFAULT_MODELS = "piper"


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
    from omni_triton.serve.supervisor import run_serve

    return run_serve(args)


def cmd_cluster(args: argparse.Namespace) -> int:
    from omni_triton.serve.cluster import run_cluster

    return run_cluster(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omni-triton", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="write the embedded default model folders into the cache")
    p.add_argument("--models", default=PIPELINES, help="comma separated Triton model names")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("models", help="list the models of the repositories")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("serve", help="start tritonserver and the OpenAI frontend")
    p.add_argument("--models", default=DEFAULT_MODELS,
                   help="comma separated Triton model (or OpenAI model) names loaded at start and kept "
                        f"loaded (pinned); default {DEFAULT_MODELS}")
    on_demand.add_arguments(p, "all", "pipelines the frontend loads on their first request and unloads "
                            "when idle: comma separated names, 'all' (default: every pipeline not in "
                            f"--models: {PIPELINES}) or 'none'")
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

    from omni_triton.serve import cluster

    p = sub.add_parser("cluster", help="the scale-out set-up on one machine: PostgreSQL, N Triton replicas, "
                                       "M frontends (docs/scaling.md)")
    cluster.add_arguments(p)
    p.set_defaults(func=cmd_cluster)
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

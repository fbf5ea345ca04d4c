"""``python -m openai_frontend --triton-url localhost:8001 --host 127.0.0.1 --port 9000 [--models a,b]``"""

from __future__ import annotations

import argparse
import logging

import uvicorn

from .app import Settings, create_app
from .engine import TritonEngine


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m openai_frontend", description=__doc__)
    p.add_argument("--triton-url", default="localhost:8001", help="Triton gRPC host:port")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument(
        "--models",
        default=None,
        help="comma-separated Triton models to serve (default: every model in the repository "
        "index; /health then requires all of them READY)",
    )
    p.add_argument("--max-inflight", type=int, default=16, help="admitted speech requests; 429 beyond")
    p.add_argument("--default-max-input-chars", type=int, default=4096)
    p.add_argument("--max-body-bytes", type=int, default=16 << 20)
    p.add_argument("--rpc-timeout", type=float, default=5.0, help="seconds, Triton metadata calls")
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    engine = TritonEngine(args.triton_url, models=models, rpc_timeout_s=args.rpc_timeout)
    settings = Settings(
        max_inflight=args.max_inflight,
        default_max_input_chars=args.default_max_input_chars,
        max_body_bytes=args.max_body_bytes,
    )
    app = create_app(engine, settings)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower())


if __name__ == "__main__":
    main()

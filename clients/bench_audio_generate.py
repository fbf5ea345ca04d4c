"""Text-to-audio serving benchmark (Stable Audio Open): clips/s, latency percentiles, SLO attainment.

Run::

    python -m clients.bench_audio_generate --out bench_audio_generate.json
    python -m clients.bench_audio_generate --seconds 2 --steps 8 --concurrency 1,4 --requests 8
    python -m clients.bench_audio_generate --frontend-url http://127.0.0.1:9000   # a running server

Two paths, one after the other (they share the CPU cores, never overlapping):

``inprocess``
    the plain diffusers ``StableAudioPipeline.__call__`` (``output_type="np"``) on the same
    prepared weights plus the same WAV encode (``openai_frontend.serving.audio_generate.encode_clip``)
    in ``C`` worker processes (:class:`clients.proc_pool.ProcessPool`, one torch thread each, one
    request at a time each): the same parallelism as the served level ``C``. No Triton, no stage
    split, no batching.
``frontend``
    the user path: ``POST /v1/audio/generate`` (WAV) on ``stable_audio``, a closed loop of ``C``
    threads (each sends its next request when its previous clip was read). Latency: request sent
    -> last byte of the WAV read.

Unless ``--frontend-url`` is given, the benchmark starts its own tritonserver (``stable_audio``
and its stages) and frontend on free ports after the in-process phase and always stops them.
Request ``i`` uses prompt ``PROMPTS[i % len]``, the negative prompt ``NEGATIVE`` and seed ``i``;
all requests have the same length, steps and guidance (batch-compatible).

Metrics per level (over successful requests): ``latency_ms`` (``mean``, ``p50``, ``p90``,
``p99``, ``min``, ``max``), ``requests_per_s`` (clips/s), ``slo_attainment`` (fraction done
within ``--slo-ms``; failures are misses) and, for the frontend, ``denoiser_mean_batch``
(requests / executions of ``stable_audio_denoiser`` in Triton's metrics). Ratios:
``serving_overhead_latency_p50`` (frontend C=1 / in-process C=1), ``batching_gain_throughput``
(frontend at the highest C / frontend C=1) and ``throughput_vs_inprocess`` per level. No timing
is asserted anywhere.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

from clients.bench_common import (  # noqa: E402
    Result,
    closed_loop,
    format_level_table,
    git_commit,
    machine_info,
    measure_level,
    metric_sum,
    parse_concurrency,
    serving_ratios,
    stop_all_on_sigterm,
)

MODEL = "stable_audio"
DENOISER = "stable_audio_denoiser"
ASSET = "stable-audio-open-tiny"
PROMPTS = ("The sound of a cat purring", "A dog barking in the distance", "Rain on a tin roof at night",
           "Ocean waves crash on a rocky shore")
NEGATIVE = "Low quality."


def call_worker(seconds: float, steps: int, guidance: float):
    """Worker of path ``inprocess`` (one process of a :class:`clients.proc_pool.ProcessPool`):
    loads the pipeline once; ``handle(i)`` runs the plain diffusers ``__call__`` for request ``i``
    and encodes the WAV, as the frontend does. Returns the WAV's size in bytes."""
    import warnings

    import torch

    from omni_triton.checkpoints.stable_audio import checkpoint_dir
    from omni_triton.media.audio import get_format
    from omni_triton.stages.stable_audio import load_pipeline, reference_audio
    from openai_frontend.serving.audio_generate import encode_clip

    warnings.filterwarnings("ignore", message="Should have", category=UserWarning)  # torchsde's ulp warning
    torch.set_num_threads(1)
    pipe = load_pipeline(checkpoint_dir(ASSET))
    fmt = get_format("wav")
    rate = int(pipe.vae.config.sampling_rate)

    def handle(i: int) -> int:
        audio = reference_audio(pipe, PROMPTS[i % len(PROMPTS)], audio_end_s=seconds, steps=steps, seed=i,
                                negative_prompt=NEGATIVE, guidance_scale=guidance)
        return len(encode_clip(audio, rate, fmt))

    return handle


def pool_run_one(pool, timeout_s: float) -> Callable[[int], Result]:
    def run_one(i: int) -> Result:
        t = time.perf_counter()
        try:
            pool.call(i, timeout_s=timeout_s)
        except Exception as exc:  # a worker error is one failed request
            return Result(i, error=f"{type(exc).__name__}: {exc}")
        return Result(i, time.perf_counter() - t)

    return run_one


def frontend_run_one(http, url: str, seconds: float, steps: int, guidance: float) -> Callable[[int], Result]:
    """One request through ``POST /v1/audio/generate`` (WAV), timed to the last byte."""
    def run_one(i: int) -> Result:
        t = time.perf_counter()
        r = http.post(f"{url}/v1/audio/generate", json={
            "model": MODEL, "input": PROMPTS[i % len(PROMPTS)], "negative_prompt": NEGATIVE, "audio_length": seconds,
            "num_inference_steps": steps, "guidance_scale": guidance, "seed": i, "response_format": "wav"})
        if r.status_code != 200 or not r.content:
            return Result(i, error=f"{r.status_code}: {r.text[:200]}")
        return Result(i, time.perf_counter() - t)

    return run_one


def ratios(results: dict) -> dict:
    """``bench_common.serving_ratios`` of the ``inprocess`` and ``frontend`` paths."""
    return serving_ratios(results.get("inprocess", {}), results.get("frontend", {}))


def format_table(results: dict) -> str:
    return format_level_table(results, "clips", 10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench_audio_generate.json", help="JSON output file")
    p.add_argument("--seconds", type=float, default=2.0, help="length of every clip (s)")
    p.add_argument("--steps", type=int, default=8, help="denoising steps of every clip")
    p.add_argument("--guidance-scale", type=float, default=7.0, help="> 1: CFG on (two DiT passes per step)")
    p.add_argument("--concurrency", default="1,4", help="levels, comma separated (both paths)")
    p.add_argument("--requests", type=int, default=8, help="requests per level (>= concurrency)")
    p.add_argument("--warmup", type=int, default=1, help="untimed requests per level")
    p.add_argument("--slo-ms", type=float, default=2000.0, help="latency SLO, milliseconds")
    p.add_argument("--paths", default="inprocess,frontend")
    p.add_argument("--frontend-url", help="use this running frontend (no own stack)")
    p.add_argument("--metrics-url", help="Triton metrics URL of that running server (for the mean batch)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    p.add_argument("--ready-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    levels = parse_concurrency(args.concurrency)
    paths = [x.strip() for x in args.paths.split(",") if x.strip()]
    shape = (args.seconds, args.steps, args.guidance_scale)
    started = stop_all_on_sigterm()
    t0 = time.perf_counter()
    results: dict = {}
    error = None
    metrics_url = {"url": args.metrics_url}

    def denoiser_counts():
        import httpx

        text = httpx.get(metrics_url["url"], timeout=10).text
        return (metric_sum(text, "nv_inference_request_success", DENOISER),
                metric_sum(text, "nv_inference_exec_count", DENOISER))

    def run_level(path: str, c: int, run_one: Callable[[int], Result], counts=None) -> None:
        for i in range(args.warmup):
            run_one(10_000 + i)
        n, s = measure_level(closed_loop, run_one, c, args.requests, args.slo_ms, counts)
        results.setdefault(path, {})[str(c)] = s
        print(f"  {path:<10} C={c} n={n} ok={s['ok']} {s['requests_per_s']} clips/s "
              f"p50 {s['latency_ms']['p50']} ms p99 {s['latency_ms']['p99']} ms", flush=True)

    stack: dict = {"own_stack": not args.frontend_url}
    try:
        if "inprocess" in paths:
            from clients.proc_pool import ProcessPool
            from omni_triton.checkpoints.stable_audio import checkpoint_dir

            checkpoint_dir(ASSET)
            print("in-process diffusers StableAudioPipeline.__call__ + WAV encode", flush=True)
            for c in levels:
                with ProcessPool(c, call_worker, shape) as pool:
                    run_level("inprocess", c, pool_run_one(pool, args.timeout))
        if "frontend" in paths:
            url = args.frontend_url
            if not url:
                from omni_triton.paths import cache_dir
                from omni_triton.serve.process import free_port
                from omni_triton.serve.server import Frontend, TritonServer

                logs = cache_dir() / "logs"
                tag = f"bench-audio-generate-{os.getpid()}"
                t = time.perf_counter()
                server = TritonServer([MODEL], http_port=free_port(), grpc_port=free_port(),
                                      metrics_port=free_port(), log_path=logs / f"{tag}-tritonserver.log")
                started.append(server)
                server.start()
                server.wait_ready(timeout=args.ready_timeout)
                frontend = Frontend(server.grpc_url, port=free_port(), models=[MODEL],
                                    log_path=logs / f"{tag}-frontend.log", admin_key=server.admin_key)
                started.append(frontend)
                frontend.start()
                frontend.wait_ready()
                url = frontend.url
                metrics_url["url"] = f"http://127.0.0.1:{server.metrics_port}/metrics"
                stack.update(ready_s=round(time.perf_counter() - t, 2), models=server.models)
            import httpx

            print(f"OpenAI frontend {url}", flush=True)
            with httpx.Client(timeout=httpx.Timeout(args.timeout, connect=10.0),
                              limits=httpx.Limits(max_connections=max(levels) + 2)) as http:
                for c in levels:
                    run_level("frontend", c, frontend_run_one(http, url, *shape),
                              denoiser_counts if metrics_url["url"] else None)
    except Exception as exc:  # keep what was measured; report the failure
        error = f"{type(exc).__name__}: {exc}"
        print(f"error: {error}", file=sys.stderr)
    finally:
        for proc in reversed(started):
            proc.stop()

    rat = ratios(results)
    report = {
        "config": {
            "command": " ".join([Path(sys.executable).name, "-m", "clients.bench_audio_generate",
                                 *(argv if argv is not None else sys.argv[1:])]),
            "model": MODEL, "asset": ASSET, "seconds": args.seconds, "steps": args.steps,
            "guidance_scale": args.guidance_scale, "negative_prompt": NEGATIVE, "concurrency": levels,
            "requests_per_level": args.requests, "warmup": args.warmup, "slo_ms": args.slo_ms,
            "prompts": list(PROMPTS), "seed": "request index",
            "load_pattern": "closed loop: C threads, each sends its next request when its previous clip was read",
            "machine": machine_info(), "git_commit": git_commit(), "stack": stack,
            "notes": ["inprocess: StableAudioPipeline.__call__ + WAV encode in C worker processes (one torch "
                      "thread each, one request at a time each), no batching",
                      "frontend: POST /v1/audio/generate (WAV); Triton stages one instance each, one torch thread "
                      "each; the denoiser batches compatible requests",
                      "tiny random-weight checkpoint: fixed per-request costs weigh more than with real weights"],
        },
        "results": results, "ratios": rat, "wall_s": round(time.perf_counter() - t0, 2), "error": error,
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    print()
    print(format_table(results))
    print(json.dumps(rat))
    print(f"\nwrote {args.out}; total wall time {report['wall_s']:.1f} s")
    return 1 if error else 0


if __name__ == "__main__":
    raise SystemExit(main())

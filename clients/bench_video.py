"""Video-generation serving benchmark: jobs/s, latency percentiles and SLO attainment.

Run::

    python -m clients.bench_video --out bench_video.json
    python -m clients.bench_video --size 64x64 --frames 17 --steps 8 --concurrency 1,4 --requests 8
    python -m clients.bench_video --frontend-url http://127.0.0.1:9000   # a running server

Two paths, one after the other (they share the CPU cores, never overlapping):

``inprocess``
    the plain diffusers ``WanPipeline.__call__`` (``output_type="np"``) on the same prepared
    weights plus the same MP4 encode (``omni_triton.media.video.encode_mp4``) in this process, at
    every ``--concurrency`` level: ``C`` threads, each with its own pipeline object (a pipeline
    keeps per-call state, so threads cannot share one), one torch thread for the process. No
    Triton, no stage split, no batching.
``frontend``
    the user path: ``POST /v1/videos`` (a job), ``GET /v1/videos/{id}`` every 20 ms until it is
    completed, then ``GET /v1/videos/{id}/content``; a closed loop of ``C`` threads (each starts
    its next job when its previous one was downloaded). Latency: create sent -> MP4 read.

``inprocess_i2v`` / ``frontend_i2v``
    the same two paths for image-to-video: ``WanImageToVideoPipeline.__call__(image=...)`` on the
    prepared ``wan2.2-i2v-tiny``, and ``POST /v1/videos`` on ``wan_i2v`` with the same image as
    ``input_reference`` (a PNG upload of the video's size; job ``i`` gets image ``i``).

Unless ``--frontend-url`` is given, the benchmark starts its own tritonserver (``wan_t2v``,
``wan_i2v`` when an I2V path runs, and their stages) and frontend (video store in a temporary
folder) on free ports after the in-process
phase and always stops them. Job ``i`` uses prompt ``PROMPTS[i % len]`` and seed ``i``; all jobs
have the same size, frames, steps and guidance (batch-compatible).

Metrics per level (over successful jobs): ``latency_ms`` (``mean``, ``p50``, ``p90``, ``p99``,
``min``, ``max``), ``requests_per_s`` (= jobs/s: successful jobs / wall seconds of the level),
``slo_attainment`` (fraction of all jobs done within ``--slo-ms``; failures are misses) and, for
the frontend with its own stack or ``--metrics-url``, ``denoiser_mean_batch`` (requests /
executions of ``wan_t2v_denoiser`` / ``wan_i2v_denoiser`` in Triton's metrics).

Ratios: ``serving_overhead_latency_p50`` (frontend C=1 / in-process C=1), ``batching_gain_throughput``
(frontend at the highest C / frontend C=1 jobs/s) and ``throughput_vs_inprocess`` per level
(frontend / in-process jobs/s at equal concurrency); the same under ``i2v`` for the image-to-video
paths. No timing is asserted anywhere.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

from clients.bench_common import (  # noqa: E402
    InstancePool,
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

MODEL = "wan_t2v"
DENOISER = "wan_t2v_denoiser"
ASSET = "wan2.2-t2v-tiny"
I2V_MODEL = "wan_i2v"
I2V_DENOISER = "wan_i2v_denoiser"
I2V_ASSET = "wan2.2-i2v-tiny"
PROMPTS = ("a cat walks on the grass", "a red fox runs through the snow at golden hour",
           "waves crash on a rocky shore at sunset", "fireworks over a city skyline at night")
FPS = 8


def inprocess_run_one(width: int, height: int, frames: int, steps: int, guidance: float,
                      concurrency: int) -> Callable[[int], Result]:
    """Plain ``WanPipeline.__call__`` + MP4 encode; one pipeline object per concurrent thread."""
    import torch

    from omni_triton.checkpoints.wan import checkpoint_dir
    from omni_triton.media.video import encode_mp4
    from omni_triton.stages.wan import load_pipeline, reference_frames

    torch.set_num_threads(1)
    pool = InstancePool([load_pipeline(checkpoint_dir(ASSET)) for _ in range(concurrency)])

    def run_one(i: int) -> Result:
        t = time.perf_counter()
        with pool.take() as pipe:
            video = reference_frames(pipe, PROMPTS[i % len(PROMPTS)], height=height, width=width, num_frames=frames,
                                     steps=steps, seed=i, negative_prompt="", guidance_scale=guidance)
        encode_mp4(video, FPS)
        return Result(i, time.perf_counter() - t)

    return run_one


def reference_image(i: int, width: int, height: int):
    """The reference frame of I2V job ``i``: ``uint8 [height, width, 3]``, a colour gradient
    turned by ``i`` plus seeded noise."""
    import numpy as np

    y, x = np.mgrid[0:height, 0:width]
    a = (i % 8) * np.pi / 4
    ramp = (np.cos(a) * x / width + np.sin(a) * y / height + 1) * 127
    base = np.stack([ramp, 255 - ramp, np.full_like(ramp, 96)], axis=-1)
    noise = np.random.default_rng(i).normal(0, 16, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def inprocess_i2v_run_one(width: int, height: int, frames: int, steps: int, guidance: float,
                          concurrency: int) -> Callable[[int], Result]:
    """Plain ``WanImageToVideoPipeline.__call__(image=...)`` + MP4 encode; one pipeline per thread."""
    import torch
    from PIL import Image

    from omni_triton.checkpoints.wan import checkpoint_dir
    from omni_triton.media.video import encode_mp4
    from omni_triton.stages.wan import load_pipeline, reference_i2v_frames

    torch.set_num_threads(1)
    pool = InstancePool([load_pipeline(checkpoint_dir(I2V_ASSET)) for _ in range(concurrency)])

    def run_one(i: int) -> Result:
        image = Image.fromarray(reference_image(i, width, height))
        t = time.perf_counter()
        with pool.take() as pipe:
            video = reference_i2v_frames(pipe, image, PROMPTS[i % len(PROMPTS)], height=height, width=width,
                                         num_frames=frames, steps=steps, seed=i, negative_prompt="",
                                         guidance_scale=guidance)
        encode_mp4(video, FPS)
        return Result(i, time.perf_counter() - t)

    return run_one


def frontend_run_one(http, url: str, width: int, height: int, frames: int, steps: int, guidance: float,
                     timeout_s: float, model: str = MODEL) -> Callable[[int], Result]:
    """One job through ``/v1/videos``: create, poll, download. ``model`` ``wan_i2v``: job ``i``
    uploads :func:`reference_image` ``(i)`` as ``input_reference`` (PNG)."""
    from omni_triton.media.image import encode_image

    def run_one(i: int) -> Result:
        files = None
        if model == I2V_MODEL:
            files = {"input_reference": (f"{i}.png", encode_image(reference_image(i, width, height)).data,
                                         "image/png")}
        t = time.perf_counter()
        r = http.post(f"{url}/v1/videos", data={
            "model": model, "prompt": PROMPTS[i % len(PROMPTS)], "size": f"{width}x{height}",
            "num_frames": str(frames), "fps": str(FPS), "num_inference_steps": str(steps),
            "guidance_scale": str(guidance), "seed": str(i)}, files=files)
        if r.status_code != 200:
            return Result(i, error=f"create {r.status_code}: {r.text[:200]}")
        vid = r.json()["id"]
        while True:
            job = http.get(f"{url}/v1/videos/{vid}").json()
            if job["status"] == "completed":
                break
            if job["status"] not in ("queued", "in_progress"):
                return Result(i, error=f"{job['status']}: {job.get('error')}")
            if time.perf_counter() - t > timeout_s:
                return Result(i, error="timeout")
            time.sleep(0.02)
        content = http.get(f"{url}/v1/videos/{vid}/content")
        if content.status_code != 200 or not content.content:
            return Result(i, error=f"content {content.status_code}")
        latency = time.perf_counter() - t
        http.delete(f"{url}/v1/videos/{vid}")
        return Result(i, latency)

    return run_one


def ratios(results: dict) -> dict:
    """Text-to-video ratios at the top level, image-to-video ones under ``i2v`` (when measured)."""
    out = serving_ratios(results.get("inprocess", {}), results.get("frontend", {}))
    if results.get("inprocess_i2v") or results.get("frontend_i2v"):
        out["i2v"] = serving_ratios(results.get("inprocess_i2v", {}), results.get("frontend_i2v", {}))
    return out


def format_table(results: dict) -> str:
    return format_level_table(results, "jobs", 14)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench_video.json", help="JSON output file")
    p.add_argument("--size", default="64x64", help="WIDTHxHEIGHT of every video")
    p.add_argument("--frames", type=int, default=17, help="frames of every video (4k+1)")
    p.add_argument("--steps", type=int, default=8, help="denoising steps of every video")
    p.add_argument("--guidance-scale", type=float, default=4.0, help="> 1: CFG on (two DiT passes per step)")
    p.add_argument("--concurrency", default="1,4", help="levels, comma separated (both paths)")
    p.add_argument("--requests", type=int, default=8, help="jobs per level (>= concurrency)")
    p.add_argument("--warmup", type=int, default=1, help="untimed jobs per path")
    p.add_argument("--slo-ms", type=float, default=5000.0, help="latency SLO, milliseconds")
    p.add_argument("--paths", default="inprocess,frontend,inprocess_i2v,frontend_i2v")
    p.add_argument("--frontend-url", help="use this running frontend (no own stack)")
    p.add_argument("--metrics-url", help="Triton metrics URL of that running server (for the mean batch)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    p.add_argument("--ready-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    width, height = (int(v) for v in args.size.lower().split("x"))
    levels = parse_concurrency(args.concurrency)
    paths = [x.strip() for x in args.paths.split(",") if x.strip()]
    started = stop_all_on_sigterm()
    t0 = time.perf_counter()
    results: dict = {}
    error = None
    metrics_url = {"url": args.metrics_url}
    shape = (width, height, args.frames, args.steps, args.guidance_scale)

    def denoiser_counts(denoiser: str = DENOISER):
        if not metrics_url["url"]:
            return None
        import httpx

        text = httpx.get(metrics_url["url"], timeout=10).text
        return (metric_sum(text, "nv_inference_request_success", denoiser),
                metric_sum(text, "nv_inference_exec_count", denoiser))

    def run_path(path: str, make_run_one: Callable[[int], Callable[[int], Result]]):
        counts = None
        if path.startswith("frontend"):
            denoiser = I2V_DENOISER if path.endswith("_i2v") else DENOISER
            counts = lambda: denoiser_counts(denoiser)  # noqa: E731
        for c in levels:
            run_one = make_run_one(c)
            for i in range(args.warmup):
                run_one(10_000 + i)
            n, s = measure_level(closed_loop, run_one, c, args.requests, args.slo_ms, counts)
            results.setdefault(path, {})[str(c)] = s
            print(f"  {path:<14} C={c} n={n} ok={s['ok']} {s['requests_per_s']} jobs/s "
                  f"p50 {s['latency_ms']['p50']} ms p99 {s['latency_ms']['p99']} ms", flush=True)

    stack: dict = {"own_stack": not args.frontend_url}
    try:
        if "inprocess" in paths:
            print("in-process diffusers WanPipeline.__call__ + MP4 encode", flush=True)
            run_path("inprocess", lambda c: inprocess_run_one(*shape, c))
        if "inprocess_i2v" in paths:
            print("in-process diffusers WanImageToVideoPipeline.__call__ + MP4 encode", flush=True)
            run_path("inprocess_i2v", lambda c: inprocess_i2v_run_one(*shape, c))
        if "frontend" in paths or "frontend_i2v" in paths:
            models = [m for m, want in ((MODEL, "frontend" in paths), (I2V_MODEL, "frontend_i2v" in paths)) if want]
            url = args.frontend_url
            if not url:
                from omni_triton.paths import cache_dir
                from omni_triton.serve.process import free_port
                from omni_triton.serve.server import Frontend, TritonServer

                logs = cache_dir() / "logs"
                tag = f"bench-video-{os.getpid()}"
                store = tempfile.mkdtemp(prefix="bench-video-")
                t = time.perf_counter()
                server = TritonServer(models, http_port=free_port(), grpc_port=free_port(),
                                      metrics_port=free_port(), log_path=logs / f"{tag}-tritonserver.log")
                started.append(server)
                server.start()
                server.wait_ready(timeout=args.ready_timeout)
                frontend = Frontend(server.grpc_url, port=free_port(), models=models,
                                    log_path=logs / f"{tag}-frontend.log", admin_key=server.admin_key,
                                    extra_args=[f"--video-storage-dir={store}",
                                                f"--video-max-queued={max(levels) * 2}",
                                                f"--video-max-running={max(levels)}"])
                started.append(frontend)
                frontend.start()
                frontend.wait_ready()
                url = frontend.url
                metrics_url["url"] = f"http://127.0.0.1:{server.metrics_port}/metrics"
                stack.update(ready_s=round(time.perf_counter() - t, 2), models=server.models, video_store=store)
            import httpx

            print(f"OpenAI frontend {url}", flush=True)
            with httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0),
                              limits=httpx.Limits(max_connections=max(levels) + 2)) as http:
                if "frontend" in paths:
                    run_path("frontend", lambda c: frontend_run_one(http, url, *shape, args.timeout))
                if "frontend_i2v" in paths:
                    run_path("frontend_i2v", lambda c: frontend_run_one(http, url, *shape, args.timeout, I2V_MODEL))
    except Exception as exc:  # keep what was measured; report the failure
        error = f"{type(exc).__name__}: {exc}"
        print(f"error: {error}", file=sys.stderr)
    finally:
        for proc in reversed(started):
            proc.stop()

    rat = ratios(results)
    report = {
        "config": {
            "command": " ".join([Path(sys.executable).name, "-m", "clients.bench_video",
                                 *(argv if argv is not None else sys.argv[1:])]),
            "model": MODEL, "asset": ASSET, "i2v_model": I2V_MODEL, "i2v_asset": I2V_ASSET,
            "size": f"{width}x{height}", "frames": args.frames, "fps": FPS,
            "steps": args.steps, "guidance_scale": args.guidance_scale, "concurrency": levels,
            "requests_per_level": args.requests, "warmup": args.warmup, "slo_ms": args.slo_ms,
            "prompts": list(PROMPTS), "seed": "job index",
            "load_pattern": "closed loop: C threads, each starts its next job when the previous was downloaded",
            "machine": machine_info(), "git_commit": git_commit(), "stack": stack,
            "notes": ["inprocess: WanPipeline.__call__ + MP4 encode, C threads with one pipeline each, "
                      "one torch thread for the process, no batching",
                      "frontend: create + poll (20 ms) + download; Triton stages one instance each, one "
                      "torch thread each; the denoiser batches compatible jobs",
                      "tiny random-weight checkpoint: fixed per-job costs weigh more than with real weights",
                      "*_i2v: the same for image-to-video (WanImageToVideoPipeline / wan_i2v), job i with "
                      "reference image i (a PNG upload of the video's size)"],
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

"""Image-generation serving benchmark: throughput, latency percentiles and SLO attainment.

Run::

    python -m clients.bench_diffusion --out bench_diffusion.json
    python -m clients.bench_diffusion --size 128x128 --steps 4 --concurrency 1,4 --requests 16
    python -m clients.bench_diffusion --frontend-url http://127.0.0.1:9000   # a running server
    python -m clients.bench_diffusion --pipeline qwen_image_edit_plus --quick --out bench_edit_plus.json

``--pipeline`` picks what is measured (:data:`PIPELINES`): ``qwen_image`` (text-to-image,
``POST /v1/images/generations``, default) or ``qwen_image_edit_plus`` (multi-image edit,
``QwenImageEditPlusPipeline``: every request edits the same two condition images,
:data:`CONDITION_SIZES`, sent as two ``image[]`` parts of ``POST /v1/images/edits``; the peer is
``QwenImageEditPlusPipeline.__call__`` with ``image=[a, b]``, the stage split adds the VAE encoder).

In the spirit of vLLM-Omni's diffusion serving benchmark. Two paths, one after the other (they
share the CPU cores, never overlapping):

``inprocess_call``
    the real peer: the plain diffusers ``QwenImagePipeline.__call__`` (+ PNG encode) on the same
    prepared weights (``omni_triton.stages.qwen_image.reference_images``) in as many worker
    processes as the served ensemble computes in (text encoder + denoiser + VAE decoder
    instances, :func:`served_processes`; ``--processes`` overrides), one torch thread each
    (``clients.proc_pool``: one request at a time per process, the next one waits as in a server's
    queue), at every ``--concurrency`` level: the baseline without Triton, without the stage split
    and without batching, with the served parallelism.
``inprocess``
    the served stage split in this process (text encoder -> denoiser -> VAE decoder functions
    of ``omni_triton.stages.qwen_image``) at ``C=1`` only: what one request costs without Triton
    (IPC, scheduling) when alone. It is not run at higher levels: its threads would share one GIL
    while the served stages are separate processes.
``frontend``
    the user path: ``POST /v1/images/generations`` (``n=1``, PNG, ``b64_json``) on the OpenAI
    frontend over the ``qwen_image`` ensemble, from a closed loop of ``C`` threads (each sends
    its next request when its previous one ended), at each ``--concurrency`` level.

Unless ``--frontend-url`` is given, the benchmark starts its own tritonserver (the ensemble and
its stages) and frontend on free ports after the in-process phase and always stops them.
Every request ``i`` uses prompt ``PROMPTS[i % len]`` and seed ``i``; all use the same size and
steps (so all are batch-compatible), no negative prompt (CFG off). This process uses one torch
thread, as each Triton stub does.

Metrics (per level, over successful requests):

- ``latency_ms``: ``mean``, ``p50``, ``p90``, ``p99`` (linear interpolation between closest
  ranks, numpy's default), ``min``, ``max``; milliseconds from request sent to response read
  (in-process: the ``__call__`` including PNG encoding, as the frontend encodes PNG too).
- ``requests_per_s`` (= images per second): successful requests / ``wall_s``, the wall-clock
  seconds from the first request sent to the last one finished.
- ``slo_attainment``: fraction of all requests (failed ones count as misses) that succeeded
  within ``--slo-ms``.
- ``denoise_s_mean`` (frontend): mean of ``usage.denoise_seconds`` (the denoiser call's wall time).
- ``denoiser_mean_batch`` (frontend, own stack or ``--metrics-url``): requests / executions of
  ``qwen_image_denoiser`` during the level, from Triton's metrics (``nv_inference_request_success``,
  ``nv_inference_exec_count``): how many images one DiT batch carried on average. It separates
  the gain of batching from that of pipelining (text encoder, denoiser and VAE decoder run in
  separate processes, so different requests' stages also overlap).

Ratios (``ratios``):

- ``serving_overhead_latency_p50`` (and ``_mean``): frontend ``C=1`` latency / in-process
  stage split ``C=1`` (> 1: what Triton + frontend cost per request when alone);
- ``latency_p50_vs_diffusers_call``: frontend ``C=1`` p50 / plain ``__call__`` p50;
- ``batching_gain_throughput``: frontend at the highest ``C`` / frontend ``C=1`` requests/s
  (> 1: concurrent requests batched by Triton's dynamic batchers served faster);
- ``throughput_vs_diffusers_call`` and ``latency_p50_vs_diffusers_call_by_level`` per level:
  frontend / ``__call__`` in processes at the same concurrency (throughput > 1: batching and
  pipelining outweigh the serving overhead at equal parallelism);
- ``throughput_vs_inprocess`` per level where the stage split ran (``C=1``).

No timing is asserted anywhere: this is a benchmark, not a test.
"""
# ruff: noqa: E402 - the thread-count variables are set before any import that starts a pool
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before torch/numpy start their pools; as the stubs get

import argparse
import base64
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clients.bench_common import (  # noqa: F401 - Result/summarize/metric_sum re-exported
    Result,
    closed_loop,
    git_commit,
    instance_count,
    machine_info,
    measure_level,
    metric_sum,
    parse_concurrency,
    ratio,
    stop_all_on_sigterm,
    summarize,
)

MODEL = "qwen_image"
ASSET = "qwen-image-tiny"
PROMPTS = ("a red fox in the snow, golden hour", "a lighthouse on a cliff at night",
           "a bowl of fruit on a wooden table", "a cat wearing a hat")
EDIT_PROMPTS = ("put the cat of picture 1 on the sofa of picture 2", "make picture 1 look like picture 2",
                "add a rainbow", "a watercolor painting of both pictures")
#: (width, height) of the multi-image edit's condition images (random pixels, seeds 1 and 2)
CONDITION_SIZES = ((64, 48), (48, 64))


@dataclass(frozen=True)
class BenchPipeline:
    """What one ``--pipeline`` measures: the ensemble, its prepared asset, its stage models (in
    order), the prompts, and the (width, height) of the condition images every request sends
    (empty: text-to-image)."""

    model: str
    asset: str
    stages: tuple[str, ...]
    prompts: tuple[str, ...]
    condition_sizes: tuple[tuple[int, int], ...] = ()

    def condition_pixels(self) -> list:
        """The condition images, ``uint8 [h, w, 3]`` each (deterministic)."""
        import numpy as np

        return [np.random.default_rng(k + 1).integers(0, 256, (h, w, 3), dtype=np.uint8)
                for k, (w, h) in enumerate(self.condition_sizes)]


PIPELINES = {
    "qwen_image": BenchPipeline(MODEL, ASSET, ("qwen_image_text_encoder", "qwen_image_denoiser",
                                               "qwen_image_vae_decoder"), PROMPTS),
    "qwen_image_edit_plus": BenchPipeline(
        "qwen_image_edit_plus", "qwen-image-edit-plus-tiny",
        ("qwen_image_edit_plus_vae_encoder", "qwen_image_edit_plus_text_encoder", "qwen_image_edit_plus_denoiser",
         "qwen_image_edit_plus_vae_decoder"), EDIT_PROMPTS, CONDITION_SIZES),
}


def ratios(results: dict) -> dict:
    """The ratios of the module docstring from ``{"inprocess": {"1": ...}, "frontend": {...},
    "inprocess_call": {"1": ...}}``."""
    out: dict = {}
    inproc = results.get("inprocess", {})
    base = inproc.get("1")
    call = results.get("inprocess_call", {}).get("1")
    front = results.get("frontend", {})
    levels = sorted(front, key=int)
    if base and "1" in front:
        out["serving_overhead_latency_p50"] = ratio(front["1"]["latency_ms"]["p50"], base["latency_ms"]["p50"])
        out["serving_overhead_latency_mean"] = ratio(front["1"]["latency_ms"]["mean"], base["latency_ms"]["mean"])
    if call and "1" in front:
        out["latency_p50_vs_diffusers_call"] = ratio(front["1"]["latency_ms"]["p50"], call["latency_ms"]["p50"])
    if "1" in front and levels:
        top = levels[-1]
        out["batching_gain_throughput"] = ratio(front[top]["requests_per_s"], front["1"]["requests_per_s"])
        out["batching_gain_at_concurrency"] = int(top)
    if inproc:
        out["throughput_vs_inprocess"] = {c: ratio(front[c]["requests_per_s"], inproc[c]["requests_per_s"])
                                          for c in levels if c in inproc}
    calls = results.get("inprocess_call", {})
    if calls:  # same concurrency and the served process count on both sides
        out["throughput_vs_diffusers_call"] = {c: ratio(front[c]["requests_per_s"], calls[c]["requests_per_s"])
                                               for c in levels if c in calls}
        out["latency_p50_vs_diffusers_call_by_level"] = {
            c: ratio(front[c]["latency_ms"]["p50"], calls[c]["latency_ms"]["p50"]) for c in levels if c in calls}
    return out


def run_level(run_one: Callable[[int], Result], concurrency: int, n: int) -> tuple[list[Result], float]:
    """``n`` requests from a closed loop of ``concurrency`` threads; returns results and wall s."""
    return closed_loop(run_one, concurrency, n)


def _load_pipeline(asset: str = ASSET):
    import torch

    from omni_triton.paths import model_dir
    from omni_triton.stages.qwen_image import load_pipeline

    torch.set_num_threads(1)
    return load_pipeline(model_dir(asset))


STAGES = PIPELINES["qwen_image"].stages


def served_processes(pipeline: str = "qwen_image") -> int:
    """Processes that compute in the served ensemble ``pipeline``: the instances of its stages
    (each a Triton Python stub with one torch thread), from the model repository."""
    return sum(instance_count(m) for m in PIPELINES[pipeline].stages)


def _pil(pixels_list: list) -> list:
    from PIL import Image

    return [Image.fromarray(p, "RGB") for p in pixels_list]


def call_worker(width: int, height: int, steps: int, pipeline: str = "qwen_image"):
    """Worker of path ``inprocess_call`` (one process of a :class:`clients.proc_pool.ProcessPool`):
    loads the pipeline once; ``handle(i)`` runs the plain diffusers ``__call__`` for request ``i``
    (prompt ``prompts[i % len]``, seed ``i``, the condition images as ``image=[...]`` for an
    edit) and encodes the PNG, as the frontend does."""
    from omni_triton.media.image import encode_image
    from omni_triton.stages.qwen_image import reference_images

    spec = PIPELINES[pipeline]
    pipe = _load_pipeline(spec.asset)
    extra = {"image": _pil(spec.condition_pixels())} if spec.condition_sizes else {}

    def handle(i: int) -> int:
        pixels = reference_images(pipe, spec.prompts[i % len(spec.prompts)], height=height, width=width,
                                  steps=steps, seed=i, **extra)
        return len(encode_image(pixels, "png").data)

    return handle


def call_run_one(pool, timeout_s: float) -> Callable[[int], Result]:
    """Request ``i`` on the ``__call__`` worker processes (path ``inprocess_call``), timed here."""
    def run_one(i: int) -> Result:
        t = time.perf_counter()
        try:
            pool.call(i, timeout_s=timeout_s)
            return Result(i, time.perf_counter() - t)
        except Exception as exc:
            return Result(i, error=f"{type(exc).__name__}: {exc}")

    return run_one


def inprocess_run_one(width: int, height: int, steps: int, pipeline: str = "qwen_image") -> Callable[[int], Result]:
    """The served stage split in this process (path ``inprocess``): (VAE encoder ->) text encoder
    -> denoiser -> VAE decoder of ``omni_triton.stages.qwen_image`` on one pipeline, with one lock
    per stage, i.e. one instance per stage as the served stages have: concurrent requests overlap
    in different stages as they do in Triton, without dynamic batching and without Triton. The
    edit's latents go through the packed form the stages exchange."""
    from omni_triton.media.image import encode_image
    from omni_triton.stages import qwen_image as d

    spec = PIPELINES[pipeline]
    pipe = _load_pipeline(spec.asset)
    images = _pil(spec.condition_pixels())
    text_lock, denoise_lock, vae_lock, enc_lock = (threading.Lock() for _ in range(4))

    def run_one(i: int) -> Result:
        t = time.perf_counter()
        try:
            latents = conds = None
            if images:
                with enc_lock:
                    packed = d.pack_image_latents(pipe, d.vae_encode(pipe, images))
                    latents = d.unpack_image_latents(pipe, packed, [im.size for im in images])
                conds = [[d.condition_image(pipe, im)[0] for im in images]]
            with text_lock:
                embeds = d.encode_prompts(pipe, [spec.prompts[i % len(spec.prompts)]], conds)[0]
            item = d.DenoiseItem(embeds, height, width, steps, i, None)  # no negative prompt: CFG off
            if images:
                item.image, item.image_latents = list(images), latents
            with denoise_lock:
                latents = d.denoise(pipe, [item])[0].latents
            with vae_lock:
                pixels = d.vae_decode(pipe, [latents], [(height, width)])[0]
            encode_image(pixels, "png")
            return Result(i, time.perf_counter() - t)
        except Exception as exc:
            return Result(i, error=f"{type(exc).__name__}: {exc}")

    return run_one


def frontend_run_one(http, url: str, width: int, height: int, steps: int,
                     pipeline: str = "qwen_image") -> Callable[[int], Result]:
    """Request ``i`` through the OpenAI frontend: ``/v1/images/generations`` (JSON), or for an
    edit ``/v1/images/edits`` with the condition images as ``image[]`` PNG parts (the OpenAI
    SDK's field name for a list), encoded once here."""
    from omni_triton.media.image import encode_image

    spec = PIPELINES[pipeline]
    pngs = [encode_image(p, "png").data for p in spec.condition_pixels()]

    def run_one(i: int) -> Result:
        t = time.perf_counter()
        fields = {"model": spec.model, "prompt": spec.prompts[i % len(spec.prompts)], "size": f"{width}x{height}",
                  "num_inference_steps": steps, "seed": i, "response_format": "b64_json"}
        try:
            if pngs:
                r = http.post(f"{url}/v1/images/edits", data={k: str(v) for k, v in fields.items()},
                              files=[("image[]", (f"{k}.png", data, "image/png")) for k, data in enumerate(pngs)])
            else:
                r = http.post(f"{url}/v1/images/generations", json=fields)
            elapsed = time.perf_counter() - t
            if r.status_code != 200:
                return Result(i, error=f"HTTP {r.status_code}: {r.text[:200]}")
            body = r.json()
            base64.b64decode(body["data"][0]["b64_json"])
            return Result(i, elapsed, denoise_s=body["usage"].get("denoise_seconds"))
        except Exception as exc:
            return Result(i, error=f"{type(exc).__name__}: {exc}")

    return run_one


def format_table(results: dict, rat: dict) -> str:
    def f(x, nd=1):
        return "-" if x is None else f"{x:.{nd}f}"

    lines = [f"{'path':<14} {'C':>2} {'n':>4} {'ok':>4} {'req/s':>7} {'p50 ms':>8} {'p90 ms':>8} "
             f"{'p99 ms':>8} {'mean ms':>8} {'SLO':>6} {'DiT batch':>9}"]
    for path, levels in results.items():
        for c, s in sorted(levels.items(), key=lambda kv: int(kv[0])):
            lat = s["latency_ms"]
            lines.append(f"{path:<14} {c:>2} {s['requests']:>4} {s['ok']:>4} {f(s['requests_per_s'], 2):>7} "
                         f"{f(lat['p50']):>8} {f(lat['p90']):>8} {f(lat['p99']):>8} {f(lat['mean']):>8} "
                         f"{f(s['slo_attainment'], 2):>6} {f(s.get('denoiser_mean_batch'), 2):>9}")
    slo_ms = next(iter(next(iter(results.values())).values()))["slo_ms"] if results else 0.0
    lines.append(f"(SLO: fraction of requests within {slo_ms:.0f} ms; "
                 "DiT batch: images per denoiser execution)" if results else "")
    lines.append("")
    lines.append(f"serving overhead (frontend C=1 p50 / in-process p50): {rat.get('serving_overhead_latency_p50')}")
    lines.append(f"batching gain (frontend C={rat.get('batching_gain_at_concurrency')} / C=1 req/s): "
                 f"{rat.get('batching_gain_throughput')}")
    lines.append(f"throughput vs in-process stage split (C=1): {rat.get('throughput_vs_inprocess')}")
    lines.append(f"frontend C=1 p50 / plain diffusers __call__ p50: {rat.get('latency_p50_vs_diffusers_call')}")
    lines.append("throughput vs diffusers __call__ in processes at the same C: "
                 f"{rat.get('throughput_vs_diffusers_call')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench_diffusion.json", help="JSON output file")
    p.add_argument("--pipeline", default="qwen_image", choices=sorted(PIPELINES),
                   help="what to measure (qwen_image_edit_plus: two condition images per request)")
    p.add_argument("--size", default="128x128", help="WIDTHxHEIGHT of every image")
    p.add_argument("--steps", type=int, default=4, help="denoising steps of every image")
    p.add_argument("--concurrency", default="1,4", help="frontend levels, comma separated")
    p.add_argument("--requests", type=int, default=16, help="requests per level (>= concurrency)")
    p.add_argument("--warmup", type=int, default=2, help="untimed requests per path")
    p.add_argument("--slo-ms", type=float, default=1000.0, help="latency SLO, milliseconds")
    p.add_argument("--paths", default="inprocess,frontend")
    p.add_argument("--frontend-url", help="use this running frontend (no own stack)")
    p.add_argument("--metrics-url", help="Triton metrics URL of that running server (for the mean batch)")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--processes", type=int, default=0,
                   help="worker processes of the diffusers __call__ path (0: the served ensemble's stage instances)")
    p.add_argument("--quick", action="store_true",
                   help="short form (< 3 min): --size 64x64 --steps 2 --concurrency 1,4 --requests 8 --warmup 1")
    p.add_argument("--ready-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.steps, args.concurrency, args.requests, args.warmup = "64x64", 2, "1,4", 8, 1
    width, height = (int(v) for v in args.size.lower().split("x"))
    spec = PIPELINES[args.pipeline]
    levels = parse_concurrency(args.concurrency)
    paths = [x.strip() for x in args.paths.split(",") if x.strip()]
    started = stop_all_on_sigterm()  # what this run starts, stopped in `finally` and on SIGTERM
    t0 = time.perf_counter()
    results: dict = {}
    error = None

    metrics_url = {"url": args.metrics_url}

    def denoiser_counts():
        if not metrics_url["url"]:
            return None
        import httpx

        text = httpx.get(metrics_url["url"], timeout=10).text
        denoiser = f"{spec.model}_denoiser"
        return (metric_sum(text, "nv_inference_request_success", denoiser),
                metric_sum(text, "nv_inference_exec_count", denoiser))

    def run_path(path: str, run_one, level_list):
        for i in range(args.warmup):
            run_one(10_000 + i)
        for c in level_list:
            n, s = measure_level(run_level, run_one, c, args.requests, args.slo_ms,
                                 denoiser_counts if path == "frontend" else None)
            results.setdefault(path, {})[str(c)] = s
            print(f"  {path:<14} C={c} n={n} ok={s['ok']} {s['requests_per_s']} req/s "
                  f"p50 {s['latency_ms']['p50']} ms p99 {s['latency_ms']['p99']} ms", flush=True)

    processes = args.processes or served_processes(args.pipeline)
    if "inprocess" in paths:
        from clients.proc_pool import ProcessPool
        from omni_triton.checkpoints.qwen_image import checkpoint_dir

        checkpoint_dir(spec.asset)
        print(f"in-process diffusers __call__ in {processes} processes (the served stage count)", flush=True)
        with ProcessPool(processes, call_worker, (width, height, args.steps, args.pipeline)) as pool:
            run_path("inprocess_call", call_run_one(pool, args.timeout), levels)
        print("in-process stage split, C=1 (one request alone)", flush=True)
        run_path("inprocess", inprocess_run_one(width, height, args.steps, args.pipeline), [1])
    stack: dict = {"own_stack": not args.frontend_url}
    try:
        if "frontend" in paths:
            url = args.frontend_url
            if not url:
                from omni_triton.paths import cache_dir
                from omni_triton.serve.process import free_port
                from omni_triton.serve.server import Frontend, TritonServer

                logs = cache_dir() / "logs"
                tag = f"bench-diffusion-{os.getpid()}"
                t = time.perf_counter()
                server = TritonServer([spec.model], http_port=free_port(), grpc_port=free_port(),
                                      metrics_port=free_port(), log_path=logs / f"{tag}-tritonserver.log")
                started.append(server)
                server.start()
                server.wait_ready(timeout=args.ready_timeout)
                frontend = Frontend(server.grpc_url, port=free_port(), models=[spec.model],
                                    log_path=logs / f"{tag}-frontend.log", admin_key=server.admin_key)
                started.append(frontend)
                frontend.start()
                frontend.wait_ready()
                url = frontend.url
                metrics_url["url"] = f"http://127.0.0.1:{server.metrics_port}/metrics"
                stack.update(ready_s=round(time.perf_counter() - t, 2), models=server.models,
                             triton_log=str(server.log_path))
            import httpx

            print(f"OpenAI frontend {url}", flush=True)
            limit = max(levels) + 2
            with httpx.Client(timeout=httpx.Timeout(args.timeout, connect=10.0),
                              limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit)) as http:
                run_path("frontend", frontend_run_one(http, url, width, height, args.steps, args.pipeline), levels)
    except Exception as exc:  # keep what was measured; report the failure
        error = f"{type(exc).__name__}: {exc}"
        print(f"error: {error}", file=sys.stderr)
    finally:
        for proc in reversed(started):
            proc.stop()

    rat = ratios(results)
    report = {
        "config": {
            "command": " ".join([Path(sys.executable).name, "-m", "clients.bench_diffusion",
                                 *(argv if argv is not None else sys.argv[1:])]),
            "model": spec.model, "asset": spec.asset, "size": f"{width}x{height}", "steps": args.steps,
            "condition_images": [f"{w}x{h}" for w, h in spec.condition_sizes],
            "concurrency": levels, "requests_per_level": args.requests, "warmup": args.warmup,
            "slo_ms": args.slo_ms, "prompts": list(spec.prompts), "seed": "request index",
            "load_pattern": "closed loop: C threads, each sends its next request when the previous ended",
            "machine": machine_info(), "git_commit": git_commit(), "stack": stack,
            "inprocess_call_processes": processes,
            "notes": [f"inprocess_call: plain diffusers __call__ + PNG encode in {processes} worker processes "
                      "(the served stage instances), one torch thread each, one request at a time per process",
                      "inprocess: the stage split in this process at C=1 only (one request alone; no batching)",
                      f"served: {', '.join(spec.stages)}: each one instance, one torch "
                      "thread each, dynamic batching (config.pbtxt)",
                      "tiny random-weight checkpoint: compute per image is small, so fixed "
                      "per-request costs weigh more than they would with real weights"],
        },
        "results": results, "ratios": rat, "wall_s": round(time.perf_counter() - t0, 2), "error": error,
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    print()
    print(format_table(results, rat))
    print(f"\nwrote {args.out}; total wall time {report['wall_s']:.1f} s")
    return 1 if error else 0


if __name__ == "__main__":
    raise SystemExit(main())

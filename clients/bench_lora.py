"""Per-request LoRA serving benchmark (docs/lora.md): what a batch of mixed adapters costs against
a batch that shares one adapter (and against no adapter), served, same size and steps.

Run::

    python -m clients.bench_lora --out bench_lora.json
    python -m clients.bench_lora --batch 8 --adapters 4 --rounds 4 --size 64x64 --steps 2
    python -m clients.bench_lora --frontend-url http://127.0.0.1:9000 --metrics-url http://127.0.0.1:8002/metrics

Unless ``--frontend-url`` is given it starts its own tritonserver (``qwen_image`` and its stages)
and frontend on free ports with a fresh LoRA directory (``$OMNI_TRITON_LORA_DIR``) and stops them.
It builds ``--adapters`` tiny random adapters of rank ``--rank`` for the served transformer (from
the denoiser's manifest) and registers them through ``POST /v1/loras``.

Modes, each ``--rounds`` bursts of ``--batch`` concurrent ``POST /v1/images/generations``
(every request: its own seed, the same size and steps):

- ``none``: no ``lora`` field (the base model);
- ``single``: every request of the burst uses adapter 0 at scale 1 (one denoiser group);
- ``mixed``: request ``i`` uses adapter ``i % adapters`` (``adapters`` groups per burst: the
  denoiser never batches different adapters, so a burst becomes that many pipeline calls).

Per mode: ``burst_s`` (wall time of a burst: first request sent to last answered) mean and
max, ``images_per_s``, request latency percentiles, ``denoiser_mean_batch`` (requests /
executions of ``qwen_image_denoiser`` from Triton's metrics: the size of Triton's batches, each of
which the denoiser splits into one pipeline call per adapter and scale). Ratios: ``mixed_vs_single_burst_s``
(> 1: the cost of mixing adapters), ``single_vs_none_burst_s`` (the cost of an active adapter).
The first burst of each mode is a warm-up (adapters are loaded then; ``max_loras`` must be at
least ``--adapters`` for the later bursts to load nothing). No timing is asserted anywhere.
"""
# ruff: noqa: E402 - the thread-count variables are set before any import that starts a pool
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from clients.bench_common import describe_ms, git_commit, machine_info, metric_sum, ratio, stop_all_on_sigterm

MODEL = "qwen_image"
DENOISER = "qwen_image_denoiser"
PROMPTS = ("a red fox in the snow, golden hour", "a lighthouse on a cliff at night",
           "a bowl of fruit on a wooden table", "a cat wearing a hat")
MODES = ("none", "single", "mixed")


def lora_for(mode: str, i: int, adapters: int) -> dict | None:
    """The ``lora`` field of request ``i`` of a burst in ``mode``."""
    if mode == "none":
        return None
    return {"name": f"bench-{0 if mode == 'single' else i % adapters}", "scale": 1.0}


def burst(http, url: str, mode: str, batch: int, adapters: int, size: str, steps: int, seed0: int) -> dict:
    """One burst: ``batch`` requests at once. Returns its wall time, latencies and errors."""

    def one(i: int):
        body = {"model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)], "size": size, "num_inference_steps": steps,
                "seed": seed0 + i}
        lora = lora_for(mode, i, adapters)
        if lora:
            body["lora"] = lora
        t = time.perf_counter()
        r = http.post(f"{url}/v1/images/generations", json=body)
        return time.perf_counter() - t, (None if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:200]}")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(batch) as pool:
        results = list(pool.map(one, range(batch)))
    return {"wall_s": time.perf_counter() - t0, "latencies_s": [lat for lat, err in results if err is None],
            "errors": [err for _, err in results if err]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench_lora.json")
    p.add_argument("--size", default="64x64")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--batch", type=int, default=8, help="requests per burst (<= the denoiser's max_batch_size)")
    p.add_argument("--adapters", type=int, default=4, help="distinct adapters in a mixed burst")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--rounds", type=int, default=4, help="timed bursts per mode (after one warm-up burst)")
    p.add_argument("--frontend-url", help="use this running frontend (no own stack)")
    p.add_argument("--metrics-url", help="Triton metrics URL of that server (denoiser mean batch)")
    p.add_argument("--lora-dir", help="the running server's LoRA directory (its manifests); with --frontend-url")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--ready-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    started = stop_all_on_sigterm()
    t0 = time.perf_counter()
    results: dict = {}
    error = None
    stack: dict = {"own_stack": not args.frontend_url}
    try:
        import httpx

        from omni_triton.checkpoints.qwen_image_lora import write_lora
        from omni_triton.contracts import lora as cl

        url, metrics_url = args.frontend_url, args.metrics_url
        lora_dir = Path(args.lora_dir) if args.lora_dir else cl.lora_dir()
        if not url:
            from omni_triton.paths import cache_dir
            from omni_triton.serve.process import free_port
            from omni_triton.serve.server import Frontend, TritonServer

            lora_dir = Path(tempfile.mkdtemp(prefix="bench-lora-"))
            os.environ[cl.ENV] = str(lora_dir)  # both children read it
            logs = cache_dir() / "logs"
            tag = f"bench-lora-{os.getpid()}"
            t = time.perf_counter()
            server = TritonServer([MODEL], http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                                  log_path=logs / f"{tag}-tritonserver.log")
            started.append(server)
            server.start()
            server.wait_ready(timeout=args.ready_timeout)
            frontend = Frontend(server.grpc_url, port=free_port(), models=[MODEL],
                                log_path=logs / f"{tag}-frontend.log", admin_key=server.admin_key)
            started.append(frontend)
            frontend.start()
            frontend.wait_ready()
            url, metrics_url = frontend.url, f"http://127.0.0.1:{server.metrics_port}/metrics"
            stack.update(ready_s=round(time.perf_counter() - t, 2), triton_log=str(server.log_path),
                         lora_dir=str(lora_dir))
        manifest = json.loads(cl.manifest_file(lora_dir, DENOISER).read_text())["modules"]
        limit = args.batch + 2
        with httpx.Client(timeout=httpx.Timeout(args.timeout, connect=10.0),
                          limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit)) as http:
            with tempfile.TemporaryDirectory() as tmp:
                for k in range(args.adapters):
                    name = f"bench-{k}"
                    http.delete(f"{url}/v1/loras/{name}")  # a rerun against a running server
                    path = write_lora(Path(tmp) / f"{k}.safetensors", manifest, rank=args.rank, seed=100 + k)
                    r = http.post(f"{url}/v1/loras", data={"name": name},
                                  files={"file": (path.name, path.read_bytes())})
                    r.raise_for_status()

            def counts():
                if not metrics_url:
                    return None
                text = httpx.get(metrics_url, timeout=10).text
                return (metric_sum(text, "nv_inference_request_success", DENOISER),
                        metric_sum(text, "nv_inference_exec_count", DENOISER))

            for mode in MODES:
                burst(http, url, mode, args.batch, args.adapters, args.size, args.steps, 0)  # warm-up
                before = counts()
                bursts = [burst(http, url, mode, args.batch, args.adapters, args.size, args.steps, 1000 * (r + 1))
                          for r in range(args.rounds)]
                after = counts()
                walls = [b["wall_s"] for b in bursts]
                lats = [x for b in bursts for x in b["latencies_s"]]
                errors = [e for b in bursts for e in b["errors"]]
                mean_batch = None
                if before and after and after[1] > before[1]:
                    mean_batch = round((after[0] - before[0]) / (after[1] - before[1]), 3)
                results[mode] = {"burst_s": {"mean": round(sum(walls) / len(walls), 4), "max": round(max(walls), 4)},
                                 "images_per_s": round(len(lats) / sum(walls), 3) if lats else None,
                                 "latency_ms": describe_ms(lats), "errors": len(errors),
                                 "error_messages": sorted(set(errors))[:5], "denoiser_mean_batch": mean_batch}
                print(f"  {mode:<7} burst {results[mode]['burst_s']['mean']:.3f} s  "
                      f"{results[mode]['images_per_s']} img/s  denoiser batch {mean_batch}  errors {len(errors)}",
                      flush=True)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        print(f"error: {error}", file=sys.stderr)
    finally:
        for proc in reversed(started):
            proc.stop()

    def burst_mean(mode):
        return results.get(mode, {}).get("burst_s", {}).get("mean")

    report = {
        "config": {"command": " ".join([Path(sys.executable).name, "-m", "clients.bench_lora",
                                        *(argv if argv is not None else sys.argv[1:])]),
                   "model": MODEL, "size": args.size, "steps": args.steps, "batch": args.batch,
                   "adapters": args.adapters, "rank": args.rank, "rounds": args.rounds,
                   "machine": machine_info(), "git_commit": git_commit(), "stack": stack,
                   "notes": ["tiny random-weight checkpoint and adapters: the DiT step is small, so the "
                             "per-call overhead of a mixed burst weighs more than with real weights"]},
        "results": results,
        "ratios": {"mixed_vs_single_burst_s": ratio(burst_mean("mixed"), burst_mean("single")),
                   "single_vs_none_burst_s": ratio(burst_mean("single"), burst_mean("none"))},
        "wall_s": round(time.perf_counter() - t0, 2), "error": error,
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report["ratios"]))
    print(f"wrote {args.out}; total wall time {report['wall_s']:.1f} s")
    return 1 if error else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Step-cache benchmark on the embedded tiny Qwen-Image pipeline (CPU): seconds per image and the
difference (max abs, PSNR in dB over [0, 1] pixels) versus no cache, same seed.
Usage: .venv/bin/python kernels/bench.py [--steps 8] [--size 64] [--repeats 3] [--out bench_kernels.json]
A timing taken on a shared machine is an indication, not a result."""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from omni_triton import kernels
from omni_triton.checkpoints.qwen_image import checkpoint_dir
from omni_triton.stages.qwen_image.loading import load_pipeline


def run(pipe, steps, size, seed=0):
    out = pipe(prompt="a red square on a blue field", height=size, width=size, num_inference_steps=steps,
               true_cfg_scale=1.0, generator=torch.Generator().manual_seed(seed), output_type="np")
    return np.asarray(out.images[0], np.float64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    rows, reference = [], None
    for cache in kernels.STEP_CACHES:
        pipe = load_pipeline(checkpoint_dir("qwen-image-tiny"))
        opts = {"current_timestep_callback": lambda pipe=pipe: pipe.current_timestep} if cache == "pab" else {}
        line = kernels.apply(pipe.transformer, "auto", cache, **opts)
        run(pipe, a.steps, a.size)  # warm-up
        times, image = [], None
        for _ in range(a.repeats):
            t = time.perf_counter()
            image = run(pipe, a.steps, a.size)
            times.append(time.perf_counter() - t)
        if reference is None:
            reference = image
        diff = float(np.abs(image - reference).max())
        mse = float(np.mean((image - reference) ** 2))
        psnr = float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)
        rows.append({"step_cache": cache, "log": line, "seconds_median": float(np.median(times)),
                     "max_abs_diff": diff, "psnr_db": psnr})
    base = rows[0]["seconds_median"]
    print(f"{'step_cache':12} {'s/image':>8} {'speed-up':>8} {'max|d|':>8} {'PSNR dB':>8}")
    for r in rows:
        r["speed_up"] = base / r["seconds_median"]
        print(f"{r['step_cache']:12} {r['seconds_median']:8.3f} {r['speed_up']:8.2f} "
              f"{r['max_abs_diff']:8.4f} {r['psnr_db']:8.1f}")
    if a.out:
        json.dump({"steps": a.steps, "size": a.size, "rows": rows}, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()

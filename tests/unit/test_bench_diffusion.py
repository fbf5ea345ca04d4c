"""Aggregation maths of clients/bench_diffusion.py (no server, no timing asserted)."""
from __future__ import annotations

from clients.bench_diffusion import Result, ratios, run_level, summarize


def test_summarize_percentiles_and_slo():
    res = [Result(i, latency_s=(i + 1) / 10) for i in range(10)] + [Result(10, error="HTTP 500")]
    s = summarize(res, wall_s=2.0, slo_ms=500)
    assert s["ok"] == 10 and s["errors"] == 1 and s["error_messages"] == ["HTTP 500"]
    assert s["latency_ms"]["p50"] == 550.0 and s["latency_ms"]["min"] == 100.0
    assert s["latency_ms"]["p99"] == 991.0 and s["latency_ms"]["max"] == 1000.0
    assert s["requests_per_s"] == 5.0
    assert s["slo_attainment"] == round(5 / 11, 4)  # failures count as misses


def test_ratios():
    def lvl(p50, rps):
        return {"latency_ms": {"p50": p50, "mean": p50}, "requests_per_s": rps}

    r = ratios({"inprocess": {"1": lvl(50, 20), "4": lvl(60, 25)}, "inprocess_call": {"1": lvl(40, 25)},
                "frontend": {"1": lvl(100, 10), "4": lvl(150, 30)}})
    assert r["serving_overhead_latency_p50"] == 2.0 and r["batching_gain_throughput"] == 3.0
    assert r["batching_gain_at_concurrency"] == 4 and r["latency_p50_vs_diffusers_call"] == 2.5
    # each level against the in-process run at the same concurrency (same parallelism)
    assert r["throughput_vs_inprocess"] == {"1": 0.5, "4": 1.2}


def test_run_level_sends_every_request_once():
    res, wall = run_level(lambda i: Result(i, latency_s=0.0), concurrency=3, n=7)
    assert [r.index for r in res] == list(range(7)) and wall >= 0


def test_metric_sum():
    from clients.bench_diffusion import metric_sum

    text = ('nv_inference_exec_count{model="qwen_image_denoiser",version="1"} 3\n'
            'nv_inference_exec_count{model="qwen_image_vae_decoder",version="1"} 7\n'
            '# HELP nv_inference_exec_count x\n')
    assert metric_sum(text, "nv_inference_exec_count", "qwen_image_denoiser") == 3.0

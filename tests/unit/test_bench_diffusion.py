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


def test_ratios_against_diffusers_call_in_processes_at_each_level():
    """The peer (diffusers ``__call__`` in the served process count) runs at every level: the
    frontend is compared with it at the same concurrency."""
    def lvl(p50, rps):
        return {"latency_ms": {"p50": p50, "mean": p50}, "requests_per_s": rps}

    r = ratios({"inprocess_call": {"1": lvl(40, 25), "4": lvl(80, 40)}, "inprocess": {"1": lvl(50, 20)},
                "frontend": {"1": lvl(100, 10), "4": lvl(160, 60)}})
    assert r["throughput_vs_diffusers_call"] == {"1": 0.4, "4": 1.5}
    assert r["latency_p50_vs_diffusers_call_by_level"] == {"1": 2.5, "4": 2.0}
    assert r["latency_p50_vs_diffusers_call"] == 2.5 and r["throughput_vs_inprocess"] == {"1": 0.5}


def test_the_peer_gets_the_served_process_count_and_failures_are_results():
    from clients import bench_diffusion as b

    assert b.served_processes() == 3  # text encoder, denoiser, VAE decoder: one instance each

    class Pool:
        def call(self, i, timeout_s):
            if i == 1:
                raise RuntimeError("ValueError: bad")
            return 10

    run_one = b.call_run_one(Pool(), 5.0)
    ok, bad = run_one(0), run_one(1)
    assert ok.error is None and ok.latency_s >= 0
    assert bad.latency_s is None and "ValueError: bad" in bad.error

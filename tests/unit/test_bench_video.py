"""clients/bench_video: ratios and table from synthetic level summaries; the JSON report."""
import json

from clients import bench_video as bv
from clients.bench_common import Result, summarize


def _level(latencies, wall):
    return summarize([Result(i, x) for i, x in enumerate(latencies)], wall, 1500.0)


def test_ratios_compare_equal_concurrency():
    results = {"inprocess": {"1": _level([1.0, 1.0], 2.0), "4": _level([2.0] * 4, 2.0)},
               "frontend": {"1": _level([0.5, 0.5], 1.0), "4": _level([1.0] * 4, 1.0)}}
    r = bv.ratios(results)
    assert r["serving_overhead_latency_p50"] == 0.5
    assert r["batching_gain_throughput"] == 2.0 and r["batching_gain_at_concurrency"] == 4
    assert r["throughput_vs_inprocess"] == {"1": 2.0, "4": 2.0}
    table = bv.format_table(results)
    assert "frontend" in table and "inprocess" in table and len(table.splitlines()) == 5


def test_slo_attainment_counts_failures_as_misses():
    s = summarize([Result(0, 1.0), Result(1, 2.0), Result(2, error="failed: x")], 3.0, 1500.0)
    assert s["ok"] == 2 and s["slo_attainment"] == round(1 / 3, 4)


def test_report_is_written_without_paths(tmp_path):
    out = tmp_path / "b.json"
    assert bv.main(["--paths", "", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["config"]["model"] == "wan_t2v" and report["results"] == {} and report["error"] is None


def test_i2v_rows_get_their_own_ratios():
    results = {"inprocess_i2v": {"1": _level([1.0, 1.0], 2.0), "4": _level([2.0] * 4, 2.0)},
               "frontend_i2v": {"1": _level([2.0, 2.0], 4.0), "4": _level([2.0] * 4, 2.0)}}
    r = bv.ratios(results)
    assert "serving_overhead_latency_p50" not in r  # no text-to-video rows
    assert r["i2v"]["serving_overhead_latency_p50"] == 2.0 and r["i2v"]["batching_gain_throughput"] == 4.0
    assert r["i2v"]["throughput_vs_inprocess"] == {"1": 0.5, "4": 1.0}
    assert "frontend_i2v" in bv.format_table(results)


def test_reference_images_differ_per_job():
    a, b = bv.reference_image(0, 32, 16), bv.reference_image(1, 32, 16)
    assert a.shape == (16, 32, 3) and a.dtype.name == "uint8" and (a != b).any()
    assert (bv.reference_image(0, 32, 16) == a).all()

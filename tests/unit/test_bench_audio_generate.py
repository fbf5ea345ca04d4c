"""clients/bench_audio_generate: ratios and table from synthetic level summaries; the JSON report."""
import json

from clients import bench_audio_generate as ba
from clients.bench_common import Result, summarize


def _level(latencies, wall):
    return summarize([Result(i, x) for i, x in enumerate(latencies)], wall, 1500.0)


def test_ratios_compare_equal_concurrency():
    results = {"inprocess": {"1": _level([1.0, 1.0], 2.0), "4": _level([2.0] * 4, 2.0)},
               "frontend": {"1": _level([0.5, 0.5], 1.0), "4": _level([1.0] * 4, 1.0)}}
    r = ba.ratios(results)
    assert r["serving_overhead_latency_p50"] == 0.5
    assert r["batching_gain_throughput"] == 2.0 and r["batching_gain_at_concurrency"] == 4
    assert r["throughput_vs_inprocess"] == {"1": 2.0, "4": 2.0}
    table = ba.format_table(results)
    assert "frontend" in table and "inprocess" in table and len(table.splitlines()) == 5


def test_report_is_written_without_paths(tmp_path):
    out = tmp_path / "b.json"
    assert ba.main(["--paths", "", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["config"]["model"] == "stable_audio" and report["results"] == {} and report["error"] is None

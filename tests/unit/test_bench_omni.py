"""clients.bench_omni aggregation (no server, no timing asserted)."""
from __future__ import annotations

import pytest

from clients import bench_omni as bo


def test_rtf_mean_over_requests_with_audio_only():
    """A text-only (or audio-less) answer has no RTF: it must neither add to the sum nor to the
    count (dividing the RTFs of the audio answers by all requests understated it)."""
    results = [{"ttft_s": 0.1, "ttfp_s": 0.2, "e2e_s": 1.0, "audio_s": 2.0},
               {"ttft_s": 0.1, "ttfp_s": 0.3, "e2e_s": 3.0, "audio_s": 2.0},
               {"ttft_s": 0.1, "ttfp_s": None, "e2e_s": 0.5, "audio_s": 0.0},
               {"error": "boom"}]
    s = bo.summarize(results, wall_s=4.0)
    assert s["ok"] == 3 and s["errors"] == ["boom"] and s["with_audio"] == 2
    assert s["rtf_mean"] == pytest.approx((0.5 + 1.5) / 2)
    assert s["ttfp_ms"]["mean"] == 250.0 and s["e2e_ms"]["max"] == 3000.0
    assert bo.summarize([{"e2e_s": 1.0, "audio_s": 0.0}], 1.0)["rtf_mean"] is None


def test_the_baseline_gets_one_process_per_served_stage_instance():
    """thinker 1 + talker 2 + code2wav 1 served instances: 4 baseline processes (not threads)."""
    from clients.bench_common import instance_count

    counts = {s: instance_count(s) for s in ("qwen3_omni_thinker", "qwen3_omni_talker", "qwen3_omni_code2wav")}
    assert counts == {"qwen3_omni_thinker": 1, "qwen3_omni_talker": 2, "qwen3_omni_code2wav": 1}
    assert bo.baseline_processes(counts) == 4

"""clients/bench_qwen3_tts.py: the request mix and the TTFP scaling summary (no server)."""
from clients import bench_qwen3_tts as b


def test_requests_cycle_voices_and_carry_the_form():
    assert b.request_kwargs("custom_voice", 1, 40, None) == dict(text=b.TEXTS[1], task="custom_voice", max_frames=40,
                                                                voice=b.SPEAKERS[1])
    assert b.request_kwargs("voice_design", 3, 40, None)["instructions"] == b.DESIGNS[1]
    assert b.request_kwargs("base", 0, 40, b"prompt")["voice_prompt"] == b"prompt"


def test_ttfp_scaling_is_highest_over_lowest_level():
    levels = {"1": {"ttfp_ms": {"p50": 100.0}}, "8": {"ttfp_ms": {"p50": 250.0}}, "4": {"ttfp_ms": {"p50": 1.0}}}
    assert b._levels({"triton": levels}) == {"triton": {"ttfp_p50_c8_over_c1": 2.5}}
    assert b._levels({"triton": {"1": {"ttfp_ms": {"p50": None}}}}) == {"triton": {"ttfp_p50_c1_over_c1": None}}


def test_bench_tts_hands_qwen3_tts_over(monkeypatch):
    from clients import bench_tts

    import subprocess
    import sys

    seen = []
    monkeypatch.setattr(subprocess, "call", lambda cmd: seen.append(cmd) or 0)
    assert bench_tts.main(["--qwen3-tts", "--concurrency", "1"]) == 0
    assert seen == [[sys.executable, "-m", "clients.bench_qwen3_tts", "--concurrency", "1"]]

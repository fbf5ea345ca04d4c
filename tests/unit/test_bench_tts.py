"""clients.bench_tts: pure helpers only (aggregation, ratios, table) and the in-process baseline's
parallelism. No timing asserts."""
from __future__ import annotations

import pytest

from clients import bench_tts as b


def _r(i, ttfp, e2e, samples, sr=1000, error=None):
    return b.RequestResult(index=i, ttfp_s=ttfp, e2e_s=e2e, samples=samples, sample_rate=sr,
                           chunks=1, error=error)


def test_request_result_derived_values():
    r = _r(0, 0.1, 0.5, 2000)
    assert r.ok and r.audio_s == 2.0 and r.rtf == 0.25
    js = r.to_json()
    assert js["ttfp_ms"] == 100.0 and js["e2e_ms"] == 500.0 and js["rtf"] == 0.25
    assert not _r(1, None, None, 0, error="boom").ok
    assert _r(1, None, None, 0, error="boom").rtf is None


def test_summarize_aggregates_successful_requests_only():
    results = [_r(0, 0.1, 1.0, 4000), _r(1, 0.3, 2.0, 4000), _r(2, None, None, 0, error="HTTP 500")]
    s = b.summarize(results, wall_s=2.0)
    assert (s["requests"], s["ok"], s["errors"]) == (3, 2, 1)
    assert s["error_messages"] == ["HTTP 500"]
    assert s["ttfp_ms"]["mean"] == 200.0 and s["ttfp_ms"]["p50"] == 200.0
    assert s["ttfp_ms"]["p90"] == pytest.approx(280.0)
    assert s["e2e_ms"]["mean"] == 1500.0 and s["e2e_ms"]["max"] == 2000.0
    assert s["rtf_mean"] == pytest.approx((0.25 + 0.5) / 2)
    assert s["audio_s_total"] == 8.0 and s["audio_s_mean"] == 4.0
    assert s["throughput_audio_s_per_s"] == 4.0 and s["requests_per_s"] == 1.0


def test_summarize_all_failed():
    s = b.summarize([_r(0, None, None, 0, error="x")], wall_s=1.0)
    assert s["ok"] == 0 and s["ttfp_ms"]["mean"] is None and s["rtf_mean"] is None
    assert s["throughput_audio_s_per_s"] is None


def test_ratios_and_table():
    base = b.summarize([_r(0, 0.1, 1.0, 4000)], wall_s=1.0)
    served = b.summarize([_r(0, 0.2, 1.5, 4000)], wall_s=2.0)
    results = {"csm": {"inprocess": {"1": base}, "triton": {"1": served}}}
    ratios = b.all_ratios(results)
    assert list(ratios["csm"]["1"]) == ["triton_vs_inprocess"]  # no frontend run: no such pair
    r = ratios["csm"]["1"]["triton_vs_inprocess"]
    assert r["ttfp_mean"] == 2.0 and r["e2e_mean"] == 1.5 and r["throughput"] == 0.5
    table = b.format_table(results, ratios)
    assert "triton_vs_inprocess" in table and "inprocess" in table


def test_run_level_closed_loop_records_errors():
    def run_one(i, text, voice):
        if i == 2:
            raise RuntimeError("bad")
        return _r(i, 0.0, 0.0, 10)

    res, wall = b.run_level(run_one, "csm", concurrency=3, n=5)
    assert [r.index for r in res] == list(range(5)) and wall >= 0
    assert [r.ok for r in res] == [True, True, False, True, True]
    assert "RuntimeError: bad" in res[2].error


def test_inprocess_baselines_get_the_served_parallelism():
    """Two talker objects where csm_talker has two instances; Piper syntheses capped at the served
    model's workers x instances (the JSON notes say so too)."""
    from clients.bench_common import instance_count

    assert instance_count("csm_talker") == 2 and instance_count("csm_code2wav") == 1
    assert b.piper_parallelism() == 2  # piper_tts: workers 2, one instance


def test_the_player_of_a_stream_counts_underruns_and_continuity():
    """Chunks of 1 s at 1 kHz: the second arrives 0.05 s late (continuous), the third 0.5 s late."""
    r = b.RequestResult(index=0)
    r.on_audio(0.2, 1000, 1000)  # first audio at 0.2, plays until 1.2
    r.on_audio(1.25, 1000, 1000)  # 0.05 s stall, plays until 2.25
    assert r.ttfp_s == 0.2 and r.underrun_s == pytest.approx(0.05) and r.continuous
    r.on_audio(2.75, 1000, 1000)  # 0.5 s stall
    r.on_audio(2.8, 0, 1000)  # empty: ignored
    r.e2e_s = 3.0
    assert r.underrun_s == pytest.approx(0.55) and not r.continuous and r.chunks == 3 and r.samples == 3000
    smooth = b.RequestResult(index=1)
    smooth.on_audio(0.1, 1000, 1000)
    smooth.on_audio(0.5, 1000, 1000)
    smooth.e2e_s = 0.6
    s = b.summarize([r, smooth], wall_s=3.0)
    assert s["underrun_s_total"] == pytest.approx(0.55) and s["stalled_streams"] == 1
    assert s["continuity_rate"] == 0.5 and r.to_json()["longest_stall_ms"] == 500.0


def test_scheduling_summary_compares_modes_against_the_target():
    def level(ttfps, stall=0.0):
        rs = []
        for i, t in enumerate(ttfps):
            x = b.RequestResult(index=i)
            x.on_audio(t, 1000, 1000)
            x.on_audio(t + 1.0 + stall, 1000, 1000)
            x.e2e_s = t + 1.0 + stall
            rs.append(x)
        return b.summarize(rs, wall_s=3.0)

    results = {"csm": {
        "inprocess": {"1": level([0.1])},
        b.path_label("frontend", "deadline"): {"1": level([0.1]), "8": level([0.15, 0.19])},
        b.path_label("frontend", "fifo"): {"1": level([0.1]), "8": level([0.5, 0.9], stall=0.2)},
    }}
    sched = b.scheduling_summary(results)["csm"]
    assert set(sched) == {"frontend:deadline", "frontend:fifo"}  # in-process is no served mode
    good, bad = sched["frontend:deadline"], sched["frontend:fifo"]
    assert good["ttfp_p50_growth"] == pytest.approx(1.7) and good["target_met"]
    assert bad["ttfp_p50_growth"] == pytest.approx(7.0) and not bad["target_met"]
    assert bad["underrun_s_total"]["8"] == pytest.approx(0.4) and bad["continuity_rate"]["8"] == 0.0
    ratios = b.all_ratios(results)
    assert "frontend_vs_inprocess:fifo" in ratios["csm"]["1"]
    assert b.split_label("frontend:fifo") == ("frontend", "fifo") and b.path_label("inprocess", "fifo") == "inprocess"
    assert "frontend:deadline" in b.format_scheduling(b.scheduling_summary(results))
    assert "frontend:fifo" in b.format_table(results, ratios)


def test_capacity_comes_from_the_fifo_run_so_a_paced_run_cannot_dodge_the_underrun_target():
    """A paced run's own throughput is bounded by playback (each stream computed just ahead of
    its listener), so 'faster than real time' is read from the same path's fifo run: there the
    pipeline makes 8 streams x 2 s of audio in 1.6 s, 10 audio-s/s for 8 listeners, so the paced
    run's underrun misses the target. Red when the paced run's own figures decide."""
    def level(n, ttfp, e2e, wall, stall=0.0):
        out = []
        for i in range(n):
            x = b.RequestResult(index=i)
            x.on_audio(ttfp, 1000, 1000)
            x.on_audio(ttfp + 1.0 + stall, 1000, 1000)
            x.e2e_s = e2e
            out.append(x)
        return b.summarize(out, wall_s=wall)

    results = {"piper": {
        b.path_label("frontend", "deadline"): {"1": level(1, 0.1, 2.4, 2.4), "8": level(8, 0.15, 2.4, 2.6, stall=0.3)},
        b.path_label("frontend", "fifo"): {"1": level(1, 0.1, 1.0, 1.0), "8": level(8, 0.5, 1.0, 1.6)},
    }}
    sched = b.scheduling_summary(results)["piper"]
    paced = sched["frontend:deadline"]
    assert paced["capacity_audio_s_per_s"] == pytest.approx(10.0) and paced["faster_than_real_time"]
    assert paced["ttfp_p50_growth"] == pytest.approx(1.5) and not paced["target_met"]  # the underrun
    alone = b.scheduling_summary({"piper": {b.path_label("frontend", "deadline"):
                                                results["piper"][b.path_label("frontend", "deadline")]}})
    assert not alone["piper"]["frontend:deadline"]["faster_than_real_time"]  # no fifo run: its own 6.2 audio-s/s


def test_a_fifo_run_whose_streams_queue_whole_is_not_capacity_for_all_listeners():
    """Under fifo each stream waits whole and then runs alone, so its RTF is < 1 although the
    pipeline makes fewer audio seconds per second than the listeners play (omni at C=8 here: mean
    RTF 0.71, 6.9 audio-s/s for 8). Then the underrun cannot be zero for all (the target is the
    TTFP growth alone). Red with the mean RTF as the capacity test."""
    def level(n, wall, e2e):
        out = []
        for i in range(n):
            x = b.RequestResult(index=i)
            x.on_audio(0.2, 1000, 1000)
            x.on_audio(0.3, 3000, 1000)  # 4 s of audio
            x.e2e_s = e2e
            out.append(x)
        return b.summarize(out, wall_s=wall)

    fifo = {"1": level(1, 0.6, 0.6), "8": level(8, 5.0, 2.8)}  # RTF 0.7, but 6.4 audio-s/s for 8
    sched = b.scheduling_summary({"qwen3_omni": {b.path_label("frontend", "fifo"): fifo,
                                           b.path_label("frontend", "deadline"): fifo}})["qwen3_omni"]
    assert sched["frontend:fifo"]["rtf_mean"]["8"] == pytest.approx(0.7)
    assert sched["frontend:deadline"]["capacity_audio_s_per_s"] == pytest.approx(6.4)
    assert not sched["frontend:deadline"]["faster_than_real_time"]


def test_listening_clients_in_bench_tts_wait_for_playback_and_the_top_level_measures_capacity(monkeypatch):
    """``--listen``: the run_one wrapper sleeps until the player's end, and the highest level
    runs once more without it for ``capacity_audio_s_per_s``."""
    import argparse

    from clients import bench_tts as bt

    slept, calls = [], []
    monkeypatch.setattr(bt.time, "sleep", slept.append)

    def run_one(index, text, voice):
        calls.append(index)
        r = bt.RequestResult(index=index, e2e_s=0.0)
        r.on_audio(0.0, 24000, 24000)  # 1 s of audio, ends playing 1 s after the send
        return r

    args = argparse.Namespace(concurrency="1,2", requests=2, quiet=True, warmup=0, arrivals="burst", listen=True,
                              models=["piper"])
    bench = bt.Bench(args)
    bench.run_path("piper", "frontend", run_one)
    levels = bench.results["piper"]["frontend"]
    assert len(calls) == 2 + 2 + 2  # c=1, c=2 listening, c=2 again for the capacity
    assert len(slept) == 4 and all(0.9 < s <= 1.0 for s in slept)
    assert levels["2"]["listen"] and levels["2"]["capacity_audio_s_per_s"] is not None
    assert "capacity_audio_s_per_s" not in levels["1"]


def test_a_listening_level_is_judged_by_the_fifo_runs_listen_free_capacity():
    """With --listen both modes' throughput is bounded by playback, and a paced (deadline) run's
    own capacity run is too: the fifo run's listen-free figure decides "faster than real time"."""
    from clients.bench_tts import scheduling_summary

    def level(p50, capacity, underrun=0.0):
        return {"ttfp_ms": {"p50": p50, "p90": p50}, "underrun_s_total": underrun, "continuity_rate": 1.0,
                "rtf_mean": 1.0, "throughput_audio_s_per_s": 7.5, "capacity_audio_s_per_s": capacity}

    results = {"csm": {"frontend:deadline": {"1": level(100, None), "8": level(150, 7.9, underrun=1.0)},
                       "frontend:fifo": {"1": level(100, None), "8": level(900, 12.0)}}}
    got = scheduling_summary(results)["csm"]["frontend:deadline"]
    assert got["capacity_audio_s_per_s"] == 12.0 and got["faster_than_real_time"] and not got["target_met"]


def _level(ttfps, e2e, wall_s=3.0, stall=0.0, seconds=1.0):
    """A summary of requests with first audio at each ``ttfps`` (s), two chunks of ``seconds`` at
    1 kHz (the second ``stall`` s late), ending at ``e2e`` (s)."""
    rs = []
    for i, t in enumerate(ttfps):
        x = b.RequestResult(index=i)
        x.on_audio(t, int(1000 * seconds), 1000)
        x.on_audio(t + seconds + stall, int(1000 * seconds), 1000)
        x.e2e_s = e2e
        rs.append(x)
    return b.summarize(rs, wall_s=wall_s)


def test_targets_are_computed_side_by_side_from_one_run():
    """piper: streamed E2E 1.1 s vs whole 1.0 s (1.1 <= 1.2: met), TTFP 0.15 s vs 1.0 s (0.15 <=
    0.2: met), TTFP p50 0.15 -> 0.6 s (growth 4 > 2: missed); 8 streams of 2 s in 1 s of wall
    (16 audio s/s >= 8 listeners), one of them stalled: continuity 0.875 < 0.95, missed. csm: its
    capacity (2 s x 8 in 8 s = 2 audio s/s) is below 8 listeners, so continuity does not apply."""
    dl, wh = b.path_label("frontend", "deadline"), b.path_label("whole", "deadline")
    results = {
        "piper": {"inprocess": {"1": _level([0.1], 1.0)},
                  dl: {"1": _level([0.15], 1.1), "8": _level([0.6] * 7 + [0.6], 1.0, wall_s=1.0)},
                  wh: {"1": _level([1.0], 1.0)}},
        "csm": {dl: {"1": _level([0.1], 1.3), "8": _level([0.15] * 8, 8.0, wall_s=8.0, stall=0.5)},
                wh: {"1": _level([1.0], 1.0)}},
    }
    # one stalled stream out of 8 at piper's top level
    stalled = [b.RequestResult(index=i) for i in range(8)]
    for i, x in enumerate(stalled):
        x.on_audio(0.6, 1000, 1000)
        x.on_audio(1.6 + (0.5 if i == 0 else 0.0), 1000, 1000)
        x.e2e_s = 1.0
    results["piper"][dl]["8"] = b.summarize(stalled, wall_s=1.0)
    sched = b.scheduling_summary(results)
    got = {t["target"]: t for t in b.audio_targets(results, sched)}
    e2e = got["piper_tts: c=1 streamed E2E p50 / non-streamed"]
    assert e2e["measured"] == pytest.approx(1.1) and e2e["met"] is True and e2e["pipeline"] == "piper_tts"
    ttfp = got["piper_tts: c=1 TTFP p50 / non-streamed E2E p50"]
    assert ttfp["measured"] == pytest.approx(0.15) and ttfp["met"] is True
    growth = got["piper_tts: TTFP p50 growth c=1->8 (saturating)"]
    assert growth["measured"] == pytest.approx(4.0) and growth["met"] is False
    cont = got["piper_tts: continuity at c=8 (saturating)"]
    assert cont["measured"] == 0.875 and cont["met"] is False
    assert got["tts: c=1 streamed E2E p50 / non-streamed"]["met"] is False  # 1.3 > 1.2
    assert "tts: c=1 TTFP p50 / non-streamed E2E p50" not in got  # Piper's target only
    tts_cont = got["tts: continuity at c=8 (saturating)"]
    assert tts_cont["measured"] == 0.0 and tts_cont["met"] is None and "below them" in tts_cont["note"]
    # a paced run says that the figures are unpaced ones; no whole run: nothing to divide by
    del results["csm"][wh]
    paced = {t["target"]: t for t in b.audio_targets(results, sched, pacing="realtime", listen=True)}
    assert all("unpaced" in t["note"] for t in paced.values())
    assert paced["tts: c=1 streamed E2E p50 / non-streamed"]["measured"] is None
    assert "piper_tts: TTFP p50 growth c=1->8 (listening)" in paced


def test_growth_target_applies_only_from_c1_to_at_least_c8():
    dl = b.path_label("frontend", "deadline")
    results = {"csm": {dl: {"1": _level([0.1], 1.0), "4": _level([0.1] * 4, 1.0)}}}
    got = {t["target"]: t for t in b.audio_targets(results, b.scheduling_summary(results))}
    g = got["tts: TTFP p50 growth c=1->4 (saturating)"]
    assert g["measured"] == pytest.approx(1.0) and g["met"] is None and "needs levels" in g["note"]


def test_baseline_and_whole_paths_are_not_scheduling_modes():
    results = {"csm": {"transformers": {"1": _level([1.0], 1.0)}, "inprocess": {"1": _level([0.1], 1.0)},
                       "qwen_tts": {"1": _level([1.0], 1.0)},  # bench_qwen3_tts's peer
                       "whole:deadline": {"1": _level([1.0], 1.0)},
                       "frontend:deadline": {"1": _level([0.1], 1.1)}}}
    assert set(b.scheduling_summary(results)["csm"]) == {"frontend:deadline"}
    assert b.path_label("transformers", "fifo") == "transformers"
    r = b.all_ratios(results)["csm"]["1"]
    assert r["frontend_vs_whole:deadline"]["e2e_p50"] == pytest.approx(1.1)
    assert r["frontend_vs_transformers:deadline"]["ttfp_p50"] == pytest.approx(0.1)
    assert "inprocess_vs_transformers" in r and "inprocess_vs_transformers:deadline" not in r


def test_parse_args_sends_unpaced_by_default_and_checks_its_values():
    args, paths = b.parse_args([])
    assert args.pacing == "none" and args.whole_levels == [1] and args.scheduling == ["deadline", "fifo"]
    assert paths == ["inprocess", "transformers", "triton", "frontend", "whole"]
    args, _ = b.parse_args(["--pacing", "realtime", "--scheduling", "deadline", "--whole-levels", "1,8"])
    assert args.pacing == "realtime" and args.scheduling == ["deadline"] and args.whole_levels == [1, 8]
    for bad in (["--pacing", "fast"], ["--paths", "frontend,nope"], ["--scheduling", "lifo"],
                ["--models", "piper,nope"], ["--whole-levels", "0"]):
        with pytest.raises(SystemExit):
            b.parse_args(bad)
    _, paths = b.parse_args(["--frontend-url", "http://x:9000"])  # no gRPC URL: no triton path
    assert paths == ["inprocess", "transformers", "frontend", "whole"]
    assert "fifo" in b.SCHEDULING_HELP and "previous behaviour" not in b.SCHEDULING_HELP


def test_request_bodies_carry_the_pacing_only_when_streamed():
    body = b.speech_body("piper", "Hi.", "joe")
    assert body["stream"] is True and body["stream_pacing"] == "none" and body["response_format"] == "pcm"
    assert b.speech_body("piper", "Hi.", "joe", pacing="realtime")["stream_pacing"] == "realtime"
    whole = b.speech_body("piper", "Hi.", "joe", stream=False)
    assert whole["stream"] is False and "stream_pacing" not in whole
    chat = b.chat_body("qwen3_omni", "Hi.", "Ethan", pacing="realtime")
    assert chat["stream_pacing"] == "realtime" and chat["audio"] == {"format": "pcm16", "voice": "Ethan"}
    assert "stream_pacing" not in b.chat_body("qwen3_omni", "Hi.", "Ethan", stream=False)


def test_baselines_get_as_many_processes_as_the_served_path():
    assert b.baseline_processes("piper") == 2  # workers 2 x 1 instance
    assert b.baseline_processes("csm") == 3  # csm_talker 2 + csm_code2wav 1


def test_a_worker_result_keeps_the_chunk_times():
    r = b._events_result(3, [(0.2, 1000, 1000), (1.5, 1000, 1000)], 1.6)
    assert r.index == 3 and r.ttfp_s == 0.2 and r.e2e_s == 1.6 and r.audio_s == 2.0
    assert r.underrun_s == pytest.approx(0.3)

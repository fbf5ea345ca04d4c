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
    import subprocess
    import sys

    from clients import bench_tts

    seen = []
    monkeypatch.setattr(subprocess, "call", lambda cmd: seen.append(cmd) or 0)
    assert bench_tts.main(["--qwen3-tts", "--concurrency", "1"]) == 0
    assert seen == [[sys.executable, "-m", "clients.bench_qwen3_tts", "--concurrency", "1"]]


def test_served_requests_are_paced_and_played_in_real_time(monkeypatch):
    """The served path sends PACED only when asked (--paced) and feeds each stream's chunks, at their
    arrival times, to a real-time player: a chunk arriving after the audio before it ended is an
    underrun."""
    import argparse

    import numpy as np

    from clients import qwen3_tts_grpc
    from clients.tts_grpc_stream import StreamResult
    from omni_triton.contracts.tensors import PACED

    sent = []

    def fake_stream(url, pairs, timeout_s=300.0):
        sent.append(dict(pairs))
        # 0.5 s of audio at 0.1 s, the next 0.5 s only at 0.9 s: the player stalls 0.3 s
        return StreamResult(chunks=[np.zeros(12000, np.float32)] * 2, arrival_s=[0.1, 0.9], sample_rate=24000)

    monkeypatch.setattr(qwen3_tts_grpc, "stream_qwen3_tts", fake_stream)
    monkeypatch.setattr(qwen3_tts_grpc, "voice_prompt", lambda *a, **k: (b"prompt", 2.0))
    results = {}
    monkeypatch.setattr(b, "_run_levels", lambda run_one, *a: results.setdefault(len(results), run_one(0)))
    for paced in (True, False):
        sent.clear()
        results.clear()
        b.served(argparse.Namespace(max_frames=40, timeout=10.0, paced=paced, levels=[1], requests=1, warmup=0),
                 "unused:1")
        assert all((PACED in pairs) == paced for pairs in sent) and len(sent) == len(b.FORMS)
        r = results[0]
        assert (r.ttfp_s, r.samples, r.chunks, r.sample_rate) == (0.1, 24000, 2, 24000)
        assert abs(r.underrun_s - 0.3) < 1e-9 and not r.continuous


def test_listening_clients_wait_for_playback_and_capacity_is_measured_without_it(monkeypatch):
    """``--listen``: each client sleeps until its answer has played to the end before its next
    request (the wait is the player's end minus the stream's end), and the highest level is run
    once more without listening for ``capacity_audio_s_per_s``, which the target summary uses."""
    from clients.audio_bench_results import RequestResult, scheduling_summary

    slept, calls = [], []
    monkeypatch.setattr(b.time, "sleep", slept.append)

    def run_one(i, listen=False, waits=None):
        calls.append(listen)
        r = RequestResult(index=i, e2e_s=0.2)
        r.on_audio(0.1, 24000, 24000)  # 1 s of audio at 0.1 s: it ends playing at 1.1 s
        b._listen(r, b.time.perf_counter() - 0.2, listen, waits)  # the stream ended 0.2 s after its send
        return r

    out = b._run_levels(run_one, [1, 8], 8, 0, lambda m: None, "staggered", listen=True)
    assert calls.count(True) == 8 + 8 and calls.count(False) == 8  # the capacity run does not listen
    assert slept and all(0.85 < s < 0.95 for s in slept[:8])  # 1.1 - 0.2 s, less the test's own time
    assert out["8"]["listen"] and out["8"]["listen_wait_ms_mean"] > 800
    assert out["8"]["stagger_s"] > 1.0  # one listening cycle: E2E + the wait
    summary = scheduling_summary({"q3": {"triton": out}})["q3"]["triton"]
    assert summary["capacity_audio_s_per_s"] == out["8"]["capacity_audio_s_per_s"]


def test_requests_per_client_keeps_every_client_of_a_level_busy(monkeypatch):
    """``--requests-per-client K``: a level of C clients runs at least C x K requests (so its
    staggered clients overlap for most of the run), the lowest level ``--requests`` alone; both
    benchmarks take the option and count the same way."""
    import argparse

    from clients.audio_bench_results import RequestResult, add_load_args, level_requests

    monkeypatch.setattr(b.time, "sleep", lambda s: None)
    seen = []

    def run_one(i, listen=False, waits=None):
        seen.append(i)
        return RequestResult(index=i, e2e_s=0.01)

    out = b._run_levels(run_one, [1, 8], 4, 0, lambda m: None, "staggered", per_client=3)
    assert out["1"]["requests"] == 4 and out["8"]["requests"] == 24 and len(seen) == 28
    assert level_requests(4, 8) == 8 and level_requests(16, 8, 1) == 16
    p = argparse.ArgumentParser()
    add_load_args(p)
    assert p.parse_args(["--requests-per-client", "3"]).requests_per_client == 3
    import clients.bench_tts as tts

    bench = tts.Bench(argparse.Namespace(concurrency="1,8", models=["tts"], quiet=True, requests=4,
                                         requests_per_client=3))
    assert [bench.n_requests(c) for c in bench.levels] == [4, 24]


def test_targets_judge_the_served_ttfp_growth_with_saturating_clients():
    """``targets``: the served path's TTFP p50 growth c=lowest -> c=highest against 2x; met only
    with saturating clients and a measured value; in-process paths are not judged."""
    scaling = {"q3-custom": {"triton": {"ttfp_p50_c8_over_c1": 1.8}, "qwen_tts": {"ttfp_p50_c8_over_c1": 9.0}},
               "q3-design": {"triton": {"ttfp_p50_c8_over_c1": 2.4}},
               "q3-clone": {"triton": {"ttfp_p50_c8_over_c1": None}},
               "q3-other": {"inprocess": {"ttfp_p50_c8_over_c1": 1.0}}}
    t = b.targets(scaling, listen=False)
    assert set(t) == {"ttfp_p50_growth:q3-custom", "ttfp_p50_growth:q3-design", "ttfp_p50_growth:q3-clone"}
    assert t["ttfp_p50_growth:q3-custom"] == {"target": "<= 2.0", "measured": 1.8, "levels": "c8<-c1",
                                              "clients": "saturating", "met": True,
                                              "same_machine": {"qwen_tts": 9.0}}
    assert t["ttfp_p50_growth:q3-design"]["same_machine"] == {}
    assert t["ttfp_p50_growth:q3-design"]["met"] is False and t["ttfp_p50_growth:q3-clone"]["met"] is None
    assert b.targets(scaling, listen=True)["ttfp_p50_growth:q3-custom"]["met"] is None


def _summary(ttfp, e2e, thr):
    return {"ttfp_ms": {"mean": ttfp, "p50": ttfp}, "e2e_ms": {"mean": e2e, "p50": e2e}, "rtf_mean": e2e / 1000,
            "throughput_audio_s_per_s": thr}


def test_peer_ratios_are_served_over_the_qwen_tts_package_at_equal_levels():
    results = {"q3-custom": {"triton": {"1": _summary(50, 200, 4.0), "8": _summary(90, 400, 16.0)},
                             "qwen_tts": {"1": _summary(100, 100, 8.0)}}}
    r = b.peer_ratios(results)["q3-custom"]
    assert list(r) == ["1"]  # only the levels both ran
    assert r["1"]["triton_vs_qwen_tts"]["ttfp_p50"] == 0.5 and r["1"]["triton_vs_qwen_tts"]["throughput"] == 0.5
    assert b.peer_ratios({"m": {"triton": {"1": _summary(1, 1, 1)}}}) == {}


def test_worker_answers_become_results_on_the_clients_clock():
    """A worker's chunk times (its perf_counter) become times since the client's send."""
    r = b.to_result(3, 10.0, {"audio": [(10.25, 12000), (10.75, 12000)], "sample_rate": 24000, "end": 10.8})
    assert (r.index, r.ttfp_s, r.samples, r.chunks, r.sample_rate) == (3, 0.25, 24000, 2, 24000)
    assert abs(r.e2e_s - 0.8) < 1e-9 and r.continuous  # the second half arrives while the first plays


def test_main_runs_the_inprocess_paths_in_processes_and_the_served_path_unpaced(monkeypatch, tmp_path):
    """main: the in-process paths go to the Qwen3-TTS subprocess with the served pipeline's process
    count; the served path is unpaced unless --paced; --quick is the short form."""
    import json
    import subprocess

    seen = {}
    real_run = subprocess.run

    def fake_run(cmd, *a, **kw):
        if "--inprocess-only" not in cmd:  # git_commit, machine_info
            return real_run(cmd, *a, **kw)
        seen["cmd"] = cmd
        out = cmd[cmd.index("--out") + 1]
        one = _summary(100, 100, 8.0)
        json.dump({"q3-custom": {"inprocess": {"1": one, "8": one}, "qwen_tts": {"1": one, "8": one}}},
                  open(out, "w"))

    def fake_served(args, url):
        seen["paced"] = args.paced
        return {"q3-custom": {"1": _summary(50, 100, 8.0), "8": _summary(150, 300, 8.0)}}

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(b, "served", fake_served)
    monkeypatch.setattr(b, "scheduling_summary", lambda results: {})
    monkeypatch.setattr(b, "format_scheduling", lambda s: "")
    monkeypatch.setattr(b, "format_table", lambda results, ratios: "")
    out = tmp_path / "r.json"
    assert b.main(["--quick", "--triton-grpc-url", "x:1", "--out", str(out)]) == 0
    cmd = seen["cmd"]
    arg = lambda k: cmd[cmd.index(k) + 1]  # noqa: E731
    assert arg("--paths") == "inprocess,qwen_tts" and arg("--processes") == str(b.served_processes())
    assert (arg("--concurrency"), arg("--forms"), arg("--max-frames")) == ("1,8", "custom_voice", "24")
    assert b.served_processes() == 2  # talker + code2wav, one instance each (model_repository)
    assert seen["paced"] is False
    report = json.loads(out.read_text())
    assert report["targets"]["ttfp_p50_growth:q3-custom"]["measured"] == 3.0
    assert report["targets"]["ttfp_p50_growth:q3-custom"]["met"] is False
    assert report["ratios"]["q3-custom"]["1"]["triton_vs_qwen_tts"]["ttfp_p50"] == 0.5
    assert report["config"]["paced"] is False
    b.main(["--quick", "--triton-grpc-url", "x:1", "--out", str(out), "--paced", "--paths", "triton"])
    assert seen["paced"] is True

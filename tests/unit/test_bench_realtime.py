"""clients.bench_realtime: its pure parts (voiced bounds, pieces, the summary) and one session of
its three measurements against the frontend on a fake omni engine (Piper speech, server VAD)."""
from __future__ import annotations

import asyncio

import numpy as np
from test_realtime import OmniEngine, piper_pcm, server  # noqa: F401 - fixtures

from clients import bench_realtime as br

RATE = br.RATE


def test_voiced_bounds_and_pieces():
    pcm = np.zeros(RATE, "<i2")
    pcm[RATE // 4:RATE // 2] = 3000
    assert br.voiced_bounds_ms(pcm.tobytes()) == (250, 499)
    assert br.voiced_bounds_ms(bytes(4800)) is None
    parts = br.pieces(bytes(2 * RATE * 25 // 100), ms=100)  # 250 ms
    assert [len(p) for p in parts] == [4800, 4800, 2400]
    assert br.silence(10) == bytes(480)


def test_summarize_reports_ms_and_errors():
    results = [br.SessionResult(commit_to_first_audio=0.1, barge_in=0.02, statuses=["completed"]),
               br.SessionResult(commit_to_first_audio=0.3, late_audio_deltas=1, statuses=["cancelled"]),
               br.SessionResult(error="TimeoutError: x")]
    s = br.summarize(results, wall_s=1.234)
    assert s["sessions"] == 3 and s["wall_s"] == 1.23
    assert s["commit_to_first_audio_ms"] == {"mean": 200.0, "p50": 200.0, "p90": 280.0, "min": 100.0, "max": 300.0,
                                             "n": 2}
    assert s["barge_in_ms"]["n"] == 1 and s["speech_stop_to_first_audio_ms"]["n"] == 0
    assert s["barge_in_cancelled"] == 1 and s["late_audio_deltas"] == 1 and s["errors"] == ["TimeoutError: x"]
    assert s["statuses"] == ["cancelled", "completed"]


def test_one_session_against_a_fake_server(server, piper_pcm):  # noqa: F811
    port = server(OmniEngine(words=60, delay_s=0.05))
    results, _ = asyncio.run(br.run_level(f"http://127.0.0.1:{port}", "omni", [piper_pcm, piper_pcm], 1, 1,
                                          max_tokens=8, silence_ms=300, timeout_s=20))
    r = results[0]
    assert r.error is None, r.error
    assert r.commit_to_first_audio > 0 and r.speech_stop_to_first_audio > 0 and r.speech_end_to_first_audio > 0
    assert r.barge_in is not None and r.cancel_done > 0 and r.late_audio_deltas == 0  # the fake answers slowly
    assert "cancelled" in r.statuses

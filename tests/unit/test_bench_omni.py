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


def test_stage_pools_hold_one_object_per_instance():
    class Talker:
        num_code_groups = 4

        def __init__(self):
            self.streams = 0

        def stream(self, n):
            self.streams += 1
            yield from range(n)

    class Decoder:
        sampling_rate = 24000

        def decode(self, codes, left):
            return [len(codes)]

    talkers = [Talker(), Talker()]
    pool = bo._TalkerPool(talkers)
    assert pool.num_code_groups == 4 and list(pool.stream(3)) == [0, 1, 2]
    first = pool.stream(2)
    next(first)  # holds one talker while it streams
    assert list(pool.stream(1)) == [0]  # the other one serves a second request meanwhile
    list(first)
    assert sorted(t.streams for t in talkers) == [1, 2]
    dec = bo._LockedDecoder([Decoder()])
    assert dec.sampling_rate == 24000 and dec.decode([1, 2], [0]) == [2]


def test_talker_pool_speaks_while_thinking_on_one_held_talker():
    class Talker:
        num_code_groups = 4

        def stream_while_thinking(self, steps, *args, **kwargs):
            yield from steps

    pool = bo._TalkerPool([Talker()])
    first = pool.stream_while_thinking(iter([1, 2]))
    assert next(first) == 1
    assert pool.pool._free.empty()  # held while it streams
    assert list(first) == [2] and not pool.pool._free.empty()

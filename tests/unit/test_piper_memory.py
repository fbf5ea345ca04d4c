"""Piper's onnxruntime arena is given back after long sentences (omni_triton.stages.piper.speaker,
``ArenaBoundedSession``): the decision per run (a fake session), and the memory a real voice keeps
after a 24 s sentence (a subprocess, so its PSS is its own)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from omni_triton.stages.piper.speaker import SHRINK_ABOVE_IDS, ArenaBoundedSession


class FakeSession:
    def __init__(self):
        self.calls = []

    def run(self, output_names, feed, run_options=None):
        self.calls.append(run_options)
        return [np.zeros((1, 1, 10), np.float32)]

    def get_inputs(self):
        return ["input"]


def _feed(ids: int, length_scale: float = 1.0) -> dict:
    return {"input": np.zeros((1, ids), np.int64), "input_lengths": np.array([ids], np.int64),
            "scales": np.array([0.667, length_scale, 0.8], np.float32)}


def test_long_runs_shrink_the_arena_short_ones_keep_it():
    fake = FakeSession()
    session = ArenaBoundedSession(fake, shrink_above=200)
    session.run(None, _feed(150))
    session.run(None, _feed(250))
    session.run(None, _feed(60, length_scale=4.0))  # speed 0.25: 240 ids of speaking time
    assert fake.calls[0] is None
    assert fake.calls[1] is session.shrink_options and fake.calls[2] is session.shrink_options
    assert session.get_inputs() == ["input"]  # everything else is the session's


def test_negative_threshold_never_shrinks_zero_always():
    never, always = FakeSession(), FakeSession()
    ArenaBoundedSession(never, shrink_above=-1).run(None, _feed(5000))
    ArenaBoundedSession(always, shrink_above=0).run(None, _feed(1))
    assert never.calls == [None] and always.calls[0] is not None


_PROBE = """
import json, sys
from omni_triton.paths import model_dir
from omni_triton.stages.piper import PiperSpeaker, discover_voices
def pss():
    return sum(int(l.split()[1]) for l in open("/proc/self/smaps_rollup") if l.startswith("Pss:")) / 1024
speaker = PiperSpeaker(discover_voices(model_dir("piper-voices")), shrink_above=float(sys.argv[1]))
list(speaker.synthesize("Hello."))
loaded = pss()
seconds = sum(s.audio.size / s.sample_rate for s in speaker.synthesize(
    ", ".join(["and then the piper voice kept speaking"] * 12)))
print(json.dumps({"grown_mib": pss() - loaded, "seconds": seconds}))
"""


def test_a_long_sentence_leaves_no_arena_behind():
    """A 24 s one-sentence text: onnxruntime's arena took ~570 MiB for it and kept it
    (``shrink_above=-1``, the default before); with the default threshold the stub keeps < 100."""
    from omni_triton.paths import model_dir

    if not model_dir("piper-voices").exists():
        pytest.skip("Piper voice not prepared (omni-triton prepare --models piper_tts)")
    out = subprocess.run([sys.executable, "-c", _PROBE, str(SHRINK_ABOVE_IDS)], capture_output=True,
                         text=True, timeout=300, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["seconds"] > 15, result
    assert result["grown_mib"] < 100, result

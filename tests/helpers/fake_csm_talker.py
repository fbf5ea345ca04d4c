"""A ``CsmTalkerStage`` without Triton or a model, for unit tests of its frame grouping and first
chunk: its talker yields ``frames`` codec frames (int64 [1, 8], frame i filled with i)."""
from __future__ import annotations

import numpy as np


class _FakeTalker:
    def __init__(self, frames: int):
        self.frames = frames

    def stream(self, text, speaker, min_frames, max_frames, should_stop, paced):
        for i in range(self.frames):
            yield np.full((1, 8), i, np.int64)


class _Counter:
    def count(self, *args):
        pass


class OpenStream:
    """A response stream whose client never cancels."""

    cancel_seen = False

    def cancelled(self):
        return False


def fake_csm_talker_stage(frames: int, emit_frames: int):
    """A ``CsmTalkerStage`` built without ``initialize``: a fake talker of ``frames`` frames, one
    response per ``emit_frames`` frames, no metrics; set ``playback`` for deadline tests."""
    from omni_triton.adapters.csm import CsmTalkerStage

    stage = CsmTalkerStage.__new__(CsmTalkerStage)
    stage.talker, stage.emit_frames, stage.metrics, stage.step_scheduler = (
        _FakeTalker(frames), emit_frames, _Counter(), object())
    return stage

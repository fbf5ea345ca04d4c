"""The stub's call discipline (omni_triton.adapters.triton_io): every call into the server from any thread
goes through one lock. The 2.51 SIGSEGV came from two threads updating one ``pb_utils.Metric`` at
once (clients/repro_crash.py); these tests detect overlapping calls with fakes that sleep inside
the call, and show the detector fires when a call kind is left unlocked."""
from __future__ import annotations

import threading
import time

from omni_triton.adapters import triton_io


class OverlapDetector:
    """A fake Triton object whose calls record whether two threads were inside at once."""

    def __init__(self):
        self.inside = 0
        self.overlaps = 0
        self._count = threading.Lock()

    def _enter(self):
        with self._count:
            self.inside += 1
            if self.inside > 1:
                self.overlaps += 1
        time.sleep(0.002)  # long enough for the other threads to arrive
        with self._count:
            self.inside -= 1

    # pb_utils.Metric
    def increment(self, value):
        self._enter()

    def set(self, value):
        self._enter()

    # InferenceResponseSender
    def send(self, response=None, flags=0):
        self._enter()

    # InferenceRequest
    def is_cancelled(self):
        self._enter()
        return False


def hammer(calls, threads=4, each=15):
    workers = [threading.Thread(target=lambda: [c() for c in calls for _ in range(each)])
               for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def test_metric_updates_send_and_cancel_checks_never_overlap():
    fake = OverlapDetector()
    metric = triton_io.LockedMetric(fake)
    hammer([lambda: metric.increment(1), lambda: metric.set(2),
            lambda: triton_io.send(fake, None), lambda: triton_io.is_cancelled(fake)])
    assert fake.overlaps == 0


def test_detector_sees_overlap_when_metrics_are_left_unlocked(monkeypatch):
    # The pre-fix discipline (only send locked): the same hammering overlaps metric updates.
    monkeypatch.setattr(triton_io, "_LOCKED", {"send"})
    fake = OverlapDetector()
    metric = triton_io.LockedMetric(fake)
    hammer([lambda: metric.increment(1)])
    assert fake.overlaps > 0


def test_everything_is_locked_by_default():
    assert {"send", "cancel", "metrics", "log"} <= triton_io._LOCKED

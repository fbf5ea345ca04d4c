"""The talker's batching loop: requests of every form decode together, one step for all of a
form's requests at a time (vLLM-Omni's talker with ``max_num_seqs``), each with its own state,
cancel check and end callback. Tested without Triton (``tests/unit/test_qwen3_tts.py``)."""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import numpy as np

from omni_triton.stages.qwen3_tts.engine import Qwen3TtsForm, TalkerBatch, TalkerSeq
from omni_triton.stages.qwen3_tts.request import Qwen3TtsRequest

LOG = logging.getLogger("omni_triton.qwen3_tts")


class TalkerScheduler:
    """One loop thread owning a :class:`TalkerBatch` per form.

    Args:
        forms: task -> loaded form.
        max_seqs: requests decoding at once, over all forms; more wait in the queue (FIFO).
        on_step: called with the number of rows after every batched step (metrics, tests).
    """

    def __init__(self, forms: dict[str, Qwen3TtsForm], max_seqs: int = 8, on_step: Callable[[int], None] | None = None):
        self.forms = forms
        self.max_seqs = max(1, max_seqs)
        self.batches = {task: TalkerBatch(form, self.max_seqs) for task, form in forms.items()}
        self.on_step = on_step
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="qwen3-tts-talker", daemon=True)
        self._thread.start()

    def submit(self, req: Qwen3TtsRequest, emit: Callable[[np.ndarray], None], should_stop: Callable[[], bool],
               done: Callable[[str, BaseException | None], None]) -> None:
        """Queue ``req``: ``emit(frame int64 [G])`` per frame, ``done(reason, error)`` exactly once
        (reason ``stop`` | ``cancelled`` | ``error``), both on the loop thread."""
        self._queue.put((req, emit, should_stop, done))

    def active(self) -> int:
        return sum(len(b) for b in self.batches.values())

    def _admit(self, block: bool) -> None:
        while self.active() < self.max_seqs:
            try:
                req, emit, should_stop, done = self._queue.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                return
            block = False
            if should_stop():
                done("cancelled", None)
                continue
            try:
                prompt = self.forms[req.task].prompt(req)
                seq = TalkerSeq(prompt, emit, should_stop, done)
                self.batches[req.task].add(seq)
            except Exception as exc:
                LOG.exception("qwen3_tts talker: request failed at prefill")
                done("error", exc)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._admit(block=self.active() == 0)
            for batch in self.batches.values():
                if not len(batch):
                    continue
                rows = len(batch)
                try:
                    batch.step()
                except Exception as exc:
                    LOG.exception("qwen3_tts talker: batched step failed")
                    seqs = batch.seqs
                    batch.clear()
                    for seq in seqs:
                        seq.done("error", exc)
                if self.on_step is not None:
                    self.on_step(rows)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

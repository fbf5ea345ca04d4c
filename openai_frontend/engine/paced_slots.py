"""Bound on the real-time-paced streams a model holds at once (issue 29, newcomer trial).

A BLS pipeline (``csm``, ``qwen3_omni``, ``qwen3_tts``) serves one request per instance for as long
as its stream lasts (``omni_triton/adapters/bls.py``, "One thread"). An unpaced stream holds it for
its generation time (seconds); a ``PACED`` one for its playback (a minute for a long answer). With
every instance held by paced listeners, any other request to the pipeline waited for a whole
playback (8 paced ``tts`` streams of 71 s: an unpaced request's first byte after 66 s). The model's
config therefore declares ``max_paced_streams`` (below its ``instance_group`` count), and a paced
request above it is served unpaced: it gets its audio sooner than real time (its listener buffers
it) and gives its instance back after generation, so new requests still find a free one
(docs/scheduling.md "Pacing", "What a paced stream holds").
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

logger = logging.getLogger(__name__)


class PacedSlots:
    """Open paced streams per model, each bounded by its ``max_paced_streams``.

    The frontend's engine is one asyncio loop, so the counts need no lock. Counted per frontend
    process, over every replica of a model.
    """

    def __init__(self) -> None:
        self._open: dict[str, int] = {}

    def open_count(self, model: str) -> int:
        """Paced streams of ``model`` open now."""
        return self._open.get(model, 0)

    @contextlib.contextmanager
    def take(self, model: str, paced: bool, limit: int | None) -> Iterator[bool]:
        """Hold one paced slot of ``model`` while the block runs, if ``paced`` and one is free.

        Args:
            model: the Triton model name.
            paced: the request asked for real-time pacing.
            limit: the model's ``max_paced_streams``; None: no bound (single-stage models whose
                scheduler interleaves every open request, e.g. ``piper``).

        Yields:
            Whether the request is sent ``PACED``: ``paced`` and (no limit or a slot was free).
        """
        if not paced:
            yield False
            return
        if limit is not None and self.open_count(model) >= limit:
            logger.info("%s: %d paced streams open (max_paced_streams %d): this one is served unpaced",
                        model, self.open_count(model), limit)
            yield False
            return
        self._open[model] = self.open_count(model) + 1
        try:
            yield True
        finally:
            self._open[model] -= 1

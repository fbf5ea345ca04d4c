"""Admission control: a bounded number of in-flight Triton requests, 429 beyond it."""

from __future__ import annotations

from .errors import OpenAIError


class AdmissionController:
    """Non-blocking counter of in-flight Triton requests (one event loop, so no lock is needed).

    An HTTP request takes one unit per Triton request it fans out to (``n`` choices x prompts,
    ``n`` images). A slot is taken before the first Triton call and released when the response is fully sent,
    fails, or the client disconnects (streaming responses hold their slot while streaming).
    """

    def __init__(self, max_inflight: int, retry_after_s: int = 1):
        if max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        self.max_inflight = max_inflight
        self.retry_after_s = retry_after_s
        self.inflight = 0

    def acquire(self, cost: int = 1) -> Slot:
        """Take ``cost`` units (Triton requests) of capacity; 429 ``rate_limit_exceeded`` with
        ``Retry-After`` when fewer are free. ``cost`` must be in [1, ``max_inflight``]."""
        if not 1 <= cost <= self.max_inflight:
            raise ValueError(f"cost {cost} outside [1, {self.max_inflight}]")
        if self.inflight + cost > self.max_inflight:
            raise OpenAIError(
                429,
                f"Too many concurrent requests ({self.max_inflight} in flight); retry later",
                type="rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        self.inflight += cost
        return Slot(self, cost)


class Slot:
    """One admitted request; ``release()`` is idempotent."""

    def __init__(self, owner: AdmissionController, cost: int = 1):
        self._owner = owner
        self._cost = cost
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._owner.inflight -= self._cost

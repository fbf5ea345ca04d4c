"""Admission control: a bounded number of in-flight synthesis requests, 429 beyond it."""

from __future__ import annotations

from .errors import OpenAIError


class AdmissionController:
    """Non-blocking counter of in-flight requests (one event loop, so no lock is needed).

    A slot is taken before the first Triton call and released when the response is fully sent,
    fails, or the client disconnects (streaming responses hold their slot while streaming).
    """

    def __init__(self, max_inflight: int, retry_after_s: int = 1):
        if max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        self.max_inflight = max_inflight
        self.retry_after_s = retry_after_s
        self.inflight = 0

    def acquire(self) -> "Slot":
        if self.inflight >= self.max_inflight:
            raise OpenAIError(
                429,
                f"Too many concurrent requests ({self.max_inflight} in flight); retry later",
                type="rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        self.inflight += 1
        return Slot(self)


class Slot:
    """One admitted request; ``release()`` is idempotent."""

    def __init__(self, owner: AdmissionController):
        self._owner = owner
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._owner.inflight -= 1

"""Typed errors of the engine; each carries the HTTP status, OpenAI error ``type`` and ``code``
the frontend answers with (``openai_frontend.errors`` turns them into the OpenAI error body)."""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine raises; carries the HTTP mapping used by the routers."""

    status_code = 500
    error_type = "server_error"
    code: str | None = "internal_error"

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class TritonUnavailableError(EngineError):
    """Triton cannot be reached (connection refused, shutting down, deadline)."""

    status_code = 503
    error_type = "service_unavailable"
    code = "triton_unavailable"


class ModelNotFoundError(EngineError):
    """The model is not one this frontend serves."""

    status_code = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class ModelNotReadyError(EngineError):
    """The model is served but not READY in Triton (loading, failed, unloaded, missing)."""

    status_code = 503
    error_type = "service_unavailable"
    code = "model_not_ready"


class StageRestartedError(ModelNotReadyError):
    """A stage the request was running on died (its stub process was killed, crashed or ran out
    of memory) and is being restarted; Triton 2.51 would never have finished the request. A 503
    the client can retry (``Retry-After``); the frontend retries once itself where the request
    has no side effects and is deterministic."""

    code = "stage_restarted"


class StageDownError(StageRestartedError):
    """The request reached a stage that was already dead or reloading (Triton: "Stub process ...
    is not healthy", a BLS's "Model '...' is not ready"): it never ran. The same 503; a retry
    waits for the reload and does not count it as a second death."""


class InvalidRequestError(EngineError):
    """The model rejected the request's content (Triton ``INVALID_ARG``, e.g. a prompt longer
    than the model's context): the client's fault, HTTP 400."""

    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_value"


class InferenceError(EngineError):
    """Triton answered with an error response (the model's ``TritonError``) or the stream broke."""

    status_code = 500
    error_type = "server_error"
    code = "inference_error"


class ModelLoadingError(ModelNotReadyError):
    """An on-demand model is loading (``omni_triton.serve.on_demand``) and did not become ready
    within ``--load-timeout``; the load goes on. A 503 with ``Retry-After: retry_after_s``."""

    code = "model_loading"

    def __init__(self, message: str, *, param: str | None = None, retry_after_s: int = 5):
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s


class ModelLoadFailedError(ModelNotReadyError):
    """An on-demand model's load failed (Triton's reason in the message); the next request after
    the back-off (30 s) tries again: a 503 with ``Retry-After`` of that back-off."""

    code = "model_load_failed"

    def __init__(self, message: str, *, param: str | None = None, retry_after_s: int = 30):
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s


class ModelTooLargeError(EngineError):
    """An on-demand model does not fit in ``--memory-budget`` even with every other on-demand
    model unloaded (the message says its size and the budget). 503 without ``Retry-After``:
    waiting does not help."""

    status_code = 503
    error_type = "service_unavailable"
    code = "model_too_large"

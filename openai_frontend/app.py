"""FastAPI application factory: routers, OpenAI-style errors, admission control, body limit."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI

from .admission import AdmissionController
from .engine import Engine
from .errors import ErrorDetail, error_json, install_error_handlers
from .metrics import FrontendMetrics
from .routers import audio, chat, images, models, observability


@dataclass
class Settings:
    """Frontend knobs (all settable from ``python -m openai_frontend``).

    max_inflight: speech / chat / completion requests admitted at once; more get 429 + ``Retry-After``.
    default_max_input_chars: input limit for models whose config has no ``max_input_chars``
        (4096 = OpenAI's limit).
    max_body_bytes: requests with a larger ``Content-Length`` get 413 (16 MiB: room for a few
        uploaded images on ``/v1/images/edits``).
    """

    max_inflight: int = 16
    default_max_input_chars: int = 4096
    max_body_bytes: int = 16 << 20
    retry_after_s: int = 1


class BodySizeLimit:
    """ASGI middleware: 413 (OpenAI error body) when the request body exceeds ``limit`` bytes,
    judged by ``Content-Length`` or, for chunked bodies, by counting while it is read."""

    def __init__(self, app, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._reject(scope, receive, send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge()
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _TooLarge:
            await self._reject(scope, receive, send)

    async def _reject(self, scope, receive, send):
        detail = ErrorDetail(
            message=f"Request body larger than {self.limit} bytes",
            type="invalid_request_error",
            code="payload_too_large",
        )
        await error_json(413, detail)(scope, receive, send)


class _TooLarge(Exception):
    pass


def create_app(engine: Engine, settings: Settings | None = None, *, close_engine: bool = True) -> FastAPI:
    """Build the app around ``engine`` (``TritonEngine`` in production, a fake in unit tests)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        try:
            yield
        finally:
            if close_engine:
                await engine.close()

    app = FastAPI(title="Omni-Triton OpenAI frontend", lifespan=lifespan)
    app.state.engine = engine
    app.state.settings = settings
    app.state.admission = AdmissionController(settings.max_inflight, settings.retry_after_s)
    app.state.metrics = FrontendMetrics(app.state.admission)
    app.state.started_at = int(time.time())
    install_error_handlers(app)
    app.include_router(audio.router)
    app.include_router(images.router)
    app.include_router(chat.router)
    app.include_router(models.router)
    app.include_router(observability.router)
    app.add_middleware(BodySizeLimit, limit=settings.max_body_bytes)
    return app

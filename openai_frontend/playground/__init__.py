"""The browser playground (docs/playground.md): static HTML, CSS and JS modules served by the
frontend itself at ``/playground/`` (``/`` and ``/playground`` redirect there). No build step:
the files under ``static/`` are what the browser runs.

The page is public (no API key needed to load it; the API key middleware exempts
:data:`PREFIX`); every API call it makes goes to the same routes, with the same limits and the
same key, as any other client. Its responses carry a strict Content-Security-Policy (scripts,
styles and connections only from this origin; no framing), so a page served here cannot be
turned into a way around the API's rules.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: where the page lives; the API key middleware serves paths under it without a key
PREFIX = "/playground/"

#: ``Content-Security-Policy`` of every playground file. ``'self'`` covers ``ws:``/``wss:`` to
#: this host (CSP Level 3), which the Realtime tab needs; ``blob:`` media are decoded results
#: (images, WAV, MP4) fetched with the key and shown from memory.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
       "media-src 'self' blob: data:; connect-src 'self'; worker-src 'self' blob:; object-src 'none'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),  # revalidated (ETag): a new checkout's page is seen at once
    # the microphone for the Voices and Realtime tabs, from this origin only
    (b"permissions-policy", b"microphone=(self), camera=(), geolocation=()"),
)


def static_dir() -> Path:
    """The folder of the page's files (``openai_frontend/playground/static``)."""
    return Path(str(resources.files(__package__) / "static"))


class _WithHeaders:
    """ASGI wrapper adding :data:`SECURITY_HEADERS` to every response of ``app``."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                extra = [h for h in SECURITY_HEADERS if h[0] not in names]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def install_playground(app: FastAPI) -> None:
    """Serve the playground on ``app``: ``GET /`` and ``GET /playground`` redirect (307) to
    :data:`PREFIX`, whose files come from :func:`static_dir` (``index.html`` for the folder).
    Not in the OpenAPI document (they are not API operations)."""

    async def to_playground() -> RedirectResponse:
        return RedirectResponse(PREFIX, status_code=307)

    app.add_api_route("/", to_playground, methods=["GET", "HEAD"], include_in_schema=False)
    app.add_api_route("/playground", to_playground, methods=["GET", "HEAD"], include_in_schema=False)
    app.mount(PREFIX.rstrip("/"), _WithHeaders(StaticFiles(directory=static_dir(), html=True)), name="playground")

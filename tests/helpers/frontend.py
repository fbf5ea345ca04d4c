"""The OpenAI frontend app in-process for unit tests: ``create_app`` over a fake engine, reached
through an ``httpx.AsyncClient`` on an ASGI transport (no socket, no server)."""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from openai_frontend.app import Settings, create_app


def frontend_client(engine, settings: Settings | None = None, /, *, peer: tuple[str, int] | None = None,
                    base_url: str = "http://test", raise_app_exceptions: bool = True,
                    **fields) -> httpx.AsyncClient:
    """A client of a new frontend app over ``engine``.

    Args:
        engine: the engine the app serves (a fake of ``openai_frontend.engine.Engine``).
        settings: the app's settings; default ``Settings(**fields)``.
        peer: the client address the app sees (``(host, port)``); default httpx's.
        base_url: the URL requests are relative to.
        raise_app_exceptions: False: an exception escaping the app is a 500, as a real server
            answers, instead of raised into the test.
        **fields: ``Settings`` fields, when ``settings`` is not given.

    Returns:
        An unopened ``httpx.AsyncClient`` (use it with ``async with``).
    """
    if settings is not None and fields:
        raise TypeError("give settings or Settings fields, not both")
    app = create_app(engine, settings if settings is not None else Settings(**fields))
    extra = {"client": peer} if peer is not None else {}
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions, **extra)
    return httpx.AsyncClient(transport=transport, base_url=base_url)


@contextlib.asynccontextmanager
async def running_frontend(engine, settings: Settings | None = None, /,
                           **fields) -> AsyncIterator[httpx.AsyncClient]:
    """:func:`frontend_client` with the app's lifespan running (its background tasks: video jobs,
    the on-demand keep-alive, the serve-status watch), as uvicorn runs it. Yields the open
    client; its ``app`` attribute is the app."""
    client = frontend_client(engine, settings, **fields)
    app = client._transport.app  # the ASGITransport frontend_client built
    async with app.router.lifespan_context(app), client:
        client.app = app
        yield client


def serve_in_thread(app: Any, log_level: str = "warning") -> tuple[Any, threading.Thread, int]:
    """uvicorn (the real protocol code, its access log at ``log_level``) serving ``app`` on a free
    loopback port in a daemon thread, without the app's lifespan. Returns ``(server, thread,
    port)``; stop with ``server.should_exit = True`` and ``thread.join()``.

    Raises:
        AssertionError: uvicorn did not start within 20 s.
    """
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level=log_level, lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    return server, thread, server.servers[0].sockets[0].getsockname()[1]

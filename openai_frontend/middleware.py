"""ASGI middleware of the frontend: unexpected errors as JSON 500s, the optional API key, the
browser guard (cross-origin writes, DNS rebinding), the request body cap, the bounded
``X-Ignored-Fields`` header, control characters in the URL and the send timeout (slow readers).
Each answers in the OpenAI error shape (``errors.error_json``)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .auth import KEY_SUBPROTOCOL_PREFIX, ApiKeyCheck, header, is_loopback, offered_subprotocols, url_credentials
from .errors import error_json
from .schemas import ErrorDetail

logger = logging.getLogger(__name__)


class _TrackingSend:
    """An ASGI ``send`` that remembers whether the response has started (status line sent)."""

    def __init__(self, send: Send):
        self._send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


class UnexpectedErrors:
    """An exception no handler took becomes a JSON 500 (``server_error`` / ``internal_error``,
    the exception's class name only: no message, path or stack trace), sent as a normal response
    so the keep-alive connection survives. (Starlette's own 500 handler re-raises after
    answering, and uvicorn then drops the connection without ``Connection: close``.)
    An exception after the status line was sent is re-raised: the transfer must be aborted."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        sent = _TrackingSend(send)
        try:
            await self.app(scope, receive, sent)
        except Exception as exc:
            if sent.started:
                raise
            logger.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            detail = ErrorDetail(message=f"Internal server error ({type(exc).__name__})",
                                 type="server_error", code="internal_error")
            await error_json(500, detail)(scope, receive, send)


class SendTimedOut(ConnectionError):
    """Raised from ``send`` by :class:`SendTimeout` once one message took too long to send."""


class SendTimeout:
    """Abandons an HTTP response whose client stops reading it.

    When one ``send()`` of a response (a body chunk: uvicorn's ``send`` waits while the socket's
    write buffer is full) does not complete within ``timeout_s`` seconds, the pending send is
    cancelled and ``SendTimedOut`` is raised into the app, and so is every later ``send``: a
    streaming body's generator is closed (its Triton stream cancelled, its admission slot
    released). The connection is then dropped (the transport aborted where the server exposes it,
    uvicorn; else closed), one warning is logged and ``on_timeout`` is called (the
    ``omni_frontend_send_timeouts_total`` counter). The app's exception is not re-raised: the
    server would log it as an application error. WebSocket connections pass unchanged.

    ``asyncio.wait``, not ``asyncio.wait_for``: the latter can swallow a cancellation of the caller
    on Python 3.10/3.11.
    """

    def __init__(self, app: ASGIApp, timeout_s: float, on_timeout: Callable[[], None] | None = None):
        self.app = app
        self.timeout_s = timeout_s
        self.on_timeout = on_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.timeout_s or self.timeout_s <= 0:
            return await self.app(scope, receive, send)
        timed_out = False

        async def timed_send(message: Message) -> None:
            nonlocal timed_out
            if timed_out:
                raise SendTimedOut("the client stopped reading the response")
            task = asyncio.ensure_future(send(message))
            try:
                done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
            except BaseException:  # our caller was cancelled: so is the send
                task.cancel()
                raise
            if task in done:
                return task.result()
            task.cancel()
            timed_out = True
            self._timed_out(scope, send)
            raise SendTimedOut(f"a response message was not sent within {self.timeout_s:g} s "
                               "(--send-timeout-s)")

        try:
            await self.app(scope, receive, timed_send)
        except Exception:
            if not timed_out:
                raise
        if timed_out:
            await asyncio.sleep(0)  # let the aborted transport report the connection lost

    def _timed_out(self, scope: Scope, send: Send) -> None:
        client = scope.get("client")
        logger.warning("client %s stopped reading the response to %s %s: not sent within %g s "
                       "(--send-timeout-s); response abandoned, connection closed",
                       f"{client[0]}:{client[1]}" if client else "?", scope.get("method"),
                       scope.get("path"), self.timeout_s)
        if self.on_timeout is not None:
            self.on_timeout()
        # uvicorn's send is a bound method of its request cycle, which holds the transport:
        # aborting it drops the unsent buffer (a close would wait for a reader that never reads)
        transport = getattr(getattr(send, "__self__", None), "transport", None)
        abort = getattr(transport, "abort", None)
        if callable(abort):
            abort()


class ApiKey:
    """The API key gate (``auth.ApiKeyCheck``), on HTTP requests and WebSocket handshakes.

    With a key configured, every path except ``exempt`` (and those starting with one of
    ``exempt_prefixes``: the playground's static files) needs the key in a header
    (``Authorization: Bearer <key>``, or on a WebSocket the ``openai-insecure-api-key.<key>``
    subprotocol); otherwise 401 ``invalid_api_key`` with ``WWW-Authenticate: Bearer``. A
    credential-like query parameter (``?api_key=``, ``auth.URL_KEY_PARAMS``) is a 401
    ``api_key_in_url`` even when it holds the right key: URLs land in logs. A refused WebSocket
    gets the same JSON 401 where the server supports ASGI's ``websocket.http.response``
    (uvicorn does), else a close (code 1008, which the server answers 403).

    With or without a key, a WebSocket client that offered the key subprotocol (the browser
    convention) gets the first other offered subprotocol selected on accept (a browser fails a
    handshake whose offered subprotocols got no answer), never the one holding the key.
    """

    def __init__(self, app: ASGIApp, check: ApiKeyCheck, exempt: tuple[str, ...] = ("/health", "/metrics"),
                 exempt_prefixes: tuple[str, ...] = ()):
        self.app = app
        self.check = check
        self.exempt = frozenset(exempt)
        #: path prefixes served without the key (the playground's static page, which asks for it)
        self.exempt_prefixes = tuple(exempt_prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            send = _answer_key_subprotocol(scope, send)
        path = scope.get("path") or ""
        if not self.check.enabled or path in self.exempt or path.startswith(self.exempt_prefixes):
            return await self.app(scope, receive, send)
        in_url = url_credentials(scope)
        if in_url:
            message = (f"API keys in the URL are refused (query parameter {in_url[0]!r}): URLs land in "
                       "logs. Send 'Authorization: Bearer <key>' (or, from a browser WebSocket, the "
                       f"subprotocol '{KEY_SUBPROTOCOL_PREFIX}<key>')")
            code = "api_key_in_url"
        elif self.check.authorized(scope):
            return await self.app(scope, receive, send)
        elif self.check.presented(scope):
            message, code = "Incorrect API key provided", "invalid_api_key"
        else:
            message = "Missing API key: send it as 'Authorization: Bearer <key>'"
            code = "invalid_api_key"
        detail = ErrorDetail(message=message, type="invalid_request_error", code=code)
        await _refuse(401, detail, scope, receive, send, {"WWW-Authenticate": "Bearer"})


def _answer_key_subprotocol(scope: Scope, send: Send) -> Send:
    """``send`` that selects a subprotocol on ``websocket.accept`` when the client offered the
    key one and the app chose none: the first offered subprotocol not carrying a key."""
    offered = offered_subprotocols(scope)
    if not any(p.startswith(KEY_SUBPROTOCOL_PREFIX) for p in offered):
        return send
    others = [p for p in offered if not p.startswith(KEY_SUBPROTOCOL_PREFIX)]

    async def send_with_subprotocol(message: Message) -> None:
        if message["type"] == "websocket.accept" and not message.get("subprotocol") and others:
            message = {**message, "subprotocol": others[0]}
        await send(message)

    return send_with_subprotocol


async def _refuse(status: int, detail: ErrorDetail, scope: Scope, receive: Receive, send: Send,
                  headers: dict[str, str] | None = None) -> None:
    """Answers ``status`` with the OpenAI error body on HTTP; on a WebSocket handshake the same
    response through ``websocket.http.response`` when the server has it, else a 1008 close."""
    if scope["type"] == "websocket" and "websocket.http.response" not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close", "code": 1008, "reason": detail.code or "refused"})
        return
    await error_json(status, detail, headers)(scope, receive, send)


class SingleHeaders:
    """400 ``duplicate_header`` for a request (HTTP or WebSocket handshake) with more than one
    ``Host`` (RFC 9112 section 3.2: a server must answer 400) or more than one ``Origin`` or
    ``Authorization``: every check downstream reads the first value, and a second one must not
    be able to slip past it (two ``Host`` headers passed the DNS-rebinding guard)."""

    NAMES = (b"host", b"origin", b"authorization")

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        seen: set[bytes] = set()
        for key, _ in scope.get("headers") or ():
            if key in self.NAMES:
                if key in seen:
                    detail = ErrorDetail(message=f"More than one {key.decode().title()} header",
                                         type="invalid_request_error", code="duplicate_header")
                    return await _refuse(400, detail, scope, receive, send)
                seen.add(key)
        await self.app(scope, receive, send)


#: C0 control characters and DEL: never part of an id, a name or a cursor
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


class ControlCharsInUrl:
    """400 ``invalid_characters`` for a request (HTTP or WebSocket handshake) whose decoded path
    or query string holds a C0 control character (``%00``...``%1F``) or DEL (``%7F``), before any
    route runs: a path parameter or ``?after=`` cursor with a NUL reached the database, and
    PostgreSQL refuses NUL in text (a 500 there; SQLite answered a 404)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        from urllib.parse import unquote_plus

        where = None
        if _CONTROL_CHARS.search(scope.get("path") or ""):
            where = "path"
        else:
            query = (scope.get("query_string") or b"").decode("latin-1")
            if _CONTROL_CHARS.search(unquote_plus(query, encoding="latin-1")):
                where = "query string"
        if where is None:
            return await self.app(scope, receive, send)
        detail = ErrorDetail(message=f"The URL's {where} must not contain control characters (NUL, %00-%1F, %7F)",
                             type="invalid_request_error", code="invalid_characters")
        await _refuse(400, detail, scope, receive, send)


_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def _split_host(value: str) -> tuple[str, int | None] | None:
    """``host[:port]`` (IPv6 in brackets) -> (lower-case host without brackets, port or None);
    None when unparsable."""
    if not value or any(c in value for c in "@/?#\\ \t"):  # a bare authority only: no userinfo, no path
        return None
    try:
        parts = urlsplit("//" + value)
        return (parts.hostname or "").lower(), parts.port
    except ValueError:
        return None


def _origin_parts(origin: str) -> tuple[str, str, int] | None:
    """``scheme://host[:port]`` -> (scheme, host, port with the scheme's default); None when it
    is not such an origin (``null``, garbage)."""
    try:
        parts = urlsplit(origin)
        if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
            return None
        return parts.scheme, parts.hostname.lower(), parts.port or _DEFAULT_PORTS[parts.scheme]
    except ValueError:
        return None


def _is_ip_or_localhost(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


class BrowserGuard:
    """What a web page may make a browser do to this server, for a frontend running without an
    API key (a developer's local server): the checks ``CORS`` does not make.

    - **Cross-origin writes**: a ``POST``/``PUT``/``PATCH``/``DELETE`` (or any method but
      ``GET``/``HEAD``/``OPTIONS``) or a WebSocket handshake (browsers apply no CORS to either:
      a page can send a form or multipart ``POST`` and open a WebSocket to any origin) that
      carries an ``Origin`` header is a 403 ``cross_origin_refused`` unless that origin is the
      request's own (scheme default port, host and port equal to the ``Host`` header's) or listed
      in ``allowed_origins``; ``Origin: null`` (sandboxed frames, ``file:`` pages) is refused.
      Without ``Origin``, ``Sec-Fetch-Site: cross-site``/``same-site`` is refused the same way.
      Requests without either header (curl, SDKs, servers) pass.
    - **DNS rebinding**: a request that arrived on a loopback address (``scope["server"]``) must
      name a loopback host in ``Host``: ``localhost``, ``*.localhost``, an IP address, or the
      host of an ``allowed_origins`` entry; else 403 ``host_not_allowed``. (A page on
      ``http://evil.example:9000`` whose name is rebound to 127.0.0.1 is same-origin for the
      browser and sends ``Host: evil.example:9000``.)

    ``allowed_origins`` holds origins (``https://app.example.com``, ``http://localhost:3000``);
    ``"*"`` in it switches the guard off.
    """

    def __init__(self, app: ASGIApp, allowed_origins: tuple[str, ...] = ()):
        self.app = app
        self.off = "*" in allowed_origins
        self.origins = frozenset(p for p in (_origin_parts(o.strip().rstrip("/")) for o in allowed_origins) if p)
        self.hosts = frozenset(host for _, host, _ in self.origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.off or scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        refusal = self._refusal(scope)
        if refusal is None:
            return await self.app(scope, receive, send)
        await _refuse(403, refusal, scope, receive, send)

    def _refusal(self, scope: Scope) -> ErrorDetail | None:
        host_header = (header(scope, b"host") or b"").decode("latin-1")
        host = _split_host(host_header)
        server = scope.get("server")
        if server and is_loopback(str(server[0])) and (
                host is None or not (_is_ip_or_localhost(host[0]) or host[0] in self.hosts)):
            return ErrorDetail(
                message=f"Host {host_header[:100]!r} is not allowed on a loopback address (DNS rebinding guard); "
                        "use localhost or 127.0.0.1, or list the origin in --allowed-origins",
                type="invalid_request_error", code="host_not_allowed")
        if scope["type"] == "http" and scope.get("method", "GET").upper() in _SAFE_METHODS:
            return None
        origin = header(scope, b"origin")
        if origin is not None:
            parts = _origin_parts(origin.decode("latin-1").strip())
            if parts is not None and (parts in self.origins or self._same_origin(parts, host)):
                return None
            shown = origin.decode("latin-1")[:100]
        else:
            site = (header(scope, b"sec-fetch-site") or b"").decode("latin-1").strip().lower()
            if site not in ("cross-site", "same-site"):
                return None  # not a browser, or same-origin / user-initiated ("none")
            shown = f"(none; Sec-Fetch-Site: {site})"
        return ErrorDetail(
            message=f"Cross-origin request refused: Origin {shown!r} is not this server's origin. "
                    "Browsers may not write to a frontend that runs without an API key from another "
                    "site; set --api-key, or list the origin in --allowed-origins",
            type="invalid_request_error", code="cross_origin_refused")

    @staticmethod
    def _same_origin(origin: tuple[str, str, int], host: tuple[str, int | None] | None) -> bool:
        if host is None or not host[0]:
            return False
        scheme, name, port = origin
        # a Host without a port means the default port of the scheme the browser used
        return name == host[0] and port == (host[1] or _DEFAULT_PORTS[scheme])


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a body passes the cap. An ``HTTPException``, so FastAPI's
    body reader re-raises it as-is (anything else becomes its 400 "error parsing the body") and
    the app's handler answers 413."""

    def __init__(self, limit: int):
        super().__init__(413, f"Request body larger than {limit} bytes")


class BodySizeLimit:
    """413 (OpenAI error body, ``payload_too_large``) when the request body exceeds ``limit``
    bytes, judged by ``Content-Length`` or, for chunked bodies, by counting while it is read.
    ``overrides``: ``{(method, path): limit}`` for the few routes that take larger bodies (a LoRA
    upload, ``POST /v1/loras``)."""

    def __init__(self, app: ASGIApp, limit: int, overrides: dict[tuple[str, str], int] | None = None):
        self.app = app
        self.limit = limit
        self.overrides = dict(overrides or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.overrides.get((scope.get("method", ""), scope.get("path", "")), self.limit)
        headers = dict(scope.get("headers") or ())
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await self._reject(scope, receive, send, limit)
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        sent = _TrackingSend(send)
        try:
            await self.app(scope, limited_receive, sent)
        except BodyTooLarge:
            if sent.started:
                raise
            await self._reject(scope, receive, send, limit)

    async def _reject(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        detail = ErrorDetail(message=f"Request body larger than {limit} bytes",
                             type="invalid_request_error", code="payload_too_large")
        await error_json(413, detail, {"Connection": "close"})(scope, receive, send)


#: ``X-Ignored-Fields`` bounds: names listed, characters per (encoded) name, bytes of the value
IGNORED_FIELDS_MAX_NAMES = 16
IGNORED_FIELDS_MAX_NAME_CHARS = 64
IGNORED_FIELDS_MAX_BYTES = 1024
#: printable ASCII a name keeps as-is in the header; everything else is percent-encoded (UTF-8)
_FIELD_NAME_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in ',%"\\')


def _encode_field_name(name: str, max_chars: int) -> str:
    """``name`` percent-encoded (UTF-8; lone surrogates as their ``surrogatepass`` bytes) outside
    ``_FIELD_NAME_SAFE``, cut to ``max_chars`` at a whole escape with ``...`` when longer."""
    from urllib.parse import quote

    # look at no more of a huge name than can be shown: 3 escaped chars per byte, 4 bytes per char
    encoded = quote(name[:max_chars].encode("utf-8", "surrogatepass"), safe=_FIELD_NAME_SAFE)
    if len(encoded) <= max_chars and len(name) <= max_chars:
        return encoded
    cut = max_chars - 3
    if "%" in encoded[max(0, cut - 2):cut]:  # do not split a %XX escape
        cut = encoded.rindex("%", 0, cut)
    return encoded[:cut] + "..."


def format_field_names(names: Iterable[object], max_names: int = IGNORED_FIELDS_MAX_NAMES,
                       max_name_chars: int = IGNORED_FIELDS_MAX_NAME_CHARS,
                       max_bytes: int = IGNORED_FIELDS_MAX_BYTES) -> str:
    """The ``X-Ignored-Fields`` value (also used in log lines): field names joined by ``", "``,
    header-safe and bounded.

    Each name is percent-encoded (UTF-8) outside printable ASCII and in ``,`` ``%`` ``"`` ``\\``
    (so ``"€"`` is ``%E2%82%AC``: never a CR/LF, never a non-Latin-1 header value), cut to
    ``max_name_chars`` characters (``...`` at the end when cut); at most ``max_names`` names and
    ``max_bytes`` bytes in all, the rest counted in a last ``... (+N more)`` item. The result is
    ASCII and at most ``max_bytes`` long (for ``max_bytes`` >= 32).
    """
    names = list(names)
    shown: list[str] = []
    size = 0
    for i, name in enumerate(names):
        if i >= max_names:
            break
        item = _encode_field_name(str(name), max_name_chars)
        rest = len(names) - i - 1
        # room for this item plus, if anything follows, the longest possible "... (+N more)"
        tail = len(f", ... (+{len(names)} more)") if rest else 0
        if size + (2 if shown else 0) + len(item) + tail > max_bytes:
            break
        size += (2 if shown else 0) + len(item)
        shown.append(item)
    if len(shown) < len(names):
        shown.append(f"... (+{len(names) - len(shown)} more)")
    return ", ".join(shown)


class IgnoredFieldsHeader:
    """``X-Ignored-Fields: a, b.c`` on the response to a request whose unknown fields were
    ignored (``serving.common.check_fields`` leaves their names in ``scope["state"]``), on every
    kind of response (JSON, raw audio stream, SSE). Absent when every field was known. The value
    is :func:`format_field_names`: percent-encoded names, at most 16 of 64 characters and 1 KiB
    in all, then ``... (+N more)``."""

    HEADER = "X-Ignored-Fields"

    def __init__(self, app: ASGIApp, state_key: str):
        self.app = app
        self.state_key = state_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = (scope.get("state") or {}).get(self.state_key)
                if names:
                    MutableHeaders(scope=message).append(self.HEADER, format_field_names(names))
            await send(message)

        await self.app(scope, receive, send_with_header)


class SpeechFormToJson:
    """``POST /v1/audio/speech`` as ``multipart/form-data`` (or urlencoded) (per-request cloning with an uploaded
    clip: ``-F input=... -F ref_audio=@ref.wav -F ref_text=...``) turned into the same JSON request
    before FastAPI reads it, so it goes through the one validation path: a file part becomes a
    ``data:<type>;base64,`` URL, a text part of a non-string field is read as JSON (``speed=1.5``,
    ``stream=true``, ``voice={"id": "voice_..."}``), every other text part stays a string.
    Sits inside ``BodySizeLimit`` (the cap applies to the form). Docs: docs/voices.md."""

    PATH = "/v1/audio/speech"
    #: form bounds: ``ref_audio`` (+ one spare) file parts, text fields, bytes of one text field
    MAX_FILES = 2
    MAX_FIELDS = 64
    MAX_FIELD_BYTES = 1 << 20

    def __init__(self, app: ASGIApp, json_fields: frozenset[str] = frozenset()):
        self.app = app
        self.json_fields = json_fields  # fields whose text parts are parsed as JSON

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") != self.PATH
                or not dict(scope.get("headers") or ()).get(b"content-type", b"").startswith(
                    (b"multipart/form-data", b"application/x-www-form-urlencoded"))):
            return await self.app(scope, receive, send)
        import base64
        import json

        from starlette.datastructures import UploadFile
        from starlette.requests import Request

        from .errors import OpenAIError
        from .serving.common import read_form

        try:
            form = await read_form(Request(scope, receive), max_files=self.MAX_FILES, max_fields=self.MAX_FIELDS,
                                   max_part_size=self.MAX_FIELD_BYTES)
        except OpenAIError as exc:  # answered here: this middleware runs outside the app's handlers
            return await error_json(exc.status_code, exc.detail)(scope, receive, send)
        try:
            fields: dict[str, Any] = {}
            for key, value in form.multi_items():
                if isinstance(value, UploadFile):
                    data = await value.read()
                    mime = value.content_type or "application/octet-stream"
                    value = f"data:{mime};base64," + base64.b64encode(data).decode()
                elif key in self.json_fields or (key == "voice" and value.lstrip().startswith("{")):
                    try:
                        value = json.loads(value)
                    except ValueError:
                        pass  # left a string: the schema names the field in its 400
                fields[key] = value
            await form.close()
        except HTTPException:  # the body cap (413), answered by BodySizeLimit
            raise
        except Exception as exc:
            detail = ErrorDetail(message=f"Malformed multipart body: {exc}", type="invalid_request_error",
                                 code="invalid_multipart")
            return await error_json(400, detail)(scope, receive, send)
        body = json.dumps(fields).encode()
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-type", b"content-length")]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        sent = False

        async def json_receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app({**scope, "headers": headers}, json_receive, send)


class JsonValueLimit:
    """413 (``payload_too_large``) for a JSON request body with more than ``limit`` values.

    FastAPI parses a JSON body (``json.loads``) and validates it (pydantic) on the event loop, and
    neither releases the GIL, so their cost must be bounded: it grows with the number of values
    (16 MiB of ``[1,1,...]`` or of tiny chat messages took seconds), not with the bytes of one
    long string (a base64 data URL parses at memory speed). The values are counted, over-estimated,
    as the ``,``, ``{`` and ``[`` bytes of each body chunk as it arrives (a C scan, spread over
    the chunks), before anything is parsed. Bodies of other content types pass unchanged.
    """

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or b"json" not in dict(scope.get("headers") or ()).get(b"content-type", b""):
            return await self.app(scope, receive, send)
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                body = message.get("body", b"")
                seen += body.count(b",") + body.count(b"{") + body.count(b"[")
                if seen > self.limit:
                    # an HTTPException: FastAPI's body reader re-raises it and the app answers 413
                    raise HTTPException(413, f"The JSON body holds more than {self.limit} values "
                                             "(--max-json-values)", headers={"Connection": "close"})
            return message

        await self.app(scope, counting_receive, send)

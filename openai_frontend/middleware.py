"""ASGI middleware of the frontend: unexpected errors as JSON 500s, the optional API key, and the
request body cap. Each answers in the OpenAI error shape (``errors.error_json``)."""

from __future__ import annotations

import logging
import secrets

from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException

from .errors import ErrorDetail, error_json

logger = logging.getLogger(__name__)


class _TrackingSend:
    """An ASGI ``send`` that remembers whether the response has started (status line sent)."""

    def __init__(self, send):
        self._send = send
        self.started = False

    async def __call__(self, message):
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


class UnexpectedErrors:
    """An exception no handler took becomes a JSON 500 (``server_error`` / ``internal_error``,
    the exception's class name only: no message, path or stack trace), sent as a normal response
    so the keep-alive connection survives. (Starlette's own 500 handler re-raises after
    answering, and uvicorn then drops the connection without ``Connection: close``.)
    An exception after the status line was sent is re-raised: the transfer must be aborted."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
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


class ApiKey:
    """Optional API key: every path except ``exempt`` needs ``Authorization: Bearer <key>``
    (what the OpenAI SDKs send); otherwise 401 ``invalid_api_key`` with
    ``WWW-Authenticate: Bearer``. Keys are compared in constant time."""

    def __init__(self, app, key: str, exempt: tuple[str, ...] = ("/health", "/metrics")):
        if not key:
            raise ValueError("empty API key")
        self.app = app
        self._key = key.encode("utf-8")
        self.exempt = frozenset(exempt)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") in self.exempt:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        auth = headers.get(b"authorization", b"")
        scheme, _, token = auth.partition(b" ")
        if scheme.lower() == b"bearer" and secrets.compare_digest(token.strip(), self._key):
            return await self.app(scope, receive, send)
        message = ("Incorrect API key provided" if auth else
                   "Missing API key: send it as 'Authorization: Bearer <key>'")
        detail = ErrorDetail(message=message, type="invalid_request_error", code="invalid_api_key")
        await error_json(401, detail, {"WWW-Authenticate": "Bearer"})(scope, receive, send)


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a body passes the cap. An ``HTTPException``, so FastAPI's
    body reader re-raises it as-is (anything else becomes its 400 "error parsing the body") and
    the app's handler answers 413."""

    def __init__(self, limit: int):
        super().__init__(413, f"Request body larger than {limit} bytes")


class BodySizeLimit:
    """413 (OpenAI error body, ``payload_too_large``) when the request body exceeds ``limit``
    bytes, judged by ``Content-Length`` or, for chunked bodies, by counting while it is read."""

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
                    raise BodyTooLarge(self.limit)
            return message

        sent = _TrackingSend(send)
        try:
            await self.app(scope, limited_receive, sent)
        except BodyTooLarge:
            if sent.started:
                raise
            await self._reject(scope, receive, send)

    async def _reject(self, scope, receive, send):
        detail = ErrorDetail(message=f"Request body larger than {self.limit} bytes",
                             type="invalid_request_error", code="payload_too_large")
        await error_json(413, detail, {"Connection": "close"})(scope, receive, send)


class IgnoredFieldsHeader:
    """``X-Ignored-Fields: a, b.c`` on the response to a request whose unknown fields were
    ignored (``serving.common.check_fields`` leaves their names in ``scope["state"]``), on every
    kind of response (JSON, raw audio stream, SSE). Absent when every field was known."""

    HEADER = "X-Ignored-Fields"

    def __init__(self, app, state_key: str):
        self.app = app
        self.state_key = state_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_header(message):
            if message["type"] == "http.response.start":
                names = (scope.get("state") or {}).get(self.state_key)
                if names:
                    MutableHeaders(scope=message).append(self.HEADER, ", ".join(names))
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

    def __init__(self, app, json_fields: frozenset[str] = frozenset()):
        self.app = app
        self.json_fields = json_fields  # fields whose text parts are parsed as JSON

    async def __call__(self, scope, receive, send):
        if (scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") != self.PATH
                or not dict(scope.get("headers") or ()).get(b"content-type", b"").startswith(
                    (b"multipart/form-data", b"application/x-www-form-urlencoded"))):
            return await self.app(scope, receive, send)
        import base64
        import json

        from starlette.datastructures import UploadFile
        from starlette.requests import Request

        try:
            form = await Request(scope, receive).form(max_files=2, max_fields=64)
            fields: dict = {}
            for key, value in form.multi_items():
                if isinstance(value, UploadFile):
                    data = await value.read()
                    value = f"data:{value.content_type or 'application/octet-stream'};base64," + base64.b64encode(data).decode()
                elif key in self.json_fields or (key == "voice" and value.lstrip().startswith("{")):
                    try:
                        value = json.loads(value)
                    except ValueError:
                        pass  # left a string: the schema names the field in its 400
                fields[key] = value
            await form.close()
        except HTTPException:  # the body cap (413)
            raise
        except Exception as exc:  # noqa: BLE001 - a malformed multipart body
            detail = ErrorDetail(message=f"Malformed multipart body: {exc}", type="invalid_request_error",
                                 code="invalid_multipart")
            return await error_json(400, detail)(scope, receive, send)
        body = json.dumps(fields).encode()
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-type", b"content-length")]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        sent = False

        async def json_receive():
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

    def __init__(self, app, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or b"json" not in dict(scope.get("headers") or ()).get(b"content-type", b""):
            return await self.app(scope, receive, send)
        seen = 0

        async def counting_receive():
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

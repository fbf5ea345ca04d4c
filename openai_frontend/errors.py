"""OpenAI-style errors: one exception type, one JSON shape, handlers for everything else.

Every error leaves the server as ``{"error": {"message", "type", "param", "code"}}`` with a
matching HTTP status, including FastAPI's validation errors (400, not 422), malformed JSON,
unknown routes and unexpected exceptions (500 via ``middleware.UnexpectedErrors``; logged,
never fatal to the server). Messages never carry file paths or stack traces (``public_message``).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .engine.errors import EngineError, ModelTooLargeError
from .schemas import ErrorDetail, ErrorResponse

logger = logging.getLogger(__name__)


class OpenAIError(Exception):
    """An error to return to the client as-is."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status_code = status_code
        self.detail = ErrorDetail(message=message, type=type, param=param, code=code)
        self.headers = headers


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


#: Absolute paths under the usual system roots (``/root/.cache/...``, ``/usr/lib/...``): never
#: shown to clients. API paths such as ``/v1/images/edits`` are left alone.
_PATH = re.compile(r"(?<![\w/])(?:/(?:root|home|tmp|usr|opt|work|var|etc|dev|proc|srv|mnt|run|lib|lib64|"
                   r"app|workspace|data|site-packages)\b[^\s'\",:;()\[\]]*|[A-Za-z]:\\[^\s'\",:;]*)")
_TRACEBACK = "Traceback (most recent call last)"


def public_message(message: str) -> str:
    """``message`` fit for a client: stack traces cut off, file paths replaced by ``<path>``,
    and never empty (an exception without text once gave "llm: llm failed: ")."""
    if _TRACEBACK in message:
        message = message.split(_TRACEBACK, 1)[0].rstrip()
    message = _PATH.sub("<path>", message).strip()
    if not message or message.endswith(":"):
        message = (message + " " if message else "") + "no details available"
    return message


class _ErrorResponse(JSONResponse):
    """JSON with ASCII escapes: an error that quotes client text can never fail to encode (a lone
    surrogate would make Starlette's UTF-8 rendering raise)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_json(
    status_code: int, detail: ErrorDetail, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The OpenAI error body ``{"error": {"message", "type", "param", "code"}}`` with
    ``status_code``; the message goes through ``public_message``."""
    detail = detail.model_copy(update={"message": public_message(detail.message)})
    return _ErrorResponse(ErrorResponse(error=detail).model_dump(), status_code=status_code,
                          headers=headers)


def engine_error_detail(exc: EngineError) -> ErrorDetail:
    """The OpenAI error detail of an engine error (message cleaned by ``public_message``; also
    used for error events inside streams)."""
    return ErrorDetail(message=public_message(exc.message), type=exc.error_type, param=exc.param,
                       code=exc.code)


def retry_after_s(exc: EngineError) -> int | None:
    """``Retry-After`` seconds of an engine error: the error's own ``retry_after_s`` (an
    on-demand model loading: ``ModelLoadingError``), none for ``model_too_large`` (waiting does not
    help), else 1 for every other 503 (a stage being restarted, Triton unavailable), none below."""
    if exc.status_code != 503 or isinstance(exc, ModelTooLargeError):
        return None
    own = getattr(exc, "retry_after_s", None)
    return int(own) if isinstance(own, (int, float)) else 1


def _validation_detail(exc: RequestValidationError) -> ErrorDetail:
    return validation_detail(list(exc.errors()))


def validation_detail(errors: list[Any]) -> ErrorDetail:
    """The OpenAI error detail of pydantic's ``errors()`` (a ``ValidationError`` or FastAPI's
    ``RequestValidationError``): the most telling error's field as ``param`` (union-member tags
    such as ``function-after[...]`` left out), our validators' codes (``invalid_characters``)."""
    # our own validators' errors say the most; with unions pydantic lists one error per member
    ours = [e for e in errors if e.get("type") in _CUSTOM_CODES]
    first = ours[0] if ours else (errors[0] if errors else {})
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        return ErrorDetail(
            message=f"Malformed JSON body: {ctx.get('error', first.get('msg', ''))}",
            type="invalid_request_error",
            code="invalid_json",
        )
    loc = list(first.get("loc", ()))
    if loc and loc[0] in ("body", "query", "path", "header", "cookie"):  # where, not which field
        loc = loc[1:]
    loc = [str(p) for p in loc if not _UNION_TAG.search(str(p))]
    param = loc[0] if loc else None
    where = ".".join(loc) if loc else "body"
    if first.get("type") == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {where}"
    elif first.get("type") == "missing":
        message = f"Missing required parameter: '{where}'"
    else:
        message = f"Invalid value for '{where}': {first.get('msg', 'invalid')}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more error(s))"
    code = first.get("type") if first.get("type") in _CUSTOM_CODES else "invalid_value"
    return ErrorDetail(message=message, type="invalid_request_error", param=param, code=code)


#: loc parts that name a union member (``str``, ``list[TextPart]``, ``function-after[...]``,
#: ``VoiceRef``) rather than a field
_UNION_TAG = re.compile(r"[\[\]()]|^(str|int|float|bool|list|dict|none|literal)$|^[A-Z]")

#: pydantic error types of our own validators (``schemas._text``) sent as the error ``code``
_CUSTOM_CODES = {"invalid_characters"}


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
#: the 400 detail FastAPI raises when a JSON body does not parse (fastapi/routing.py)
_FASTAPI_BODY_ERROR = "There was an error parsing the body"


def allowed_methods(request: Request) -> str:
    """The ``Allow`` header of a 405: the methods of every route of the path template that
    Starlette matched first (its own header names only that route's, e.g. ``POST`` for
    ``/v1/videos``, which has GET too; ``/v1/videos/sync`` stays POST, not the methods of
    ``/v1/videos/{video_id}``)."""
    from starlette.routing import Match

    template, methods = None, set()
    for route in request.app.router.routes:
        match, _ = route.matches({**request.scope, "method": "\x00"})  # no method matches: path only
        if match == Match.NONE:
            continue
        template = template or getattr(route, "path_format", None)
        if getattr(route, "path_format", None) == template:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return error_json(exc.status_code, exc.detail, exc.headers)

    @app.exception_handler(EngineError)
    async def _engine_error(_: Request, exc: EngineError) -> JSONResponse:
        if exc.status_code >= 500:
            logger.warning("engine error: %s", exc.message)
        retry_after = retry_after_s(exc)
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        return error_json(exc.status_code, engine_error_detail(exc), headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_json(400, _validation_detail(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code)
        if exc.status_code == 400 and exc.detail == _FASTAPI_BODY_ERROR:  # FastAPI's JSON body parse failure
            code = "invalid_json"  # (not JSON, invalid UTF-8, nested too deeply), as read_json_object's
        detail = ErrorDetail(
            message=str(exc.detail),
            type="invalid_request_error" if exc.status_code < 500 else "server_error",
            code=code,
        )
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            headers["Allow"] = allowed_methods(request)
        if exc.status_code == 413:  # the rest of the body was not read
            headers["Connection"] = "close"
        return error_json(exc.status_code, detail, headers or None)

    # Unexpected exceptions: middleware.UnexpectedErrors (a handler for Exception would run in
    # Starlette's ServerErrorMiddleware, which re-raises and so drops the connection).


def install_store_unavailable_handler(app: FastAPI, errors: tuple[type[Exception], ...]) -> None:
    """Answer ``errors`` (the shared database cannot be reached: ``Database.unavailable_errors``)
    raised by a request's store call with a 503 ``store_unavailable`` + ``Retry-After: 1``
    (another frontend, or this one a moment later, may succeed) instead of a 500; logged."""
    async def _store_unavailable(_: Request, exc: Exception) -> JSONResponse:
        logger.warning("store unavailable: %s: %s", type(exc).__name__, exc)
        detail = ErrorDetail(message=f"The database does not answer ({type(exc).__name__}); retry later",
                             type="server_error", code="store_unavailable")
        return error_json(503, detail, {"Retry-After": "1"})

    for error in errors:
        app.add_exception_handler(error, _store_unavailable)

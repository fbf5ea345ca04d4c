"""OpenAI-style errors: one exception type, one JSON shape, handlers for everything else.

Every error leaves the server as ``{"error": {"message", "type", "param", "code"}}`` with a
matching HTTP status, including FastAPI's validation errors (400, not 422), malformed JSON,
unknown routes and unexpected exceptions (500; logged, never fatal to the server).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .engine.errors import EngineError
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


def error_json(
    status_code: int, detail: ErrorDetail, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        ErrorResponse(error=detail).model_dump(), status_code=status_code, headers=headers
    )


def engine_error_detail(exc: EngineError) -> ErrorDetail:
    return ErrorDetail(message=exc.message, type=exc.error_type, param=exc.param, code=exc.code)


def _validation_detail(exc: RequestValidationError) -> ErrorDetail:
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        return ErrorDetail(
            message=f"Malformed JSON body: {ctx.get('error', first.get('msg', ''))}",
            type="invalid_request_error",
            code="invalid_json",
        )
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
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
    return ErrorDetail(
        message=message, type="invalid_request_error", param=param, code="invalid_value"
    )


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError):
        return error_json(exc.status_code, exc.detail, exc.headers)

    @app.exception_handler(EngineError)
    async def _engine_error(_: Request, exc: EngineError):
        if exc.status_code >= 500:
            logger.warning("engine error: %s", exc.message)
        headers = {"Retry-After": "1"} if exc.status_code == 503 else None
        return error_json(exc.status_code, engine_error_detail(exc), headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError):
        return error_json(400, _validation_detail(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException):
        detail = ErrorDetail(
            message=str(exc.detail),
            type="invalid_request_error" if exc.status_code < 500 else "server_error",
            code=_HTTP_CODES.get(exc.status_code),
        )
        return error_json(exc.status_code, detail, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception):
        logger.exception("unhandled error")
        detail = ErrorDetail(
            message=f"Internal server error: {type(exc).__name__}",
            type="server_error",
            code="internal_error",
        )
        return error_json(500, detail)

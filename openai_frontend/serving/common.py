"""What every API's serving code shares: model resolution, the admitted-request scope, and
waiting on work while watching for a client disconnect."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Iterable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request
from pydantic import BaseModel
from python_multipart.multipart import parse_options_header
from sse_starlette import EventSourceResponse
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..engine import EngineError, ModelInfo, ModelNotFoundError
from ..engine.errors import StageDownError, StageRestartedError
from ..errors import OpenAIError, bad_request
from ..middleware import format_field_names
from ..schemas import ChatMessage, ignored_fields, is_text

if TYPE_CHECKING:
    from starlette.datastructures import State

    from ..admission import Slot
    from ..engine import Engine

T = TypeVar("T")

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- SSE
#: Line separator of every server-sent event: ``\n`` (events end in ``\n\n``), as OpenAI's API
#: and vLLM(-Omni)'s servers send it. sse-starlette's default is ``\r\n``, which the SSE spec
#: allows but vLLM's benchmark parser (it splits on ``\n\n``) does not.
SSE_SEPARATOR = "\n"


def sse_response(body: AsyncIterable[Mapping[str, Any]], **kwargs: Any) -> EventSourceResponse:
    """An ``EventSourceResponse`` over ``body`` whose events are framed with
    :data:`SSE_SEPARATOR`; ``kwargs`` go to ``EventSourceResponse`` (``headers``, ``background``).

    ``body`` yields event dicts (``{"data": ..., "event": ...}``): sse-starlette frames those
    with the response's ``sep`` (a ``ServerSentEvent`` object would keep its own default)."""
    return EventSourceResponse(body, sep=SSE_SEPARATOR, **kwargs)


class ClosingStreamingResponse(StreamingResponse):
    """A ``StreamingResponse`` that closes its async body iterator however the transfer ended.

    Starlette's leaves the iterator to the garbage collector when ``send`` raises (a client that
    stopped reading: ``middleware.SendTimeout``), so a generator holding an admission slot and a
    Triton stream would keep them until a cycle collection. (sse-starlette's
    ``EventSourceResponse`` closes its iterator itself.)"""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


# --------------------------------------------------------------------------- unknown fields
#: Where :func:`check_fields` leaves the ignored field names for the ``X-Ignored-Fields``
#: header (``middleware.IgnoredFieldsHeader``): a key of the request's ``scope["state"]``.
IGNORED_FIELDS_STATE = "ignored_fields"


def check_fields(body: BaseModel, request: Request) -> list[str]:
    """Unknown request fields, as vLLM treats them (default) or as OpenAI does
    (``Settings.strict_params``, ``--strict-params``).

    Default: the unknown fields (:func:`schemas.ignored_fields`, dotted paths) are ignored,
    logged once per request and named in the response's ``X-Ignored-Fields`` header.
    Strict: the first unknown field is a 400 ``Unrecognized request argument supplied: <field>``
    (``param`` = the field). Known fields keep their strict type checks either way.

    Returns the ignored field names (``[]`` when all are known).
    """
    names = ignored_fields(body)
    if not names:
        return names
    if request.app.state.settings.strict_params:
        raise bad_request(f"Unrecognized request argument supplied: {names[0]}"
                          + (f" (and {len(names) - 1} more)" if len(names) > 1 else ""),
                          param=names[0].split(".")[0], code="unknown_parameter")
    logger.warning("%s %s: ignoring unknown field(s) %s", request.method, request.url.path,
                   format_field_names(names))  # bounded, no CR/LF: the names are the client's
    request.scope.setdefault("state", {})[IGNORED_FIELDS_STATE] = names
    return names


# --------------------------------------------------------------------------- text caps
def messages_chars(messages: Iterable[ChatMessage]) -> int:
    """Characters of text in chat ``messages`` (``schemas.ChatMessage``): string contents, text
    parts and names. Media parts are not text (the body cap and their decoders bound them)."""
    total = 0
    for m in messages:
        if isinstance(m.content, str):
            total += len(m.content)
        elif m.content is not None:
            total += sum(len(p.text) for p in m.content if p.type == "text")
        total += len(m.name or "")
    return total


def check_prompt_chars(chars: int, request: Request, param: str) -> None:
    """400 ``prompt_too_long`` when a request's text (``chars`` characters) is over
    ``Settings.max_prompt_chars`` (``--max-prompt-chars``); checked before the request is
    tokenized, rendered or sent anywhere."""
    limit = request.app.state.settings.max_prompt_chars
    if chars > limit:
        raise bad_request(f"'{param}' holds {chars} characters of text; at most {limit} (--max-prompt-chars)",
                          param=param, code="prompt_too_long")


def ignore_fields(request: Request, names: list[str]) -> None:
    """Known fields the resolved model cannot use but that are harmless to drop (the speech
    extras ``task_type``/``language`` on a model without them): treated like unknown fields,
    added to ``X-Ignored-Fields`` (a 400 ``unknown_parameter`` with ``--strict-params``)."""
    if request.app.state.settings.strict_params:
        raise bad_request(f"Unrecognized request argument supplied: {names[0]}", param=names[0],
                          code="unknown_parameter")
    logger.warning("%s %s: ignoring field(s) %s (not supported by the model)", request.method,
                   request.url.path, format_field_names(names))
    state = request.scope.setdefault("state", {})
    state[IGNORED_FIELDS_STATE] = list(state.get(IGNORED_FIELDS_STATE) or []) + list(names)


# --------------------------------------------------------------------------- forms
class _StrictMultiPartParser(MultiPartParser):
    """Starlette's ``MultiPartParser`` whose text parts must decode in the form's charset
    (``MultiPartException`` otherwise; Starlette falls back to Latin-1)."""

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None:
            try:
                bytes(part.data).decode(self._charset or "utf-8")
            except (UnicodeDecodeError, LookupError):
                raise MultiPartException(f"text part '{part.field_name[:64]}' is not valid "
                                         f"{self._charset or 'utf-8'}") from None
        super().on_part_end()


async def read_form(request: Request, *, max_files: int, max_fields: int, max_part_size: int = 1 << 20) -> FormData:
    """The request's ``multipart/form-data`` (or urlencoded) form, parsed by Starlette with
    bounds: at most ``max_files`` file parts, ``max_fields`` text fields and ``max_part_size``
    bytes per text field. The one way every route reads a form (``/v1/audio/speech``,
    ``/v1/images/edits``, ``/v1/videos``, ``/v1/audio/voices``, ``/v1/audio/voice_consents``).

    Raises:
        OpenAIError: 400 ``invalid_multipart`` for anything Starlette or python-multipart refuse
            (no or empty boundary, broken parts, an unknown charset, too many files or fields,
            a text field over ``max_part_size``, a text part not valid in the form's charset,
            UTF-8 by default), with their reason.
        HTTPException: 413 from the frontend's body cap (``middleware.BodyTooLarge``), as is.
    """
    try:
        if parse_options_header(request.headers.get("content-type", ""))[0] == b"multipart/form-data":
            # Starlette's own parser, but a text part that is not valid in its charset (UTF-8 by
            # default) is refused instead of silently read as Latin-1 (a lone surrogate's bytes
            # became 'í\xa0\x80' in a stored prompt or voice name)
            async with aclosing(request.stream()) as stream:
                return await _StrictMultiPartParser(request.headers, stream, max_files=max_files,
                                                    max_fields=max_fields, max_part_size=max_part_size).parse()
        return await request.form(max_files=max_files, max_fields=max_fields, max_part_size=max_part_size)
    except MultiPartException as exc:
        reason = exc.message
    except StarletteHTTPException as exc:  # Starlette's 400 for a MultiPartException; the body cap's 413
        if exc.status_code == 413:
            raise
        reason = str(exc.detail)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
    raise bad_request(f"Malformed multipart body: {reason}", code="invalid_multipart")


async def read_json_object(request: Request) -> dict[str, Any]:
    """The request's JSON body, which must be an object (for the routes that read their body
    themselves: ``/v1/videos``, ``/v1/audio/voices``...; the others get FastAPI's parsing).

    Raises:
        OpenAIError: 400 ``invalid_json`` for a body that is not JSON (invalid UTF-8 included),
            nested too deeply for the parser (``RecursionError``: was a 500), or not an object.
    """
    try:
        data = await request.json()
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise bad_request(f"Malformed JSON body: {reason}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("The JSON body must be an object", code="invalid_json")
    return data


# --------------------------------------------------------------------------- model resolution
@dataclass(frozen=True)
class ModelKind:
    """A family of models one API serves: ``accepts(info)`` says whether ``info`` belongs to it,
    ``description`` names it in error messages (e.g. ``text-to-speech``)."""

    description: str
    accepts: Callable[[ModelInfo], bool]


SPEECH = ModelKind("text-to-speech", lambda m: m.is_speech)
TEXT_TO_IMAGE = ModelKind("text-to-image", lambda m: m.is_image and not m.is_image_edit)
IMAGE_EDIT = ModelKind("image-edit", lambda m: m.is_image_edit)


async def resolve_model(engine: Engine, name: str | None, kind: ModelKind | None = None) -> ModelInfo:
    """The READY model a client calls ``name``.

    Args:
        engine: the ``Engine``.
        name: the Triton model name or a model's ``served_model_name``; ``None`` picks the only
            READY model of ``kind`` (a 400 ``model_required`` unless there is exactly one).
        kind: when given, a model outside it is a 400 ``model_not_supported`` (``param: model``).

    Raises:
        ModelNotFoundError (404), ModelNotReadyError (503), TritonUnavailableError (503),
        OpenAIError (400) as above, and 400 ``invalid_characters`` for a name that is not Unicode
        text (a lone surrogate, NUL: Triton's gRPC API would fail to encode it).
    """
    if name is not None and not is_text(name):
        raise bad_request("'model' is not valid Unicode text", param="model", code="invalid_characters")
    if name is None:
        if kind is None:
            raise bad_request("'model' is required", param="model", code="model_required")
        models = [m for m in await engine.list_models() if m.ready and kind.accepts(m)]
        if len(models) != 1:
            raise bad_request(f"'model' is required when the server serves {len(models)} "
                              f"{kind.description} models ({', '.join(m.name for m in models) or 'none'})",
                              param="model", code="model_required")
        return models[0]
    # An unloaded on-demand pipeline of another kind is refused before get_model loads it (only
    # TritonEngine has offline_model: the repository's view of its on-demand pipelines).
    offline_model = getattr(engine, "offline_model", None)
    offline = offline_model(name) if kind is not None and offline_model is not None else None
    if offline is not None and kind is not None and not kind.accepts(offline):
        raise bad_request(f"The model '{name}' is not a {kind.description} model", param="model",
                          code="model_not_supported")
    try:
        info = await engine.get_model(name)
    except ModelNotFoundError:
        aliases = [m for m in await engine.list_models()
                   if m.served_model_name == name and m.name != name]
        if not aliases:
            raise
        info = await engine.get_model(aliases[0].name)
    if kind is not None and not kind.accepts(info):
        raise bad_request(f"The model '{name}' is not a {kind.description} model", param="model",
                          code="model_not_supported")
    return info


# --------------------------------------------------------------------------- admission
def outcome_of(exc: BaseException | None) -> str:
    """The metric outcome of a request that ended with ``exc``: ``ok`` (None), ``cancelled``
    (task cancelled, body closed), ``invalid_input`` (a 4xx: the client's fault), else ``error``."""
    if exc is None:
        return "ok"
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return "cancelled"
    status = getattr(exc, "status_code", 500)
    if isinstance(exc, (OpenAIError, EngineError)) and status < 500:
        return "invalid_input"
    return "error"


class AdmittedRequest:
    """One request holding admission capacity, from the first Triton call until its response is
    fully sent, failed, or its client went away; records its outcome exactly once.

    ``async with AdmittedRequest(state, record) as req:`` takes ``cost`` units of admission
    (a 429 ``rate_limit_exceeded`` + ``Retry-After`` beyond ``--max-inflight``, counted in
    ``omni_frontend_rejected_requests``). On exit the outcome is ``req.outcome`` if the body set
    it, else derived from the exception (``outcome_of``); ``record(outcome)`` is called and the
    capacity released. A streaming response calls ``req.hand_over(body)`` inside the block: the
    block's exit then leaves the request open, and the returned iterator closes it when the body
    ends (``req.close`` is also the response's background task, for a body that never started).

    Args:
        state: ``app.state`` (``admission``, ``metrics``).
        record: called once with the outcome (``ok``, ``invalid_input``, ``cancelled``, ``error``).
        cost: Triton requests this HTTP request fans out to (choices x prompts, images);
            capped at the admission limit so the largest allowed request can still run alone.
    """

    def __init__(self, state: State, record: Callable[[str], None], cost: int = 1):
        self._admission = state.admission
        self._metrics = state.metrics
        self._record = record
        self._cost = max(1, min(cost, self._admission.max_inflight))
        self._slot: Slot | None = None
        self._handed_over = False
        self._closed = False
        self.outcome: str | None = None
        self.t0 = 0.0

    async def __aenter__(self) -> AdmittedRequest:
        try:
            self._slot = self._admission.acquire(self._cost)
        except OpenAIError:
            self._metrics.rejected.inc()
            raise
        self.t0 = time.perf_counter()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        # never swallows the exception (a bool return type would make every caller's block "may fall through")
        if exc is None and self._handed_over:
            return
        self.finish(exc)

    def elapsed(self) -> float:
        """Seconds since admission."""
        return time.perf_counter() - self.t0

    def finish(self, exc: BaseException | None = None) -> None:
        """Record the outcome and release the capacity (idempotent)."""
        if self._closed:
            return
        self._closed = True
        outcome = outcome_of(exc) if exc is not None else (self.outcome or "ok")
        try:
            self._record(outcome)
        finally:
            if self._slot is not None:  # None only before __aenter__ took a slot
                self._slot.release()

    def hand_over(self, body: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
        """Make the streaming ``body`` own this request: the returned iterator yields ``body``'s
        items and finishes the request when it ends, fails or is closed."""
        self._handed_over = True
        return self._own(body)

    async def _own(self, body: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
        error: BaseException | None = None
        try:
            async for item in body:
                yield item
        except BaseException as exc:
            error = exc
            raise
        finally:
            await body.aclose()
            self.finish(error)

    async def close(self) -> None:
        """Finish as ``cancelled`` unless already finished (a response body that never ran)."""
        if not self._closed:
            self.finish(asyncio.CancelledError())


async def until_disconnect(request: Request, work: Awaitable[object]) -> bool:
    """Run the coroutine ``work``; True when it finished, False when the HTTP client disconnected
    first (then ``work`` is cancelled, which cancels its Triton calls). Starlette does not cancel a
    non-streaming handler on disconnect, hence this watcher (vLLM's server does the same).
    Exceptions of ``work`` propagate."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            logger.info("client disconnected; request cancelled")
            return False
        task.result()  # raises the work's exception
        return True
    finally:
        watcher.cancel()
        if not task.done():  # this handler was cancelled: stop the work before returning
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


# --------------------------------------------------------------------------- stage restarts
async def retry_after_stage_restart(engine: Engine, model: str, attempt: Callable[[], Awaitable[T]],
                                    wait_s: float = 180.0, poll_s: float = 0.5) -> T:
    """``await attempt()``; if a stage died under it (:class:`StageRestartedError`), wait until
    ``model`` is READY again and run ``attempt()`` once more.

    For requests without side effects whose answer does not depend on the try (speech, seeded
    images, greedy or seeded chat): the client gets the answer it would have got, late, instead
    of a 503. A retry that reaches the stage before serve has reloaded it
    (:class:`StageDownError`: Triton still lists the model READY for a moment after its stub
    died) never ran, so it is not a second death: it waits and tries again. A second death, or
    ``model`` not served again within ``wait_s`` seconds, raises the first 503
    (``StageRestartedError``, with ``Retry-After``).
    """
    first: StageRestartedError | None = None
    deadline = 0.0  # wait_s from the first failure (the first try may run for minutes)
    while True:
        try:
            return await attempt()
        except StageRestartedError as exc:
            if first is not None and not isinstance(exc, StageDownError):
                raise first from None  # it ran again and a stage died under it again
            if first is None:
                first, deadline = exc, time.monotonic() + wait_s
            if time.monotonic() > deadline:
                raise first from None
            logger.warning("%s: %s; retrying when it is READY again", model, exc.message)
        await asyncio.sleep(poll_s)
        while True:
            try:
                await engine.get_model(model)
                break
            except EngineError:
                if time.monotonic() > deadline:
                    raise first from None
                await asyncio.sleep(poll_s)

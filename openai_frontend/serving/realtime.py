"""``WS /v1/realtime?model=omni`` (or ``qwen25_omni``): the OpenAI Realtime API (docs/realtime.md).

The protocol (events, both namings, the conversation and its truncation rule) lives in
``openai_frontend.realtime``; this module is the socket: the handshake (the API key was checked
by ``middleware.ApiKey``, as on ``/v1/audio/speech/stream``), the model, the limits, and the
loop that hands each client event to the session.

Limits (``Settings.realtime_*``, CLI ``--realtime-*``), each answered by an ``error`` event:

* ``--realtime-max-sessions`` (32) open at once: one more gets ``too_many_sessions`` and close
  1013 (try again later) before ``session.created``; a slot is freed however its session ends.
* ``--realtime-max-session-s`` (1800): then ``session_expired`` and close 1008.
* ``--realtime-idle-timeout-s`` (120): no client event for that long while no response runs:
  ``idle_timeout`` and close 1008.
* ``--realtime-max-event-bytes`` (4 MiB, and ``--max-json-values``): a larger event is refused
  before it is parsed (``event_too_large``); the session goes on. (uvicorn's ``ws_max_size``,
  ``--max-body-bytes``, closes the socket with 1009 on a frame beyond it.)
* ``--realtime-max-buffer-s`` (60) of uncommitted audio: ``input_audio_buffer_full``, the append
  is dropped, the session goes on. Conversation memory: ``--realtime-max-items`` (64) and
  ``--realtime-max-audio-s`` (600) of user audio (oldest whole items deleted beyond).

Malformed events (not JSON, not an object, an unknown ``type``, bad base64, a bad field) get an
``error`` event naming the problem; the session goes on.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from ..engine import EngineError
from ..errors import OpenAIError, engine_error_detail, public_message
from ..offload import off_loop
from ..realtime.protocol import RealtimeError, error_event, naming_of
from ..realtime.session import RealtimeLimits, RealtimeSession
from .common import resolve_model

logger = logging.getLogger(__name__)

#: Events longer than this (characters) are parsed off the event loop (``json.loads`` of 256 KiB
#: takes ~0.2 ms; of the 4 MiB limit ~3.4 ms, measured).
INLINE_PARSE_CHARS = 256 << 10


class _Socket:
    """Sends JSON events on the socket, one at a time (the response task and the event loop both send)."""

    def __init__(self, ws: WebSocket):
        self.ws = ws
        self.lock = asyncio.Lock()

    async def send(self, event: dict[str, Any]) -> None:
        text = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
        async with self.lock:
            await self.ws.send_text(text)

    async def fatal(self, exc: RealtimeError) -> None:
        """The error event of ``exc``, then close with its close code (the caller returns)."""
        try:
            await self.send(error_event(exc))
            async with self.lock:
                await self.ws.close(code=exc.close_code, reason=exc.code)
        except (WebSocketDisconnect, RuntimeError):
            pass


async def realtime(ws: WebSocket) -> None:
    """``WS /v1/realtime``: see the module docstring. At most ``Settings.realtime_max_sessions``
    at once: counted before the first ``await`` and given back in ``finally``."""
    state = ws.app.state
    limit = state.settings.realtime_max_sessions
    open_now = getattr(state, "realtime_sessions", 0)
    offered = [p for p in ws.scope.get("subprotocols") or [] if p == "realtime"]
    if open_now >= limit:
        await ws.accept(subprotocol=offered[0] if offered else None)
        await _Socket(ws).fatal(RealtimeError(f"{open_now} realtime sessions are open, the most this server allows; "
                                              "try again later", "too_many_sessions", fatal=True, close_code=1013))
        return
    state.realtime_sessions = open_now + 1
    state.metrics.realtime_sessions.inc()
    try:
        await ws.accept(subprotocol=offered[0] if offered else None)
        await _serve(ws, _Socket(ws))
    except WebSocketDisconnect:
        pass
    finally:
        state.realtime_sessions -= 1
        state.metrics.realtime_sessions.dec()
        if ws.client_state == WebSocketState.CONNECTED and ws.application_state == WebSocketState.CONNECTED:
            try:
                await ws.close()
            except RuntimeError:
                pass


async def _open(ws: WebSocket, sock: _Socket) -> RealtimeSession | None:
    """The session of the handshake's ``model``, or None after a fatal error event."""
    state = ws.app.state
    settings = state.settings
    name = ws.query_params.get("model")
    try:
        info = await resolve_model(state.engine, name or None)
        if not (info.is_chat and info.can_speak):
            raise RealtimeError(f"The model '{info.public_name}' cannot serve realtime sessions (it needs a chat "
                                "model that speaks: omni, qwen25_omni)", "model_not_supported", "model", fatal=True)
    except RealtimeError as exc:
        await sock.fatal(exc)
        return None
    except (OpenAIError, EngineError) as exc:
        d = engine_error_detail(exc) if isinstance(exc, EngineError) else exc.detail
        await sock.fatal(RealtimeError(public_message(d.message), d.code or "invalid_model", "model", fatal=True))
        return None
    limits = RealtimeLimits(max_buffer_s=settings.realtime_max_buffer_s, max_items=settings.realtime_max_items,
                            max_audio_s=settings.realtime_max_audio_s)
    expires_at = int(time.time() + settings.realtime_max_session_s)
    return RealtimeSession(sock.send, state, info, naming_of(ws.headers.get("openai-beta")), limits, expires_at)


def _parse(raw: str, settings: Any) -> dict[str, Any]:
    """A client event: size checked before parsing (``event_too_large``), a JSON object with a ``type``."""
    if len(raw) > settings.realtime_max_event_bytes or (
            raw.count(",") + raw.count("{") + raw.count("[") > settings.max_json_values):
        raise RealtimeError(f"An event is over {settings.realtime_max_event_bytes} characters or "
                            f"{settings.max_json_values} JSON values; send audio in smaller appends",
                            "event_too_large")
    try:
        event = json.loads(raw)
    except (ValueError, RecursionError):
        raise RealtimeError("The event is not valid JSON", "invalid_json") from None
    if not isinstance(event, dict):
        raise RealtimeError("An event must be a JSON object with a 'type'", "invalid_event")
    return event


async def _serve(ws: WebSocket, sock: _Socket) -> None:
    settings = ws.app.state.settings
    session = await _open(ws, sock)
    if session is None:
        return
    loop = asyncio.get_running_loop()
    end_at = loop.time() + settings.realtime_max_session_s
    last_event = loop.time()
    await session.start()
    receiver: asyncio.Future[Any] | None = None
    try:
        while True:
            receiver = asyncio.ensure_future(ws.receive())
            while True:
                now = loop.time()
                idle_at = None if session.busy else last_event + settings.realtime_idle_timeout_s
                wake = min(end_at, idle_at) if idle_at is not None else end_at
                # while a response runs the idle clock stops: look again within a second
                timeout = min(wake - now, 1.0) if session.busy else wake - now
                done, _ = await asyncio.wait({receiver}, timeout=max(0.0, timeout))
                if done:
                    break
                now = loop.time()
                if now >= end_at:
                    await sock.fatal(RealtimeError(f"Your session hit the maximum duration of "
                                                   f"{settings.realtime_max_session_s:g} seconds.", "session_expired",
                                                   fatal=True))
                    return
                if not session.busy and now >= last_event + settings.realtime_idle_timeout_s:
                    await sock.fatal(RealtimeError(f"No client event for {settings.realtime_idle_timeout_s:g} s",
                                                   "idle_timeout", fatal=True))
                    return
            message = receiver.result()
            receiver = None
            last_event = loop.time()
            if message["type"] == "websocket.disconnect":
                return
            event_id = None
            try:
                raw = message.get("text")
                if raw is None:
                    raise RealtimeError("Send events as JSON text messages", "invalid_event")
                # parsing a large event (an append of seconds of audio) is CPU work: off the loop
                event = (await off_loop(_parse, raw, settings)) if len(raw) > INLINE_PARSE_CHARS \
                    else _parse(raw, settings)
                event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
                await session.handle(event)
            except RealtimeError as exc:
                if exc.fatal:
                    await sock.fatal(exc)
                    return
                await sock.send(error_event(exc, event_id[:64] if event_id else None))
            except (WebSocketDisconnect, asyncio.CancelledError):
                raise
            except Exception:  # a bug: the client is told, the session goes on
                logger.exception("realtime event failed")
                await sock.send(error_event(RealtimeError("The server had an error while processing the event",
                                                          "server_error", error_type="server_error"),
                                            event_id[:64] if event_id else None))
    finally:
        if receiver is not None and not receiver.done():
            receiver.cancel()
        await session.close()

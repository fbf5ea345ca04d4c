"""``POST /v1/audio/speech/batch`` and ``WS /v1/audio/speech/stream`` (vLLM-Omni's protocols,
docs/voices.md), for every speech model.

Batch: 1-32 items, each a ``SpeechRequest`` made of the batch's defaults and the item's own
fields, validated and synthesised on its own (at most ``Settings.batch_concurrency`` at once,
each holding an admission slot); one JSON answer with a result or an error per item.

WebSocket (text in, audio out as sentences complete)::

    client -> {"type": "session.config", "model", "voice", "response_format", "stream_audio",
               "stream_pacing", ...}
    client -> {"type": "input.text", "text": "..."}   (any number, any split)
    client -> {"type": "input.done"}                  (flush: the rest is one more sentence)
    client -> {"type": "session.close"}               (finish what is queued, then close)
    server <- {"type": "audio.start", "utterance_index", "sentence_index", "sentence_text",
               "format", "sample_rate"}
    server <- binary frames: the sentence's audio (one encoded clip; with ``stream_audio``: PCM
              int16 LE chunks as Triton streams them, as fast as they are made; with
              ``"stream_pacing": "realtime"`` in the config, computed ahead of playback by at
              most the stage's ``max_lead_ms``: ``PACED``)
    server <- {"type": "audio.done", "utterance_index", "sentence_index", "total_bytes", "error"}
    server <- {"type": "session.done", "utterance_index", "total_sentences"}  (after input.done)
    server <- {"type": "error", "message", "code"?}   (non-fatal: the session goes on)
    server <- {"type": "error", "message", "code", "param", "status_code": 413}, then close 1009
              (fatal: a size limit, below)
    server <- {"type": "error", "message", "code": "too_many_sessions", "param", "status_code": 429},
              then close 1013 (try again later): refused, ``--speech-stream-max-sessions`` are open
    server <- {"type": "error", "message", "code": "idle_timeout", "param", "status_code": 408},
              then close 1008: idle for ``--speech-stream-idle-timeout-s`` (below)

Limits, checked before any work on the message: a message longer than ``--max-body-bytes``
characters or with more than ``--max-json-values`` values (``message_too_large``); text that would leave more than
``--speech-stream-max-pending-chars`` (65,536) characters unspoken in the session, i.e. its
buffer plus the sentences queued and not yet spoken (``text_too_long``). Sentence splitting is
linear in the text (``split_sentences``). ``session.config`` is validated once, off the event
loop (a ``ref_audio`` clip is decoded once per config, not once per sentence).

Sessions: at most ``--speech-stream-max-sessions`` (64) are open at once in one frontend; one
more is accepted only to be told ``too_many_sessions`` and closed (1013) before it can send
anything; a slot is freed however its session ends. Idle sessions are closed (``idle_timeout``,
1008): one without a ``session.config`` ``--speech-stream-idle-timeout-s`` (30) seconds after the
handshake, and one that sends no message for that long while nothing of it is queued or being
spoken (never while its audio is being made or sent; the clock restarts when it is done).

Each complete sentence (``split_sentences``) is queued and synthesised in order by one worker
while more text arrives. A closed socket cancels the worker, which closes the Triton stream of
the sentence being synthesised (the stage sees ``is_cancelled()``).
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import secrets
from typing import Any

import numpy as np
from fastapi import Request
from numpy.typing import NDArray
from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from omni_triton.media.audio import StreamResampler, encode_audio, float_to_pcm16, resample

from ..engine import Engine, EngineError, ModelInfo, SpeechOptions
from ..errors import OpenAIError, bad_request, engine_error_detail, public_message, validation_detail
from ..offload import off_loop
from ..schemas import SpeechBatchRequest, SpeechRequest, is_text
from .common import SPEECH, AdmittedRequest, resolve_model, until_disconnect
from .speech import check_input, plan, synthesize
from .voices import drop_unsupported_extras

logger = logging.getLogger(__name__)

#: A sentence ends at ``.!?;`` (and their CJK forms, or ``…``), closing quotes/brackets allowed,
#: followed by whitespace; or at a line break. The end of the buffer is not a boundary (more text
#: may follow: "3." of "3.14", "..." still being typed) until ``input.done``.
#: Linear time: a punctuation run is only entered at its first character (the look-behind) and
#: every quantifier is possessive, so no position is scanned twice; the old form
#: (``[.!?;…]+[\"')\]]*\s+`` tried every start inside a run: 30,000 ``.`` took 9 s on the loop).
_BOUNDARY = re.compile(r"(?<![.!?;…])[.!?;…]++[\"')\]]*+\s++"
                       r"|(?<![。！？；])[。！？；]++[\"')\]」』]*+\s*+"
                       r"|\n++")
_SPACE = re.compile(r"\s*+")
#: Text without any boundary is cut at its last space once it is this long.
MAX_SENTENCE_CHARS = 400


def split_sentences(buffer: str) -> tuple[list[str], str]:
    """Complete sentences at the start of ``buffer`` and the incomplete rest.

    ``"Hi there. How are"`` -> ``(["Hi there."], "How are")``. Whitespace-only sentences are
    dropped. A rest longer than ``MAX_SENTENCE_CHARS`` is cut at its last space (or hard).
    Runs in time linear in ``len(buffer)`` whatever it holds (runs of punctuation, spaces, quotes).
    """
    out, start = [], 0
    for m in _BOUNDARY.finditer(buffer):
        sentence = buffer[start:m.end()].strip()
        if sentence:
            out.append(sentence)
        start = m.end()
    end = len(buffer)
    while end - start > MAX_SENTENCE_CHARS:  # offsets, not slices of the rest: no quadratic copying
        cut = buffer.rfind(" ", start, start + MAX_SENTENCE_CHARS)
        cut = cut if cut > start else start + MAX_SENTENCE_CHARS
        piece = buffer[start:cut].strip()
        if piece:
            out.append(piece)
        space = _SPACE.match(buffer, cut)  # always matches (possibly empty)
        start = space.end() if space else cut
    return out, buffer[start:]


async def collect_clip(engine: Engine, info: ModelInfo, text: str, voice: str | None, speed: float | None,
                       options: SpeechOptions | None) -> tuple[NDArray[Any], int]:
    """Synthesise ``text`` whole: float32 [T] and its sample rate (empty when nothing was spoken)."""
    chunks, rate = [], info.sample_rate or 0
    gen = synthesize(engine, info, text, voice, speed, options)
    try:
        async for chunk, sr in gen:
            chunks.append(chunk)
            rate = sr or rate
    finally:
        await gen.aclose()
    return (np.concatenate(chunks) if chunks else np.zeros(0, np.float32)), rate


def _error_fields(exc: Exception) -> dict[str, Any]:
    if isinstance(exc, OpenAIError):
        d = exc.detail
        return {"error": public_message(d.message), "code": d.code, "param": d.param, "status_code": exc.status_code}
    if isinstance(exc, EngineError):
        d = engine_error_detail(exc)
        return {"error": d.message, "code": d.code, "param": d.param, "status_code": exc.status_code}
    if isinstance(exc, ValidationError):
        d = validation_detail(exc.errors())
        return {"error": d.message, "code": d.code, "param": d.param, "status_code": 400}
    raise exc


# --------------------------------------------------------------------------- batch
async def create_batch(body: SpeechBatchRequest, request: Request) -> dict[str, Any]:
    """``POST /v1/audio/speech/batch``: ``{"id", "object", "results": [...], "total", "succeeded",
    "failed"}``; a result is ``{"index", "status": "success", "audio_data" (base64), "media_type",
    "sample_rate", "usage"}`` or ``{"index", "status": "error", "error", "code", "param",
    "status_code"}``."""
    state = request.app.state
    engine = state.engine
    store = getattr(state, "voice_store", None)
    defaults = body.model_dump(exclude={"items"}, exclude_none=True)
    defaults.setdefault("response_format", "wav")
    sem = asyncio.Semaphore(max(1, state.settings.batch_concurrency))

    async def one(index: int, item: Any) -> dict[str, Any]:
        try:
            payload = {**defaults, **{k: v for k, v in item.model_dump().items() if v is not None}}
            req = SpeechRequest.model_validate(payload)
            if req.streaming:
                raise bad_request("Batch items cannot stream", param="stream", code="invalid_value")
            info = await resolve_model(engine, req.model, SPEECH)
            req, ignored = drop_unsupported_extras(req, info)
            fmt, voice, speed, options = await off_loop(plan, req, info, state.settings.default_max_input_chars,
                                                        store)

            def record(outcome: str, name: str = info.public_name) -> None:
                state.metrics.requests.labels(name, "batch", outcome).inc()

            async with sem:
                async with AdmittedRequest(state, record):
                    clip, rate = await collect_clip(engine, info, req.input, voice, speed, options)
            if not clip.size:
                raise bad_request(f"The model '{info.public_name}' found nothing to speak in 'input'", param="input",
                                  code="no_speech")
            if req.sample_rate and req.sample_rate != rate:
                clip = await off_loop(resample, clip, rate, req.sample_rate)
                rate = req.sample_rate
            data = await off_loop(encode_audio, clip, rate, fmt.name)
            n = len(req.input)
            return {"index": index, "status": "success", "audio_data": base64.b64encode(data).decode("ascii"),
                    "media_type": fmt.content_type, "sample_rate": rate,
                    **({"ignored_fields": ignored} if ignored else {}),
                    "usage": {"input_tokens": n, "output_tokens": 0, "total_tokens": n,
                              "audio_samples": int(clip.size), "audio_seconds": round(clip.size / rate, 6)}}
        except (OpenAIError, EngineError, ValidationError) as exc:
            return {"index": index, "status": "error", **_error_fields(exc)}

    results: list[dict[str, Any]] = []

    async def run_all() -> None:
        results.extend(await asyncio.gather(*(one(i, it) for i, it in enumerate(body.items))))

    if not await until_disconnect(request, run_all()):
        return {"error": "client disconnected"}
    ok = sum(r["status"] == "success" for r in results)
    return {"id": "speech-batch-" + secrets.token_hex(8), "object": "audio.speech.batch", "results": results,
            "total": len(results), "succeeded": ok, "failed": len(results) - ok}


# --------------------------------------------------------------------------- WebSocket
class _Session:
    """One WebSocket session: its config, text buffer and the queue of sentences to speak."""

    def __init__(self, ws: WebSocket):
        self.ws = ws
        self.state = ws.app.state
        self.body: SpeechRequest | None = None
        self.info: ModelInfo | None = None
        #: ``speech.plan``'s (format, voice, speed, options) of the current config: made once per
        #: ``session.config`` (a ``ref_audio`` clip is decoded once, not once per sentence)
        self.planned: tuple[Any, ...] | None = None
        self.stream_audio = False
        self.buffer = ""
        #: characters of the queued sentences not yet spoken
        self.queued_chars = 0
        self.utterance = 0
        self.sentences = 0  # queued in the current utterance
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.send_lock = asyncio.Lock()
        #: the worker holds an item (a sentence being synthesised or sent)
        self.working = False
        #: loop time of the last message received or queue item finished (the idle clock)
        self.last_activity = asyncio.get_running_loop().time()

    @property
    def idle(self) -> bool:
        """Nothing of the session is queued or being spoken."""
        return not self.working and self.queue.empty()

    async def send_json(self, data: dict[str, Any]) -> None:
        async with self.send_lock:
            await self.ws.send_text(json.dumps(data))

    async def send_bytes(self, data: bytes) -> None:
        async with self.send_lock:
            await self.ws.send_bytes(data)

    async def error(self, message: str, code: str | None = None) -> None:
        await self.send_json({"type": "error", "message": public_message(message), "code": code})

    async def too_big(self, message: str, code: str, param: str | None = None) -> None:
        """The fatal error of a client over a size limit: an ``error`` event with ``status_code``
        413, then the socket is closed with 1009 (message too big). The caller returns."""
        await self.fatal(message, code, 413, 1009, param)

    async def fatal(self, message: str, code: str, status_code: int, close_code: int,
                    param: str | None = None) -> None:
        """A fatal ``error`` event, then the socket is closed with ``close_code``. The caller returns."""
        await self.send_json({"type": "error", "message": message, "code": code, "param": param,
                              "status_code": status_code})
        async with self.send_lock:
            await self.ws.close(code=close_code, reason=code)

    async def configure(self, msg: dict[str, Any]) -> None:
        if self.buffer.strip():
            raise bad_request("session.config while text is buffered; send input.done first", code="text_pending")
        fields = {k: v for k, v in msg.items() if k not in ("type", "stream_audio")}
        stream_audio = msg.get("stream_audio", False)
        if not isinstance(stream_audio, bool):
            raise bad_request("'stream_audio' must be a boolean", param="stream_audio", code="invalid_value")
        fields.setdefault("response_format", "pcm")
        fields["input"] = "config"
        body = SpeechRequest.model_validate(fields)
        if body.stream or body.stream_format != "audio":
            raise bad_request("'stream'/'stream_format' do not apply to the WebSocket (see stream_audio)",
                              param="stream", code="invalid_value")
        info = await resolve_model(self.state.engine, body.model, SPEECH)
        body, _ = drop_unsupported_extras(body, info)  # task_type/language on a model without them
        planned = await off_loop(plan, body, info, self.state.settings.default_max_input_chars,
                                 getattr(self.state, "voice_store", None))
        if stream_audio and planned[0].name != "pcm":
            raise bad_request("stream_audio sends PCM chunks: response_format must be 'pcm'",
                              param="response_format", code="unsupported_format")
        self.body, self.info, self.planned, self.stream_audio = body, info, planned, stream_audio

    def accepts(self, text: str) -> bool:
        """Whether ``text`` fits in the session's unspoken-text budget
        (``Settings.speech_stream_max_pending_chars``)."""
        return bool(self.pending_chars + len(text) <= self.state.settings.speech_stream_max_pending_chars)

    @property
    def pending_chars(self) -> int:
        """Characters received and not yet spoken: the buffer plus the queued sentences."""
        return len(self.buffer) + self.queued_chars

    def add_text(self, text: str, flush: bool) -> None:
        """Queue the sentences ``text`` completes (all of the rest with ``flush``); linear in
        ``len(text)`` plus the buffer (at most ``MAX_SENTENCE_CHARS`` between messages)."""
        self.buffer += text
        sentences, self.buffer = split_sentences(self.buffer)
        if flush and self.buffer.strip():
            sentences.append(self.buffer.strip())
        if flush:
            self.buffer = ""
        self.queued_chars += sum(map(len, sentences))
        for s in sentences:
            self.queue.put_nowait(("sentence", self.utterance, self.sentences, s, self.body, self.info,
                                   self.planned, self.stream_audio))
            self.sentences += 1
        if flush:
            self.queue.put_nowait(("done", self.utterance, self.sentences))
            self.utterance += 1
            self.sentences = 0

    async def worker(self) -> None:
        """Speak the queued sentences in order; ends at the ``close`` item."""
        while True:
            item = await self.queue.get()
            if item[0] == "close":
                return
            self.working = True
            try:
                if item[0] == "done":
                    await self.send_json({"type": "session.done", "utterance_index": item[1],
                                          "total_sentences": item[2]})
                    continue
                try:
                    await self.speak(*item[1:])
                finally:
                    self.queued_chars -= len(item[3])
            finally:
                self.working = False
                self.last_activity = asyncio.get_running_loop().time()

    async def speak(self, utterance: int, index: int, text: str, body: SpeechRequest, info: ModelInfo,
                    planned: tuple[Any, ...], stream_audio: bool) -> None:
        state = self.state
        started, total, failed = False, 0, False
        head = {"utterance_index": utterance, "sentence_index": index}

        def record(outcome: str) -> None:
            state.metrics.requests.labels(info.public_name, "websocket", outcome).inc()

        try:
            check_input(text, info, state.settings.default_max_input_chars)
            fmt, voice, speed, options = planned  # made once by session.config
            async with AdmittedRequest(state, record):
                rate = body.sample_rate or info.sample_rate or 24000
                if stream_audio:
                    # as fast as the stages make it, unless the config asked for real time
                    # (docs/scheduling.md "Pacing"): then the deadlines count from this sentence's
                    # request, while the listener still plays the previous sentence's tail, so
                    # they are never later than needed
                    gen = synthesize(state.engine, info, text, voice, speed, options, paced=body.realtime)
                    resampler = None
                    try:
                        async for chunk, sr in gen:
                            if resampler is None:
                                model_rate = sr or info.sample_rate or 24000
                                rate = body.sample_rate or model_rate
                                resampler = StreamResampler(model_rate, rate)  # soxr, across chunks
                                await self.send_json({"type": "audio.start", **head, "sentence_text": text,
                                                      "format": "pcm", "sample_rate": rate})
                                started = True
                            data = float_to_pcm16(resampler.process(chunk))
                            if data:
                                total += len(data)
                                await self.send_bytes(data)
                        if resampler is not None and (data := float_to_pcm16(resampler.flush())):
                            total += len(data)
                            await self.send_bytes(data)
                    finally:
                        await gen.aclose()
                else:
                    clip, model_rate = await collect_clip(state.engine, info, text, voice, speed, options)
                    rate = body.sample_rate or model_rate
                    if clip.size:
                        if rate != model_rate:
                            clip = await off_loop(resample, clip, model_rate, rate)
                        data = await off_loop(encode_audio, clip, rate, fmt.name)
                        await self.send_json({"type": "audio.start", **head, "sentence_text": text,
                                              "format": fmt.name, "sample_rate": rate})
                        started = True
                        total = len(data)
                        await self.send_bytes(data)
        except (OpenAIError, EngineError, ValidationError) as exc:
            failed = True
            err = _error_fields(exc)
            await self.send_json({"type": "error", **head, "message": err["error"], "code": err["code"]})
        if not started and not failed:
            await self.send_json({"type": "audio.start", **head, "sentence_text": text, "format": body.response_format,
                                  "sample_rate": body.sample_rate or info.sample_rate})
        await self.send_json({"type": "audio.done", **head, "total_bytes": total, "error": failed})


async def speech_stream(ws: WebSocket) -> None:
    """``WS /v1/audio/speech/stream``: see the module docstring. The API key (when configured)
    was checked on the handshake by ``middleware.ApiKey``.

    At most ``Settings.speech_stream_max_sessions`` sessions at once: the slot is counted before
    the first ``await`` (no two handshakes can both take the last one) and given back in
    ``finally`` however the session ends (close, error, disconnect, cancellation)."""
    state = ws.app.state
    limit = state.settings.speech_stream_max_sessions
    open_now = getattr(state, "speech_stream_sessions", 0)
    if open_now >= limit:
        await ws.accept()
        session = _Session(ws)
        try:
            await session.fatal(f"{open_now} speech stream sessions are open, the most this server allows; "
                                "try again later", "too_many_sessions", 429, 1013)
        except (WebSocketDisconnect, RuntimeError):
            pass
        return
    state.speech_stream_sessions = open_now + 1
    try:
        await _serve(ws)
    finally:
        state.speech_stream_sessions -= 1


async def _receive_or_idle(session: _Session, receiver: asyncio.Future[Any], worker: asyncio.Task[Any],
                           config_deadline: float) -> set[Any]:
    """Wait for the next message or the worker's end: the finished ones; empty when the session
    has been idle too long (``Settings.speech_stream_idle_timeout_s``). Never empty while the
    worker holds an item or has one queued."""
    loop = asyncio.get_running_loop()
    idle_s = session.state.settings.speech_stream_idle_timeout_s
    while True:
        if session.body is None and session.idle:
            deadline = config_deadline
        elif session.idle:
            deadline = session.last_activity + idle_s
        else:
            deadline = None  # speaking: look again when that is done (or at the idle period)
        timeout = idle_s if deadline is None else deadline - loop.time()
        if deadline is not None and timeout <= 0:
            return set()
        done, _ = await asyncio.wait({receiver, worker}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if done:
            return set(done)


async def _serve(ws: WebSocket) -> None:
    await ws.accept()
    session = _Session(ws)
    config_deadline = session.last_activity + session.state.settings.speech_stream_idle_timeout_s
    worker = asyncio.create_task(session.worker())
    receiver = None
    try:
        while True:
            receiver = asyncio.ensure_future(ws.receive())
            done = await _receive_or_idle(session, receiver, worker, config_deadline)
            if not done:
                receiver.cancel()
                idle_s = session.state.settings.speech_stream_idle_timeout_s
                await session.fatal(f"No session.config within {idle_s:g} s of the handshake" if session.body is None
                                    else f"No message for {idle_s:g} s with nothing to speak",
                                    "idle_timeout", 408, 1008)
                return
            if worker in done:  # the worker failed (socket gone while sending): see finally
                receiver.cancel()
                return
            session.last_activity = asyncio.get_running_loop().time()
            message = receiver.result()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("text") is None:
                await session.error("Send JSON text messages", "invalid_message")
                continue
            raw, settings = message["text"], session.state.settings
            if len(raw) > settings.max_body_bytes or (  # checked before parsing, as for HTTP bodies
                    raw.count(",") + raw.count("{") + raw.count("[") > settings.max_json_values):
                await session.too_big(f"A message is over {settings.max_body_bytes} characters or "
                                      f"{settings.max_json_values} JSON values", "message_too_large")
                return
            try:
                msg = json.loads(message["text"])
                if not isinstance(msg, dict):
                    raise ValueError
            except ValueError:
                await session.error("Messages must be JSON objects", "invalid_json")
                continue
            kind = msg.get("type")
            try:
                if kind == "session.config":
                    await session.configure(msg)
                elif kind in ("input.text", "input.done"):
                    if session.body is None:
                        raise bad_request("Send session.config first", code="not_configured")
                    text = msg.get("text", "") if kind == "input.text" else ""
                    if not isinstance(text, str):
                        raise bad_request("'text' must be a string", param="text", code="invalid_value")
                    if not is_text(text):  # NUL, or a lone surrogate (its JSON escape) the engine cannot encode
                        raise bad_request("'text' must be valid Unicode text without NUL", param="text",
                                          code="invalid_characters")
                    if not session.accepts(text):  # before any work on it
                        limit = session.state.settings.speech_stream_max_pending_chars
                        await session.too_big(
                            f"The session would hold {session.pending_chars + len(text)} characters not yet "
                            f"spoken; at most {limit}: send less text at once, or wait for audio.done events",
                            "text_too_long", param="text")
                        return
                    session.add_text(text, flush=kind == "input.done")
                elif kind == "session.close":
                    if session.body is not None and session.buffer.strip():
                        session.add_text("", flush=True)
                    session.queue.put_nowait(("close",))
                    await worker
                    await ws.close()
                    return
                else:
                    raise bad_request(f"Unknown message type {str(kind)[:64]!r}", param="type", code="invalid_message")
            except (OpenAIError, EngineError, ValidationError) as exc:
                err = _error_fields(exc)
                await session.error(err["error"], err["code"])
    except WebSocketDisconnect:
        return
    finally:
        if receiver is not None and not receiver.done():
            receiver.cancel()
        if not worker.done():
            worker.cancel()  # closes the Triton stream of the sentence being spoken
        try:
            await worker
        except (asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
            pass
        except Exception:
            logger.debug("speech stream worker ended with an error", exc_info=True)
        if ws.client_state == WebSocketState.CONNECTED and ws.application_state == WebSocketState.CONNECTED:
            try:
                await ws.close()
            except RuntimeError:
                pass

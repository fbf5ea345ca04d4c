"""``POST /v1/audio/speech/batch`` and ``WS /v1/audio/speech/stream`` (vLLM-Omni's protocols,
docs/voices.md), for every speech model.

Batch: 1-32 items, each a ``SpeechRequest`` made of the batch's defaults and the item's own
fields, validated and synthesised on its own (at most ``Settings.batch_concurrency`` at once,
each holding an admission slot); one JSON answer with a result or an error per item.

WebSocket (text in, audio out as sentences complete)::

    client -> {"type": "session.config", "model", "voice", "response_format", "stream_audio", ...}
    client -> {"type": "input.text", "text": "..."}   (any number, any split)
    client -> {"type": "input.done"}                  (flush: the rest is one more sentence)
    client -> {"type": "session.close"}               (finish what is queued, then close)
    server <- {"type": "audio.start", "utterance_index", "sentence_index", "sentence_text",
               "format", "sample_rate"}
    server <- binary frames: the sentence's audio (one encoded clip; with ``stream_audio``: PCM
              int16 LE chunks as Triton streams them, computed ahead of playback by at most
              the stage's ``max_lead_ms``: ``PACED``)
    server <- {"type": "audio.done", "utterance_index", "sentence_index", "total_bytes", "error"}
    server <- {"type": "session.done", "utterance_index", "total_sentences"}  (after input.done)
    server <- {"type": "error", "message", "code"?}   (non-fatal: the session goes on)

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

import numpy as np
from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from omni_triton.media.audio import StreamResampler, encode_audio, float_to_pcm16, resample

from ..engine import EngineError, ModelInfo
from ..errors import OpenAIError, bad_request, engine_error_detail, public_message
from ..schemas import SpeechBatchRequest, SpeechRequest
from .common import SPEECH, AdmittedRequest, resolve_model, until_disconnect
from .speech import plan, synthesize
from .voices import drop_unsupported_extras

logger = logging.getLogger(__name__)

#: A sentence ends at ``.!?;`` (and their CJK forms, or ``…``), closing quotes/brackets allowed,
#: followed by whitespace; or at a line break. The end of the buffer is not a boundary (more text
#: may follow: "3." of "3.14", "..." still being typed) until ``input.done``.
_BOUNDARY = re.compile(r"[.!?;…]+[\"')\]]*\s+|[。！？；]+[\"')\]」』]*\s*|\n+")
#: Text without any boundary is cut at its last space once it is this long.
MAX_SENTENCE_CHARS = 400


def split_sentences(buffer: str) -> tuple[list[str], str]:
    """Complete sentences at the start of ``buffer`` and the incomplete rest.

    ``"Hi there. How are"`` -> ``(["Hi there."], "How are")``. Whitespace-only sentences are
    dropped. A rest longer than ``MAX_SENTENCE_CHARS`` is cut at its last space (or hard).
    """
    out, start = [], 0
    for m in _BOUNDARY.finditer(buffer):
        sentence = buffer[start:m.end()].strip()
        if sentence:
            out.append(sentence)
        start = m.end()
    rest = buffer[start:]
    while len(rest) > MAX_SENTENCE_CHARS:
        cut = rest.rfind(" ", 0, MAX_SENTENCE_CHARS)
        cut = cut if cut > 0 else MAX_SENTENCE_CHARS
        if rest[:cut].strip():
            out.append(rest[:cut].strip())
        rest = rest[cut:].lstrip()
    return out, rest


async def collect_clip(engine, info: ModelInfo, text: str, voice, speed, options) -> tuple[np.ndarray, int]:
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


def _error_fields(exc: Exception) -> dict:
    if isinstance(exc, OpenAIError):
        d = exc.detail
        return {"error": public_message(d.message), "code": d.code, "param": d.param, "status_code": exc.status_code}
    if isinstance(exc, EngineError):
        d = engine_error_detail(exc)
        return {"error": d.message, "code": d.code, "param": d.param, "status_code": exc.status_code}
    if isinstance(exc, ValidationError):
        e = exc.errors()[0]
        where = ".".join(str(p) for p in e.get("loc", ()))
        return {"error": f"{where}: {e.get('msg')}", "code": "invalid_value", "param": where or None,
                "status_code": 400}
    raise exc


# --------------------------------------------------------------------------- batch
async def create_batch(body: SpeechBatchRequest, request) -> dict:
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

    async def one(index: int, item) -> dict:
        try:
            payload = {**defaults, **{k: v for k, v in item.model_dump().items() if v is not None}}
            req = SpeechRequest.model_validate(payload)
            if req.streaming:
                raise bad_request("Batch items cannot stream", param="stream", code="invalid_value")
            info = await resolve_model(engine, req.model, SPEECH)
            req, ignored = drop_unsupported_extras(req, info)
            fmt, voice, speed, options = plan(req, info, state.settings.default_max_input_chars, store)

            def record(outcome: str, name=info.name) -> None:
                state.metrics.requests.labels(name, "batch", outcome).inc()

            async with sem:
                async with AdmittedRequest(state, record):
                    clip, rate = await collect_clip(engine, info, req.input, voice, speed, options)
            if not clip.size:
                raise bad_request(f"The model '{info.name}' found nothing to speak in 'input'", param="input",
                                  code="no_speech")
            if req.sample_rate and req.sample_rate != rate:
                clip = await asyncio.to_thread(resample, clip, rate, req.sample_rate)
                rate = req.sample_rate
            data = await asyncio.to_thread(encode_audio, clip, rate, fmt.name)
            n = len(req.input)
            return {"index": index, "status": "success", "audio_data": base64.b64encode(data).decode("ascii"),
                    "media_type": fmt.content_type, "sample_rate": rate,
                    **({"ignored_fields": ignored} if ignored else {}),
                    "usage": {"input_tokens": n, "output_tokens": 0, "total_tokens": n,
                              "audio_samples": int(clip.size), "audio_seconds": round(clip.size / rate, 6)}}
        except (OpenAIError, EngineError, ValidationError) as exc:
            return {"index": index, "status": "error", **_error_fields(exc)}

    results: list[dict] = []

    async def run_all():
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
        self.stream_audio = False
        self.buffer = ""
        self.utterance = 0
        self.sentences = 0  # queued in the current utterance
        self.queue: asyncio.Queue = asyncio.Queue()
        self.send_lock = asyncio.Lock()

    async def send_json(self, data: dict) -> None:
        async with self.send_lock:
            await self.ws.send_text(json.dumps(data))

    async def send_bytes(self, data: bytes) -> None:
        async with self.send_lock:
            await self.ws.send_bytes(data)

    async def error(self, message: str, code: str | None = None) -> None:
        await self.send_json({"type": "error", "message": public_message(message), "code": code})

    async def configure(self, msg: dict) -> None:
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
        fmt, *_ = plan(body, info, self.state.settings.default_max_input_chars,
                       getattr(self.state, "voice_store", None))
        if stream_audio and fmt.name != "pcm":
            raise bad_request("stream_audio sends PCM chunks: response_format must be 'pcm'",
                              param="response_format", code="unsupported_format")
        self.body, self.info, self.stream_audio = body, info, stream_audio

    def add_text(self, text: str, flush: bool) -> None:
        self.buffer += text
        sentences, self.buffer = split_sentences(self.buffer)
        if flush and self.buffer.strip():
            sentences.append(self.buffer.strip())
        if flush:
            self.buffer = ""
        for s in sentences:
            self.queue.put_nowait(("sentence", self.utterance, self.sentences, s, self.body, self.info,
                                   self.stream_audio))
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
            if item[0] == "done":
                await self.send_json({"type": "session.done", "utterance_index": item[1], "total_sentences": item[2]})
                continue
            await self.speak(*item[1:])

    async def speak(self, utterance: int, index: int, text: str, body: SpeechRequest, info: ModelInfo,
                    stream_audio: bool) -> None:
        state = self.state
        started, total, failed = False, 0, False
        head = {"utterance_index": utterance, "sentence_index": index}

        def record(outcome: str) -> None:
            state.metrics.requests.labels(info.name, "websocket", outcome).inc()

        try:
            req = body.model_copy(update={"input": text})
            fmt, voice, speed, options = plan(req, info, state.settings.default_max_input_chars,
                                              getattr(state, "voice_store", None))
            async with AdmittedRequest(state, record):
                rate = body.sample_rate or info.sample_rate or 24000
                if stream_audio:
                    # played as it comes, so paced to its listener (docs/scheduling.md "Pacing"):
                    # the deadlines count from this sentence's request, while the listener still
                    # plays the previous sentence's tail, so they are never later than needed
                    gen = synthesize(state.engine, info, text, voice, speed, options, paced=True)
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
                            clip = await asyncio.to_thread(resample, clip, model_rate, rate)
                        data = await asyncio.to_thread(encode_audio, clip, rate, fmt.name)
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
    was checked on the handshake by ``middleware.ApiKey``."""
    await ws.accept()
    session = _Session(ws)
    worker = asyncio.create_task(session.worker())
    try:
        while True:
            receiver = asyncio.ensure_future(ws.receive())
            done, _ = await asyncio.wait({receiver, worker}, return_when=asyncio.FIRST_COMPLETED)
            if worker in done:  # the worker failed (socket gone while sending): see finally
                receiver.cancel()
                return
            message = receiver.result()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("text") is None:
                await session.error("Send JSON text messages", "invalid_message")
                continue
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
                    if not isinstance(text, str) or "\x00" in text:
                        raise bad_request("'text' must be a string without NUL", param="text", code="invalid_value")
                    session.add_text(text, flush=kind == "input.done")
                elif kind == "session.close":
                    if session.body is not None and session.buffer.strip():
                        session.add_text("", flush=True)
                    session.queue.put_nowait(("close",))
                    await worker
                    await ws.close()
                    return
                else:
                    raise bad_request(f"Unknown message type {kind!r}", param="type", code="invalid_message")
            except (OpenAIError, EngineError, ValidationError) as exc:
                err = _error_fields(exc)
                await session.error(err["error"], err["code"])
    except WebSocketDisconnect:
        return
    finally:
        if not worker.done():
            worker.cancel()  # closes the Triton stream of the sentence being spoken
        try:
            await worker
        except (asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
            pass
        except Exception:  # noqa: BLE001 - the socket is gone; nothing to report to
            logger.debug("speech stream worker ended with an error", exc_info=True)
        if ws.client_state == WebSocketState.CONNECTED and ws.application_state == WebSocketState.CONNECTED:
            try:
                await ws.close()
            except RuntimeError:
                pass

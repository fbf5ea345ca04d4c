"""One Realtime session: the audio buffer, server VAD, the conversation and its responses.

:class:`RealtimeSession` is fed parsed client events (:meth:`RealtimeSession.handle`) by the
WebSocket loop (``serving/realtime.py``) and sends server events through the ``send`` callable
it is given. A response is one ``Engine.generate`` call on the omni BLS (one Triton request,
holding one admission slot) run as a task while events keep arriving; cancelling it (barge-in:
server VAD ``speech_started`` with ``interrupt_response``, or ``response.cancel``) closes the
generator, which cancels the gRPC stream, so Triton's thinker and talker stop at their next chunk
(``omni_thinker_cancelled_total`` / ``omni_talker_cancelled_total`` move). The cancelled
response ends with ``response.done`` status ``cancelled``; its assistant item keeps the text and
audio actually sent, status ``incomplete``, and no audio delta follows ``response.done``.

Input audio transcription (docs/realtime.md "Input audio transcription"): when the session's
``transcription`` is set, each user audio part without a transcript (a committed buffer, an
``input_audio`` item) is transcribed by a task of its own, concurrently with the response, on
``/v1/audio/transcriptions``' path (``serving.transcriptions``: VAD segments, then
``Engine.transcribe``); it sends ``conversation.item.input_audio_transcription.delta`` events,
then ``.completed`` (the part's transcript is set) or ``.failed``. A model without audio input
(``qwen25_omni``) has transcription on by default, and its responses wait (at most
``RealtimeLimits.transcript_wait_s``) for the transcripts of the items in their prompt, which
carries them as text. Closing the session, or deleting the item, cancels its transcription.

Work that grows with a payload runs off the event loop (``offload.off_loop``): base64 decoding
of large appends, WAV encoding of committed audio, resampling + PCM16 + base64 of output chunks.
WebRTC's VAD costs ~0.2 ms per 100 ms append (on the loop); appends over 1 s go off the loop.
"""
from __future__ import annotations

import asyncio
import base64
import functools
import logging
import math
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from omni_triton.media.audio import StreamResampler, float_to_pcm16
from omni_triton.media.vad import StreamingVAD, VADConfig

from ..engine import EngineError, GenerationChunk, GenerationRequest, ModelInfo
from ..errors import OpenAIError, engine_error_detail, public_message
from ..offload import off_loop
from ..serving.common import AdmittedRequest
from ..serving.transcriptions import (
    PreparedAudio,
    TranscriptionJob,
    prepare_samples,
    transcript_deltas,
    transcription_job,
)
from .conversation import (
    Item,
    Part,
    check_max_output_tokens,
    context_error_tokens,
    decode_b64,
    heard_prefix,
    item_json,
    item_tokens,
    load_text_counter,
    messages_of,
    parse_item,
    prepare_audio,
    select_items,
    shrunk_budget,
    text_counter,
    text_tokens,
)
from .protocol import (
    BYTES_PER_MS,
    RATE,
    Naming,
    RealtimeError,
    SessionConfig,
    TranscriptionConfig,
    apply_session_update,
    new_id,
    parse_max_tokens,
    parse_modalities,
    session_json,
)

logger = logging.getLogger(__name__)

#: base64 payloads larger than this are decoded off the event loop (a thread hop costs ~50 us;
#: decoding 64 KiB ~30 us on the loop).
INLINE_B64_CHARS = 64 << 10
#: Appends longer than this (1 s) go through the VAD off the event loop. Measured (webrtcvad +
#: soxr 24 -> 16 kHz, one core): 0.2 ms per 100 ms append, 26 ms per 60 s of audio.
VAD_INLINE_BYTES = RATE * 2
#: In server-VAD mode, audio older than this before the current speech (beyond the prefix
#: padding) is dropped from the buffer while nobody speaks: a silent stream never fills it.
VAD_KEEP_MS = 1000
#: Appends whose arrival times are kept for the barge-in latency (10 s of 100 ms appends).
ARRIVALS_KEPT = 100
#: Reserve for the answer when ``max_output_tokens`` is ``inf``: a quarter of the context, at most this.
DEFAULT_RESERVE_TOKENS = 256


@dataclass(frozen=True)
class RealtimeLimits:
    """Per-session bounds (``Settings.realtime_*``, docs/realtime.md "Limits").

    max_buffer_s: seconds of uncommitted audio (an append beyond: ``input_audio_buffer_full``).
    max_items / max_audio_s: conversation items / seconds of user audio kept; beyond, the oldest
        whole items are deleted (``conversation.item.deleted``).
    max_text_chars: characters of one text field (instructions, an item's text).
    paced: responses computed just ahead of playback (``PACED``, docs/scheduling.md "Pacing").
    transcript_wait_s: how long a response on a model without audio input waits for the
        transcripts of its prompt's user audio (then it fails: ``input_audio_transcription_timeout``).
    """

    max_buffer_s: float = 60.0
    max_items: int = 64
    max_audio_s: float = 600.0
    max_text_chars: int = 32_768
    paced: bool = True
    transcript_wait_s: float = 30.0


@dataclass
class _Response:
    id: str
    item: Item
    audio_out: bool
    voice: str | None
    sampling: dict[str, Any]
    max_output_tokens: int | None
    instructions: str
    in_conversation: bool
    metadata: Any = None
    #: what triggered it: ("commit" | "speech_stop", perf_counter time) for the latency metrics
    trigger: tuple[str, float] | None = None
    task: asyncio.Task[None] | None = None
    cancel_reason: str | None = None
    #: perf_counter time of the barge-in (speech start) or response.cancel
    cancel_at: float = 0.0
    text: list[str] = field(default_factory=list)
    audio_bytes: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    finish_reason: str | None = None
    last_audio_at: float = 0.0
    sent_audio: bool = False
    started: bool = False  # its task ran (a task cancelled before its first step never does)
    finishing: bool = False  # its closing events are being sent: a cancel waits for them
    #: the prompt's item budget and estimate (fixed part, whole), for the context retry
    budget: tuple[int, int, int] | None = None


class RealtimeSession:
    """The state of one session (module docstring).

    Args:
        send: sends one server event (a JSON object); safe to call from several tasks.
        state: ``app.state`` (engine, metrics, admission).
        info: the served omni model (``model=`` of the URL).
        naming: GA or beta event names.
        limits: the session bounds.
    """

    def __init__(self, send: Callable[[dict[str, Any]], Awaitable[None]], state: Any, info: ModelInfo,
                 naming: Naming, limits: RealtimeLimits, expires_at: int):
        self.send = send
        self.state = state
        self.engine = state.engine
        self.metrics = state.metrics
        self.info = info
        self.naming = naming
        self.limits = limits
        self.id = new_id("sess")
        self.conversation_id = new_id("conv")
        self.expires_at = expires_at
        #: the model takes ``input_audio`` parts; if not, user audio goes in as its transcript
        self.hears = "audio" in info.input_modalities
        self.transcription_settings = state.settings.transcription
        default = None if self.hears else TranscriptionConfig(self.transcription_settings.default_model)
        self.config = SessionConfig(voice=self._default_voice(), transcription=default)
        #: running transcriptions by (item id, content index)
        self.transcribing: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._job: tuple[TranscriptionConfig, TranscriptionJob] | None = None
        self.items: list[Item] = []
        self.buffer = bytearray()
        #: bytes of input audio appended during the session (positions of VAD events)
        self.fed_bytes = 0
        self.vad: StreamingVAD | None = None
        self.vad_base_ms = 0  # session position where the current VAD started
        self.speech_item_id: str | None = None  # the item the current speech will become
        #: (session position in ms where an append ended, perf_counter time it arrived), the
        #: last ARRIVALS_KEPT appends: when the voice that started speech reached the server
        self.arrivals: deque[tuple[int, float]] = deque(maxlen=ARRIVALS_KEPT)
        self.response: _Response | None = None
        #: perf_counter time of the last input_audio_buffer.commit not yet answered
        self.last_commit_at: float | None = None

    # ------------------------------------------------------------------ helpers
    def _default_voice(self) -> str:
        return "alloy"

    @property
    def busy(self) -> bool:
        """A response is running (the idle clock does not run)."""
        return self.response is not None

    async def emit(self, kind: str, **fields: Any) -> None:
        """Send one server event of type ``kind`` with a fresh ``event_id``."""
        await self.send({"type": kind, "event_id": new_id("event"), **fields})

    def _session_json(self) -> dict[str, Any]:
        return session_json(self.config, self.naming, self.id, self.info.public_name, self.expires_at)

    def _reset_vad(self) -> None:
        td = self.config.turn_detection
        if td is None:
            self.vad = None
        else:
            self.vad = StreamingVAD(RATE, VADConfig(threshold=td.threshold, prefix_padding_ms=td.prefix_padding_ms,
                                                    silence_duration_ms=td.silence_duration_ms))
        self.vad_base_ms = self.fed_bytes // BYTES_PER_MS
        self.speech_item_id = None

    def _check_voice(self, voice: str, param: str) -> str:
        if self.info.resolve_voice(voice) is None:
            raise RealtimeError(f"Unknown voice '{voice}' for model '{self.info.public_name}'; available: "
                                + ", ".join(self.info.voices), "invalid_voice", param)
        return voice

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Send ``session.created`` (the first server event) and start the server VAD."""
        self._reset_vad()
        await self.emit("session.created", session=self._session_json())

    async def close(self) -> None:
        """The socket is gone: cancel the running response and transcriptions (their Triton
        requests) without events."""
        tasks = list(self.transcribing.values())
        resp = self.response
        if resp is not None and resp.task is not None and not resp.task.done():
            tasks.append(resp.task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def handle(self, event: dict[str, Any]) -> None:
        """Serve one client event. Raises ``RealtimeError`` (sent as an error event by the caller)."""
        kind = event.get("type")
        handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            raise RealtimeError(f"Invalid value: {str(kind)[:64]!r}. Supported values are: "
                                + ", ".join(sorted(_HANDLERS)), "invalid_value", "type")
        await handler(self, event)

    # ------------------------------------------------------------------ session.update
    async def on_session_update(self, event: dict[str, Any]) -> None:
        names = frozenset({self.info.name, self.info.public_name})
        config = apply_session_update(self.config, event.get("session"), self.naming, names,
                                      self.limits.max_text_chars)
        if config.voice != self.config.voice:
            self._check_voice(config.voice, "session.voice" if self.naming.beta else "session.audio.output.voice")
        check_max_output_tokens(config.max_output_tokens, self.info.max_model_len, "session.max_response_output_tokens"
                                if self.naming.beta else "session.max_output_tokens")
        if config.transcription is not None and config.transcription != self.config.transcription:
            await self._transcription_job(config.transcription)  # refused here if the model cannot serve it
        vad_changed = config.turn_detection != self.config.turn_detection
        self.config = config
        if vad_changed:
            self._reset_vad()
        await self.emit("session.updated", session=self._session_json())

    # ------------------------------------------------------------------ input audio buffer
    async def on_append(self, event: dict[str, Any]) -> None:
        data = event.get("audio")
        if not isinstance(data, str):
            raise RealtimeError("'audio' must be a base64 string of PCM16 24 kHz audio", "invalid_value", "audio")
        if len(data) > INLINE_B64_CHARS:
            pcm = await off_loop(decode_b64, data, "audio")
        else:
            pcm = decode_b64(data, "audio")
        limit = int(self.limits.max_buffer_s * RATE) * 2
        if self.vad is not None and not self.vad.speaking:  # only the last moments can start a turn
            excess = len(self.buffer) + len(pcm) - self._vad_keep_bytes(limit)
            if excess > 0:
                del self.buffer[:excess]
        if len(self.buffer) + len(pcm) > limit and self.vad is not None and self.vad.speaking and len(pcm) <= limit:
            # a turn longer than the buffer ends here: committed (and answered) as if the speaker
            # paused, and the VAD starts afresh (else it would never hear the end of that speech)
            item_id = self.speech_item_id
            self._reset_vad()
            self.speech_item_id = item_id
            await self._speech_stopped(self.fed_bytes // BYTES_PER_MS, whole_buffer=True)
        if len(self.buffer) + len(pcm) > limit:
            seconds = (len(self.buffer) + len(pcm)) / BYTES_PER_MS / 1000
            raise RealtimeError(f"The input audio buffer would hold {seconds:.1f} s; at most "
                                f"{self.limits.max_buffer_s:g} s: commit or clear it", "input_audio_buffer_full",
                                "audio")
        self.buffer += pcm
        self.fed_bytes += len(pcm)
        self.arrivals.append((self.fed_bytes // BYTES_PER_MS, time.perf_counter()))
        if self.vad is None:
            return
        vad = self.vad
        events = (await off_loop(vad.feed, pcm)) if len(pcm) > VAD_INLINE_BYTES else vad.feed(pcm)
        for ev in events:
            position = self.vad_base_ms + ev.audio_ms
            if ev.kind == "speech_started":
                await self._speech_started(position)
            else:
                await self._speech_stopped(position)
        if self.vad is not None and not self.vad.speaking:  # keep the buffer bounded while nobody speaks
            keep = self._vad_keep_bytes(limit)
            if len(self.buffer) > keep:
                del self.buffer[:len(self.buffer) - keep]

    def _vad_keep_bytes(self, limit: int) -> int:
        """Bytes of the buffer kept while nobody speaks: the prefix padding + ``VAD_KEEP_MS``, at
        most the buffer limit."""
        td = self.config.turn_detection
        return min(limit, ((td.prefix_padding_ms if td else 0) + VAD_KEEP_MS) * BYTES_PER_MS)

    def _buffer_start_ms(self) -> int:
        return (self.fed_bytes - len(self.buffer)) // BYTES_PER_MS

    def _arrived_at(self, position_ms: int) -> float:
        """When the audio at session position ``position_ms`` reached the server (now if unknown)."""
        for end_ms, at in self.arrivals:
            if end_ms > position_ms:
                return at
        return time.perf_counter()

    async def _speech_started(self, position_ms: int) -> None:
        drop = (position_ms - self._buffer_start_ms()) * BYTES_PER_MS
        if drop > 0:
            del self.buffer[:drop]
        self.speech_item_id = new_id("item")
        await self.emit("input_audio_buffer.speech_started", audio_start_ms=position_ms, item_id=self.speech_item_id)
        td = self.config.turn_detection
        if self.response is not None and td is not None and td.interrupt_response:
            # barge-in latency counts from the first voiced frame's arrival (after the padding)
            voice_ms = position_ms + (td.prefix_padding_ms if position_ms > 0 else 0)
            await self._cancel("turn_detected", self._arrived_at(voice_ms))

    async def _speech_stopped(self, position_ms: int, whole_buffer: bool = False) -> None:
        """Speech stopped at session position ``position_ms``: commit the buffer up to it (all of
        it with ``whole_buffer``: a turn cut at the buffer limit, where rounding the position to
        whole ms would leave a few bytes behind and the append that follows over the limit)."""
        stopped_at = time.perf_counter()
        item_id = self.speech_item_id or new_id("item")
        self.speech_item_id = None
        await self.emit("input_audio_buffer.speech_stopped", audio_end_ms=position_ms, item_id=item_id)
        cut = len(self.buffer) if whole_buffer else max(0, (position_ms - self._buffer_start_ms()) * BYTES_PER_MS)
        if cut < 100 * BYTES_PER_MS:
            return
        await self._commit(cut, item_id)
        td = self.config.turn_detection
        if td is not None and td.create_response and self.response is None:
            await self._create_response({}, trigger=("speech_stop", stopped_at))

    async def on_commit(self, event: dict[str, Any]) -> None:
        if len(self.buffer) < 100 * BYTES_PER_MS:
            raise RealtimeError(f"Error committing input audio buffer: buffer too small. Expected at least 100ms of "
                                f"audio, but buffer only has {len(self.buffer) / BYTES_PER_MS:.2f}ms of audio.",
                                "input_audio_buffer_commit_empty")
        self.last_commit_at = time.perf_counter()
        item_id = self.speech_item_id or new_id("item")
        self.speech_item_id = None
        await self._commit(len(self.buffer), item_id)

    async def _commit(self, nbytes: int, item_id: str) -> None:
        pcm = bytes(self.buffer[:nbytes])
        del self.buffer[:nbytes]
        wav = await off_loop(prepare_audio, pcm)
        item = Item(item_id, "user", [Part("input_audio", pcm=pcm, wav_b64=wav, audio_ms=len(pcm) // BYTES_PER_MS)])
        previous = self.items[-1].id if self.items else None
        await self.emit("input_audio_buffer.committed", item_id=item.id, previous_item_id=previous)
        await self._add_item(item, previous)
        self._start_transcriptions(item)

    async def on_clear(self, event: dict[str, Any]) -> None:
        self.buffer.clear()
        if self.vad is not None:
            self._reset_vad()
        await self.emit("input_audio_buffer.cleared")

    # ------------------------------------------------------------------ conversation items
    async def _add_item(self, item: Item, previous: str | None, index: int | None = None) -> None:
        if index is None:
            self.items.append(item)
        else:
            self.items.insert(index, item)
        await self.emit("conversation.item.created", previous_item_id=previous, item=item_json(item, self.naming))
        await self._evict()

    async def _evict(self) -> None:
        """Delete the oldest whole items beyond ``max_items`` / ``max_audio_s`` (never the
        running response's item)."""
        running = self.response.item.id if self.response is not None else None
        while self.items and (len(self.items) > self.limits.max_items
                              or sum(i.audio_ms for i in self.items) > self.limits.max_audio_s * 1000):
            if self.items[0].id == running or len(self.items) == 1:
                break
            old = self.items.pop(0)
            self._stop_transcriptions(old)
            await self.emit("conversation.item.deleted", item_id=old.id)

    def _find(self, item_id: Any, param: str = "item_id") -> int:
        if not isinstance(item_id, str):
            raise RealtimeError(f"'{param}' must be a string", "invalid_type", param)
        for i, item in enumerate(self.items):
            if item.id == item_id:
                return i
        raise RealtimeError(f"Item with item_id not found: {item_id[:64]}", "item_not_found", param)

    async def on_item_create(self, event: dict[str, Any]) -> None:
        raw = event.get("item")
        big = isinstance(raw, dict) and any(isinstance(c, dict) and isinstance(c.get("audio"), str)
                                            and len(c["audio"]) > INLINE_B64_CHARS
                                            for c in raw.get("content") or [] if isinstance(raw.get("content"), list))
        item = (await off_loop(parse_item, raw, self.limits.max_text_chars)) if big \
            else parse_item(raw, self.limits.max_text_chars)
        if any(i.id == item.id for i in self.items):
            raise RealtimeError(f"Item with id {item.id[:64]} already exists", "item_already_exists", "item.id")
        previous = event.get("previous_item_id")
        if previous is None:
            await self._add_item(item, self.items[-1].id if self.items else None)
        elif previous == "root":
            await self._add_item(item, None, 0)
        else:
            index = self._find(previous, "previous_item_id")
            await self._add_item(item, previous, index + 1)
        if item.role == "user":
            self._start_transcriptions(item)

    # ------------------------------------------------------------------ input audio transcription
    def _transcription_param(self) -> str:
        return "session.input_audio_transcription" if self.naming.beta else "session.audio.input.transcription"

    async def _transcription_job(self, config: TranscriptionConfig) -> TranscriptionJob:
        """The job of ``config`` (model resolved and fields checked as ``/v1/audio/transcriptions``
        does; cached per config). Raises ``RealtimeError`` naming the session field."""
        if self._job is not None and self._job[0] == config:
            return self._job[1]
        try:
            job = await transcription_job(self.engine, config.model, config.language, config.prompt,
                                          self.transcription_settings.default_model, "realtime")
        except (OpenAIError, EngineError) as exc:
            d = engine_error_detail(exc) if isinstance(exc, EngineError) else exc.detail
            field_name = d.param if d.param in ("language", "prompt") else "model"
            raise RealtimeError(public_message(d.message), d.code or "invalid_value",
                                f"{self._transcription_param()}.{field_name}") from None
        self._job = (config, job)
        return job

    def _start_transcriptions(self, item: Item) -> None:
        """Start transcribing ``item``'s audio parts that have no transcript (transcription on)."""
        config = self.config.transcription
        if config is None:
            return
        for index, part in enumerate(item.parts):
            key = (item.id, index)
            if part.kind != "input_audio" or part.text is not None or key in self.transcribing:
                continue
            task = asyncio.create_task(self._transcribe(item, index, config))
            self.transcribing[key] = task
            task.add_done_callback(functools.partial(self._transcribed, key))

    def _transcribed(self, key: tuple[str, int], task: asyncio.Task[None]) -> None:
        if self.transcribing.get(key) is task:
            del self.transcribing[key]
        _retrieve(task)

    def _stop_transcriptions(self, item: Item) -> None:
        """``item`` left the conversation: its transcriptions are cancelled (no events follow)."""
        for index in range(len(item.parts)):
            task = self.transcribing.pop((item.id, index), None)
            if task is not None:
                task.cancel()

    async def _transcribe(self, item: Item, index: int, config: TranscriptionConfig) -> None:
        """Transcribe part ``index`` of ``item``: delta events, then ``.completed`` (the part's
        transcript set) or ``.failed`` with the error (the session goes on)."""
        part = item.parts[index]
        head = {"item_id": item.id, "content_index": index}
        try:
            job = await self._transcription_job(config)
            audio: PreparedAudio = await off_loop(_prepare_pcm, part.pcm, job.max_segment_s)
            concurrency = max(1, self.transcription_settings.concurrency)
            metrics = self.metrics

            def record(outcome: str) -> None:
                metrics.transcription_requests.labels(job.info.public_name, "realtime", "stream", outcome).inc()
                if outcome == "ok":
                    metrics.transcribed_audio_seconds.labels(job.info.public_name).inc(audio.seconds)

            text: list[str] = []
            async with AdmittedRequest(self.state, record, cost=min(max(len(audio.segments), 1), concurrency)) as req:
                async with aclosing(transcript_deltas(self.engine, job, audio, concurrency)) as deltas:
                    async for delta in deltas:
                        text.append(delta)
                        await self.emit("conversation.item.input_audio_transcription.delta", **head, delta=delta)
                req.outcome = "ok"
            part.text = "".join(text)
            await self.emit("conversation.item.input_audio_transcription.completed", **head, transcript=part.text,
                            usage={"type": "duration", "seconds": round(audio.seconds, 3)})
            return
        except RealtimeError as exc:
            error = {"type": exc.error_type, "code": exc.code, "message": exc.message, "param": exc.param}
        except (EngineError, OpenAIError) as exc:
            d = engine_error_detail(exc) if isinstance(exc, EngineError) else exc.detail
            error = {"type": d.type, "code": d.code, "message": public_message(d.message), "param": d.param}
        except Exception:
            logger.exception("realtime transcription of %s failed", item.id)
            error = {"type": "server_error", "code": "server_error", "message": "The server had an error",
                     "param": None}
        await self.emit("conversation.item.input_audio_transcription.failed", **head, error=error)

    async def _await_transcripts(self, items: list[Item]) -> None:
        """Wait (at most ``limits.transcript_wait_s``) for the running transcriptions of ``items``.
        Raises ``RealtimeError`` ``input_audio_transcription_timeout``. Cancelling the caller
        leaves the transcriptions running."""
        tasks = [task for item in items if item.role == "user" for index in range(len(item.parts))
                 if (task := self.transcribing.get((item.id, index))) is not None]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=self.limits.transcript_wait_s)
        if pending:
            raise RealtimeError(f"The transcript of the user audio was not ready within "
                                f"{self.limits.transcript_wait_s:g} s", "input_audio_transcription_timeout",
                                error_type="server_error")

    async def on_item_delete(self, event: dict[str, Any]) -> None:
        index = self._find(event.get("item_id"))
        if self.response is not None and self.items[index].id == self.response.item.id:
            raise RealtimeError("The item of the running response cannot be deleted", "invalid_value", "item_id")
        item = self.items.pop(index)
        self._stop_transcriptions(item)
        await self.emit("conversation.item.deleted", item_id=item.id)

    async def on_item_retrieve(self, event: dict[str, Any]) -> None:
        """The item with its user audio (base64 PCM16 24 kHz, encoded off the loop), as OpenAI
        returns it; assistant audio is not kept (its transcript is)."""
        item = self.items[self._find(event.get("item_id"))]
        data = item_json(item, self.naming)
        for part, out in zip(item.parts, data["content"], strict=True):
            if part.kind == "input_audio":
                out["audio"] = await off_loop(_b64, part.pcm)
        await self.emit("conversation.item.retrieved", item=data)

    async def on_item_truncate(self, event: dict[str, Any]) -> None:
        """Cut an assistant item's audio to ``audio_end_ms`` (what the listener heard): its
        transcript becomes the share of words heard (``conversation.heard_prefix``); the next
        prompt carries that."""
        item = self.items[self._find(event.get("item_id"))]
        content_index, end_ms = event.get("content_index"), event.get("audio_end_ms")
        if item.role != "assistant":
            raise RealtimeError("Only assistant message items can be truncated", "invalid_value", "item_id")
        if isinstance(content_index, bool) or not isinstance(content_index, int) \
                or not 0 <= content_index < len(item.parts) or item.parts[content_index].kind != "audio":
            raise RealtimeError("'content_index' must name an audio content part of the item", "invalid_value",
                                "content_index")
        part = item.parts[content_index]
        if isinstance(end_ms, bool) or not isinstance(end_ms, int) or not 0 <= end_ms <= part.audio_ms:
            raise RealtimeError(f"'audio_end_ms' must be within [0, {part.audio_ms}] (the item's audio length in ms)",
                                "invalid_value", "audio_end_ms")
        if self.response is not None and self.response.item is item:
            raise RealtimeError("The item of the running response cannot be truncated; cancel it first",
                                "invalid_value", "item_id")
        part.text = heard_prefix(part.text or "", end_ms, part.audio_ms)
        part.audio_ms = end_ms
        await self.emit("conversation.item.truncated", item_id=item.id, content_index=content_index,
                        audio_end_ms=end_ms)

    # ------------------------------------------------------------------ responses
    async def on_response_create(self, event: dict[str, Any]) -> None:
        params = event.get("response") or {}
        if not isinstance(params, dict):
            raise RealtimeError("'response' must be an object", "invalid_type", "response")
        trigger = ("commit", self.last_commit_at) if self.last_commit_at is not None else None
        await self._create_response(params, trigger=trigger)
        self.last_commit_at = None

    async def on_response_cancel(self, event: dict[str, Any]) -> None:
        wanted = event.get("response_id")
        if self.response is None or (wanted is not None and wanted != self.response.id):
            raise RealtimeError("Cancellation failed: no active response found", "response_cancel_not_active")
        await self._cancel("client_cancelled", time.perf_counter())

    async def _cancel(self, reason: str, at: float) -> None:
        resp = self.response
        if resp is None or resp.task is None:
            return
        if resp.finishing:  # its closing events are on their way
            await asyncio.gather(resp.task, return_exceptions=True)
            return
        resp.cancel_reason, resp.cancel_at = reason, at
        resp.task.cancel()
        await asyncio.gather(resp.task, return_exceptions=True)
        if not resp.started:  # cancelled before its first step: nothing ran, close it here
            try:
                await self._finish(resp, "cancelled", {"type": "cancelled", "reason": reason})
            finally:
                self.response = None

    def _response_params(self, params: dict[str, Any]) -> dict[str, Any]:
        beta = self.naming.beta
        allowed = {"instructions", "metadata", "conversation", "tools", "tool_choice", "input"}
        allowed |= ({"modalities", "voice", "output_audio_format", "temperature", "max_response_output_tokens"}
                    if beta else {"output_modalities", "audio", "max_output_tokens", "prompt"})
        for key in params:
            if key not in allowed:
                raise RealtimeError(f"Unknown parameter: 'response.{str(key)[:64]}'.", "unknown_parameter",
                                    f"response.{str(key)[:64]}")
        if params.get("input") is not None:
            raise RealtimeError("response.input (out-of-band context) is not supported", "unsupported_value",
                                "response.input")
        if params.get("tools") not in (None, []):
            raise RealtimeError("Tools are not supported by this server", "unsupported_tools", "response.tools")
        cfg = self.config
        out: dict[str, Any] = {"instructions": cfg.instructions, "audio_out": cfg.audio_out, "voice": cfg.voice,
                               "max_output_tokens": cfg.max_output_tokens, "temperature": cfg.temperature,
                               "conversation": "auto", "metadata": params.get("metadata")}
        if "instructions" in params:
            value = params["instructions"]
            if not isinstance(value, str) or len(value) > self.limits.max_text_chars:
                raise RealtimeError("'response.instructions' must be a string of at most "
                                    f"{self.limits.max_text_chars} characters", "invalid_value",
                                    "response.instructions")
            out["instructions"] = value
        if "conversation" in params:
            if params["conversation"] not in ("auto", "none"):
                raise RealtimeError("'response.conversation' must be 'auto' or 'none'", "invalid_value",
                                    "response.conversation")
            out["conversation"] = params["conversation"]
        key = "modalities" if beta else "output_modalities"
        if key in params:
            out["audio_out"] = parse_modalities(params[key], f"response.{key}")
        key = "max_response_output_tokens" if beta else "max_output_tokens"
        if key in params:
            out["max_output_tokens"] = parse_max_tokens(params[key], f"response.{key}")
            check_max_output_tokens(out["max_output_tokens"], self.info.max_model_len, f"response.{key}")
        if beta:
            if "voice" in params:
                out["voice"] = self._check_voice(str(params["voice"])[:64], "response.voice")
            if "temperature" in params:
                t = params["temperature"]
                if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 2:
                    raise RealtimeError("'response.temperature' must be within [0, 2]", "invalid_value",
                                        "response.temperature")
                out["temperature"] = float(t)
            if params.get("output_audio_format", "pcm16") != "pcm16":
                raise RealtimeError("Only pcm16 (24 kHz) is supported", "unsupported_audio_format",
                                    "response.output_audio_format")
        elif isinstance(params.get("audio"), dict):
            output = params["audio"].get("output") or {}
            if isinstance(output, dict) and "voice" in output:
                voice = output["voice"].get("id") if isinstance(output["voice"], dict) else output["voice"]
                out["voice"] = self._check_voice(str(voice)[:64], "response.audio.output.voice")
        return out

    async def _create_response(self, params: dict[str, Any], trigger: tuple[str, float] | None) -> None:
        if self.response is not None:
            raise RealtimeError(f"Conversation already has an active response in progress: {self.response.id}. Wait "
                                "until the response is finished before creating a new one.",
                                "conversation_already_has_active_response")
        p = self._response_params(params)
        sampling: dict[str, Any] = {}
        if p["max_output_tokens"] is not None:
            sampling["max_tokens"] = p["max_output_tokens"]
        if p["temperature"] is not None:
            sampling["temperature"] = p["temperature"]
        item = Item(new_id("item"), "assistant", [Part("audio" if p["audio_out"] else "text", text="")],
                    status="in_progress")
        resp = _Response(new_id("resp"), item, p["audio_out"], self.info.resolve_voice(p["voice"]), sampling,
                         p["max_output_tokens"], p["instructions"], p["conversation"] == "auto",
                         metadata=p["metadata"], trigger=trigger)
        self.response = resp
        try:
            await self.emit("response.created", response=self._response_json(resp, "in_progress", None))
            # the prompt is fixed now: items added while it runs go to the next one
            prompt_items = list(self.items)
            if resp.in_conversation:
                previous = self.items[-1].id if self.items else None
                self.items.append(item)
            await self.emit("response.output_item.added", response_id=resp.id, output_index=0,
                            item=item_json(item, self.naming))
            if resp.in_conversation:
                await self.emit("conversation.item.created", previous_item_id=previous,
                                item=item_json(item, self.naming))
            await self.emit("response.content_part.added", response_id=resp.id, item_id=item.id, output_index=0,
                            content_index=0, part=self._part(resp))
        except BaseException:
            self.response = None
            raise
        resp.task = asyncio.create_task(self._run(resp, prompt_items))
        resp.task.add_done_callback(_retrieve)

    def _part(self, resp: _Response) -> dict[str, Any]:
        if resp.audio_out:
            return {"type": "audio", "transcript": "".join(resp.text)}
        return {"type": "text", "text": "".join(resp.text)}

    def _messages(self, resp: _Response, items: list[Item], budget: int | None = None) -> list[dict[str, Any]]:
        """The prompt of ``resp`` (``conversation`` module docstring: the truncation rule). On a
        model without audio input user audio goes in as its transcript; the newest user item's
        audio must have one (older audio without one is left out). ``budget``: the items' token
        budget of a retry (``shrunk_budget``). CPU work (the tokenizer counts every item): run it
        off the event loop."""
        newest = next((i for i in reversed(items) if i.role == "user"), None)
        if not self.hears and newest is not None and any(p.kind == "input_audio" and p.text is None
                                                         for p in newest.parts):
            if self.config.transcription is None:
                raise RealtimeError(f"The model '{self.info.public_name}' does not take audio input "
                                    f"(it takes {', '.join(self.info.input_modalities)}); send text items or "
                                    "turn input audio transcription on (its transcript is sent instead)",
                                    "unsupported_content_part")
            raise RealtimeError(f"The audio of item {newest.id} has no transcript (its transcription failed: see "
                                "conversation.item.input_audio_transcription.failed), and the model "
                                f"'{self.info.public_name}' does not take audio input",
                                "input_audio_transcription_failed")
        context = self.info.max_model_len or 0
        if not context or self.config.truncation == "disabled":
            kept = items
        else:
            reserve = resp.max_output_tokens or min(DEFAULT_RESERVE_TOKENS, context // 4)
            count = text_counter(self.info.name)
            fixed = text_tokens(resp.instructions, count)
            if budget is None:
                budget = context - reserve - fixed
            max_media = self.info.parameters.get("max_media_parts")
            kept = select_items(items, budget, int(max_media) if max_media and max_media.isdigit() else None, count,
                                audio_as_text=not self.hears)
            resp.budget = (budget, fixed, fixed + sum(item_tokens(i, count, not self.hears) for i in kept))
        messages = messages_of(kept, resp.instructions, audio_as_text=not self.hears)
        if not any(m["role"] == "user" for m in messages):
            raise RealtimeError("The conversation has no user item to answer; commit audio or create an item first",
                                "conversation_empty")
        return messages

    def _encode(self, resampler: StreamResampler | None, audio: NDArray[Any], last: bool) -> tuple[str, int]:
        """Base64 PCM16 24 kHz of one output chunk (CPU work: off the loop) and its byte count."""
        samples = resampler.process(audio) if resampler is not None else audio
        if last and resampler is not None:
            samples = np.concatenate([samples, resampler.flush()])
        data = float_to_pcm16(samples)
        return base64.b64encode(data).decode("ascii"), len(data)

    async def _send_audio(self, resp: _Response, b64: str, n: int) -> None:
        if not n:
            return
        await self.emit(self.naming.audio_delta, response_id=resp.id, item_id=resp.item.id, output_index=0,
                        content_index=0, delta=b64)
        now = time.perf_counter()
        resp.audio_bytes += n
        resp.last_audio_at = now
        if not resp.sent_audio:
            resp.sent_audio = True
            if resp.trigger is not None:
                kind, t0 = resp.trigger
                hist = (self.metrics.realtime_commit_to_first_audio if kind == "commit"
                        else self.metrics.realtime_speech_stop_to_first_audio)
                hist.labels(self.info.public_name).observe(now - t0)

    async def _run(self, resp: _Response, items: list[Item]) -> None:
        """Run ``resp`` on the engine and send its events; ends with ``response.done``."""
        resp.started = True
        status: str = "completed"
        details: dict[str, Any] | None = None

        def record(outcome: str) -> None:
            self.metrics.generation_requests.labels(self.info.public_name, "realtime", "stream", outcome).inc()

        try:
            if not self.hears:
                await self._await_transcripts(items)
            await load_text_counter(self.engine, self.info)
            messages = await off_loop(self._messages, resp, items)
            async with AdmittedRequest(self.state, record) as req:
                resampler: StreamResampler | None = None
                gen = self._generate(resp, items, messages)
                try:
                    async for chunk in gen:
                        if chunk.prompt_tokens is not None:
                            resp.prompt_tokens = chunk.prompt_tokens
                        if chunk.completion_tokens is not None:
                            resp.completion_tokens = max(resp.completion_tokens, chunk.completion_tokens)
                        if chunk.finish_reason:
                            resp.finish_reason = chunk.finish_reason
                        if chunk.text:
                            resp.text.append(chunk.text)
                            kind = self.naming.transcript_delta if resp.audio_out else self.naming.text_delta
                            await self.emit(kind, response_id=resp.id, item_id=resp.item.id, output_index=0,
                                            content_index=0, delta=chunk.text)
                        if resp.audio_out and chunk.audio is not None and chunk.audio.size:
                            rate = chunk.sample_rate or self.info.sample_rate or RATE
                            if resampler is None and rate != RATE:
                                resampler = StreamResampler(rate, RATE)
                            b64, n = await off_loop(self._encode, resampler, chunk.audio, False)
                            await self._send_audio(resp, b64, n)
                    if resampler is not None:
                        b64, n = await off_loop(self._encode, resampler, np.zeros(0, np.float32), True)
                        await self._send_audio(resp, b64, n)
                finally:
                    await gen.aclose()  # on cancel: the gRPC stream is cancelled, Triton's stages stop
                req.outcome = "ok"
            if resp.finish_reason == "length":
                status, details = "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
        except asyncio.CancelledError:
            if resp.cancel_reason is None:  # the session is closing: no more events
                self.response = None
                raise
            task = asyncio.current_task()
            uncancel = getattr(task, "uncancel", None)  # Python 3.11+: this cancel was handled
            if uncancel is not None:
                uncancel()
            status, details = "cancelled", {"type": "cancelled", "reason": resp.cancel_reason}
        except RealtimeError as exc:
            status, details = "failed", {"type": "failed", "error": {"type": exc.error_type, "code": exc.code,
                                                                     "message": exc.message}}
        except (EngineError, OpenAIError) as exc:
            d = engine_error_detail(exc) if isinstance(exc, EngineError) else exc.detail
            status, details = "failed", {"type": "failed", "error": {"type": d.type, "code": d.code,
                                                                     "message": public_message(d.message)}}
        except Exception:
            logger.exception("realtime response %s failed", resp.id)
            status, details = "failed", {"type": "failed", "error": {"type": "server_error", "code": "server_error",
                                                                     "message": "The server had an error"}}
        resp.finishing = True
        try:
            await self._finish(resp, status, details)
        finally:
            self.response = None

    async def _generate(self, resp: _Response, items: list[Item],
                        messages: list[dict[str, Any]]) -> AsyncGenerator[GenerationChunk, None]:
        """The engine's chunks for ``resp``. When the model refuses the prompt as too long before
        any chunk (the estimate was not an upper bound for it), retried once with fewer old items
        (``conversation.shrunk_budget``, docs/realtime.md "Context")."""
        for attempt in range(2):
            request = GenerationRequest(messages=messages, sampling=resp.sampling,
                                        modalities=("text", "audio") if resp.audio_out else ("text",),
                                        voice=resp.voice, request_id=resp.id,
                                        paced=resp.audio_out and self.limits.paced)
            gen = self.engine.generate(self.info.name, request)
            started = False
            try:
                async for chunk in gen:
                    started = True
                    yield chunk
                return
            except (EngineError, OpenAIError) as exc:
                message = exc.message if isinstance(exc, EngineError) else exc.detail.message
                actual = context_error_tokens(message)
                if started or attempt or actual is None or resp.budget is None:
                    raise
                logger.info("realtime response %s: the model counted %d prompt tokens (estimate %d); retrying "
                            "with fewer items", resp.id, actual, resp.budget[2])
                messages = await off_loop(self._messages, resp, items, shrunk_budget(*resp.budget, actual))
            finally:
                await gen.aclose()

    async def _finish(self, resp: _Response, status: str, details: dict[str, Any] | None) -> None:
        item, naming = resp.item, self.naming
        text = "".join(resp.text)
        part = item.parts[0]
        part.text = text
        part.audio_ms = resp.audio_bytes // BYTES_PER_MS
        item.status = "completed" if status == "completed" else "incomplete"
        head = {"response_id": resp.id, "item_id": item.id, "output_index": 0, "content_index": 0}
        if resp.audio_out:
            await self.emit(naming.audio_done, **head)
            await self.emit(naming.transcript_done, **head, transcript=text)
        else:
            await self.emit(naming.text_done, **head, text=text)
        await self.emit("response.content_part.done", **head, part=self._part(resp))
        await self.emit("response.output_item.done", response_id=resp.id, output_index=0,
                        item=item_json(item, naming))
        if resp.cancel_reason is not None and status == "cancelled":
            # barge-in latency: the user's voice reaching the server (or response.cancel) -> the
            # last audio delta sent (0 when none was sent after it)
            self.metrics.realtime_barge_in.labels(self.info.public_name, resp.cancel_reason).observe(
                max(0.0, resp.last_audio_at - resp.cancel_at) if resp.sent_audio else 0.0)
        await self.emit("response.done", response=self._response_json(resp, status, details))

    def _usage(self, resp: _Response) -> dict[str, Any]:
        frame_rate = self.info.parameters.get("frame_rate_hz")
        audio_tokens = 0
        if frame_rate:
            try:
                audio_tokens = math.ceil(resp.audio_bytes / BYTES_PER_MS / 1000 * float(frame_rate))
            except ValueError:
                audio_tokens = 0
        prompt = resp.prompt_tokens or 0
        out = resp.completion_tokens + audio_tokens
        return {"total_tokens": prompt + out, "input_tokens": prompt, "output_tokens": out,
                "input_token_details": {"cached_tokens": 0},
                "output_token_details": {"text_tokens": resp.completion_tokens, "audio_tokens": audio_tokens}}

    def _response_json(self, resp: _Response, status: str, details: dict[str, Any] | None) -> dict[str, Any]:
        done = status != "in_progress"
        out: dict[str, Any] = {
            "id": resp.id, "object": "realtime.response", "status": status, "status_details": details,
            "output": [item_json(resp.item, self.naming)] if done else [],
            "conversation_id": self.conversation_id if resp.in_conversation else None,
            "usage": self._usage(resp) if done else None, "metadata": resp.metadata,
            "max_output_tokens": "inf" if resp.max_output_tokens is None else resp.max_output_tokens}
        if self.naming.beta:
            out.update(modalities=["text", "audio"] if resp.audio_out else ["text"], voice=self.config.voice,
                       output_audio_format="pcm16",
                       temperature=resp.sampling.get("temperature", 0.8))
        else:
            out.update(output_modalities=["audio"] if resp.audio_out else ["text"],
                       audio={"output": {"format": {"type": "audio/pcm", "rate": RATE}, "voice": self.config.voice}})
        return out


def _prepare_pcm(pcm: bytes, max_segment_s: float) -> PreparedAudio:
    """PCM16 24 kHz user audio as ``/v1/audio/transcriptions`` prepares an upload (16 kHz, VAD
    segments of at most ``max_segment_s``). CPU work linear in the audio: off the event loop."""
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    return prepare_samples(samples, RATE, max_segment_s)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _retrieve(task: asyncio.Task[None]) -> None:
    """Done callback of a response task: its exception (the socket gone while it sent) is read
    here, so it is not reported as never retrieved; the socket loop ends the session anyway."""
    if not task.cancelled() and task.exception() is not None:
        logger.debug("realtime response ended with %r", task.exception())


_HANDLERS: dict[str, Callable[[RealtimeSession, dict[str, Any]], Awaitable[None]]] = {
    "session.update": RealtimeSession.on_session_update,
    "input_audio_buffer.append": RealtimeSession.on_append,
    "input_audio_buffer.commit": RealtimeSession.on_commit,
    "input_audio_buffer.clear": RealtimeSession.on_clear,
    "conversation.item.create": RealtimeSession.on_item_create,
    "conversation.item.delete": RealtimeSession.on_item_delete,
    "conversation.item.retrieve": RealtimeSession.on_item_retrieve,
    "conversation.item.truncate": RealtimeSession.on_item_truncate,
    "response.create": RealtimeSession.on_response_create,
    "response.cancel": RealtimeSession.on_response_cancel,
}

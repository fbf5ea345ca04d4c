"""``POST /v1/audio/speech``: validation, synthesis, framing (voices: ``serving.voices``; batches and
the WebSocket: ``serving.speech_stream``).

Response modes of ``/v1/audio/speech``:

* whole clip (default): the model's chunks are collected, then encoded once
  (``mp3`` default, ``opus``, ``flac``, ``wav``, ``pcm``).
* ``stream=true`` (``stream_format="audio"``): raw bytes sent as each chunk arrives from Triton:
  ``pcm`` (int16 LE mono) or ``wav`` (``omni_triton.media.audio.streaming_wav_header`` then int16 PCM).
* ``stream_format="sse"``: ``speech.audio.delta`` events whose ``audio`` is base64 of the next
  bytes of that same byte stream, then ``speech.audio.done`` with ``usage``; if Triton fails
  mid-stream, ``speech.audio.error`` is sent instead of ``done``.

A stream is sent as fast as the stages make it (each chunk forwarded as it arrives); with
``stream_pacing: "realtime"`` the stages compute it at most their ``max_lead_ms`` ahead of the
listener instead (``PACED``, docs/scheduling.md "Pacing").

Streaming responses wait for the first chunk before sending the status line, so an error that
happens before any audio exists (model error, Triton down) is still a JSON error with its
status code. A raw-audio stream that fails later is aborted (no terminating chunk), so clients
see a truncated transfer rather than a clean end.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import Request
from fastapi.responses import Response
from numpy.typing import NDArray
from starlette.background import BackgroundTask

from omni_triton.media.audio import (
    RESAMPLE_RATES,
    STREAMING_FORMATS,
    SUPPORTED_FORMATS,
    AudioFormat,
    StreamResampler,
    UnsupportedFormatError,
    encode_audio,
    float_to_pcm16,
    get_format,
    resample,
    streaming_wav_header,
)

from ..engine import AudioChunk, Engine, EngineError, ModelInfo, SpeechOptions
from ..errors import OpenAIError, bad_request, engine_error_detail, error_json
from ..offload import off_loop
from ..schemas import (
    ErrorDetail,
    SpeechAudioDelta,
    SpeechAudioDone,
    SpeechAudioError,
    SpeechRequest,
    SpeechUsage,
)
from .common import (
    SPEECH,
    AdmittedRequest,
    ClosingStreamingResponse,
    check_fields,
    ignore_fields,
    resolve_model,
    retry_after_stage_restart,
    sse_response,
    until_disconnect,
)
from .voices import drop_unsupported_extras, resolve_speech

if TYPE_CHECKING:
    from ..voice_store import VoiceStore

logger = logging.getLogger(__name__)

#: Default ``response_format`` for a whole clip: OpenAI's ``mp3`` when libsndfile can write it.
DEFAULT_FORMAT = "mp3" if "mp3" in SUPPORTED_FORMATS else "wav"
#: Default ``response_format`` when streaming (raw bytes or SSE).
DEFAULT_STREAM_FORMAT = "pcm"


class StreamAborted(RuntimeError):
    """Raised out of a raw-audio response body after Triton failed mid-stream."""


def _is_stream_aborted(exc: BaseException | None) -> bool:
    """``exc`` is a :class:`StreamAborted`, or an exception group holding only such (read by its
    ``exceptions`` tuple: the GPU image's Python 3.10 has no builtin ``BaseExceptionGroup``)."""
    group = getattr(exc, "exceptions", None)
    if isinstance(group, tuple) and group:
        return all(_is_stream_aborted(e) for e in group)
    return isinstance(exc, StreamAborted)


class QuietStreamAborted(logging.Filter):
    """Drops the server's "Exception in ASGI application" traceback of a :class:`StreamAborted`:
    the abort is deliberate (the only way left to tell a raw-audio client that its stream broke)
    and already logged as one warning line by ``_raw_audio``. Every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not _is_stream_aborted(exc)


def install_quiet_stream_aborted(logger_names: tuple[str, ...] = ("uvicorn.error",)) -> None:
    """Adds one :class:`QuietStreamAborted` to each named logger (idempotent)."""
    for name in logger_names:
        log = logging.getLogger(name)
        if not any(isinstance(f, QuietStreamAborted) for f in log.filters):
            log.addFilter(QuietStreamAborted())


def check_input(text: str, info: ModelInfo, default_max_chars: int) -> None:
    """400 ``empty_input`` / ``input_too_long`` (over the model's ``max_input_chars``, else
    ``default_max_chars``) for the text to speak."""
    if not text.strip():
        raise bad_request("'input' must not be empty", param="input", code="empty_input")
    limit = info.max_input_chars or default_max_chars
    if len(text) > limit:
        raise bad_request(
            f"'input' is {len(text)} characters; the model '{info.public_name}' accepts at most {limit}",
            param="input",
            code="input_too_long",
        )


def plan(body: SpeechRequest, info: ModelInfo, default_max_chars: int, store: VoiceStore | None = None
         ) -> tuple[AudioFormat, str | None, float | None, SpeechOptions | None]:
    """Validate the request against the model (``store``: the ``VoiceStore`` of custom voices).

    Returns:
        (``omni_triton.media.audio`` format, voice or None, speed or None when 1.0,
        ``SpeechOptions`` or None: the Qwen3-TTS extras, ``serving.voices.resolve_speech``).

    Raises:
        OpenAIError: 400 naming the offending field (empty/too long input, unknown voice,
            unsupported speed/instructions/format...), 409 for a corrupt stored voice.
    """
    check_input(body.input, info, default_max_chars)
    voice, options = resolve_speech(body, info, store)
    if body.speed != 1.0 and not info.supports_speed:
        raise bad_request(
            f"The model '{info.public_name}' does not support 'speed' (only 1.0)", param="speed",
            code="unsupported_speed",
        )
    if body.sample_rate is not None and body.sample_rate not in (*RESAMPLE_RATES, info.sample_rate):
        raise bad_request(
            f"sample_rate={body.sample_rate} is not supported; supported rates: "
            + ", ".join(str(r) for r in sorted({*RESAMPLE_RATES, *([info.sample_rate] if info.sample_rate else [])})),
            param="sample_rate", code="unsupported_sample_rate")
    name = body.response_format
    if name is None:
        name = DEFAULT_STREAM_FORMAT if body.streaming else DEFAULT_FORMAT
    try:
        fmt = get_format(name, body.sample_rate or info.sample_rate)
    except UnsupportedFormatError as exc:
        raise bad_request(str(exc), param="response_format", code="unsupported_format") from None
    if body.streaming and name not in STREAMING_FORMATS:
        raise bad_request(
            f"response_format '{name}' cannot be streamed; streaming supports: "
            + ", ".join(STREAMING_FORMATS),
            param="response_format",
            code="unsupported_format",
        )
    speed = body.speed if body.speed != 1.0 else None
    return fmt, voice, speed, options


def synthesize(engine: Engine, info: ModelInfo, text: str, voice: str | None, speed: float | None,
               options: SpeechOptions | None, paced: bool = False) -> AsyncGenerator[AudioChunk, None]:
    """``engine.synthesize`` with ``options`` passed only when there are any and ``paced`` only
    when True (engines written before those keep working). ``paced``: a streamed response whose
    request opted into real-time pacing (``stream_pacing: "realtime"``); False (the default) lets
    the stages compute it as fast as they can (docs/scheduling.md "Pacing")."""
    extra: dict[str, Any] = {}
    if options:
        extra["options"] = options
    if paced:
        extra["paced"] = True
    return engine.synthesize(info.name, text, voice, speed, **extra)


def _nothing_to_speak(model: str) -> OpenAIError:
    """The model finished without any audio (e.g. input "..." has no speakable words)."""
    return bad_request(f"The model '{model}' found nothing to speak in 'input'", param="input",
                       code="no_speech")


def _audio_headers(fmt_name: str, sample_rate: int) -> dict[str, str]:
    headers = {"X-Sample-Rate": str(sample_rate), "Cache-Control": "no-store"}
    if fmt_name == "pcm":
        headers.update({"X-Sample-Format": "s16le", "X-Channels": "1"})
    return headers


async def create_speech(body: SpeechRequest, request: Request) -> Response:
    """Serve one ``/v1/audio/speech`` request (``request``: anything with ``app.state``).

    Returns a ``Response`` (whole clip), ``StreamingResponse`` (raw stream) or
    ``EventSourceResponse`` (SSE). Raises ``OpenAIError`` / ``EngineError`` before any byte is sent.
    """
    check_fields(body, request)
    state = request.app.state
    engine, metrics = state.engine, state.metrics
    info = await resolve_model(engine, body.model, SPEECH)
    body, extras = drop_unsupported_extras(body, info)
    if extras:
        ignore_fields(request, extras)
    # off the loop: a ref_audio clip is decoded and a stored voice's prompt read and checked here
    fmt, voice, speed, options = await off_loop(plan, body, info, state.settings.default_max_input_chars,
                                                getattr(state, "voice_store", None))
    mode = "sse" if body.stream_format == "sse" else ("stream" if body.stream else "clip")
    counted = {"samples": 0, "rate": info.sample_rate or 0}

    def record(outcome: str) -> None:
        metrics.requests.labels(info.public_name, mode, outcome).inc()
        if counted["rate"]:
            metrics.audio_seconds.labels(info.public_name).inc(counted["samples"] / counted["rate"])

    async with AdmittedRequest(state, record) as req:
        if not body.streaming:
            chunks: list[NDArray[Any]] = []

            async def attempt() -> None:  # speech has no side effects: retried once if a stage dies
                chunks.clear()
                counted["samples"] = 0
                gen = synthesize(engine, info, body.input, voice, speed, options)
                try:
                    async for chunk, sr in gen:
                        if not chunks:
                            metrics.ttfa.labels(info.public_name).observe(req.elapsed())
                        chunks.append(chunk)
                        counted["samples"] += len(chunk)
                        counted["rate"] = sr or counted["rate"]
                finally:
                    await gen.aclose()

            # A client that goes away releases its admission slot at once, even if the stage
            # never answers (the work is cancelled with its Triton call).
            if not await until_disconnect(request, retry_after_stage_restart(engine, info.name, attempt)):
                req.outcome = "cancelled"
                return _client_gone()
            if not chunks:
                raise _nothing_to_speak(info.public_name)
            clip, rate = np.concatenate(chunks), counted["rate"]
            if body.sample_rate and body.sample_rate != rate:  # vLLM-Omni's sample_rate (soxr)
                clip = await off_loop(resample, clip, rate, body.sample_rate)
                rate = counted["rate"] = body.sample_rate
                counted["samples"] = len(clip)
            try:
                data = await off_loop(encode_audio, clip, rate, fmt.name)
            except UnsupportedFormatError as exc:  # rate only known after synthesis
                raise bad_request(str(exc), param="response_format") from None
            return Response(data, media_type=fmt.content_type, headers=_audio_headers(fmt.name, rate))

        # ---- streaming: wait for the first chunk so early errors keep their status code
        # unpaced unless the client asked for real time: as fast as the stages make it
        gen = synthesize(engine, info, body.input, voice, speed, options, paced=body.realtime)
        first_chunk: list[AudioChunk | None] = []

        async def first_response() -> None:
            try:
                first_chunk.append(await gen.__anext__())
            except StopAsyncIteration:
                first_chunk.append(None)

        try:
            if not await until_disconnect(request, first_response()):
                await gen.aclose()
                req.outcome = "cancelled"
                return _client_gone()
        except BaseException:
            await gen.aclose()
            raise
        first = first_chunk[0]
        if first is None:
            await gen.aclose()
            raise _nothing_to_speak(info.public_name)
        metrics.ttfa.labels(info.public_name).observe(req.elapsed())
        model_rate = first[1] or info.sample_rate or 24000
        rate = body.sample_rate or model_rate  # what the client gets (sample_rate: resampled)
        counted["rate"] = rate
        resampler = StreamResampler(model_rate, rate)

        def pcm(samples: NDArray[Any]) -> bytes:
            counted["samples"] += len(samples)
            return float_to_pcm16(samples)

        async def pcm_stream() -> AsyncGenerator[bytes, None]:
            """Bytes of the ``fmt`` stream: optional WAV header, then int16 PCM per chunk (at the
            requested ``sample_rate``: resampled as it streams, the filter's tail at the end)."""
            try:
                if fmt.name == "wav":
                    yield streaming_wav_header(rate)
                data = pcm(resampler.process(first[0]))
                if data:
                    yield data
                async for chunk, _ in gen:
                    data = pcm(resampler.process(chunk))
                    if data:
                        yield data
                data = pcm(resampler.flush())
                if data:
                    yield data
            finally:
                await gen.aclose()

        if body.stream_format == "audio":
            body_iter = req.hand_over(_raw_audio(pcm_stream()))
            return ClosingStreamingResponse(
                body_iter, media_type=fmt.content_type, headers=_audio_headers(fmt.name, rate),
                # Runs after the response ends, including after a client disconnect: makes sure
                # the Triton stream is cancelled even if the iterator was parked at a yield.
                background=BackgroundTask(_close_all, body_iter, req))

        def done() -> SpeechAudioDone:
            n = len(body.input)
            return SpeechAudioDone(usage=SpeechUsage(
                input_tokens=n, total_tokens=n, audio_samples=counted["samples"],
                audio_seconds=round(counted["samples"] / rate, 6), sample_rate=rate))

        events = req.hand_over(_sse_events(pcm_stream(), done, req))
        return sse_response(events, headers={"X-Sample-Rate": str(rate)},
                            background=BackgroundTask(_close_all, events, req))


def _client_gone() -> Response:
    """What a request whose client left before the answer gets (nobody reads it; 499 is nginx's
    "client closed request", for the access log)."""
    return error_json(499, ErrorDetail(message="Client disconnected", type="invalid_request_error",
                                       code="client_disconnected"))


async def _close_all(body_iter: AsyncGenerator[Any, None], req: AdmittedRequest) -> None:
    await body_iter.aclose()
    await req.close()


async def _raw_audio(stream: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    """Raw audio bytes; a Triton failure after the status line aborts the transfer (the server
    closes the connection without the last chunk): the only honest signal left."""
    try:
        async for data in stream:
            yield data
    except EngineError as exc:
        logger.warning("speech stream aborted: %s", exc.message)
        raise StreamAborted(exc.message) from exc
    finally:
        await stream.aclose()


async def _sse_events(stream: AsyncGenerator[bytes, None], done: Callable[[], SpeechAudioDone],
                      req: AdmittedRequest) -> AsyncGenerator[dict[str, str], None]:
    """``speech.audio.delta`` per chunk, then ``speech.audio.done`` (or ``speech.audio.error``)."""
    try:
        async for data in stream:
            delta = SpeechAudioDelta(audio=base64.b64encode(data).decode("ascii"))
            yield dict(data=delta.model_dump_json(), event=delta.type)
    except EngineError as exc:
        logger.warning("speech SSE stream failed: %s", exc.message)
        req.outcome = "error"
        err = SpeechAudioError(error=engine_error_detail(exc))
        yield dict(data=err.model_dump_json(), event=err.type)
        return
    finally:
        await stream.aclose()
    final = done()
    yield dict(data=final.model_dump_json(), event=final.type)

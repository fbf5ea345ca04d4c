"""``POST /v1/audio/speech`` and ``GET /v1/audio/voices``.

Response modes of ``/v1/audio/speech``:

* whole clip (default): the model's chunks are collected, then encoded once
  (``mp3`` default, ``opus``, ``flac``, ``wav``, ``pcm``).
* ``stream=true`` (``stream_format="audio"``): raw bytes sent as each chunk arrives from Triton:
  ``pcm`` (int16 LE mono) or ``wav`` (``omni_triton.media.audio.streaming_wav_header`` then int16 PCM).
* ``stream_format="sse"``: ``speech.audio.delta`` events whose ``audio`` is base64 of the next
  bytes of that same byte stream, then ``speech.audio.done`` with ``usage``; if Triton fails
  mid-stream, ``speech.audio.error`` is sent instead of ``done``.

Streaming responses wait for the first chunk before sending the status line, so an error that
happens before any audio exists (model error, Triton down) is still a JSON error with its
status code. A raw-audio stream that fails later is aborted (no terminating chunk), so clients
see a truncated transfer rather than a clean end.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time

import numpy as np
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from omni_triton.media.audio import STREAMING_FORMATS, SUPPORTED_FORMATS, UnsupportedFormatError, encode_audio, float_to_pcm16, get_format, streaming_wav_header

from ..engine import EngineError, ModelInfo, ModelNotFoundError
from ..errors import OpenAIError, bad_request, engine_error_detail
from ..schemas import (
    ModelVoices,
    SpeechAudioDelta,
    SpeechAudioDone,
    SpeechAudioError,
    SpeechRequest,
    SpeechUsage,
    VoiceList,
)

logger = logging.getLogger(__name__)
router = APIRouter(tags=["audio"])

#: Default ``response_format`` for a whole clip: OpenAI's ``mp3`` when libsndfile can write it.
DEFAULT_FORMAT = "mp3" if "mp3" in SUPPORTED_FORMATS else "wav"
#: Default ``response_format`` when streaming (raw bytes or SSE).
DEFAULT_STREAM_FORMAT = "pcm"


class StreamAborted(RuntimeError):
    """Raised out of a raw-audio response body after Triton failed mid-stream."""


async def _resolve_model(engine, name: str | None) -> ModelInfo:
    if name is None:
        speech = [m for m in await engine.list_models() if m.ready and m.is_speech]
        if len(speech) != 1:
            raise bad_request(
                "'model' is required when the server serves "
                f"{len(speech)} speech models ({', '.join(m.name for m in speech) or 'none'})",
                param="model",
                code="model_required",
            )
        return speech[0]
    info = await engine.get_model(name)
    if not info.is_speech:
        raise bad_request(f"The model '{name}' is not a text-to-speech model", param="model")
    return info


def _plan(body: SpeechRequest, info: ModelInfo, default_max_chars: int):
    """Validate the request against the model; return (format, voice, speed)."""
    if not body.input.strip():
        raise bad_request("'input' must not be empty", param="input", code="empty_input")
    if "\x00" in body.input:
        raise bad_request("'input' must not contain NUL characters", param="input",
                          code="invalid_characters")
    try:
        body.input.encode("utf-8")
    except UnicodeEncodeError as exc:  # e.g. a lone surrogate escaped as "\ud800" in the JSON
        raise bad_request(f"'input' is not valid Unicode text ({exc.reason} at character "
                          f"{exc.start})", param="input", code="invalid_characters") from None
    limit = info.max_input_chars or default_max_chars
    if len(body.input) > limit:
        raise bad_request(
            f"'input' is {len(body.input)} characters; the model '{info.name}' accepts at most {limit}",
            param="input",
            code="input_too_long",
        )
    voice = body.voice_id
    if voice is None:
        voice = info.default_voice
    elif info.voices and voice not in info.voices:
        raise bad_request(
            f"Unknown voice '{voice}' for model '{info.name}'; available: {', '.join(info.voices)}",
            param="voice",
            code="invalid_voice",
        )
    if body.speed != 1.0 and not info.supports_speed:
        raise bad_request(
            f"The model '{info.name}' does not support 'speed' (only 1.0)", param="speed",
            code="unsupported_speed",
        )
    if body.instructions and body.instructions.strip():
        raise bad_request(
            f"The model '{info.name}' does not support 'instructions'", param="instructions",
            code="unsupported_instructions",
        )
    name = body.response_format
    if name is None:
        name = DEFAULT_STREAM_FORMAT if body.streaming else DEFAULT_FORMAT
    try:
        fmt = get_format(name, info.sample_rate)
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
    return fmt, voice, speed


def _nothing_to_speak(model: str) -> OpenAIError:
    """The model finished without any audio (e.g. input "..." has no speakable words)."""
    return bad_request(f"The model '{model}' found nothing to speak in 'input'", param="input",
                       code="no_speech")


def _audio_headers(fmt_name: str, sample_rate: int) -> dict[str, str]:
    headers = {"X-Sample-Rate": str(sample_rate), "Cache-Control": "no-store"}
    if fmt_name == "pcm":
        headers.update({"X-Sample-Format": "s16le", "X-Channels": "1"})
    return headers


@router.post("/v1/audio/speech", response_model=None)
async def create_speech(body: SpeechRequest, request: Request):
    state = request.app.state
    engine, metrics = state.engine, state.metrics
    info = await _resolve_model(engine, body.model)
    fmt, voice, speed = _plan(body, info, state.settings.default_max_input_chars)
    mode = "sse" if body.stream_format == "sse" else ("stream" if body.stream else "clip")
    try:
        slot = state.admission.acquire()
    except OpenAIError:
        metrics.rejected.inc()
        raise
    t0 = time.perf_counter()
    gen = engine.synthesize(info.name, body.input, voice, speed)
    outcome = "error"

    def usage(samples: int, rate: int) -> SpeechUsage:
        n = len(body.input)
        return SpeechUsage(
            input_tokens=n,
            total_tokens=n,
            audio_samples=samples,
            audio_seconds=round(samples / rate, 6) if rate else 0.0,
            sample_rate=rate or None,
        )

    def finish(samples: int, rate: int) -> None:
        metrics.requests.labels(info.name, mode, outcome).inc()
        if rate:
            metrics.audio_seconds.labels(info.name).inc(samples / rate)
        slot.release()

    # ---- whole clip
    if not body.streaming:
        chunks: list[np.ndarray] = []
        rate = info.sample_rate or 0
        try:
            async for chunk, sr in gen:
                if not chunks:
                    metrics.ttfa.labels(info.name).observe(time.perf_counter() - t0)
                chunks.append(chunk)
                rate = sr or rate
            if not chunks:
                outcome = "invalid_input"  # a client error, not a server one
                raise _nothing_to_speak(info.name)
            samples = np.concatenate(chunks)
            try:
                data = await asyncio.to_thread(encode_audio, samples, rate, fmt.name)
            except UnsupportedFormatError as exc:  # rate only known after synthesis
                raise bad_request(str(exc), param="response_format") from None
            outcome = "ok"
        finally:
            await gen.aclose()
            finish(sum(len(c) for c in chunks), rate)
        return Response(data, media_type=fmt.content_type, headers=_audio_headers(fmt.name, rate))

    # ---- streaming: wait for the first chunk so early errors keep their status code
    try:
        try:
            first = await gen.__anext__()
        except StopAsyncIteration:
            first = None
    except BaseException:
        await gen.aclose()
        finish(0, 0)
        raise
    if first is None:
        await gen.aclose()
        outcome = "invalid_input"  # a client error, not a server one
        finish(0, 0)
        raise _nothing_to_speak(info.name)
    metrics.ttfa.labels(info.name).observe(time.perf_counter() - t0)
    rate = (first[1] if first else 0) or info.sample_rate or 24000
    counted = {"samples": 0}

    async def pcm_stream():
        """Bytes of the ``fmt`` stream: optional WAV header, then int16 PCM per chunk."""
        if fmt.name == "wav":
            yield streaming_wav_header(rate)
        if first is not None:
            counted["samples"] += len(first[0])
            yield float_to_pcm16(first[0])
        async for chunk, _ in gen:
            counted["samples"] += len(chunk)
            yield float_to_pcm16(chunk)

    if body.stream_format == "audio":

        async def audio_body():
            nonlocal outcome
            stream = pcm_stream()
            try:
                async for data in stream:
                    yield data
                outcome = "ok"
            except asyncio.CancelledError:
                outcome = "cancelled"
                raise
            except GeneratorExit:
                outcome = "cancelled"
                raise
            except EngineError as exc:
                # The status line is gone; the only honest signal left is to abort the
                # transfer (the server closes the connection without the last chunk).
                logger.warning("speech stream aborted: %s", exc.message)
                raise StreamAborted(exc.message) from exc
            finally:
                await stream.aclose()
                await gen.aclose()
                finish(counted["samples"], rate)

        body_iter = audio_body()
        return StreamingResponse(
            body_iter,
            media_type=fmt.content_type,
            headers=_audio_headers(fmt.name, rate),
            # Runs after the response ends, including after a client disconnect: makes sure
            # the Triton stream is cancelled even if the iterator was parked at a yield.
            background=BackgroundTask(body_iter.aclose),
        )

    async def sse_body():
        nonlocal outcome
        stream = pcm_stream()
        try:
            try:
                async for data in stream:
                    delta = SpeechAudioDelta(audio=base64.b64encode(data).decode("ascii"))
                    yield ServerSentEvent(data=delta.model_dump_json(), event=delta.type)
            except EngineError as exc:
                logger.warning("speech SSE stream failed: %s", exc.message)
                err = SpeechAudioError(error=engine_error_detail(exc))
                yield ServerSentEvent(data=err.model_dump_json(), event=err.type)
                return
            done = SpeechAudioDone(usage=usage(counted["samples"], rate))
            yield ServerSentEvent(data=done.model_dump_json(), event=done.type)
            outcome = "ok"
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "cancelled"
            raise
        finally:
            await stream.aclose()
            await gen.aclose()
            finish(counted["samples"], rate)

    return EventSourceResponse(sse_body(), headers={"X-Sample-Rate": str(rate)})


@router.get("/v1/audio/voices", response_model=VoiceList)
async def list_voices(request: Request, model: str | None = Query(default=None)):
    engine = request.app.state.engine
    models = [m for m in await engine.list_models() if m.ready and m.is_speech]
    if model is not None:
        models = [m for m in models if m.name == model]
        if not models:
            raise ModelNotFoundError(f"The model '{model}' does not exist", param="model")
    data = [
        ModelVoices(
            model=m.name,
            voices=list(m.voices),
            default_voice=m.default_voice,
            sample_rate=m.sample_rate,
            supports_speed=m.supports_speed,
            max_input_chars=m.max_input_chars,
        )
        for m in models
    ]
    union = sorted({v for m in models for v in m.voices})
    return VoiceList(voices=union, data=data)

"""``POST /v1/audio/generate``: text-to-audio on a diffusion model (Stable Audio Open), vLLM-Omni's
Audio Generate API (docs/audio_generation.md).

Every field is checked against the model's limits (config ``parameters`` of the ``stable_audio``
BLS, written from the checkpoint's configs) before any work: the clip's seconds (start, end,
length <= ``max_seconds``), steps, guidance scale, seed, prompt size (characters here, tokens at
the text encoder). A bad value is a 400 in the OpenAI error shape naming the field.

Response modes:

* whole clip (default): the model's float waveform encoded once (``wav`` default, ``flac``,
  ``mp3``, ``pcm``, ``opus``: ``omni_triton.media.audio.encode_audio``, libsndfile).
* ``stream=true`` (or ``stream_format="sse"``): Server-Sent Events, one
  ``audio.generate.progress`` per finished denoising step, then ``audio.generate.done`` with the
  encoded clip in base64 (``audio.generate.error`` if a stage fails mid-way).

Cancel: a client that disconnects (either mode) cancels the Triton stream; the BLS cancels the
denoiser, which stops its pipeline call at the next step boundary (when no other request shares
that call). No job store: a clip takes seconds, and the SSE form already shows progress.
"""

from __future__ import annotations

import base64
import logging
import math
import secrets
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import Response
from numpy.typing import NDArray
from starlette.background import BackgroundTask

from omni_triton.contracts import stable_audio as ac
from omni_triton.media.audio import AudioFormat, UnsupportedFormatError, encode_audio, get_format

from ..engine import AudioGenerateEvent, AudioGenerateJob, EngineError, InferenceError, ModelInfo
from ..errors import bad_request, engine_error_detail
from ..offload import off_loop
from ..schemas import AudioGenerateDone, AudioGenerateError, AudioGenerateProgress, AudioGenerateRequest
from .common import AdmittedRequest, ModelKind, check_fields, resolve_model, sse_response, until_disconnect

logger = logging.getLogger(__name__)

TEXT_TO_AUDIO = ModelKind("text-to-audio", lambda m: m.is_audio_generation)
#: Characters a prompt or negative prompt may have (the text encoder then refuses more tokens than
#: its tokenizer keeps; T5's ``model_max_length`` 128 tokens is well under this).
MAX_PROMPT_CHARS = 4000


def _param(info: ModelInfo, key: str, default: Any, kind: type[int] | type[float] = float) -> Any:
    try:
        return kind(info.parameters[key]) if info.parameters.get(key) else default
    except ValueError:
        return default


def plan(body: AudioGenerateRequest, info: ModelInfo) -> tuple[AudioGenerateJob, AudioFormat]:
    """Validate ``body`` against the model's limits; the job to run and the output format.

    Seconds: ``audio_start_in_s`` (or ``audio_start``, default 0) to ``audio_end_in_s``, or
    ``audio_start + audio_length``, or the model's longest clip (``max_seconds``, diffusers'
    default ``audio_end_in_s``). Both ``audio_length`` and ``audio_end_in_s`` given must agree.

    Raises:
        OpenAIError: 400 naming the first bad field.
    """
    limits = ac.AudioLimits(_param(info, "max_seconds", 47.55), _param(info, "min_seconds", 0.0),
                            _param(info, "max_seconds_value", 512.0), _param(info, "max_steps", 200, int))
    for name, text in (("input", body.input), ("negative_prompt", body.negative_prompt)):
        if text is not None and len(text) > MAX_PROMPT_CHARS:
            raise bad_request(f"{name} has {len(text)} characters; at most {MAX_PROMPT_CHARS}", param=name,
                              code="string_above_max_length")
    if not body.input.strip():
        raise bad_request("input is empty", param="input", code="invalid_value")
    if body.speed is not None and body.speed != 1.0:
        raise bad_request(f"speed={body.speed:g}: this model generates at its own pace; only 1.0 is served",
                          param="speed", code="unsupported_parameter")
    if body.audio_start is not None and body.audio_start_in_s is not None and body.audio_start != body.audio_start_in_s:
        raise bad_request("audio_start and audio_start_in_s conflict; give one", param="audio_start_in_s",
                          code="conflicting_duration")
    start = body.audio_start_in_s if body.audio_start_in_s is not None else (body.audio_start or 0.0)
    if body.audio_end_in_s is not None:
        end = body.audio_end_in_s
        if body.audio_length is not None and not math.isclose(start + body.audio_length, end, abs_tol=1e-9):
            raise bad_request(f"audio_length={body.audio_length:g} and audio_end_in_s={end:g} (start {start:g}) "
                              "conflict; give one", param="audio_length", code="conflicting_duration")
    elif body.audio_length is not None:
        end = start + body.audio_length
    else:
        end = start + limits.max_seconds
    param = "audio_end_in_s" if body.audio_end_in_s is not None else "audio_length"
    if not end > start:
        raise bad_request(f"audio_end_in_s={end:g} must be greater than the start {start:g}", param=param,
                          code="invalid_audio_length")
    if end - start > limits.max_seconds + 1e-9:
        raise bad_request(f"audio length {end - start:g} s: the model '{info.public_name}' makes at most "
                          f"{limits.max_seconds:g} s", param=param, code="invalid_audio_length")
    if not limits.min_value <= start <= limits.max_value or not limits.min_value <= end <= limits.max_value:
        raise bad_request(f"the clip [{start:g}, {end:g}] s must lie in [{limits.min_value:g}, {limits.max_value:g}] "
                          f"s for the model '{info.public_name}'", param="audio_start" if start > limits.max_value
                          else param, code="invalid_audio_length")
    steps = body.num_inference_steps if body.num_inference_steps is not None else _param(info, "default_steps", 8, int)
    if not ac.MIN_INFERENCE_STEPS <= steps <= limits.max_steps:
        raise bad_request(f"num_inference_steps={steps}: must be in [{ac.MIN_INFERENCE_STEPS}, {limits.max_steps}]",
                          param="num_inference_steps", code="invalid_num_inference_steps")
    scale = body.guidance_scale if body.guidance_scale is not None else _param(info, "default_guidance_scale", 7.0)
    try:
        fmt = get_format(body.response_format, _param(info, "sample_rate", None, int))
    except UnsupportedFormatError as exc:
        raise bad_request(str(exc), param="response_format", code="unsupported_response_format") from None
    seed = body.seed if body.seed is not None else secrets.randbelow(2**31)
    job = AudioGenerateJob(prompt=body.input, audio_start_s=float(start), audio_end_s=float(end), steps=steps,
                           seed=seed, guidance_scale=float(scale), negative_prompt=body.negative_prompt)
    return job, fmt


def encode_clip(audio: NDArray[Any], sample_rate: int, fmt: AudioFormat) -> bytes:
    """``float32 [channels, samples]`` -> the ``fmt`` file (interleaved 16-bit, libsndfile)."""
    return encode_audio(np.ascontiguousarray(np.asarray(audio, np.float32).T), sample_rate, fmt.name)


def _headers(fmt: AudioFormat, audio: NDArray[Any], rate: int, steps: int | None, seconds: float) -> dict[str, str]:
    headers = {"X-Sample-Rate": str(rate), "X-Channels": str(audio.shape[0]),
               "X-Audio-Seconds": f"{audio.shape[1] / rate:.6f}", "X-Generation-Seconds": f"{seconds:.3f}"}
    if steps is not None:
        headers["X-Num-Inference-Steps"] = str(steps)
    if fmt.name == "pcm":
        headers["X-Sample-Format"] = "s16le"
    return headers


async def create_audio(body: AudioGenerateRequest, request: Request) -> Response:
    """Serve one ``/v1/audio/generate`` request: the encoded clip, or an SSE stream (``stream``).

    Raises ``OpenAIError`` / ``EngineError`` before any byte is sent.
    """
    check_fields(body, request)
    state = request.app.state
    engine, metrics = state.engine, state.metrics
    info = await resolve_model(engine, body.model, TEXT_TO_AUDIO)
    job, fmt = plan(body, info)
    mode = "sse" if body.sse else "clip"

    def record(outcome: str) -> None:
        metrics.requests.labels(info.public_name, f"generate-{mode}", outcome).inc()

    async with AdmittedRequest(state, record) as req:
        if not body.sse:
            clip = await run_clip(request, info, job, fmt)
            if clip is None:
                req.outcome = "cancelled"
                return Response(status_code=499)
            final, audio, data = clip
            return Response(data, media_type=fmt.content_type,
                            headers=_headers(fmt, audio, final.sample_rate, final.num_steps, req.elapsed()))

        # wait for the first event (the text encoder ran), so an early error keeps its status code
        gen = engine.generate_audio(info.name, job)
        first: list[AudioGenerateEvent] = []

        async def first_event() -> None:
            try:
                first.append(await gen.__anext__())
            except StopAsyncIteration:
                raise InferenceError(f"{info.name}: the stream ended without audio") from None

        try:
            if not await until_disconnect(request, first_event()):
                await gen.aclose()
                req.outcome = "cancelled"
                return Response(status_code=499)
        except BaseException:
            await gen.aclose()
            raise
        events = req.hand_over(_sse_events(_chain(first[0], gen), fmt, req))
        return sse_response(events, background=BackgroundTask(_close_all, events, req))


async def run_clip(request: Request, info: ModelInfo, job: AudioGenerateJob,
                   fmt: AudioFormat) -> tuple[AudioGenerateEvent, NDArray[Any], bytes] | None:
    """Run ``job`` to its last event and encode the clip (``fmt``, off the event loop); ``None``
    when the client disconnected first (the Triton stream, and so the denoiser, is cancelled).
    Shared by ``/v1/audio/generate`` and the chat form (``chat.py``). Returns the last event, its
    ``float32 [channels, samples]`` waveform and the encoded bytes.

    Raises:
        EngineError: a stage failed (mapped to its HTTP status by the app).
    """
    result: dict[str, Any] = {}

    async def work() -> None:
        final = await _final(request.app.state.engine.generate_audio(info.name, job), info.name)
        result["event"], result["audio"] = final, final.audio
        result["data"] = await off_loop(encode_clip, final.audio, final.sample_rate, fmt)

    if not await until_disconnect(request, work()):
        return None
    return result["event"], result["audio"], result["data"]


async def _chain(first: AudioGenerateEvent,
                 gen: AsyncGenerator[AudioGenerateEvent, None]) -> AsyncGenerator[AudioGenerateEvent, None]:
    try:
        yield first
        async for event in gen:
            yield event
    finally:
        await gen.aclose()


async def _final(gen: AsyncGenerator[AudioGenerateEvent, None], model: str) -> AudioGenerateEvent:
    try:
        async for event in gen:
            if event.audio is not None:
                return event
    finally:
        await gen.aclose()
    raise InferenceError(f"{model}: the stream ended without audio")


async def _sse_events(gen: AsyncGenerator[AudioGenerateEvent, None], fmt: AudioFormat,
                      req: AdmittedRequest) -> AsyncGenerator[dict[str, str], None]:
    """``audio.generate.progress`` per step, then ``audio.generate.done`` (or ``.error``)."""
    try:
        async for event in gen:
            if event.audio is None:
                total = max(event.total, 1)
                progress = AudioGenerateProgress(step=event.step, total_steps=total,
                                                 progress=int(100 * event.step / total))
                yield dict(data=progress.model_dump_json(), event=progress.type)
                continue
            data = await off_loop(encode_clip, event.audio, event.sample_rate, fmt)
            done = AudioGenerateDone(audio=base64.b64encode(data).decode("ascii"), response_format=fmt.name,
                                     sample_rate=event.sample_rate, channels=int(event.audio.shape[0]),
                                     audio_seconds=round(event.audio.shape[1] / event.sample_rate, 6),
                                     num_inference_steps=event.num_steps or 0)
            yield dict(data=done.model_dump_json(), event=done.type)
            return
    except EngineError as exc:
        logger.warning("audio generate SSE stream failed: %s", exc.message)
        req.outcome = "error"
        err = AudioGenerateError(error=engine_error_detail(exc))
        yield dict(data=err.model_dump_json(), event=err.type)
    finally:
        await gen.aclose()


async def _close_all(body_iter: AsyncGenerator[Any, None], req: AdmittedRequest) -> None:
    await body_iter.aclose()
    await req.close()


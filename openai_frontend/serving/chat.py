"""Serving of ``POST /v1/chat/completions`` and ``POST /v1/completions`` over chat-contract
Triton models (and chat on a text-to-image model, answered with images).

Each choice is one Triton request (``docs/chat_contracts.md``) on its own ``ModelStreamInfer``
RPC; ``n`` choices are ``n`` requests run concurrently (with a ``seed``, choice ``i`` uses
``seed + i``). The model's stage applies the chat template and counts tokens; the frontend only
validates what it can without a tokenizer, frames the answer and reports the stage's counts.

Audio: ``modalities`` containing ``"audio"`` needs a model that speaks. A text model (``llm``)
whose speech twin is served (a model whose config parameter ``speaks_for`` names it, e.g.
``llm_tts``) has the request sent to that twin; a model that cannot speak is a 400.

* non-stream: ``message.content`` (when text is asked for) and ``message.audio`` =
  ``{id, data: base64 of the whole clip in audio.format, expires_at, transcript}``.
* stream (SSE, ``data: {chunk}`` ... ``data: [DONE]``): a first chunk per choice with the role
  (and ``audio.id``), then chunks in arrival order carrying ``delta.content`` (text) and
  ``delta.audio.data`` (base64 of the next bytes of a ``pcm16`` or streaming-``wav`` byte
  stream), then per choice a last chunk with ``finish_reason`` (and ``audio.expires_at`` +
  the whole ``audio.transcript``), then the usage chunk if ``stream_options.include_usage``.

Streams wait for the first response of every choice before the status line is sent, so input
the stage rejects (``INVALID_ARG``, e.g. a prompt over the context) is still a JSON 400. A
later failure is sent as ``data: {"error": {...}}`` (the OpenAI SDK raises ``APIError`` on it)
before ``[DONE]``. A client that goes away cancels every choice's gRPC stream; the stage then
aborts the request in its engine.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.background import BackgroundTask

from omni_triton.contracts.chat import MODALITIES, part_modality
from omni_triton.media.audio import UnsupportedFormatError, get_format
from omni_triton.media.fetch import UrlFetchError, UrlFetchPolicy, fetch_url

from ..engine import Engine, EngineError, GenerationChunk, GenerationRequest, ModelInfo
from ..errors import OpenAIError, bad_request, engine_error_detail, error_json
from ..generation import (
    CHAT_AUDIO_FORMATS,
    CHAT_STREAM_AUDIO_FORMATS,
    END,
    AudioStreamEncoder,
    ChoiceState,
    encode_clip_b64,
    merge,
    message_json,
    now,
    sampling_parameters,
    usage_of,
)
from ..offload import off_loop
from ..schemas import (
    AudioGenerateRequest,
    ChatCompletion,
    ChatCompletionAudio,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionChunkChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChoiceDelta,
    ChoiceDeltaAudio,
    Completion,
    CompletionChoice,
    CompletionRequest,
    ErrorDetail,
    ErrorResponse,
    ImageGenerationRequest,
    TextPart,
    Usage,
)
from . import audio_generate, images
from .common import (
    AdmittedRequest,
    check_fields,
    check_prompt_chars,
    messages_chars,
    resolve_model,
    retry_after_stage_restart,
    sse_response,
    until_disconnect,
)
from .stage_metrics import RequestStages

if TYPE_CHECKING:
    from ..metrics import FrontendMetrics

#: One item of ``generation.merge``: (choice index, chunk, or ``END`` when that choice is done).
Item = tuple[int, GenerationChunk | None]
#: What a chunk is sent as (``ChatCompletionChunk.modality``).
Modality = Literal["text", "audio", "image"]

logger = logging.getLogger(__name__)


async def speaking_model(engine: Engine, info: ModelInfo) -> ModelInfo:
    """The model that answers ``info``'s chat requests with audio: ``info`` itself if it can
    speak, else its served speech twin (config parameter ``speaks_for``). 400 if neither."""
    if info.can_speak:
        return info
    names = {info.name, info.public_name}
    twins = [m for m in await engine.list_models() if m.speaks_for in names]
    if not twins:
        raise bad_request(
            f"The model '{info.public_name}' cannot produce audio (its output modalities: "
            f"{', '.join(info.output_modalities) or 'text'}) and no model that speaks for it is "
            "served; ask for modalities ['text']",
            param="modalities", code="unsupported_modality")
    ready = [m for m in twins if m.ready]
    # get_model raises ModelNotReadyError (503) with the reason when none is READY
    return await engine.get_model((ready or twins)[0].name)


# --------------------------------------------------------------------------- plan of a request
@dataclass
class _Plan:
    """One HTTP request turned into Triton requests and a response shape."""

    endpoint: str  # "chat" | "completions"
    model_name: str  # as the client named it (the response's ``model``)
    target: ModelInfo  # the Triton model that serves it
    requests: list[GenerationRequest]
    stream: bool
    include_usage: bool
    prompt_of_choice: list[int] | None = None  # completions: prompt index of each choice
    wants_text: bool = True
    audio_format: str | None = None  # chat audio.format when audio is asked for
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (with include_usage)
    stage_metrics: bool = False  # return_stage_metrics: add vLLM-Omni's ``metrics``
    response_id: str = ""
    created: int = field(default_factory=now)

    @property
    def mode(self) -> str:
        return "stream" if self.stream else "whole"


def _check_token_limit(info: ModelInfo, limit: int | None, param: str) -> None:
    if limit is not None and info.max_model_len and limit > info.max_model_len:
        raise bad_request(
            f"'{param}' is {limit} but the model '{info.public_name}' has a context of "
            f"{info.max_model_len} tokens", param=param, code="invalid_value")


def _check_fanout(count: int, limit: int, what: str) -> None:
    """400 when one HTTP request would become more than ``limit`` Triton requests
    (``--max-fanout``; 64 prompts x n=16 were 1,024 requests on one admission slot)."""
    if count > limit:
        raise bad_request(f"{what} is {count} generations; at most {limit} per request",
                          param="n" if what.startswith("n=") else "prompt", code="too_many_generations")


def _plan_audio(body: ChatCompletionRequest, target: ModelInfo) -> tuple[str, str | None]:
    """Validated (audio format, voice) of a chat request that asks for audio."""
    fmt = body.audio.format if body.audio is not None else "wav"
    try:
        get_format(CHAT_AUDIO_FORMATS[fmt], target.sample_rate)
    except UnsupportedFormatError as exc:
        raise bad_request(str(exc).replace("response_format", "audio.format"), param="audio.format",
                          code="unsupported_format") from None
    if body.stream and fmt not in CHAT_STREAM_AUDIO_FORMATS:
        raise bad_request(
            f"audio.format '{fmt}' cannot be streamed; streaming supports: "
            + ", ".join(CHAT_STREAM_AUDIO_FORMATS), param="audio.format", code="unsupported_format")
    voice = body.audio.voice_id if body.audio is not None else None
    if voice is None:
        voice = target.default_voice
    elif target.resolve_voice(voice) is None:  # OpenAI names map to the model's voices (docs/voices.md)
        raise bad_request(
            f"Unknown voice '{voice}' for model '{target.public_name}'; available: "
            + ", ".join(target.voices), param="audio.voice", code="invalid_voice")
    else:
        voice = target.resolve_voice(voice)
    return fmt, voice


async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response | dict[str, Any]:
    """Serve ``POST /v1/chat/completions`` (``request``: the Starlette request). Returns the
    completion (a dict), an SSE response, or an image chat's ``JSONResponse``."""
    check_fields(body, request)
    check_prompt_chars(messages_chars(body.messages), request, "messages")
    engine = request.app.state.engine
    info = await resolve_model(engine, body.model)
    if info.is_audio_generation:
        return await _audio_chat(body, request, info)
    given = [f for f in AUDIO_FIELDS if getattr(body, f) is not None]
    if given:
        raise bad_request(f"The model '{body.model}' does not generate audio clips ({given[0]} applies to "
                          "text-to-audio models only)", param=given[0], code="unsupported_parameter")
    if info.is_image and not info.is_image_edit:
        check_media_parts([message_json(m) for m in body.messages], info, body.model)
        return await _image_chat(body, request, info)
    if info.is_image_edit:
        raise bad_request(f"The model '{body.model}' edits images and does not support chat "
                          "completions (image inputs in messages are not supported); use "
                          "POST /v1/images/edits", param="model", code="unsupported_model")
    given = [f for f in IMAGE_FIELDS if getattr(body, f) is not None]
    if given or (body.modalities and "image" in body.modalities):
        raise bad_request(f"The model '{body.model}' does not generate images "
                          f"({', '.join(given) or 'modalities'} applies to image models only)",
                          param=given[0] if given else "modalities", code="unsupported_modality")
    if not info.is_chat:
        raise bad_request(f"The model '{body.model}' does not support chat completions",
                          param="model", code="unsupported_model")
    for i, m in enumerate(body.messages):
        if m.content is None:
            raise bad_request(f"messages[{i}].content is required", param=f"messages.{i}.content",
                              code="invalid_value")
    wanted = output_modalities(body, info)
    wants_audio = "audio" in wanted
    target, fmt, voice = info, None, None
    if wants_audio:
        target = await speaking_model(engine, info)
        fmt, voice = _plan_audio(body, target)
    elif body.audio is not None:
        raise bad_request("'audio' is only valid with modalities including 'audio'", param="audio",
                          code="invalid_value")
    _check_fanout(body.n, request.app.state.settings.max_fanout, f"n={body.n}")
    limit = body.token_limit
    _check_token_limit(target, limit, "max_completion_tokens" if body.max_completion_tokens else "max_tokens")
    messages = [message_json(m) for m in body.messages]
    check_media_parts(messages, target, body.model)
    messages = await fetch_media_urls(messages, request.app.state.settings.media_urls)
    response_id = f"chatcmpl-{uuid.uuid4().hex}"
    modalities = None
    if MODALITIES in target.inputs:  # speech models: say whether audio is wanted
        modalities = ("text", "audio") if wants_audio else ("text",)
    requests = [
        GenerationRequest(messages=messages, sampling=sampling_parameters(body, limit, i),
                          modalities=modalities, voice=voice, request_id=f"{response_id}-{i}",
                          paced=bool(body.stream and wants_audio and body.realtime))
        for i in range(body.n)
    ]
    plan = _Plan("chat", body.model, target, requests, body.stream, body.include_usage,
                 wants_text="text" in wanted, audio_format=fmt, response_id=response_id,
                 continuous_usage=body.continuous_usage, stage_metrics=body.return_stage_metrics)
    return await _run(plan, request)


def check_media_parts(messages: list[dict[str, Any]], target: ModelInfo, model_name: str) -> None:
    """400 naming the first content part type ``target`` cannot take (its ``input_modalities``),
    e.g. "The model 'llm' does not accept input_audio parts"."""
    accepted = set(target.input_modalities)
    for i, m in enumerate(messages):
        if not isinstance(m.get("content"), list):
            continue
        for j, part in enumerate(m["content"]):
            if part_modality(part) not in accepted:
                raise bad_request(
                    f"The model '{model_name}' does not accept {part['type']} parts (it takes "
                    f"{', '.join(sorted(accepted))} input)", param=f"messages.{i}.content.{j}",
                    code="unsupported_content_part")
            if part["type"] != "text" and m["role"] != "user":
                raise bad_request(f"{part['type']} parts are only accepted in user messages",
                                  param=f"messages.{i}.content.{j}", code="invalid_value")


async def fetch_media_urls(messages: list[dict[str, Any]], policy: UrlFetchPolicy) -> list[dict[str, Any]]:
    """``messages`` with every http(s) ``image_url`` / ``video_url`` fetched under ``policy``
    and replaced by a base64 data URL (the model only sees data). Each refusal is its 4xx
    (``omni_triton.media.fetch.fetch_url``); other URL schemes but ``data:`` are a 400."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m.get("content"), list):
            out.append(m)
            continue
        parts = []
        for j, part in enumerate(m["content"]):
            kind = part["type"]
            url = part[kind]["url"] if kind in ("image_url", "video_url") else None
            if url is not None and not url[:5].lower() == "data:":
                try:
                    mime, data = await fetch_url(url, policy)
                except UrlFetchError as exc:
                    raise OpenAIError(exc.status, exc.message, param=f"messages.{i}.content.{j}.{kind}.url",
                                      code=exc.code) from None
                mime = mime or ("image/*" if kind == "image_url" else "video/*")
                url = await off_loop(_data_url, mime, data)
                part = {"type": kind, kind: {"url": url}}
            parts.append(part)
        out.append({**m, "content": parts})
    return out


def _data_url(mime: str, data: bytes) -> str:
    """A ``data:`` URL of ``data`` (base64) with media type ``mime``."""
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def output_modalities(body: ChatCompletionRequest, info: ModelInfo) -> tuple[str, ...]:
    """The output modalities of a chat request: ``modalities`` when given (OpenAI), else every
    output modality of the model (vLLM-Omni's default: an omni or spoken model speaks; a text
    model writes; an image model draws). A text model with a speech twin (``llm``) stays text."""
    if body.modalities:
        return tuple(body.modalities)
    return info.output_modalities or ("text",)


#: ``ChatCompletionRequest`` fields that only a diffusion model takes.
IMAGE_FIELDS = ("size", "negative_prompt", "num_inference_steps", "guidance_scale",
                "true_cfg_scale", "output_format")


#: ``ChatCompletionRequest`` fields that only a text-to-audio model takes.
AUDIO_FIELDS = ("audio_start_in_s", "audio_end_in_s", "extra_args")
#: Keys of ``extra_args`` the text-to-audio chat takes (the rest: 400).
_AUDIO_EXTRA_ARGS = ("audio_start_in_s", "audio_end_in_s", "negative_prompt", "num_inference_steps",
                     "guidance_scale", "seed")
#: chat ``audio.format`` -> the audio generate ``response_format``
_CHAT_AUDIO_FORMATS = {"wav": "wav", "mp3": "mp3", "flac": "flac", "opus": "opus", "pcm16": "pcm"}


def _audio_generate_body(body: ChatCompletionRequest, info: ModelInfo) -> AudioGenerateRequest:
    """The ``/v1/audio/generate`` body a text-to-audio chat request stands for: the last user
    message's text is ``input``; the diffusion fields come from the top level (``extra_body``) or
    ``extra_args`` (both given and different: 400); ``audio.format`` (default ``wav``) is the
    ``response_format``.

    Raises:
        OpenAIError: 400 naming the field (fields that do not apply, a bad ``extra_args`` key or
        value, no user text).
    """
    for name in ("size", "true_cfg_scale", "output_format", "tools", "response_format"):
        if getattr(body, name, None) is not None:
            raise bad_request(f"{name} does not apply to the text-to-audio model '{body.model}'", param=name,
                              code="unsupported_parameter")
    if body.n != 1:
        raise bad_request(f"n={body.n}: the text-to-audio model '{body.model}' makes one clip per request",
                          param="n", code="invalid_value")
    if body.modalities and "audio" not in body.modalities:
        raise bad_request(f"The model '{body.model}' answers with audio only", param="modalities",
                          code="unsupported_modality")
    if body.audio is not None and body.audio.voice is not None:
        raise bad_request(f"The model '{body.model}' has no voices", param="audio.voice", code="invalid_voice")
    users = [m for m in body.messages if m.role == "user"]
    content = users[-1].content if users else None
    prompt = content if isinstance(content, str) else " ".join(
        p.text for p in content or [] if isinstance(p, TextPart))
    if not users or not prompt:
        raise bad_request("A user message with the audio description (text) is required", param="messages",
                          code="invalid_value")
    fields: dict[str, Any] = {f: getattr(body, f) for f in _AUDIO_EXTRA_ARGS if getattr(body, f) is not None}
    for key, value in (body.extra_args or {}).items():
        if key not in _AUDIO_EXTRA_ARGS:
            raise bad_request(f"extra_args.{key} is not a field of the text-to-audio model '{body.model}' "
                              f"(it takes {', '.join(_AUDIO_EXTRA_ARGS)})", param=f"extra_args.{key}",
                              code="unsupported_parameter")
        if key in fields and fields[key] != value:
            raise bad_request(f"{key} is given twice (top level and extra_args) with different values",
                              param=f"extra_args.{key}", code="invalid_value")
        fields[key] = value
    fmt = body.audio.format if body.audio is not None else "wav"
    if fmt not in _CHAT_AUDIO_FORMATS:
        raise bad_request(f"audio.format={fmt} is not served for '{body.model}' (one of "
                          f"{', '.join(_CHAT_AUDIO_FORMATS)})", param="audio.format",
                          code="unsupported_response_format")
    try:
        return AudioGenerateRequest(input=prompt, model=info.name, response_format=_CHAT_AUDIO_FORMATS[fmt],
                                    **fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = ".".join(str(x) for x in err["loc"])
        param = name if getattr(body, name, None) is not None else f"extra_args.{name}"
        raise bad_request(f"{param}: {err['msg']}", param=param, code="invalid_value") from None


async def _audio_chat(body: ChatCompletionRequest, request: Request, info: ModelInfo) -> Response:
    """A chat completion on a text-to-audio model (Stable Audio Open), vLLM-Omni's diffusion chat
    form: the last user message is the description; ``audio_start_in_s``, ``audio_end_in_s``,
    ``negative_prompt``, ``num_inference_steps``, ``guidance_scale``, ``seed`` top level or under
    ``extra_args``. Validated and run exactly as ``POST /v1/audio/generate``
    (``audio_generate.plan`` / ``run_clip``: same limits, same 400s, a disconnect cancels the
    denoiser). The answer is ``choices[0].message.audio`` (OpenAI ``ChatCompletionAudio``: ``data``
    base64 of the clip in ``audio.format``, default ``wav``; ``transcript`` empty), ``content``
    null. ``stream=true``: 400 (one clip, no tokens to stream; ``/v1/audio/generate`` with
    ``stream`` has per-step progress).
    """
    if body.stream:
        raise bad_request(f"stream is not supported for the text-to-audio model '{body.model}' in chat "
                          "completions; use POST /v1/audio/generate with stream=true for progress",
                          param="stream", code="unsupported_parameter")
    job, fmt = audio_generate.plan(_audio_generate_body(body, info), info)
    state = request.app.state

    def record(outcome: str) -> None:
        state.metrics.requests.labels(info.public_name, "chat-clip", outcome).inc()

    async with AdmittedRequest(state, record) as req:
        clip = await audio_generate.run_clip(request, info, job, fmt)
        if clip is None:
            req.outcome = "cancelled"
            return Response(status_code=499)
        final, wave, data = clip
        elapsed = req.elapsed()
    response_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    audio = {"id": f"audio-{uuid.uuid4().hex}", "data": base64.b64encode(data).decode("ascii"),
             "expires_at": created + 3600, "transcript": ""}
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
             "num_inference_steps": final.num_steps, "denoise_seconds": final.denoise_seconds}
    response = {"id": response_id, "object": "chat.completion", "created": created, "model": body.model,
                "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                             "message": {"role": "assistant", "content": None, "audio": audio}}],
                "usage": usage}
    headers = {"X-Sample-Rate": str(final.sample_rate), "X-Channels": str(wave.shape[0]),
               "X-Audio-Seconds": f"{wave.shape[1] / final.sample_rate:.6f}",
               "X-Generation-Seconds": f"{elapsed:.3f}", "X-Seed": str(job.seed)}
    return JSONResponse(response, headers=headers)


async def _image_chat(body: ChatCompletionRequest, request: Request, info: ModelInfo) -> Response:
    """A chat completion on a text-to-image model, as vLLM-Omni answers it: the last user
    message is the prompt and ``message.content`` is a list of ``image_url`` parts, one data URL
    (``data:image/png;base64,...``) per image (``n`` images, image ``i`` with ``seed + i``).

    Image options are the images API's (``size``, ``negative_prompt``, ``num_inference_steps``,
    ``guidance_scale``, ``true_cfg_scale``, ``output_format``, ``seed``) and are validated the same
    way; ``usage`` carries ``num_inference_steps`` and ``denoise_seconds`` (also as the
    ``X-Denoise-Steps`` / ``X-Denoise-Seconds`` headers); ``return_stage_metrics`` adds
    ``metrics``. Audio is a 400.

    ``stream``: as vLLM-Omni streams it, one chunk with ``modality: "image"`` whose
    ``delta.content`` holds the image parts (and ``finish_reason`` ``stop``, ``metrics`` when
    asked for), the usage chunk if ``stream_options.include_usage``, then ``[DONE]``. The images
    are made before the status line, so every error is still a JSON 4xx/5xx.
    """
    if body.wants_audio:
        raise bad_request(f"The model '{body.model}' cannot produce audio", param="modalities",
                          code="unsupported_modality")
    users = [m for m in body.messages if m.role == "user"]
    if not users:
        raise bad_request("A user message with the image prompt is required", param="messages",
                          code="invalid_value")
    content = users[-1].content
    prompt = content if isinstance(content, str) else " ".join(p.text for p in content or [] if isinstance(p, TextPart))
    image_body = ImageGenerationRequest(
        prompt=prompt, model=info.name, n=body.n, size=body.size, seed=body.seed,
        negative_prompt=body.negative_prompt, num_inference_steps=body.num_inference_steps,
        guidance_scale=body.guidance_scale, true_cfg_scale=body.true_cfg_scale,
        output_format=body.output_format)
    job, fmt = images.plan(image_body, info)
    result = await images.generate(request, info, job, fmt, None, "chat", body.return_stage_metrics)
    parts = [{"type": "image_url",
              "image_url": {"url": f"data:{e.mime_type};base64,{base64.b64encode(e.data).decode('ascii')}"}}
             for e in result.encoded]
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.model}
    usage = {"prompt_tokens": len(prompt), "completion_tokens": 0, "total_tokens": len(prompt),
             "num_inference_steps": result.steps, "denoise_seconds": result.seconds}
    extra = {"metrics": result.metrics} if result.metrics is not None else {}
    if body.stream:
        chunk = {**head, "object": "chat.completion.chunk", "modality": "image", **extra,
                 "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                              "delta": {"role": "assistant", "content": parts}}]}
        events = [json.dumps(chunk, separators=(",", ":"))]
        if body.include_usage:
            events.append(json.dumps({**head, "object": "chat.completion.chunk", "modality": "image",
                                      "choices": [], "usage": usage}, separators=(",", ":")))
        events.append("[DONE]")

        async def stream() -> AsyncGenerator[dict[str, str], None]:
            for data in events:
                yield {"data": data}

        return sse_response(stream(), headers=images.denoise_headers(result))
    response = {
        **head, "object": "chat.completion", **extra,
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                     "message": {"role": "assistant", "content": parts}}],
        "usage": usage,
    }
    return JSONResponse(response, headers=images.denoise_headers(result))


async def create_completion(body: CompletionRequest, request: Request) -> Response | dict[str, Any]:
    """Serve ``POST /v1/completions``: each prompt gets ``n`` choices (indexed
    ``prompt_index * n + i``). Returns the completion (a dict) or an SSE response."""
    check_fields(body, request)
    check_prompt_chars(sum(map(len, body.prompts)), request, "prompt")
    engine = request.app.state.engine
    info = await resolve_model(engine, body.model)
    if not info.is_completion:
        raise bad_request(f"The model '{body.model}' does not support completions",
                          param="model", code="unsupported_model")
    prompts = body.prompts
    if not prompts or any(not p for p in prompts):
        raise bad_request("'prompt' must be a non-empty string or a non-empty list of them",
                          param="prompt", code="invalid_value")
    _check_token_limit(info, body.max_tokens, "max_tokens")
    _check_fanout(len(prompts) * body.n, request.app.state.settings.max_fanout,
                  f"{len(prompts)} prompt(s) x n={body.n}")
    response_id = f"cmpl-{uuid.uuid4().hex}"
    requests, groups = [], []
    for p_index, prompt in enumerate(prompts):
        for i in range(body.n):
            choice = p_index * body.n + i
            requests.append(GenerationRequest(
                prompt=prompt, sampling=sampling_parameters(body, body.max_tokens, i),
                # a completion is text: a model that can also speak (omni) is told so
                modalities=("text",) if MODALITIES in info.inputs else None,
                request_id=f"{response_id}-{choice}"))
            groups.append(p_index)
    plan = _Plan("completions", body.model, info, requests, body.stream, body.include_usage,
                 prompt_of_choice=groups, response_id=response_id,
                 continuous_usage=body.continuous_usage)
    return await _run(plan, request)


# --------------------------------------------------------------------------- execution
def _observe_tpot(metrics: FrontendMetrics, plan: _Plan, states: list[ChoiceState], seen: dict[str, float]) -> None:
    """TPOT of a single-choice request: (last text - first text) / (completion tokens - 1)."""
    if len(plan.requests) != 1 or "first_at" not in seen:
        return
    tokens = states[0].completion_tokens
    if tokens > 1:
        metrics.tpot.labels(plan.target.public_name).observe((seen["last_at"] - seen["first_at"]) / (tokens - 1))


async def _run(plan: _Plan, request: Request) -> Response | dict[str, Any]:
    """Admit the plan's Triton requests (one unit each), run them concurrently and answer."""
    state = request.app.state
    engine, metrics = state.engine, state.metrics
    states = [ChoiceState() for _ in plan.requests]
    seen: dict[str, float] = {}  # first_at / last_at: seconds since admission of the first / last text

    def record(outcome: str) -> None:
        metrics.generation_requests.labels(plan.target.public_name, plan.endpoint, plan.mode, outcome).inc()
        metrics.completion_tokens.labels(plan.target.public_name).inc(sum(s.completion_tokens for s in states))
        _observe_tpot(metrics, plan, states, seen)
        audio = sum(sum(len(a) for a in s.audio) / (s.sample_rate or plan.target.sample_rate or 24000)
                    for s in states if s.audio)
        if audio:  # seconds of speech sent in chat answers (as /v1/audio/speech counts its own)
            metrics.audio_seconds.labels(plan.target.public_name).inc(audio)

    async with AdmittedRequest(state, record, cost=len(plan.requests)) as req:
        clock = RequestStages(plan.target, enabled=plan.stage_metrics)

        def observe(chunk: GenerationChunk | None) -> None:
            if chunk is None or not chunk.text:
                return
            now = req.elapsed()
            if "first_at" not in seen:
                seen["first_at"] = now
                metrics.ttft.labels(plan.target.public_name).observe(now)
            elif len(plan.requests) == 1:  # ITL between one choice's chunks
                metrics.itl.labels(plan.target.public_name).observe(now - seen["last_at"])
            seen["last_at"] = now

        if not plan.stream:
            async def attempt() -> bool:
                states[:] = [ChoiceState() for _ in plan.requests]
                clock.reset()
                merged = merge([engine.generate(plan.target.name, r) for r in plan.requests])
                try:
                    return await until_disconnect(request, _collect(merged, states, observe, clock))
                finally:
                    await merged.aclose()

            if all(_deterministic(r) for r in plan.requests):  # greedy or seeded: retried once
                finished = await retry_after_stage_restart(engine, plan.target.name, attempt)
            else:
                finished = await attempt()
            if not finished:
                req.outcome = "cancelled"
                # nobody reads this; 499 is nginx's "client closed request", for the access log
                return error_json(499, ErrorDetail(message="Client disconnected", type="invalid_request_error",
                                                   code="client_disconnected"))
            response = await off_loop(_whole_response, plan, states)
            metrics_object = clock.metrics(_chat_summary(plan, states))
            if metrics_object is not None:
                response["metrics"] = metrics_object
            return response  # a dict: FastAPI encodes it (the routes declare response_model=None)

        # ---- stream: wait for every choice's first response so early errors keep their status
        merged = merge([engine.generate(plan.target.name, r) for r in plan.requests])
        buffered: list[Item] = []
        try:
            started: set[int] = set()
            while len(started) < len(states):
                i, chunk = await merged.__anext__()
                buffered.append((i, chunk))
                started.add(i)
        except StopAsyncIteration:
            pass
        except BaseException:
            await merged.aclose()
            raise
        body = req.hand_over(_events(plan, states, buffered, merged, observe, req, clock))
        # The background task runs after the response ends, also after a client disconnect: the
        # Triton streams are cancelled even if the body iterator was parked at a ``yield``.
        return sse_response(body, background=BackgroundTask(_close_all, body, req))


def _deterministic(request: GenerationRequest) -> bool:
    """Whether running ``request`` again gives the same answer: greedy (temperature 0) or seeded."""
    sampling = request.sampling or {}
    return sampling.get("temperature") == 0 or sampling.get("seed") is not None


async def _close_all(body: AsyncGenerator[Any, None], req: AdmittedRequest) -> None:
    await body.aclose()
    await req.close()


def _chat_summary(plan: _Plan, states: list[ChoiceState]) -> dict[str, Any]:
    """A chat request's summary at the top level of its ``metrics`` (vLLM-Omni's names, where its
    client reads them): what it produced, from the stage's own token counts."""
    usage = usage_of(states, plan.prompt_of_choice)
    return {"final_output_type": "audio" if plan.audio_format else "text", "output_unit_type": "token",
            "num_tokens_in": usage.prompt_tokens, "num_tokens_out": usage.completion_tokens}


async def _events(plan: _Plan, states: list[ChoiceState], buffered: Sequence[Item],
                  merged: AsyncGenerator[Item, None], observe: Callable[[GenerationChunk | None], None],
                  req: AdmittedRequest, clock: RequestStages) -> AsyncGenerator[dict[str, str], None]:
    """The SSE events of a streamed answer: the buffered first responses, then the rest as they
    arrive; a failure after the status line is a ``data: {"error": ...}`` event. With
    ``return_stage_metrics``, a chunk without choices carrying ``metrics`` precedes the usage
    chunk."""
    framer = _StreamFramer(plan, states)
    try:
        for line in framer.opening():
            yield dict(data=line)
        try:
            async def items() -> AsyncGenerator[Item, None]:
                for item in buffered:
                    yield item
                async for item in merged:
                    yield item

            async for i, chunk in items():
                observe(chunk)
                clock.observe(i, chunk)
                for line in framer.on_item(i, chunk):
                    yield dict(data=line)
        except EngineError as exc:
            logger.warning("%s stream failed: %s", plan.endpoint, exc.message)
            req.outcome = "error"
            yield dict(data=ErrorResponse(error=engine_error_detail(exc)).model_dump_json())
            yield dict(data="[DONE]")
            return
        metrics_object = clock.metrics(_chat_summary(plan, states))
        if metrics_object is not None:
            yield dict(data=framer.metrics_chunk(metrics_object))
        for line in framer.closing():
            yield dict(data=line)
        yield dict(data="[DONE]")
    finally:
        await merged.aclose()


async def _collect(merged: AsyncGenerator[Item, None], states: list[ChoiceState],
                   observe: Callable[[GenerationChunk | None], None], clock: RequestStages) -> None:
    async for i, chunk in merged:
        observe(chunk)
        clock.observe(i, chunk)
        if chunk is not None:  # END
            states[i].add(chunk)


# --------------------------------------------------------------------------- framing
def _whole_response(plan: _Plan, states: list[ChoiceState]) -> dict[str, Any]:
    """The non-streamed body (runs in a thread: audio encoding is CPU work)."""
    usage = usage_of(states, plan.prompt_of_choice)
    if plan.endpoint == "completions":
        return Completion(
            id=plan.response_id, created=plan.created, model=plan.model_name, usage=usage,
            choices=[CompletionChoice(index=i, text=s.full_text, finish_reason=s.finish_reason)
                     for i, s in enumerate(states)],
        ).model_dump()
    choices = []
    for i, s in enumerate(states):
        audio = None
        if plan.audio_format is not None:
            rate = s.sample_rate or plan.target.sample_rate or 24000
            audio = ChatCompletionAudio(
                id=f"audio_{uuid.uuid4().hex}", data=encode_clip_b64(s.samples, rate, plan.audio_format),
                expires_at=plan.created, transcript=s.full_text)
        message = ChatCompletionMessage(content=s.full_text if plan.wants_text else None, audio=audio)
        choices.append(ChatCompletionChoice(index=i, message=message, finish_reason=s.finish_reason))
    return ChatCompletion(id=plan.response_id, created=plan.created, model=plan.model_name,
                          choices=choices, usage=usage).model_dump()


def chunk_json(chunk: ChatCompletionChunk | Completion) -> str:
    """One SSE ``data`` payload: ``None`` fields dropped except each choice's ``finish_reason``
    (OpenAI always sends it, ``null`` until the end) and ``usage`` when the client asked for it."""
    data = chunk.model_dump(exclude_none=True)
    for choice in data.get("choices", []):
        choice.setdefault("finish_reason", None)
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


class _StreamFramer:
    """Turns ``(choice index, GenerationChunk | END)`` items into SSE ``data`` payloads."""

    def __init__(self, plan: _Plan, states: list[ChoiceState]):
        self.plan = plan
        self.states = states
        self.audio_ids = [f"audio_{uuid.uuid4().hex}" for _ in states]
        self.encoders = [AudioStreamEncoder(plan.audio_format) if plan.audio_format else None
                         for _ in states]

    def _usage(self, index: int) -> Usage | None:
        """vLLM's continuous usage stats: choice ``index``'s counts so far (the prompt's tokens
        as the stage reported them, 0 before its first response)."""
        if not self.plan.continuous_usage:
            return None
        state = self.states[index]
        prompt = state.prompt_tokens or 0
        return Usage(prompt_tokens=prompt, completion_tokens=state.completion_tokens,
                     total_tokens=prompt + state.completion_tokens)

    def _chat(self, index: int, delta: ChoiceDelta, finish_reason: str | None = None,
              modality: Modality = "text") -> str:
        chunk = ChatCompletionChunk(
            id=self.plan.response_id, created=self.plan.created, model=self.plan.model_name,
            choices=[ChatCompletionChunkChoice(index=index, delta=delta, finish_reason=finish_reason)],
            usage=self._usage(index), modality=modality)
        return chunk_json(chunk)

    def _completion(self, index: int, text: str, finish_reason: str | None = None) -> str:
        chunk = Completion(
            id=self.plan.response_id, created=self.plan.created, model=self.plan.model_name,
            choices=[CompletionChoice(index=index, text=text, finish_reason=finish_reason)],
            usage=self._usage(index))
        return chunk_json(chunk)

    def opening(self) -> list[str]:
        if self.plan.endpoint != "chat":
            return []
        out = []
        for i in range(len(self.states)):
            audio = ChoiceDeltaAudio(id=self.audio_ids[i]) if self.plan.audio_format else None
            out.append(self._chat(i, ChoiceDelta(role="assistant", content="" if self.plan.wants_text else None,
                                                 audio=audio),
                                  modality="text" if self.plan.wants_text else "audio"))
        return out

    def on_item(self, i: int, chunk: GenerationChunk | None) -> list[str]:
        state = self.states[i]
        if chunk is END:
            if self.plan.endpoint == "completions":
                return [self._completion(i, "", state.finish_reason or "stop")]
            audio = None
            if self.plan.audio_format:
                audio = ChoiceDeltaAudio(id=self.audio_ids[i], expires_at=self.plan.created,
                                         transcript=state.full_text)
            return [self._chat(i, ChoiceDelta(audio=audio), state.finish_reason or "stop",
                               modality="audio" if audio is not None else "text")]
        state.add(chunk)
        if self.plan.endpoint == "completions":
            return [self._completion(i, chunk.text)] if chunk.text else []
        out = []
        if chunk.text and self.plan.wants_text:
            out.append(self._chat(i, ChoiceDelta(content=chunk.text)))
        encoder = self.encoders[i]
        if encoder is not None and chunk.audio is not None and chunk.audio.size:
            # one chunk per modality (vLLM-Omni routes chunks by their ``modality``)
            rate = chunk.sample_rate or self.plan.target.sample_rate or 24000
            audio = ChoiceDeltaAudio(id=self.audio_ids[i], data=encoder.encode(chunk.audio, rate))
            out.append(self._chat(i, ChoiceDelta(audio=audio), modality="audio"))
        return out

    def metrics_chunk(self, metrics: dict[str, Any]) -> str:
        """A chunk without choices carrying vLLM-Omni's ``metrics`` object."""
        cls = ChatCompletionChunk if self.plan.endpoint == "chat" else Completion
        chunk = cls(id=self.plan.response_id, created=self.plan.created, model=self.plan.model_name,
                    choices=[])
        data = chunk.model_dump(exclude_none=True)
        data["metrics"] = metrics
        return json.dumps(data, separators=(",", ":"))

    def closing(self) -> list[str]:
        if not self.plan.include_usage:
            return []
        usage = usage_of(self.states, self.plan.prompt_of_choice)
        cls = ChatCompletionChunk if self.plan.endpoint == "chat" else Completion
        chunk = cls(id=self.plan.response_id, created=self.plan.created, model=self.plan.model_name,
                    choices=[], usage=usage)
        return [json.dumps(chunk.model_dump(exclude_none=True), separators=(",", ":"))]

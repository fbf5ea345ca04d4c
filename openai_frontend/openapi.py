"""The frontend's OpenAPI document (``GET /openapi.json``): what every route really accepts and
answers, so a schema-driven fuzzer (schemathesis, ``tests/unit/test_openapi_fuzz.py``) and client
generators can rely on it.

FastAPI describes the routes whose body is a pydantic model. This module adds what it cannot see:

* the request bodies of the routes that read the request themselves: the multipart forms of
  ``/v1/images/edits``, ``/v1/videos``, ``/v1/videos/sync``, ``/v1/audio/voices``,
  ``/v1/audio/voice_consents`` (+ rename), ``/v1/audio/transcriptions``,
  ``/v1/audio/translations``, ``/v1/loras`` (and its JSON form, vLLM's ``/v1/load_lora_adapter``),
  and the multipart form of ``/v1/audio/speech``
  (``middleware.SpeechFormToJson``); file parts are ``format: binary`` strings;
* the success responses: JSON objects (videos, voices, consents, batches, chat), raw audio
  (``audio/wav``, ``audio/mpeg``...), MP4 (``video/mp4``), server-sent events
  (``text/event-stream``) and Prometheus text (``/metrics``);
* the error shape on every operation: ``4XX`` and ``5XX`` answer ``ErrorResponse``
  (``{"error": {"message", "type", "param", "code"}}``) and FastAPI's ``422`` is gone (this
  server answers 400).

The WebSockets ``/v1/audio/speech/stream`` and ``/v1/realtime`` are not OpenAPI operations;
their messages are in docs/voices.md ("Streaming speech over a WebSocket") and docs/realtime.md.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

from omni_triton.media.audio import SUPPORTED_FORMATS
from omni_triton.media.video import MIME_TYPE as VIDEO_MIME_TYPE

from .schemas import (
    ChatCompletion,
    Completion,
    ErrorResponse,
    ImageEditForm,
    SpeechRequest,
    TranscriptionForm,
    TranslationForm,
)
from .serving.videos import VideoCreateForm

REF = "#/components/schemas/{model}"
BINARY = {"type": "string", "format": "binary"}


# --------------------------------------------------------------------------- response objects
class Video(BaseModel):
    """OpenAI's ``video`` object (``video_jobs.JobRecord.to_openai``)."""

    id: str
    object: Literal["video"] = "video"
    model: str
    status: Literal["queued", "in_progress", "completed", "failed", "expired"]
    progress: int
    created_at: int
    completed_at: int | None = None
    expires_at: int | None = None
    size: str
    seconds: str
    prompt: str
    error: dict[str, Any] | None = None
    remixed_from_video_id: str | None = None


class VideoList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Video]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool


class Deleted(BaseModel):
    """``{"id", "object", "deleted": true}`` of a DELETE (videos, voices, consents)."""

    id: str
    object: str
    deleted: bool


class Voice(BaseModel):
    """OpenAI's ``audio.voice`` object plus ``prompt``, ``ref_text``, ``consent``, ``seconds``,
    ``error`` (``voice_store.StoredVoice.to_openai``)."""

    id: str
    object: Literal["audio.voice"] = "audio.voice"
    name: str
    type: Literal["audio_sample", "prompt"]
    created_at: int
    prompt: str | None = None
    ref_text: str | None = None
    consent: str | None = None
    seconds: float | None = None
    error: str | None = None


class VoiceConsent(BaseModel):
    id: str
    object: Literal["audio.voice_consent"] = "audio.voice_consent"
    name: str
    language: str
    created_at: int


class VoiceConsentList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VoiceConsent]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool


class SpeechBatchResult(BaseModel):
    """One item of a batch: ``status`` ``success`` (``audio_data`` base64, ``media_type``...) or
    ``error`` (``error``, ``code``, ``param``, ``status_code``)."""

    model_config = {"extra": "allow"}
    index: int
    status: Literal["success", "error"]


class SpeechBatchResponse(BaseModel):
    model_config = {"extra": "allow"}
    id: str
    object: Literal["audio.speech.batch"] = "audio.speech.batch"
    results: list[SpeechBatchResult]
    total: int
    succeeded: int
    failed: int


class Lora(BaseModel):
    """A registered LoRA adapter (``lora_store.StoredLora.to_openai``; docs/lora.md)."""

    object: Literal["lora"] = "lora"
    name: str
    id: str
    created_at: int
    bytes: int
    format: Literal["diffusers", "peft"]
    rank: int
    modules: int
    source: Literal["upload", "path"]
    path: str | None = None
    error: str | None = None


class LoraList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Lora]


class LoraDeleted(BaseModel):
    object: Literal["lora.deleted"] = "lora.deleted"
    name: str
    id: str
    deleted: bool


# --------------------------------------------------------------------------- request forms
class LoraUploadForm(BaseModel):
    """``POST /v1/loras`` (multipart): the adapter's ``name`` (+ the ``file``; optional
    ``adapter_config``: PEFT's JSON)."""

    name: str = Field(min_length=1, max_length=128)
    adapter_config: str | None = None


class LoraPathBody(BaseModel):
    """``POST /v1/loras`` (JSON): a server-side ``.safetensors`` or PEFT folder under ``--lora-allowed-dirs``."""

    name: str = Field(min_length=1, max_length=128)
    path: str = Field(min_length=1)


class VllmLoadLora(BaseModel):
    """vLLM's ``POST /v1/load_lora_adapter``."""

    lora_name: str
    lora_path: str


class VllmUnloadLora(BaseModel):
    """vLLM's ``POST /v1/unload_lora_adapter``."""

    lora_name: str

class VoiceCreateForm(BaseModel):
    """``POST /v1/audio/voices``: a clone (``audio_sample`` + ``consent`` [+ ``ref_text``]) or a
    designed voice (``type=prompt`` + ``prompt``); docs/voices.md."""

    name: str = Field(min_length=1, max_length=64)
    type: Literal["audio_sample", "prompt"] = "audio_sample"
    prompt: str | None = None
    consent: str | None = None
    ref_text: str | None = None


class VoiceConsentForm(BaseModel):
    """``POST /v1/audio/voice_consents``: a consent recording and who gave it."""

    name: str = Field(min_length=1)
    language: str = Field(min_length=1)


class VoiceConsentRename(BaseModel):
    name: str = Field(min_length=1)


def _inline(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    """``model``'s JSON schema with its nested models moved to ``components``."""
    schema = model.model_json_schema(ref_template=REF)
    components.update(schema.pop("$defs", {}))
    return schema


def _form(model: type[BaseModel], components: dict[str, Any], files: dict[str, dict[str, Any]] | None = None,
          required_files: tuple[str, ...] = ()) -> dict[str, Any]:
    """A ``multipart/form-data`` schema: ``model``'s fields (objects sent as their JSON text)
    plus ``files`` (``format: binary`` parts)."""
    schema = _inline(model, components)
    props = {}
    for name, prop in schema.get("properties", {}).items():
        props[name] = _form_field(prop, components)
    props.update(files or {})
    out = {"type": "object", "properties": props}
    required = list(schema.get("required", [])) + list(required_files)
    if required:
        out["required"] = required
    return out


def _form_field(prop: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    """A form field's schema: scalars as they are (sent as text), anything else as a string."""
    options = prop.get("anyOf", [prop])
    scalars = [o for o in options if o.get("type") in ("string", "integer", "number", "boolean")
               or "enum" in o or "const" in o]
    keep = {k: v for k, v in prop.items() if k in ("title", "description", "default")}
    if len(scalars) == 1:
        return {**keep, **scalars[0]}
    return {**keep, "type": "string"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _content(model: type[BaseModel]) -> dict[str, Any]:
    return _json({"$ref": REF.format(model=model.__name__)})


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document of ``app`` (FastAPI's, completed as the module docstring says)."""
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                      description="OpenAI-compatible API of Omni-Triton (docs/ in the repository). Not listed "
                                  "here, as OpenAPI has no WebSocket operations: WS /v1/audio/speech/stream "
                                  "(session.config, input.text, input.done, session.close in; audio.start, "
                                  "binary audio, audio.done, session.done, error out: docs/voices.md) and "
                                  "WS /v1/realtime?model=omni (OpenAI's Realtime API, GA and beta namings: "
                                  "docs/realtime.md).")
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    models = (ErrorResponse, Video, VideoList, Deleted, Voice, VoiceConsent, VoiceConsentList, SpeechBatchResponse,
              ChatCompletion, Completion, Lora, LoraList, LoraDeleted)
    for model in models:
        components[model.__name__] = _inline(model, components)
    # an image model's chat answer carries image_url parts as its content
    message = components.get("ChatCompletionMessage", {}).get("properties", {})
    if "content" in message:
        message["content"] = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}},
                                        {"type": "null"}]}
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)

    image_file = {**BINARY, "description": "an image (PNG, JPEG, WebP...)"}
    audio_file = {**BINARY, "description": "an audio file (WAV, FLAC, MP3, OGG, M4A, WebM...)"}
    video_form = _form(VideoCreateForm, components, {"input_reference": image_file})
    video_json = _inline(VideoCreateForm, components)
    video_json["properties"]["input_reference"] = {"anyOf": [
        {"type": "object", "properties": {"image_url": {"type": "string", "description": "data:image/...;base64,..."}}},
        {"type": "null"}]}
    speech_form = _form(SpeechRequest, components, {"ref_audio": {**BINARY, "description": "a reference clip"}})
    voice_form = _form(VoiceCreateForm, components, {"audio_sample": BINARY})
    bodies = {
        ("post", "/v1/images/edits"): {"multipart/form-data": {"schema": _form(
            ImageEditForm, components, {"image": image_file, "mask": image_file}, required_files=("image",))}},
        ("post", "/v1/videos"): {"multipart/form-data": {"schema": video_form}, **_json(video_json)},
        ("post", "/v1/videos/sync"): {"multipart/form-data": {"schema": video_form}, **_json(video_json)},
        ("post", "/v1/audio/voices"): {"multipart/form-data": {"schema": voice_form},
                                       **_json(_inline(VoiceCreateForm, components))},
        ("post", "/v1/audio/voice_consents"): {"multipart/form-data": {"schema": _form(
            VoiceConsentForm, components, {"recording": {**BINARY, "description": "the consent recording"}},
            required_files=("recording",))}},
        ("post", "/v1/audio/voice_consents/{consent_id}"): {
            "multipart/form-data": {"schema": _form(VoiceConsentRename, components)},
            **_json(_inline(VoiceConsentRename, components))},
        ("post", "/v1/audio/speech"): {"multipart/form-data": {"schema": speech_form}},
        ("post", "/v1/audio/transcriptions"): {"multipart/form-data": {"schema": _form(
            TranscriptionForm, components, {"file": audio_file}, required_files=("file",))}},
        ("post", "/v1/audio/translations"): {"multipart/form-data": {"schema": _form(
            TranslationForm, components, {"file": audio_file}, required_files=("file",))}},
        ("post", "/v1/loras"): {"multipart/form-data": {"schema": _form(
            LoraUploadForm, components, {"file": {**BINARY, "description": "a LoRA .safetensors"}},
            required_files=("file",))}, **_json(_inline(LoraPathBody, components))},
        ("post", "/v1/load_lora_adapter"): _json(_inline(VllmLoadLora, components)),
        ("post", "/v1/unload_lora_adapter"): _json(_inline(VllmUnloadLora, components)),
    }
    # server-sent events, described per event (how schemathesis reads them): ``data`` is the JSON
    # chunk (or ``[DONE]``), ``event`` its kind where the API names one (speech: ``speech.audio.delta``...)
    sse = {"text/event-stream": {"schema": {
        "type": "object", "required": ["data"],
        "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"},
                       "retry": {"type": "integer"}}}}}
    audio = {f.content_type: {"schema": {"type": "string", "format": "binary"}} for f in SUPPORTED_FORMATS.values()}
    mp4 = {VIDEO_MIME_TYPE: {"schema": {"type": "string", "format": "binary"}}}
    successes = {
        ("post", "/v1/audio/speech"): {**audio, **sse},
        ("post", "/v1/audio/generate"): {**audio, **sse},
        ("post", "/v1/audio/speech/batch"): _content(SpeechBatchResponse),
        ("post", "/v1/audio/voices"): _content(Voice),
        ("delete", "/v1/audio/voices/{voice_id}"): _content(Deleted),
        ("post", "/v1/audio/voice_consents"): _content(VoiceConsent),
        ("get", "/v1/audio/voice_consents"): _content(VoiceConsentList),
        ("get", "/v1/audio/voice_consents/{consent_id}"): _content(VoiceConsent),
        ("post", "/v1/audio/voice_consents/{consent_id}"): _content(VoiceConsent),
        ("delete", "/v1/audio/voice_consents/{consent_id}"): _content(Deleted),
        ("post", "/v1/videos"): _content(Video),
        ("get", "/v1/videos"): _content(VideoList),
        ("get", "/v1/videos/{video_id}"): _content(Video),
        ("delete", "/v1/videos/{video_id}"): _content(Deleted),
        ("post", "/v1/videos/sync"): mp4,
        ("get", "/v1/videos/{video_id}/content"): mp4,
        ("post", "/v1/chat/completions"): {**_content(ChatCompletion), **sse},
        ("post", "/v1/completions"): {**_content(Completion), **sse},
        ("get", "/metrics"): {"text/plain": {"schema": {"type": "string"}}},
        ("post", "/v1/loras"): _content(Lora),
        ("get", "/v1/loras"): _content(LoraList),
        ("get", "/v1/loras/{name}"): _content(Lora),
        ("delete", "/v1/loras/{name}"): _content(LoraDeleted),
        ("post", "/v1/load_lora_adapter"): {"text/plain": {"schema": {"type": "string"}}},
        ("post", "/v1/unload_lora_adapter"): {"text/plain": {"schema": {"type": "string"}}},
        # json / verbose_json objects, text / srt / vtt as text, stream=true as events
        ("post", "/v1/audio/transcriptions"): {**_json({"type": "object"}),
                                               "text/plain": {"schema": {"type": "string"}}, **sse},
        ("post", "/v1/audio/translations"): {**_json({"type": "object"}),
                                             "text/plain": {"schema": {"type": "string"}}},
    }
    error = {"description": "an error in the OpenAI shape", "content": _content(ErrorResponse)}
    for path, operations in doc.get("paths", {}).items():
        for method, op in operations.items():
            if (method, path) in bodies:
                op["requestBody"] = {"required": True, "content": {
                    **op.get("requestBody", {}).get("content", {}), **bodies[(method, path)]}}
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            if (method, path) in successes:
                responses["200"] = {"description": "OK", "content": successes[(method, path)]}
            if path == "/v1/videos/{video_id}/content":  # a Range request
                responses["206"] = {"description": "the requested byte range", "content": mp4}
            if path == "/health":  # unhealthy: the same body with 503
                responses["503"] = {"description": "Triton or a model is not ready", **{
                    "content": responses["200"]["content"]}}
            responses.setdefault("4XX", error)
            responses.setdefault("5XX", error)
    return doc


def install_openapi(app: FastAPI) -> None:
    """Serve :func:`build_openapi`'s document (built once, on the first request) as ``app``'s."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to replace the schema

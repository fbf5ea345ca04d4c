"""Pydantic models of the HTTP API (OpenAI shapes plus the few documented extensions)."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


# --------------------------------------------------------------------------- errors
class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorDetail


# --------------------------------------------------------------------------- models
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "omni-triton"
    #: extension: ``image`` (diffusion pipelines), ``audio`` (speech) or ``text``
    modality: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# --------------------------------------------------------------------------- speech
class VoiceRef(BaseModel):
    """OpenAI's custom-voice form ``{"id": "..."}``; the id must be one of the model's voices."""

    model_config = ConfigDict(extra="forbid")
    id: str


class SpeechRequest(BaseModel):
    """``POST /v1/audio/speech`` body.

    OpenAI fields: ``model``, ``input``, ``voice``, ``response_format``, ``speed``,
    ``instructions``, ``stream_format``. Extension (as in vLLM-Omni): ``stream``.
    Unknown fields are rejected (400, like OpenAI's "Unrecognized request argument").

    * ``model``: optional only when the frontend serves exactly one speech model.
    * ``voice``: optional; default is the model's ``default_voice``.
    * ``response_format``: default ``mp3`` (OpenAI's default) for a whole clip and ``pcm``
      when streaming (``stream=true`` or ``stream_format="sse"``).
    * ``stream_format``: ``audio`` (default) or ``sse``; ``sse`` always streams.
    """

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: str
    voice: str | VoiceRef | None = None
    response_format: str | None = None
    speed: float = Field(1.0, ge=0.25, le=4.0)
    instructions: str | None = None
    stream: bool = False
    stream_format: Literal["audio", "sse"] = "audio"

    @property
    def voice_id(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice

    @property
    def streaming(self) -> bool:
        return self.stream or self.stream_format == "sse"


class SpeechUsage(BaseModel):
    """Usage of one speech request. The frontend has no tokenizer: ``input_tokens`` counts the
    input's characters; ``output_tokens`` is 0 (codec frames are internal to Triton). The
    ``audio_*`` fields are extensions."""

    input_tokens: int
    output_tokens: int = 0
    total_tokens: int
    audio_samples: int = 0
    audio_seconds: float = 0.0
    sample_rate: int | None = None


class SpeechAudioDelta(BaseModel):
    type: Literal["speech.audio.delta"] = "speech.audio.delta"
    audio: str  # base64 of the next bytes of the response_format byte stream


class SpeechAudioDone(BaseModel):
    type: Literal["speech.audio.done"] = "speech.audio.done"
    usage: SpeechUsage


class SpeechAudioError(BaseModel):
    """Sent instead of ``speech.audio.done`` when synthesis fails mid-stream (vLLM-Omni)."""

    type: Literal["speech.audio.error"] = "speech.audio.error"
    error: ErrorDetail


# --------------------------------------------------------------------------- voices / health
class ModelVoices(BaseModel):
    model: str
    voices: list[str]
    default_voice: str | None = None
    sample_rate: int | None = None
    supports_speed: bool = False
    max_input_chars: int | None = None


class VoiceList(BaseModel):
    """``GET /v1/audio/voices``: ``voices`` is the union over models (vLLM-Omni's shape),
    ``data`` the per-model detail."""

    object: Literal["list"] = "list"
    voices: list[str]
    data: list[ModelVoices]


class HealthStatus(BaseModel):
    status: Literal["ok", "unhealthy"]
    triton_live: bool
    models: dict[str, str]  # name -> Triton state
    not_ready: list[str] = []
    message: str | None = None


# --------------------------------------------------------------------------- images
class ImageGenerationRequest(BaseModel):
    """``POST /v1/images/generations`` body.

    OpenAI fields: ``prompt``, ``model``, ``n``, ``size``, ``response_format`` (only
    ``b64_json``), ``output_format``, ``output_compression``; accepted and ignored when at their
    no-op values: ``quality``, ``style``, ``background``, ``moderation``, ``user``.
    Extensions (vLLM-Omni's names): ``seed``, ``negative_prompt``, ``num_inference_steps``,
    ``guidance_scale``, ``true_cfg_scale``. Unknown fields are rejected (400).
    """

    model_config = ConfigDict(extra="forbid")

    prompt: str
    model: str | None = None
    n: int = 1
    size: str | None = None
    response_format: str | None = None
    output_format: str | None = None
    output_compression: int | None = Field(None, ge=0, le=100)
    seed: int | None = Field(None, ge=0, le=2**62)
    negative_prompt: str | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = Field(None, ge=0)
    true_cfg_scale: float | None = Field(None, ge=0)
    stream: bool = False
    quality: str | None = None
    style: str | None = None
    background: str | None = None
    moderation: str | None = None
    user: str | None = None


class ImageData(BaseModel):
    b64_json: str
    revised_prompt: str | None = None
    #: extension: the seed this image was generated with
    seed: int | None = None


class ImageUsage(BaseModel):
    """OpenAI's image usage (``input_tokens`` = prompt characters: the frontend has no
    tokenizer; ``output_tokens`` = 0), plus the denoising extensions: steps per image and the
    summed wall time (seconds) of the denoiser calls that made the images."""

    input_tokens: int
    output_tokens: int = 0
    total_tokens: int
    num_inference_steps: int
    denoise_seconds: float


class ImagesResponse(BaseModel):
    created: int
    data: list[ImageData]
    output_format: str
    size: str
    usage: ImageUsage

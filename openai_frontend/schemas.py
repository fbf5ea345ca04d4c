"""Pydantic models of the HTTP API (OpenAI shapes plus the few documented extensions)."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

#: Config of every request body model: unknown fields are kept aside (``model_extra``) so the
#: serving layer can name them: ignored with an ``X-Ignored-Fields`` header by default (vLLM's
#: behaviour), a 400 "Unrecognized request argument" with ``--strict-params`` (OpenAI's); see
#: :func:`ignored_fields`. Strict types, as OpenAI's API is (``"n": "2"`` and
#: ``"max_tokens": true`` are 400s, not 2 and 1); no NaN/Infinity in numbers (Python's JSON
#: parser accepts the literals ``NaN`` and ``Infinity``).
REQUEST_CONFIG = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


def ignored_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """Dotted paths of the request fields no schema declares, in ``model`` and every model nested
    in it (lists by index): e.g. ``["foo", "messages.0.tool_calls", "stream_options.bar"]``.

    ``model`` is a validated request model built with :data:`REQUEST_CONFIG`; its unknown keys
    are in ``model_extra``. Empty when every field is known."""
    out = [f"{prefix}{name}" for name in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name, None)
        items = enumerate(value) if isinstance(value, list) else [(None, value)]
        for index, item in items:
            if isinstance(item, BaseModel):
                where = f"{prefix}{name}." if index is None else f"{prefix}{name}.{index}."
                out.extend(ignored_fields(item, where))
    return out

#: The largest value of any integer request field that is not a seed (int32: what the engines'
#: tensors hold; beyond it vLLM failed with an empty 500).
INT32_MAX = 2**31 - 1

#: The ASR contract's ``PROMPT`` cap (characters): a transcription ``prompt``'s.
from omni_triton.contracts.asr import MAX_PROMPT_CHARS as _ASR_MAX_PROMPT_CHARS  # noqa: E402

#: Upper bound of ``true_cfg_scale`` / ``guidance_scale``: the stages apply the same contract bound
#: (1e308 or Infinity made an all-black image; 4.0 is the default).
from omni_triton.contracts.image import MAX_GUIDANCE_SCALE  # noqa: E402


def _text(value: str) -> str:
    """Reject what cannot travel as UTF-8 to Triton: lone surrogates (``"\\ud800"`` in the JSON)
    and NUL characters."""
    if "\x00" in value:
        raise PydanticCustomError("invalid_characters", "must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PydanticCustomError(
            "invalid_characters", "is not valid Unicode text ({reason} at character {start})",
            {"reason": exc.reason, "start": exc.start}) from None
    return value


def is_text(value: str) -> bool:
    """True when ``value`` is what ``_text`` accepts: UTF-8-encodable (no lone surrogate) and
    without NUL. For client strings checked outside a schema (form fields, ids)."""
    try:
        _text(value)
    except PydanticCustomError:
        return False
    return True


#: A request string: valid Unicode without NUL (see ``_text``).
Text = Annotated[str, AfterValidator(_text)]

# Length caps (characters) of the free-text request fields. pydantic checks them while it reads
# the body, before any validator or serving code looks at the text; over a cap is a 400 naming
# the field ("Invalid value for 'instructions': String should have at most 4096 characters").
# docs/openai_frontend.md "Limits" lists them with the caps that depend on the model or settings
# (speech ``input``: the model's ``max_input_chars``; chat/completions/tokenize text:
# ``--max-prompt-chars``; image ``prompt``: ``serving.images.MAX_PROMPT_CHARS``).

#: names and enum-like strings: ``model``, ``voice``, ``response_format``, ``language``, ``size``...
MAX_NAME_FIELD_CHARS = 256
#: ``instructions`` of a speech request (a voice/style description for the TTS stage)
MAX_INSTRUCTIONS_CHARS = 4096
#: ``ref_text``: the transcript of a ``ref_audio`` clip (at most 60 s of speech)
MAX_REF_TEXT_CHARS = 4096
#: ``negative_prompt`` of image and chat-on-image requests (as long as an image ``prompt``)
MAX_NEGATIVE_PROMPT_CHARS = 32000
#: ``prompt`` of a designed voice (``POST /v1/audio/voices`` with ``type=prompt``)
MAX_VOICE_PROMPT_CHARS = 4096  # the default of VoiceSettings.max_prompt_chars (--voice-max-prompt-chars)
#: ``stop`` sequences of chat/completions: each, and how many
MAX_STOP_CHARS = 4096
MAX_STOP_SEQUENCES = 64
#: token ids of one ``POST /detokenize``
MAX_DETOKENIZE_TOKENS = 1 << 16  # also the JSON value cap's default (--max-json-values)


def max_chars(limit: int) -> BeforeValidator:
    """The length check of a :data:`Text` of at most ``limit`` characters, run before anything
    else looks at the text (a ``BeforeValidator``: pydantic's own ``max_length`` would first
    reject a lone surrogate with a less helpful error than ``_text``'s). Use as
    ``Annotated[str, max_chars(limit), AfterValidator(_text)]``."""

    def check_length(value: Any) -> Any:
        if isinstance(value, str) and len(value) > limit:
            raise PydanticCustomError("string_too_long", "String should have at most {max_length} characters",
                                      {"max_length": limit})
        return value

    return BeforeValidator(check_length)


#: a :data:`Text` of at most :data:`MAX_NAME_FIELD_CHARS`
Name = Annotated[str, max_chars(MAX_NAME_FIELD_CHARS), AfterValidator(_text)]
#: one ``stop`` sequence
Stop = Annotated[str, max_chars(MAX_STOP_CHARS), AfterValidator(_text)]
#: speech ``instructions`` (style, or the voice description of ``voice_design``)
Instructions = Annotated[str, max_chars(MAX_INSTRUCTIONS_CHARS), AfterValidator(_text)]
#: the transcript of a voice-clone reference clip
RefText = Annotated[str, max_chars(MAX_REF_TEXT_CHARS), AfterValidator(_text)]
#: an image or video ``negative_prompt``
NegativePrompt = Annotated[str, max_chars(MAX_NEGATIVE_PROMPT_CHARS), AfterValidator(_text)]


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
    """OpenAI model object plus two extensions: ``modalities`` (what the model answers with:
    ``["text"]``, ``["text", "audio"]``, ``["audio"]`` for speech models; absent for internal
    stages) and ``max_model_len`` (context in tokens, as vLLM's server reports it)."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "omni-triton"
    #: extension: ``image`` (diffusion pipelines), ``audio`` (speech) or ``text``
    modality: str | None = None
    modalities: list[str] | None = None
    max_model_len: int | None = None
    #: extension: ``loaded``, ``loading``, ``unloaded`` (an on-demand model not loaded yet: its
    #: first request loads it) or ``failed`` (with ``reason``); docs/running.md "On-demand models"
    state: Literal["loaded", "loading", "unloaded", "failed"] | None = None
    reason: str | None = None
    #: extension: the API routes that take this model as ``model`` (``/v1/audio/speech``,
    #: ``/v1/chat/completions``, ``/v1/images/edits``, ``/v1/realtime``...; the playground fills
    #: each tab's model list from it); absent for internal stages
    endpoints: list[str] | None = None
    #: extension, image edit models: how many input images one edit takes, and whether a
    #: ``mask`` is taken (and required) for masked inpainting
    max_input_images: int | None = None
    supports_mask: bool | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# --------------------------------------------------------------------------- speech
#: ``stream_pacing`` of a streamed speech answer (docs/scheduling.md "Pacing"): ``none`` (the
#: default) streams the audio as fast as the stages make it, in deadline order among the open
#: requests; ``realtime`` asks the stages to compute it at most their ``max_lead_ms`` ahead of
#: its listener (Triton's optional ``PACED`` input, sent only then). Ignored when nothing streams.
StreamPacing = Literal["none", "realtime"]


class VoiceRef(BaseModel):
    """OpenAI's custom-voice form ``{"id": "..."}``; the id must be one of the model's voices."""

    model_config = REQUEST_CONFIG
    id: Name


class SpeechRequest(BaseModel):
    """``POST /v1/audio/speech`` body.

    OpenAI fields: ``model``, ``input``, ``voice``, ``response_format``, ``speed``,
    ``instructions``, ``stream_format``. Extension (as in vLLM-Omni): ``stream``.
    Unknown fields are ignored and named in ``X-Ignored-Fields`` (vLLM); a 400 with
    ``--strict-params`` (OpenAI's "Unrecognized request argument").

    * ``model``: optional only when the frontend serves exactly one speech model.
    * ``voice``: optional; default is the model's ``default_voice``.
    * ``response_format``: default ``mp3`` (OpenAI's default) for a whole clip and ``pcm``
      when streaming (``stream=true`` or ``stream_format="sse"``).
    * ``stream_format``: ``audio`` (default) or ``sse``; ``sse`` always streams.
    * ``stream_pacing`` (extension): ``none`` (default: as fast as generated) or ``realtime``
      (computed just ahead of playback: :data:`StreamPacing`); accepted and ignored for a whole
      clip. The WebSocket session's ``session.config`` takes it too (with ``stream_audio``).
    """

    model_config = REQUEST_CONFIG

    model: Name | None = None
    input: Text
    voice: Name | VoiceRef | None = None
    response_format: Name | None = None
    speed: float = Field(1.0, ge=0.25, le=4.0)
    instructions: Instructions | None = None
    stream: bool = False
    stream_format: Literal["audio", "sse"] = "audio"
    stream_pacing: StreamPacing = "none"
    #: vLLM's sampling extension (its benchmark's random dataset always sends it). Accepted and
    #: without effect on the served speech models: none lets a client override its end decision
    #: (Piper speaks its whole input sentence by sentence; the ``tts`` pipeline's talker stops at
    #: its end-of-audio frame or its frame cap). docs/vllm_omni_compat.md.
    ignore_eos: bool | None = None
    #: vLLM-Omni's field: the output sample rate in Hz (omitted: the model's own). The audio is
    #: resampled with soxr; ``omni_triton.media.audio.RESAMPLE_RATES`` lists the rates offered.
    sample_rate: int | None = Field(None, gt=0, le=384000)
    #: vLLM-Omni's Qwen3-TTS extensions (docs/voices.md): ``CustomVoice`` | ``VoiceDesign`` |
    #: ``Base`` (or the contract's ``custom_voice`` | ``voice_design`` | ``base``).
    task_type: Name | None = None
    language: Name | None = None
    #: Reference clip for per-request cloning: a ``data:audio/...;base64,`` URL (or bare base64).
    ref_audio: Text | None = None
    ref_text: RefText | None = None
    x_vector_only_mode: bool | None = None

    @property
    def voice_id(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice

    @property
    def streaming(self) -> bool:
        return self.stream or self.stream_format == "sse"

    @property
    def realtime(self) -> bool:
        """Whether a stream of this request is paced to its listener (``stream_pacing``
        ``realtime``); the caller decides whether it streams at all."""
        return self.stream_pacing == "realtime"


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
    #: OpenAI voice name -> the voice it speaks with on this model (docs/voices.md)
    openai_voices: dict[str, str] = Field(default_factory=dict)
    #: ids of the stored voices this model can speak with (clones, designed voices)
    custom_voices: list[str] = Field(default_factory=list)


class VoiceList(BaseModel):
    """``GET /v1/audio/voices``: ``voices`` is the union over models (vLLM-Omni's shape),
    ``data`` the per-model detail."""

    object: Literal["list"] = "list"
    voices: list[str]
    data: list[ModelVoices]
    #: every stored voice (``audio.voice`` objects; a corrupt one carries ``error``)
    uploaded_voices: list[dict[str, Any]] = Field(default_factory=list)
    #: why the voice store could not be opened (then no uploaded voices are listed), else null
    voice_store_error: str | None = None


class SpeechBatchItem(BaseModel):
    """One item of ``POST /v1/audio/speech/batch``: ``input`` plus any ``SpeechRequest`` field
    overriding the batch's default. Validated loosely here; each item is then validated as a
    ``SpeechRequest`` on its own, so a bad item fails alone."""

    model_config = ConfigDict(extra="allow")
    input: object = None


class SpeechBatchRequest(BaseModel):
    """``POST /v1/audio/speech/batch`` (vLLM-Omni): 1-32 ``items``; the other fields are defaults
    for every item (``response_format`` default ``wav``)."""

    model_config = REQUEST_CONFIG
    items: list[SpeechBatchItem] = Field(min_length=1, max_length=32)
    model: Name | None = None
    voice: Name | VoiceRef | None = None
    response_format: Name | None = None
    speed: float | None = None
    instructions: Instructions | None = None
    task_type: Name | None = None
    language: Name | None = None
    ref_audio: Text | None = None
    ref_text: RefText | None = None
    x_vector_only_mode: bool | None = None
    sample_rate: int | None = None


class HealthStatus(BaseModel):
    """``GET /health``. Callers not allowed the detail (see ``routers.observability.shows_detail``)
    get ``status`` alone; the other fields are then absent."""

    status: Literal["ok", "unhealthy"]
    triton_live: bool | None = None
    models: dict[str, str] | None = None  # name -> Triton state
    not_ready: list[str] = []
    message: str | None = None
    #: ``omni-triton serve``'s supervision record when the frontend runs under it: ``state``
    #: (starting/ready/restarting), ``restarts``, ``last_crash`` (``at``, ``exit_code``,
    #: ``reason``), ``stub_reloads`` (model -> count), ``last_stub_death``; ``None`` otherwise.
    serve: dict[str, Any] | None = None
    #: the shared database (``--database-url``): ``{"ok": bool, "error": str | None}``, the last
    #: database call's outcome; ``None`` without one (SQLite files). Informational: the status
    #: stays 200 while it is down (speech and the other model endpoints do not need it).
    database: dict[str, Any] | None = None


# --------------------------------------------------------------------------- images
class ImageGenerationRequest(BaseModel):
    """``POST /v1/images/generations`` body.

    OpenAI fields: ``prompt``, ``model``, ``n``, ``size``, ``response_format`` (only
    ``b64_json``), ``output_format``, ``output_compression``; accepted and ignored when at their
    no-op values: ``quality``, ``style``, ``background``, ``moderation``, ``user``.
    Extensions (vLLM-Omni's names): ``seed``, ``negative_prompt``, ``num_inference_steps``,
    ``guidance_scale``, ``true_cfg_scale``, ``lora`` (``{"name", "scale"}``: a registered adapter,
    docs/lora.md; checked by ``serving.loras.parse_selection``). Unknown fields: ignored
    (``X-Ignored-Fields``), 400 with ``--strict-params``.
    """

    model_config = REQUEST_CONFIG

    prompt: Text
    model: Name | None = None
    n: int = 1  # checked against the model's max_images (400 invalid_n)
    size: Text | None = None  # parse_size: invalid_size for anything but WxH (5 digits each)
    response_format: Name | None = None
    output_format: Name | None = None
    output_compression: int | None = Field(default=None, ge=0, le=100)
    seed: int | None = Field(None, ge=0, le=2**62)
    negative_prompt: NegativePrompt | None = None
    num_inference_steps: int | None = None  # checked against the model's max_steps
    guidance_scale: float | None = Field(None, ge=0, le=MAX_GUIDANCE_SCALE)
    true_cfg_scale: float | None = Field(None, ge=0, le=MAX_GUIDANCE_SCALE)
    stream: bool = False
    #: vLLM-Omni's extension: the response carries ``metrics`` / ``stage_durations``.
    return_stage_metrics: bool = False
    #: vLLM-Omni's per-request LoRA: ``{"name": registered name, "scale": weight}`` (docs/lora.md)
    lora: dict[str, Any] | None = None
    quality: Name | None = None
    style: Name | None = None
    background: Name | None = None
    moderation: Name | None = None
    user: Name | None = None


class ImageEditForm(ImageGenerationRequest):
    """The non-file fields of ``POST /v1/images/edits`` (validated like the JSON body of
    generations; ``input_fidelity`` is accepted and ignored)."""

    #: multipart form fields are strings: numbers and booleans are parsed from them (lax), but
    #: NaN/Infinity and out-of-range values are still rejected
    model_config = ConfigDict(extra="allow", strict=False, allow_inf_nan=False)

    input_fidelity: Name | None = None
    #: a form field holds ``lora`` as a JSON string; the SDK's ``lora[name]`` / ``lora[scale]``
    #: fields are gathered into an object first (``serving.images.edit_image``)
    lora: dict[str, Any] | str | None = None  # type: ignore[assignment]
    #: extension (diffusers' inpainting ``strength``, mask requests only): how far the image is
    #: noised, in (0, 1]; default: the model's ``default_strength`` (its pipeline's default)
    strength: float | None = Field(None, gt=0, le=1)


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
# --------------------------------------------------------------------------- transcriptions
#: ``prompt`` of a transcription / translation (OpenAI: "previous text or spelling hints"): the ASR
#: contract's own cap (``omni_triton.contracts.asr.MAX_PROMPT_CHARS``; Whisper keeps its last 224 tokens)
MAX_TRANSCRIPTION_PROMPT_CHARS = _ASR_MAX_PROMPT_CHARS
#: A transcription ``prompt``
TranscriptionPrompt = Annotated[str, max_chars(MAX_TRANSCRIPTION_PROMPT_CHARS), AfterValidator(_text)]
#: multipart form fields are strings: numbers and booleans are parsed from them (lax), but NaN /
#: Infinity are still rejected; unknown fields are kept (``X-Ignored-Fields``, or a 400 with
#: ``--strict-params``)
FORM_CONFIG = ConfigDict(extra="allow", strict=False, allow_inf_nan=False, populate_by_name=True)


class TranslationForm(BaseModel):
    """The non-file fields of ``POST /v1/audio/translations`` (OpenAI's, docs/transcription.md):
    the ``file`` part comes beside them."""

    model_config = FORM_CONFIG

    model: Name
    prompt: TranscriptionPrompt | None = None
    #: ``json`` (default), ``text``, ``srt``, ``verbose_json``, ``vtt``: checked by the serving
    #: layer (400 ``unsupported_format`` naming them)
    response_format: Name | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)


class TranscriptionForm(TranslationForm):
    """The non-file fields of ``POST /v1/audio/transcriptions`` (OpenAI's; docs/transcription.md).
    ``timestamp_granularities[]`` is how the OpenAI SDK sends the list (one part per value)."""

    language: Name | None = None
    timestamp_granularities: list[Name] | None = Field(default=None, alias="timestamp_granularities[]")
    stream: bool | None = None


# --------------------------------------------------------------------------- chat / completions
#: Roles a chat message may have. ``developer`` (OpenAI's newer name for ``system``) is sent to
#: the stage as ``system``; tool / function messages are not supported (no tool calling).
ChatRole = Literal["system", "developer", "user", "assistant"]


class TextPart(BaseModel):
    """A ``{"type": "text", "text": ...}`` content part."""

    model_config = REQUEST_CONFIG
    type: Literal["text"]
    text: Text


class InputAudio(BaseModel):
    """``input_audio`` of a content part (OpenAI): base64 ``data`` of a ``format`` file."""

    model_config = REQUEST_CONFIG
    data: str
    format: Literal["wav", "mp3", "flac", "ogg"]


class InputAudioPart(BaseModel):
    """``{"type": "input_audio", "input_audio": {"data", "format"}}`` (models that take audio)."""

    model_config = REQUEST_CONFIG
    type: Literal["input_audio"]
    input_audio: InputAudio


class MediaURL(BaseModel):
    """``image_url`` / ``video_url`` of a content part: a ``data:`` URL, or http(s) where the
    frontend allows it (``--media-url-allowed-hosts``); OpenAI's ``detail`` is accepted and unused."""

    model_config = REQUEST_CONFIG
    url: Text
    detail: Literal["auto", "low", "high"] | None = None


class ImageURLPart(BaseModel):
    """``{"type": "image_url", "image_url": {"url"}}`` (models that take images)."""

    model_config = REQUEST_CONFIG
    type: Literal["image_url"]
    image_url: MediaURL


class VideoURLPart(BaseModel):
    """``{"type": "video_url", "video_url": {"url"}}`` (vLLM's extension; models that take video)."""

    model_config = REQUEST_CONFIG
    type: Literal["video_url"]
    video_url: MediaURL


#: One content part; which media types a model takes is its config parameter ``input_modalities``.
ContentPart = Annotated[TextPart | InputAudioPart | ImageURLPart | VideoURLPart, Field(discriminator="type")]


class ChatMessage(BaseModel):
    """One input message: ``role`` and ``content`` (a string or a list of content parts: text,
    and ``input_audio`` / ``image_url`` / ``video_url`` for models whose ``input_modalities``
    include them; others answer 400 naming the part type).

    ``name`` is accepted and passed on. Tool calls and unknown part types are rejected (400)
    rather than silently dropped.
    """

    model_config = REQUEST_CONFIG
    role: ChatRole
    content: Text | list[ContentPart] | None = None
    name: Name | None = None


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` (OpenAI: a last chunk with the usage) and
    ``continuous_usage_stats`` (vLLM's extension: with ``include_usage``, every chunk also carries
    the usage so far of its choice)."""

    model_config = REQUEST_CONFIG
    include_usage: bool = False
    continuous_usage_stats: bool = False


class AudioParam(BaseModel):
    """``audio`` of a chat request (OpenAI ``ChatCompletionAudioParam``): output ``format`` and
    ``voice`` (a voice id of the model, or ``{"id": ...}``)."""

    model_config = REQUEST_CONFIG
    format: Literal["wav", "mp3", "flac", "opus", "pcm16", "aac"] = "wav"
    voice: Name | VoiceRef | None = None

    @property
    def voice_id(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice


class _SamplingFields(BaseModel):
    """Sampling fields shared by chat and completions (OpenAI names; ranges as OpenAI's API
    reference states them). ``top_k``, ``min_tokens`` and ``ignore_eos`` are vLLM extensions."""

    model_config = REQUEST_CONFIG

    model: Name
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    stop: Stop | Annotated[list[Stop], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 16)  # 64-bit in the engines; choice i: seed + i
    n: int = Field(1, ge=1, le=16)
    user: Name | None = None
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX)
    min_tokens: int | None = Field(None, ge=0, le=INT32_MAX)
    ignore_eos: bool | None = None

    @property
    def stop_list(self) -> list[Text] | None:
        if self.stop is None:
            return None
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Usage on every streamed chunk (vLLM: ``continuous_usage_stats`` with ``include_usage``)."""
        options = self.stream_options
        return options is not None and bool(options.include_usage and options.continuous_usage_stats)


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions`` body (OpenAI fields the served models can honour).

    ``max_completion_tokens`` (OpenAI's current name) wins over the deprecated ``max_tokens``.
    ``modalities``: output modalities, ``["text"]``, ``["text", "audio"]`` or ``["audio"]``
    (audio plus its transcript, no ``content``); omitted: all of the model's output modalities
    (vLLM-Omni's default: ``omni`` and ``llm_tts`` speak, ``llm`` writes;
    ``serving.chat.output_modalities``). ``audio``: output format and
    voice when audio is asked for (default ``wav`` and the model's default voice).
    """

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    modalities: list[Literal["text", "audio", "image"]] | None = Field(None, min_length=1)
    audio: AudioParam | None = None
    logprobs: Literal[False] | None = None
    frequency_penalty: Literal[0, 0.0] | None = None  # type: ignore[valid-type]  # pydantic takes the float 0.0
    presence_penalty: Literal[0, 0.0] | None = None  # type: ignore[valid-type]  # pydantic takes the float 0.0
    #: Diffusion models only (vLLM-Omni's chat on image models; same meaning as in
    #: ``ImageGenerationRequest``): the last user message is the prompt.
    size: Text | None = None  # parse_size: invalid_size for anything but WxH (5 digits each)
    negative_prompt: NegativePrompt | None = None
    num_inference_steps: int | None = None  # checked against the model's max_steps
    guidance_scale: float | None = Field(None, ge=0, le=MAX_GUIDANCE_SCALE)
    true_cfg_scale: float | None = Field(None, ge=0, le=MAX_GUIDANCE_SCALE)
    output_format: Name | None = None
    #: Text-to-audio models only (vLLM-Omni's diffusion chat form; diffusers' ``StableAudioPipeline``
    #: names): the clip is ``[audio_start_in_s, audio_end_in_s)`` seconds, checked as in
    #: ``/v1/audio/generate``. Also taken from ``extra_args`` (vLLM-Omni's pass-through dict).
    audio_start_in_s: float | None = Field(None, ge=0, allow_inf_nan=False)
    audio_end_in_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    extra_args: dict[str, Any] | None = None
    #: vLLM-Omni's extension: the response carries ``metrics`` (per-stage timings from Triton).
    return_stage_metrics: bool = False
    #: Extension (docs/scheduling.md "Pacing"): a streamed answer with audio is sent as fast as
    #: it is generated (``none``, default) or computed just ahead of playback (``realtime``);
    #: ignored without ``stream`` or without audio output.
    stream_pacing: StreamPacing = "none"

    @property
    def wants_audio(self) -> bool:
        return bool(self.modalities and "audio" in self.modalities)

    @property
    def realtime(self) -> bool:
        """``stream_pacing`` is ``realtime`` (applies to a streamed answer with audio only)."""
        return self.stream_pacing == "realtime"

    @property
    def wants_text(self) -> bool:
        return self.modalities is None or "text" in self.modalities

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions`` body: ``prompt`` is a string or a list of strings (each gets
    ``n`` choices, indexed ``prompt_index * n + i`` as OpenAI does). ``max_tokens`` defaults to
    16, OpenAI's default for this API."""

    prompt: Text | list[Text]
    max_tokens: int | None = Field(16, ge=1, le=INT32_MAX)
    echo: Literal[False] | None = None
    logprobs: None = None
    suffix: None = None

    @property
    def prompts(self) -> list[Text]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


class Usage(BaseModel):
    """Token counts reported by the stage: the prompt counted once, completions summed over
    choices (as OpenAI and vLLM count them for ``n`` > 1)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletionAudio(BaseModel):
    """``message.audio`` (OpenAI ``ChatCompletionAudio``): base64 of the whole clip in the
    requested format, and the text it speaks."""

    id: str
    data: str
    expires_at: int
    transcript: str


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: None = None
    audio: ChatCompletionAudio | None = None


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatCompletionMessage
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ChoiceDeltaAudio(BaseModel):
    """A streamed audio update (OpenAI ``ChoiceDeltaAudio``): ``id`` on the first one,
    ``data`` = base64 of the next bytes of the audio stream, and a last update with
    ``expires_at`` and the whole ``transcript``."""

    id: str | None = None
    data: str | None = None
    expires_at: int | None = None
    transcript: str | None = None


class ChoiceDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    audio: ChoiceDeltaAudio | None = None


class ChatCompletionChunkChoice(BaseModel):
    index: int
    delta: ChoiceDelta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    """A streamed chat chunk. ``modality`` (vLLM-Omni's extension, on every chunk): what the
    chunk carries, ``text`` (content, role, finish), ``audio`` (``delta.audio``) or ``image``;
    ``metrics``: the stage metrics (``return_stage_metrics``), on the last chunk."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionChunkChoice]
    usage: Usage | None = None
    modality: Literal["text", "audio", "image"] | None = None
    metrics: dict[str, Any] | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: None = None


class Completion(BaseModel):
    """``text_completion`` object; a streamed chunk has the same shape with the text delta."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


# --------------------------------------------------------------------------- tokenize
class TokenizeRequest(BaseModel):
    """``POST /tokenize`` (vLLM's ``TokenizeCompletionRequest`` / ``TokenizeChatRequest`` in one):
    exactly one of ``prompt`` and ``messages``. ``add_special_tokens`` defaults to true for a
    prompt and false for messages (the chat template holds them), as vLLM's do."""

    model_config = REQUEST_CONFIG
    model: Name
    prompt: Text | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None
    return_token_strs: bool = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int | None = None
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``: token ids of the model's vocabulary."""

    model_config = REQUEST_CONFIG
    model: Name
    tokens: list[Annotated[int, Field(ge=0, le=INT32_MAX)]] = Field(max_length=MAX_DETOKENIZE_TOKENS)


class DetokenizeResponse(BaseModel):
    prompt: str


class AudioGenerateRequest(BaseModel):
    """``POST /v1/audio/generate`` body (vLLM-Omni's Audio Generate API, docs/audio_generation.md).

    vLLM-Omni fields: ``input`` (required), ``model``, ``response_format`` (``wav`` default,
    ``flac``, ``mp3``, ``pcm``, ``opus``), ``audio_length`` (seconds; default: the model's
    longest clip, as ``StableAudioPipeline``'s ``audio_end_in_s`` default), ``audio_start``
    (seconds, default 0), ``negative_prompt``, ``guidance_scale``, ``num_inference_steps``,
    ``seed``, ``speed`` (1.0 only: no time stretching here), ``stream_format``. The diffusion
    names ``audio_start_in_s`` / ``audio_end_in_s`` (vLLM-Omni's ``extra`` of the diffusion
    chat form, diffusers' own) are accepted too. Extension: ``stream=true`` (or
    ``stream_format="sse"``) answers Server-Sent Events: ``audio.generate.progress`` per
    denoising step, then ``audio.generate.done`` with the encoded clip in base64.
    """

    model_config = REQUEST_CONFIG

    input: Text
    model: Name | None = None
    response_format: Name = "wav"
    audio_length: float | None = Field(None, gt=0, allow_inf_nan=False)
    audio_start: float | None = Field(None, ge=0, allow_inf_nan=False)
    audio_start_in_s: float | None = Field(None, ge=0, allow_inf_nan=False)
    audio_end_in_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    negative_prompt: Text | None = None
    guidance_scale: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    num_inference_steps: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    speed: float | None = Field(None, ge=0.25, le=4.0)
    stream: bool = False
    stream_format: Literal["audio", "sse"] | None = None

    @property
    def sse(self) -> bool:
        return self.stream or self.stream_format == "sse"


class AudioGenerateProgress(BaseModel):
    """SSE event of ``/v1/audio/generate`` with ``stream=true``: ``step`` of ``total_steps``
    denoising steps finished (``progress``: percent, as the video jobs report it)."""

    type: Literal["audio.generate.progress"] = "audio.generate.progress"
    step: int
    total_steps: int
    progress: int


class AudioGenerateDone(BaseModel):
    """The last SSE event of a streamed ``/v1/audio/generate``: the encoded clip."""

    type: Literal["audio.generate.done"] = "audio.generate.done"
    audio: str  #: base64 of the ``response_format`` file
    response_format: str
    sample_rate: int
    channels: int
    audio_seconds: float
    num_inference_steps: int


class AudioGenerateError(BaseModel):
    """An error after the SSE stream began (a failed stage)."""

    type: Literal["audio.generate.error"] = "audio.generate.error"
    error: ErrorDetail

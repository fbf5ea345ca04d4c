"""Custom voices (docs/voices.md): ``/v1/audio/voices`` (create / list / delete),
``/v1/audio/voice_consents``, and how a speech request's voice, ``ref_audio``, ``instructions``,
``task_type`` and ``language`` become the Qwen3-TTS inputs (``omni_triton.contracts.qwen3_tts``).

Which model a stored voice works on follows from the contract, not from names: a clone
(``audio_sample``) needs a speech model that takes ``VOICE_PROMPT``; a designed voice (``prompt``)
one that takes ``TASK`` and ``INSTRUCTIONS``; the prompt is computed by the READY model whose
outputs include ``VOICE_PROMPT`` (``qwen3_tts_voice_prompt``).
"""
from __future__ import annotations

import base64
import binascii
import logging
import re
from typing import Any, Literal, overload

from fastapi import Request
from numpy.typing import NDArray
from starlette.datastructures import UploadFile

from omni_triton.contracts import qwen3_tts as qwen3_contract
from omni_triton.media import audio as media_audio
from omni_triton.media.audio import AudioDecodeError, AudioLimits

from ..engine import Engine, ModelInfo, ModelNotFoundError, SpeechOptions
from ..errors import OpenAIError, bad_request
from ..offload import off_loop
from ..schemas import MAX_REF_TEXT_CHARS, ModelVoices, SpeechRequest, VoiceList, is_text
from ..voice_store import (
    AUDIO_SAMPLE,
    PROMPT,
    DuplicateVoiceName,
    QuotaExceededError,
    StoredConsent,
    StoredVoice,
    VoiceCorruptError,
    VoiceStore,
)
from .common import read_form, read_json_object

logger = logging.getLogger(__name__)

#: vLLM-Omni's ``task_type`` names -> the contract's ``TASK`` values.
TASK_TYPES = {"customvoice": "custom_voice", "custom_voice": "custom_voice",
              "voicedesign": "voice_design", "voice_design": "voice_design", "base": "base"}
MAX_NAME_CHARS = 64
_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,64}")
#: a consent's ``language``: a BCP 47-shaped tag (``en``, ``en-US``, ``zh-Hans-CN``, ``yue``)
_LANGUAGE = re.compile(r"[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8}){0,4}")
_DATA_URL = re.compile(r"data:(?P<mime>[\w.+/-]*)(?:;[\w=.-]+)*;base64,(?P<data>.*)", re.S)
#: longest clip any audio field takes when its caller sets no limit, and the most channels (mixed
#: to mono) of any uploaded audio (docs/voices.md "Limits")
MAX_AUDIO_SECONDS = 60.0
MAX_AUDIO_CHANNELS = 8
#: ``ref_audio`` of a speech request: longest clip
MAX_REF_AUDIO_SECONDS = 60.0
_CONSENT_EXTS = {"audio/mpeg": "mp3", "audio/wav": "wav", "audio/x-wav": "wav", "audio/ogg": "ogg",
                 "audio/aac": "aac", "audio/flac": "flac", "audio/webm": "webm", "audio/mp4": "mp4"}


# --------------------------------------------------------------------------- audio input
def decode_audio(data: bytes, target_rate: int, param: str, min_seconds: float | None = None,
                 max_seconds: float | None = None) -> tuple[NDArray[Any], float]:
    """Uploaded audio bytes (WAV, FLAC, OGG, MP3, M4A...) -> float32 mono [T] in [-1, 1] at
    ``target_rate`` Hz, and its length in seconds: ``omni_triton.media.audio.decode_audio``
    (header checked first, decoding stopped at ``max_seconds``; at most
    :data:`MAX_AUDIO_CHANNELS` channels) with its refusals as OpenAI errors naming ``param``.
    Blocking (seconds of CPU for a long clip): call it in a worker thread.

    Raises:
        OpenAIError: 400 ``invalid_audio`` (not audio / empty / rate or channels out of range),
            ``audio_too_short`` / ``audio_too_long`` outside [``min_seconds``, ``max_seconds``].
    """
    limits = AudioLimits(max_seconds=MAX_AUDIO_SECONDS if max_seconds is None else max_seconds,
                         min_seconds=min_seconds or 0.0, max_channels=MAX_AUDIO_CHANNELS)
    try:
        clip = media_audio.decode_audio(data, target_rate, limits)
    except AudioDecodeError as exc:
        raise bad_request(f"'{param}': {exc}", param=param, code=exc.code) from None
    return clip.samples, clip.seconds


def decode_data_url(text: str, param: str = "ref_audio") -> bytes:
    """``data:audio/wav;base64,...`` (or bare base64) -> bytes. Raises OpenAIError 400."""
    m = _DATA_URL.fullmatch(text.strip())
    payload = m.group("data") if m else text.strip()
    if not m and "://" in text:
        raise bad_request(f"'{param}' must be a base64 data URL (data:audio/...;base64,...); URLs are "
                          "not fetched", param=param, code="invalid_audio")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"'{param}' is not valid base64", param=param, code="invalid_audio") from None


# --------------------------------------------------------------------------- models
def can_clone(info: ModelInfo) -> bool:
    """A speech model that speaks with a stored clone prompt (``VOICE_PROMPT`` in)."""
    return info.is_speech and qwen3_contract.VOICE_PROMPT in info.inputs


def can_design(info: ModelInfo) -> bool:
    """A speech model that speaks with a described voice (``TASK`` + ``INSTRUCTIONS`` in)."""
    return info.is_speech and {qwen3_contract.TASK, qwen3_contract.INSTRUCTIONS} <= info.inputs


def usable_on(voice: StoredVoice, info: ModelInfo) -> bool:
    return can_clone(info) if voice.type == AUDIO_SAMPLE else can_design(info)


async def _prompt_model(engine: Engine) -> ModelInfo:
    """The READY model computing clone prompts (``VOICE_PROMPT`` out, ``REF_AUDIO`` in); an
    on-demand one (``--on-demand qwen3_tts``) is loaded first (``get_model``: 503 while loading)."""
    for m in await engine.list_models():
        computes = qwen3_contract.VOICE_PROMPT in m.outputs and qwen3_contract.REF_AUDIO in m.inputs
        if computes and (m.ready or m.on_demand):
            return m if m.ready else await engine.get_model(m.name)
    raise OpenAIError(400, "Voice cloning is not available: no served model computes voice prompts "
                      "(qwen3_tts_voice_prompt)", param="audio_sample", code="voice_cloning_unavailable")


def quota_error(exc: QuotaExceededError) -> OpenAIError:
    """A store limit -> 400 ``quota_exceeded`` (``prompt_too_long`` for the designed-voice prompt):
    a 400, not a 429, because retrying does not help until something is deleted (the OpenAI SDK
    retries 429s on its own)."""
    if exc.limit == "max_prompt_chars":
        return bad_request(str(exc), param="prompt", code="prompt_too_long")
    return bad_request(str(exc), code="quota_exceeded")


def store_of(state: Any) -> VoiceStore:
    store: VoiceStore | None = getattr(state, "voice_store", None)
    if store is None and getattr(state, "voice_store_error", None):
        raise OpenAIError(503, f"The voice store cannot be opened: {state.voice_store_error}", type="server_error",
                          code="voice_store_unavailable")
    if store is None:
        raise OpenAIError(404, "Custom voices are disabled on this server (no --voice-storage-dir)",
                          code="voices_disabled")
    return store


# --------------------------------------------------------------------------- speech requests
def _unsupported(info: ModelInfo, field: str) -> OpenAIError:
    return bad_request(f"The model '{info.public_name}' does not support '{field}'", param=field,
                       code=f"unsupported_{field}")


#: vLLM-Omni speech extras that are harmless to leave out on a model without the input: ignored
#: and named in ``X-Ignored-Fields`` there (a 400 with ``--strict-params``), as unknown fields are.
#: The others (``instructions``, ``ref_audio``...) change what is spoken: a 400 when unsupported.
LENIENT_EXTRAS = {"task_type": qwen3_contract.TASK, "language": qwen3_contract.LANGUAGE}


def drop_unsupported_extras(body: SpeechRequest, info: ModelInfo) -> tuple[SpeechRequest, list[str]]:
    """``body`` without the :data:`LENIENT_EXTRAS` that ``info`` does not take, and their names."""
    names = [f for f, tensor in LENIENT_EXTRAS.items() if getattr(body, f) is not None and tensor not in info.inputs]
    return (body.model_copy(update={f: None for f in names}) if names else body), names


def resolve_speech(body: SpeechRequest, info: ModelInfo, store: VoiceStore | None, sample_rate: int = 24000
                   ) -> tuple[str | None, SpeechOptions | None]:
    """The model voice and Qwen3-TTS extras of one speech request.

    ``voice``: a voice of the model; an OpenAI name mapped by the model's table; else the id or
    name of a stored voice usable on the model (a clone -> ``VOICE_PROMPT`` + ``TASK=base``; a
    designed voice -> ``TASK=voice_design`` + ``INSTRUCTIONS`` = its prompt). ``ref_audio`` (data
    URL) + ``ref_text``: per-request cloning. ``instructions``, ``task_type``, ``language``: sent
    when the model declares them, else a 400 naming the field.

    Raises:
        OpenAIError: 400 (unknown voice, unsupported field, bad ``ref_audio``, bad ``task_type``),
            409 ``voice_corrupt`` (the stored voice's files are damaged).
    """
    c = qwen3_contract
    opts: dict[str, Any] = {}
    voice = body.voice_id
    if voice is not None:
        mapped = info.resolve_voice(voice)
        if mapped is None:
            stored = store.get(voice) if store is not None else None
            if stored is None:
                raise bad_request(
                    f"Unknown voice '{voice}' for model '{info.public_name}'; available: {', '.join(info.voices)}",
                    param="voice", code="invalid_voice")
            if not usable_on(stored, info):
                raise bad_request(f"The voice '{voice}' ({stored.type}) cannot be used with the model "
                                  f"'{info.public_name}'", param="voice", code="unsupported_voice")
            if stored.error:
                raise OpenAIError(409, f"The voice '{voice}' is unusable: {stored.error}", param="voice",
                                  code="voice_corrupt")
            if stored.type == AUDIO_SAMPLE:
                try:
                    assert store is not None  # stored came from it
                    opts.update(voice_prompt=store.voice_prompt(stored), task="base")
                except VoiceCorruptError as exc:
                    raise OpenAIError(409, f"The voice '{voice}' is unusable: {exc}", param="voice",
                                      code="voice_corrupt") from None
            else:
                opts.update(task="voice_design", instructions=stored.prompt)
            voice = None
        else:
            voice = mapped
    if voice is None and not opts:
        voice = info.default_voice
    if body.instructions and body.instructions.strip():
        if c.INSTRUCTIONS not in info.inputs:
            raise _unsupported(info, "instructions")
        if opts.get("task") == "voice_design":
            raise bad_request("A designed voice already carries its description; 'instructions' cannot be "
                              "added to it", param="instructions", code="invalid_value")
        opts["instructions"] = body.instructions
    if body.task_type is not None:
        if c.TASK not in info.inputs:
            raise _unsupported(info, "task_type")
        task = TASK_TYPES.get(body.task_type.strip().lower())
        if task is None:
            raise bad_request(f"task_type '{body.task_type}' is not one of CustomVoice, VoiceDesign, Base",
                              param="task_type", code="invalid_value")
        if opts.get("task") and opts["task"] != task:
            raise bad_request(f"task_type '{body.task_type}' does not fit the stored voice (a "
                              f"{opts['task']} voice)", param="task_type", code="invalid_value")
        opts["task"] = task
    if body.language is not None:
        if c.LANGUAGE not in info.inputs:
            raise _unsupported(info, "language")
        opts["language"] = body.language
    if body.ref_audio is not None:
        if c.REF_AUDIO not in info.inputs:
            raise _unsupported(info, "ref_audio")
        if "voice_prompt" in opts:
            raise bad_request("Give either a stored voice or 'ref_audio', not both", param="ref_audio",
                              code="invalid_value")
        clip, _ = decode_audio(decode_data_url(body.ref_audio), sample_rate, "ref_audio",
                               max_seconds=MAX_REF_AUDIO_SECONDS)
        opts.update(ref_audio=clip, ref_sample_rate=sample_rate, task=opts.get("task") or "base")
    if body.ref_text is not None or body.x_vector_only_mode is not None:
        if body.ref_audio is None:
            field = "ref_text" if body.ref_text is not None else "x_vector_only_mode"
            raise bad_request(f"'{field}' needs 'ref_audio'", param=field, code="invalid_value")
        if body.ref_text is not None:
            opts["ref_text"] = body.ref_text
        if body.x_vector_only_mode is not None:
            opts["x_vector_only"] = body.x_vector_only_mode
    if opts.get("task") == "voice_design" and not opts.get("instructions"):
        raise bad_request("task_type VoiceDesign needs 'instructions' describing the voice",
                          param="instructions", code="invalid_value")
    if opts and opts.get("task") in ("base", "voice_design"):
        voice = None  # the speaker comes from the prompt / description, not a named voice
    return voice, (SpeechOptions(**opts) if opts else None)


# --------------------------------------------------------------------------- /v1/audio/voices
async def _form(request: Request, max_part: int) -> dict[str, Any]:
    """The request's form fields (multipart or urlencoded) or JSON object, as a dict."""
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("application/json"):
        return await read_json_object(request)
    form = await read_form(request, max_files=2, max_fields=32, max_part_size=max_part)
    out = {}
    for key, value in form.multi_items():
        if key in out:
            raise bad_request(f"Field '{key}' given more than once", param=key)
        out[key] = value
    return out


@overload
def _text_field(fields: dict[str, Any], key: str, required: Literal[True]) -> str: ...
@overload
def _text_field(fields: dict[str, Any], key: str, required: bool = False) -> str | None: ...
def _text_field(fields: dict[str, Any], key: str, required: bool = False) -> str | None:
    value = fields.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise bad_request(f"Missing required parameter: '{key}'", param=key, code="missing_required_parameter")
        return None
    if not isinstance(value, str):
        raise bad_request(f"'{key}' must be a text field", param=key, code="invalid_value")
    if not is_text(value):  # NUL, or a lone surrogate from a JSON body: SQLite and file names need UTF-8
        raise bad_request(f"'{key}' must be valid Unicode text without NUL characters", param=key,
                          code="invalid_characters")
    return value.strip()


async def _file_bytes(value: Any, param: str, limit: int) -> bytes:
    if not isinstance(value, UploadFile):
        raise bad_request(f"'{param}' must be a file part", param=param, code="invalid_audio")
    data = await value.read(limit + 1)
    if len(data) > limit:
        raise OpenAIError(413, f"'{param}' is larger than {limit} bytes", param=param, code="file_too_large")
    return data


async def create_voice(request: Request) -> dict[str, Any]:
    """``POST /v1/audio/voices``: a clone (``audio_sample`` / ``ref_audio`` + ``consent`` [+
    ``ref_text``]) or a designed voice (``type=prompt`` + ``prompt``). Returns ``audio.voice``."""
    state = request.app.state
    store = store_of(state)
    cfg = store.settings
    fields = await _form(request, cfg.max_upload_bytes + 1)
    vtype = _text_field(fields, "type") or AUDIO_SAMPLE
    if vtype not in (AUDIO_SAMPLE, PROMPT):
        raise bad_request(f"'type' must be '{AUDIO_SAMPLE}' or '{PROMPT}'", param="type", code="invalid_value")
    name = _text_field(fields, "name", required=True)
    if not _NAME.fullmatch(name):
        raise bad_request(f"'name' must be 1-{MAX_NAME_CHARS} printable characters", param="name",
                          code="invalid_value")
    if await off_loop(store.name_taken, name):  # store calls off the loop: PostgreSQL is a round trip away
        raise OpenAIError(409, f"A voice named '{name}' exists already", param="name", code="duplicate_name")
    try:
        await off_loop(store.check_quota, "voice")  # the counts, before any decoding; the insert checks again
        if vtype == PROMPT:
            prompt = _text_field(fields, "prompt", required=True)
            if len(prompt) > store.settings.max_prompt_chars:  # before any work (add_design checks again)
                raise bad_request(f"'prompt' is {len(prompt)} characters; at most {store.settings.max_prompt_chars}",
                                  param="prompt", code="prompt_too_long")
            voice = await off_loop(store.add_design, name, prompt)  # a committed (fsynced) row
        else:
            upload = fields.get("audio_sample", fields.get("ref_audio"))
            if upload is None:
                raise bad_request("Missing required parameter: 'audio_sample'", param="audio_sample",
                                  code="missing_required_parameter")
            consent = _text_field(fields, "consent")
            if cfg.require_consent:
                if consent is None:
                    raise bad_request("Missing required parameter: 'consent' (the id of a consent recording, "
                                      "POST /v1/audio/voice_consents)", param="consent", code="consent_required")
                if await off_loop(store.get_consent, consent) is None:
                    raise bad_request(f"No consent recording '{consent}'", param="consent", code="invalid_consent")
            ref_text = _text_field(fields, "ref_text")
            if ref_text is not None and len(ref_text) > MAX_REF_TEXT_CHARS:
                raise bad_request(f"'ref_text' is {len(ref_text)} characters; at most {MAX_REF_TEXT_CHARS}",
                                  param="ref_text", code="invalid_value")
            data = await _file_bytes(upload, "audio_sample", cfg.max_upload_bytes)
            clip, seconds = await off_loop(decode_audio, data, cfg.sample_rate, "audio_sample",
                                                    cfg.min_seconds, cfg.max_seconds)
            model = await _prompt_model(state.engine)
            prompt_bytes, _ = await state.engine.voice_prompt(model.name, clip, cfg.sample_rate, ref_text,
                                                              ref_text is None)
            if not isinstance(prompt_bytes, bytes) or not prompt_bytes:
                raise OpenAIError(502, f"{model.name} returned no voice prompt", type="server_error",
                                  code="voice_prompt_failed")
            voice = await off_loop(store.add_clip, name, clip, cfg.sample_rate, prompt_bytes, ref_text,
                                            consent, seconds)
    except DuplicateVoiceName:  # a concurrent upload took the name between the check and the insert
        raise OpenAIError(409, f"A voice named '{name}' exists already", param="name",
                          code="duplicate_name") from None
    except QuotaExceededError as exc:
        raise quota_error(exc) from None
    logger.info("voice %s (%s, %s) stored", voice.id, voice.name, voice.type)
    return voice.to_openai()


async def delete_voice(request: Request, voice_id: str) -> dict[str, Any]:
    """``DELETE /v1/audio/voices/{id}`` (id or name): ``audio.voice.deleted``; 404 if unknown."""
    voice = await off_loop(store_of(request.app.state).delete, voice_id)  # files removed, row committed
    if voice is None:
        raise OpenAIError(404, f"No voice '{voice_id}'", param="voice_id", code="voice_not_found")
    return {"id": voice.id, "object": "audio.voice.deleted", "deleted": True}


async def list_voices(state: Any, model: str | None) -> VoiceList:
    """``GET /v1/audio/voices[?model=]``: the READY (or on-demand) speech models' voices (and those of chat models
    that speak: omni, llm_tts), their OpenAI name table, and every stored voice (404 for an
    unknown ``model``). A shared database that does not answer: no stored voices, the built-in
    ones listed, ``voice_store_error`` says why (a 200, not a 503)."""
    store = getattr(state, "voice_store", None)
    store_error = getattr(state, "voice_store_error", None)
    database = getattr(state, "database", None)
    unavailable: tuple[type[Exception], ...] = database.unavailable_errors if database is not None else ()
    try:
        stored = await off_loop(store.list_voices) if store is not None else []  # stats (and hashes new) files
    except unavailable as exc:
        # the shared database is away: the models' own voices still work (docs/voices.md)
        stored, store_error = [], f"the voice database does not answer ({type(exc).__name__}); retry later"
    # on-demand models not loaded yet are listed from their repository config (same parameters)
    models = [m for m in await state.engine.list_models()
              if (m.ready or m.on_demand) and (m.is_speech or m.can_speak)]
    if model is not None:
        models = [m for m in models if m.name == model or m.public_name == model]
        if not models:
            raise ModelNotFoundError(f"The model '{model}' does not exist", param="model")
    data = [
        ModelVoices(model=m.public_name, voices=list(m.voices), default_voice=m.default_voice,
                    sample_rate=m.sample_rate, supports_speed=m.supports_speed,
                    max_input_chars=m.max_input_chars, openai_voices=m.openai_voice_table,
                    custom_voices=[v.id for v in stored if not v.error and usable_on(v, m)])
        for m in models
    ]
    custom = {v.name for v in stored if any(v.id in d.custom_voices for d in data)}
    return VoiceList(voices=sorted({v for m in models for v in m.voices} | custom), data=data,
                     uploaded_voices=[v.to_openai() for v in stored],
                     voice_store_error=store_error)


# --------------------------------------------------------------------------- consents
async def create_consent(request: Request) -> dict[str, Any]:
    """``POST /v1/audio/voice_consents`` (multipart ``name``, ``language``, ``recording``)."""
    store = store_of(request.app.state)
    fields = await _form(request, store.settings.max_upload_bytes + 1)
    name = _consent_name(_text_field(fields, "name", required=True))
    language = _text_field(fields, "language", required=True)
    if not _LANGUAGE.fullmatch(language):
        raise bad_request(f"'language' must be a BCP 47 language tag such as 'en' or 'en-US' (got {language[:32]!r})",
                          param="language", code="invalid_value")
    try:
        await off_loop(store.check_quota, "consent")  # the count, before the recording is read and decoded
    except QuotaExceededError as exc:
        raise quota_error(exc) from None
    if "recording" not in fields:
        raise bad_request("Missing required parameter: 'recording'", param="recording",
                          code="missing_required_parameter")
    upload = fields["recording"]
    data = await _file_bytes(upload, "recording", store.settings.max_upload_bytes)
    cfg = store.settings  # a consent recording gets the limits of a voice clip
    await off_loop(decode_audio, data, cfg.sample_rate, "recording", cfg.min_seconds, cfg.max_seconds)
    ext = _CONSENT_EXTS.get((upload.content_type or "").split(";")[0].strip(), "bin")
    try:
        return (await off_loop(store.add_consent, name, language, data, ext)).to_openai()
    except QuotaExceededError as exc:
        raise quota_error(exc) from None


def _consent_name(name: str) -> str:
    """``name`` when it is 1-64 characters without control characters (as a voice's name)."""
    if not _NAME.fullmatch(name):
        raise bad_request(f"'name' must be 1-{MAX_NAME_CHARS} printable characters", param="name",
                          code="invalid_value")
    return name


async def _consent_or_404(store: VoiceStore, consent_id: str) -> StoredConsent:
    consent = await off_loop(store.get_consent, consent_id)
    if consent is None:
        raise OpenAIError(404, f"No consent recording '{consent_id}'", param="consent_id",
                          code="consent_not_found")
    return consent


async def get_consent(request: Request, consent_id: str) -> dict[str, Any]:
    return (await _consent_or_404(store_of(request.app.state), consent_id)).to_openai()


async def update_consent(request: Request, consent_id: str) -> dict[str, Any]:
    store = store_of(request.app.state)
    await _consent_or_404(store, consent_id)
    fields = await _form(request, 1 << 16)
    name = _consent_name(_text_field(fields, "name", required=True))
    renamed = await off_loop(store.rename_consent, consent_id, name)
    if renamed is None:  # deleted since _consent_or_404 looked (was an AttributeError: a 500)
        raise OpenAIError(404, f"No consent recording '{consent_id}'", param="consent_id", code="consent_not_found")
    return renamed.to_openai()


async def list_consents(request: Request, after: str | None, limit: int) -> dict[str, Any]:
    if not 1 <= limit <= 100:
        raise bad_request("'limit' must be between 1 and 100", param="limit", code="invalid_value")
    try:
        page, more = await off_loop(store_of(request.app.state).list_consents, after, limit)
    except KeyError:  # as /v1/videos?after=
        raise bad_request(f"after={(after or '')[:64]!r}: no such consent", param="after",
                          code="invalid_value") from None
    data = [c.to_openai() for c in page]
    return {"object": "list", "data": data, "has_more": more,
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}


async def delete_consent(request: Request, consent_id: str) -> dict[str, Any]:
    if not await off_loop(store_of(request.app.state).delete_consent, consent_id):
        raise OpenAIError(404, f"No consent recording '{consent_id}'", param="consent_id",
                          code="consent_not_found")
    return {"id": consent_id, "object": "audio.voice_consent", "deleted": True}

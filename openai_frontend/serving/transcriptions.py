"""``POST /v1/audio/transcriptions`` and ``POST /v1/audio/translations`` (docs/transcription.md).

One request, as OpenAI defines it (multipart: ``file``, ``model``, ``language``, ``prompt``,
``response_format``, ``temperature``, ``timestamp_granularities[]``, ``stream``):

1. the form is read with bounds (``read_form``; the ``file`` part at most
   ``Settings.max_upload_bytes``: 413), the fields validated (``schemas.TranscriptionForm``);
2. off the event loop: the upload is decoded bounded (``omni_triton.media.audio.decode_audio``:
   header checked first, decoding stopped past ``TranscriptionSettings.max_audio_s``), mixed to
   mono and resampled to 16 kHz (soxr), then cut into speech segments by
   ``omni_triton.media.vad.speech_segments`` (each at most the model's ``max_audio_s``);
3. the segments are sent as concurrent requests (at most ``TranscriptionSettings.concurrency``
   in flight per HTTP request): an ASR model (``task`` ``transcription``) through
   ``Engine.transcribe``, an omni model (a chat model that hears audio) through
   ``Engine.generate`` with a transcription instruction and the segment as an ``input_audio``
   WAV part (text only);
4. their texts are joined in segment order with one space (:class:`TextJoiner`), streamed as
   ``transcript.text.delta`` events in that order (``stream=true``) or rendered as ``json``,
   ``text``, ``srt`` (``srt.compose``), ``vtt`` (``webvtt``) or ``verbose_json`` (segment times
   from the VAD segments).

OpenAI's model names ``whisper-1``, ``gpt-4o-transcribe`` and ``gpt-4o-mini-transcribe`` name the
default transcription model (``TranscriptionSettings.default_model``, ``pocketsphinx``) unless a
served model has that name.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import logging
import re
import zlib
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pycountry
import srt
import webvtt
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from numpy.typing import NDArray
from pydantic import ValidationError
from starlette.background import BackgroundTask
from starlette.datastructures import UploadFile

from omni_triton.contracts import asr as asr_contract
from omni_triton.media import audio as media_audio
from omni_triton.media import vad as media_vad

from ..engine import Engine, EngineError, GenerationRequest, ModelInfo, ModelNotFoundError
from ..errors import OpenAIError, bad_request, engine_error_detail, error_json, validation_detail
from ..offload import off_loop
from ..schemas import ErrorDetail, TranscriptionForm, TranslationForm
from .common import (
    AdmittedRequest,
    ModelKind,
    check_fields,
    read_form,
    resolve_model,
    retry_after_stage_restart,
    sse_response,
    until_disconnect,
)

logger = logging.getLogger(__name__)

#: ``response_format`` values (OpenAI's, without ``diarized_json``: no speaker labels here)
RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
#: formats a ``stream=true`` request may ask for (the stream carries text events either way)
STREAM_FORMATS = ("json", "text")
#: OpenAI's transcription model names: the default transcription model unless served by that name
OPENAI_ALIASES = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe")
#: what ASR models take (``contracts.asr.SAMPLE_RATE``): every upload is resampled to it
SAMPLE_RATE = asr_contract.SAMPLE_RATE
#: longest segment sent to an omni model (its config declares no ``max_audio_s``): Whisper's window
OMNI_MAX_SEGMENT_S = 30.0
#: ``max_tokens`` of one omni segment (~ 3x the tokens of 30 s of fast speech)
OMNI_MAX_TOKENS = 256
#: multipart bounds: the ``file`` part only, text fields, bytes of one text field
MAX_FORM_FILES = 1
MAX_FORM_FIELDS = 32
MAX_FIELD_BYTES = 64 << 10
#: an ISO-639-1 code (``en``; three letters where Whisper has no two-letter one: ``haw``, ``yue``)
_LANGUAGE = re.compile(r"[a-z]{2,3}")
#: the multipart names of ``timestamp_granularities`` (the SDK sends ``timestamp_granularities[]``)
_GRANULARITY_FIELDS = ("timestamp_granularities[]", "timestamp_granularities")

TRANSCRIPTION = ModelKind("transcription", lambda m: m.is_transcription or m.hears)


@dataclass
class TranscriptionSettings:
    """``/v1/audio/transcriptions`` knobs (``python -m openai_frontend --transcription-*``).

    default_model: the model OpenAI's names (:data:`OPENAI_ALIASES`) stand for.
    max_audio_s: longest upload, in seconds of decoded audio (400 ``audio_too_long`` beyond;
        the decoder stops there, whatever the header says).
    concurrency: segments of one request in flight at once (each one Triton request; the
        request takes that many admission units, at most ``--max-inflight``).
    """

    default_model: str = "pocketsphinx"
    max_audio_s: float = 600.0
    concurrency: int = 4


# --------------------------------------------------------------------------- audio
@dataclass(frozen=True)
class PreparedAudio:
    """An upload ready to transcribe: ``samples`` float32 mono [T] at 16 kHz in [-1, 1], its
    length ``seconds`` as decoded, and its speech ``segments`` ([start, end) sample indices,
    each at most the model's segment length; empty when the VAD found no speech)."""

    samples: NDArray[np.float32]
    seconds: float
    segments: list[tuple[int, int]]


def prepare_audio(data: bytes, max_seconds: float, max_segment_s: float) -> PreparedAudio:
    """Decode ``data`` (WAV, FLAC, OGG, MP3, M4A, WebM...: ``media.audio.decode_audio``, bounded
    by ``max_seconds`` and 8 channels) to 16 kHz mono and cut it at VAD pauses into segments of
    at most ``max_segment_s`` seconds (``media.vad.speech_segments``, default ``VADConfig``).
    Blocking (the decode and the VAD scale with the upload): call it off the event loop.

    Raises:
        OpenAIError: 400 ``invalid_audio`` (not audio, empty, damaged, rate or channels out of
            range) or ``audio_too_long``, with ``param`` ``file``.
    """
    limits = media_audio.AudioLimits(max_seconds=max_seconds, max_channels=8)
    try:
        clip = media_audio.decode_audio(data, SAMPLE_RATE, limits)
    except media_audio.AudioDecodeError as exc:
        raise bad_request(f"'file': {exc}", param="file", code=exc.code) from None
    return prepare_samples(clip.samples, SAMPLE_RATE, max_segment_s, clip.seconds)


def prepare_samples(samples: NDArray[np.float32], sample_rate: int, max_segment_s: float,
                    seconds: float | None = None) -> PreparedAudio:
    """Mono float32 ``samples`` [T] in [-1, 1] at ``sample_rate`` Hz, resampled to 16 kHz (soxr)
    and cut at VAD pauses into segments of at most ``max_segment_s`` seconds, as
    :func:`prepare_audio` does with an upload (the Realtime API's committed PCM16 24 kHz audio
    comes this way). ``seconds``: the length to report (default: of ``samples``). Blocking
    (linear in the audio): call it off the event loop."""
    if seconds is None:
        seconds = len(samples) / sample_rate
    if sample_rate != SAMPLE_RATE:
        samples = media_audio.resample(samples, sample_rate, SAMPLE_RATE)
    samples = np.ascontiguousarray(samples, dtype=np.float32)
    segments = media_vad.speech_segments(samples, SAMPLE_RATE, max_segment_s=max_segment_s)
    return PreparedAudio(samples, seconds, [(int(s), int(e)) for s, e in segments])


def _wav_base64(samples: NDArray[np.float32]) -> str:
    """A 16 kHz segment as base64 of a 16-bit WAV file (an omni model's ``input_audio`` part)."""
    return base64.b64encode(media_audio.encode_audio(samples, SAMPLE_RATE, "wav")).decode("ascii")


# --------------------------------------------------------------------------- text
class TextJoiner:
    """Joins the texts of consecutive segments, streamed delta by delta, into one text: each
    segment's text stripped of leading and trailing whitespace, non-empty ones joined with one
    space. :meth:`feed` returns what may be sent now (trailing whitespace is held back until
    more text of the same segment comes), so the concatenation of everything it returned equals
    :attr:`text` at the end. Segments must be fed in order (0, 1, 2...)."""

    def __init__(self) -> None:
        self._segment = -1
        self._started = False  # the current segment has sent non-blank text
        self._pending = ""  # trailing whitespace of the current segment, held back
        self._parts: list[str] = []  # raw text per segment
        self._sent: list[str] = []

    def feed(self, segment: int, delta: str) -> str:
        """``delta`` of segment ``segment`` -> the text to send now (possibly ``""``)."""
        if segment != self._segment:
            if segment < self._segment:
                raise ValueError(f"segment {segment} fed after segment {self._segment}")
            self._segment, self._started, self._pending = segment, False, ""
            self._parts.extend([""] * (segment + 1 - len(self._parts)))
        self._parts[segment] += delta
        if not self._started:
            delta = delta.lstrip()
            if not delta:
                return ""
            self._started = True
            prefix = " " if self._sent else ""
        else:
            prefix = self._pending
        body = delta.rstrip()
        if not body:
            self._pending += delta
            return ""
        self._pending = delta[len(body):]
        out = prefix + body
        self._sent.append(out)
        return out

    def segment_text(self, segment: int) -> str:
        """The stripped text of ``segment`` (``""`` when it said nothing)."""
        return self._parts[segment].strip() if segment < len(self._parts) else ""

    @property
    def text(self) -> str:
        """Everything sent so far: the joined text once every segment has been fed."""
        return "".join(self._sent)


# --------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class TranscriptionJob:
    """A validated request: the model, the task (``transcribe`` | ``translate``), the
    ``response_format``, the ``language`` (ISO-639-1 or None), ``prompt``, ``temperature``,
    whether to stream, and the API it came through (the metric label)."""

    info: ModelInfo
    task: str
    response_format: str
    language: str | None = None
    prompt: str | None = None
    temperature: float | None = None
    stream: bool = False
    api: str = "transcriptions"

    @property
    def max_segment_s(self) -> float:
        """Longest segment the model takes: its ``max_audio_s``, else :data:`OMNI_MAX_SEGMENT_S`."""
        return self.info.max_audio_s or OMNI_MAX_SEGMENT_S


async def _resolve(engine: Engine, name: str, default_model: str) -> ModelInfo:
    """The model a client calls ``name``; an OpenAI name (:data:`OPENAI_ALIASES`) not served
    under that name is the default transcription model."""
    if name in OPENAI_ALIASES:
        try:
            return await resolve_model(engine, name, TRANSCRIPTION)
        except ModelNotFoundError:
            pass
        try:
            return await resolve_model(engine, default_model, TRANSCRIPTION)
        except ModelNotFoundError:
            raise ModelNotFoundError(f"The model '{name}' stands for the default transcription model "
                                     f"'{default_model}' (--transcription-model), which is not served",
                                     param="model") from None
    return await resolve_model(engine, name, TRANSCRIPTION)


def check_job(body: TranslationForm, info: ModelInfo, task: str) -> TranscriptionJob:
    """Validate the form fields against the model.

    Raises:
        OpenAIError: 400 ``unsupported_format`` (``response_format``), ``unsupported_value``
            (``stream`` with srt/vtt/verbose_json, ``timestamp_granularities`` other than
            ``segment`` or without ``verbose_json``), ``invalid_language`` (not ISO-639-1),
            ``unsupported_language`` (not one of the model's ``languages``),
            ``translation_not_supported`` (``/translations`` on a model without it).
    """
    fmt = (body.response_format or "json").strip().lower()
    if fmt not in RESPONSE_FORMATS:
        raise bad_request(f"response_format '{body.response_format}' is not supported; supported: "
                          + ", ".join(RESPONSE_FORMATS), param="response_format", code="unsupported_format")
    stream, language, granularities = False, None, None
    if isinstance(body, TranscriptionForm):
        stream = bool(body.stream)
        granularities = body.timestamp_granularities
        if body.language is not None and body.language.strip():
            language = body.language.strip().lower()
    if stream and fmt not in STREAM_FORMATS:
        raise bad_request(f"stream=true returns transcript.text events; response_format '{fmt}' cannot be "
                          f"streamed (use {' or '.join(STREAM_FORMATS)})", param="stream", code="unsupported_value")
    if granularities:
        if fmt != "verbose_json":
            raise bad_request("timestamp_granularities needs response_format 'verbose_json'",
                              param="timestamp_granularities", code="unsupported_value")
        unknown = [g for g in granularities if g != "segment"]
        if unknown:
            raise bad_request(f"timestamp_granularities '{unknown[0]}' is not supported: only 'segment' "
                              "(segment times come from the voice activity detector; no word timestamps)",
                              param="timestamp_granularities", code="unsupported_value")
    if language is not None:
        if not _LANGUAGE.fullmatch(language):
            raise bad_request(f"language '{language[:32]}' is not an ISO-639-1 code such as 'en'",
                              param="language", code="invalid_language")
        if info.languages and language not in info.languages:
            raise bad_request(f"The model '{info.public_name}' does not transcribe language '{language}'; "
                              f"it knows: {', '.join(info.languages)}", param="language",
                              code="unsupported_language")
    if task == "translate" and info.is_transcription and not info.supports_translation:
        raise bad_request(f"The model '{info.public_name}' does not translate (supports_translation is "
                          "false); use a model that does, e.g. whisper", param="model",
                          code="translation_not_supported")
    prompt = body.prompt if body.prompt and body.prompt.strip() else None
    return TranscriptionJob(info=info, task=task, response_format=fmt, language=language, prompt=prompt,
                            temperature=body.temperature, stream=stream,
                            api="translations" if task == "translate" else "transcriptions")


async def transcription_job(engine: Engine, model: str, language: str | None, prompt: str | None,
                            default_model: str, api: str) -> TranscriptionJob:
    """The job of a transcription asked for outside ``/v1/audio/transcriptions`` (the Realtime
    API's ``input_audio_transcription``): ``model`` resolved as the route resolves it (OpenAI's
    names are ``default_model``), ``language`` and ``prompt`` checked as the form's fields are;
    ``api`` is the metric label.

    Raises:
        ModelNotFoundError / OpenAIError (400) as the route does, also for a field the form
        schema refuses (too long, not text).
    """
    info = await _resolve(engine, model, default_model)
    try:
        form = TranscriptionForm.model_validate({"model": model, "language": language, "prompt": prompt})
    except ValidationError as exc:
        d = validation_detail(list(exc.errors()))
        raise OpenAIError(400, d.message, param=d.param, code=d.code) from None
    return replace(check_job(form, info, "transcribe"), api=api)


def _language_name(code: str) -> str:
    """``en`` -> ``english``, ``haw`` -> ``hawaiian`` (OpenAI's ``verbose_json`` ``language``;
    pycountry's ISO 639 names; a code it does not know is returned as is)."""
    lang = pycountry.languages.get(**{"alpha_2" if len(code) == 2 else "alpha_3": code})
    return str(lang.name).lower() if lang is not None else code


def omni_instruction(job: TranscriptionJob) -> str:
    """The text part sent with each segment to an omni model: transcribe (or translate into
    English) verbatim, the language and the client's ``prompt`` as hints."""
    if job.task == "translate":
        text = "Translate the speech in this audio into English. Reply with the English translation only."
    else:
        text = "Transcribe the speech in this audio verbatim. Reply with the transcript only."
    if job.language:
        text += f" The speech is in {_language_name(job.language).capitalize()}."
    if job.prompt:
        text += f" Context and spelling hints: {job.prompt}"
    return text


def segment_source(engine: Engine, job: TranscriptionJob) -> Callable[[NDArray[np.float32]], AsyncGenerator[str, None]]:
    """``segment samples -> text deltas`` for ``job``'s model: ``Engine.transcribe`` on an ASR
    model; on an omni model ``Engine.generate`` with the segment as a WAV ``input_audio`` part
    and :func:`omni_instruction` (text modality, ``temperature`` as given, else 0)."""
    info = job.info
    if info.is_transcription:
        def asr(samples: NDArray[np.float32]) -> AsyncGenerator[str, None]:
            return engine.transcribe(info.name, samples, job.language, job.prompt, job.task)
        return asr

    async def omni(samples: NDArray[np.float32]) -> AsyncGenerator[str, None]:
        wav = await off_loop(_wav_base64, samples)
        messages = [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
            {"type": "text", "text": omni_instruction(job)}]}]
        tokens = OMNI_MAX_TOKENS if not info.max_model_len else min(OMNI_MAX_TOKENS, info.max_model_len // 2)
        sampling = {"temperature": job.temperature or 0.0, "max_tokens": tokens}
        request = GenerationRequest(messages=messages, sampling=sampling, modalities=("text",))
        async with aclosing(engine.generate(info.name, request)) as chunks:
            async for chunk in chunks:
                if chunk.text:
                    yield chunk.text
    return omni


class _End:
    """A segment's stream ended (queue marker)."""


@dataclass
class _Failed:
    error: BaseException


async def ordered_deltas(source: Callable[[NDArray[np.float32]], AsyncGenerator[str, None]],
                         samples: NDArray[np.float32], segments: list[tuple[int, int]],
                         concurrency: int) -> AsyncGenerator[tuple[int, str], None]:
    """``(segment index, delta)`` of every segment, in segment order, while at most
    ``concurrency`` segments run at once (started in order: an earlier segment never waits for
    a later one). A later segment's deltas wait in its queue until the earlier ones ended.

    The first error (in segment order) is raised; closing the generator, or an error, cancels
    every segment still running (their Triton streams with them)."""
    queues: list[asyncio.Queue[str | _End | _Failed]] = [asyncio.Queue() for _ in segments]
    slots = asyncio.Semaphore(max(1, concurrency))

    async def run(i: int, start: int, end: int) -> None:
        async with slots:
            try:
                async with aclosing(source(samples[start:end])) as deltas:
                    async for delta in deltas:
                        queues[i].put_nowait(delta)
                queues[i].put_nowait(_End())
            except Exception as exc:
                queues[i].put_nowait(_Failed(exc))

    tasks = [asyncio.ensure_future(run(i, s, e)) for i, (s, e) in enumerate(segments)]
    try:
        for i, queue in enumerate(queues):
            while True:
                item = await queue.get()
                if isinstance(item, _End):
                    break
                if isinstance(item, _Failed):
                    raise item.error
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def transcript_deltas(engine: Engine, job: TranscriptionJob, audio: PreparedAudio,
                            concurrency: int) -> AsyncGenerator[str, None]:
    """The transcript of ``audio`` as text deltas, in order: its segments through
    :func:`segment_source` and :func:`ordered_deltas` (at most ``concurrency`` at once), joined
    by :class:`TextJoiner` (the concatenation of the deltas is the whole text; audio without
    speech yields nothing). Errors are raised as :func:`ordered_deltas` raises them; closing the
    generator cancels the segments still running."""
    joiner = TextJoiner()
    source = segment_source(engine, job)
    async with aclosing(ordered_deltas(source, audio.samples, audio.segments, concurrency)) as deltas:
        async for i, delta in deltas:
            out = joiner.feed(i, delta)
            if out:
                yield out


# --------------------------------------------------------------------------- rendering
@dataclass
class Transcript:
    """What a request produced: the joined ``text``, each segment's ``(start, end, text)`` in
    seconds (segments that said nothing left out) and the audio's ``seconds``."""

    text: str
    segments: list[tuple[float, float, str]] = field(default_factory=list)
    seconds: float = 0.0


def transcript_of(joiner: TextJoiner, audio: PreparedAudio) -> Transcript:
    """The :class:`Transcript` once every segment of ``audio`` has been fed to ``joiner``."""
    segs = [(s / SAMPLE_RATE, e / SAMPLE_RATE, joiner.segment_text(i)) for i, (s, e) in enumerate(audio.segments)]
    return Transcript(joiner.text, [s for s in segs if s[2]], audio.seconds)


def _compression_ratio(text: str) -> float:
    """Whisper's ``compression_ratio``: UTF-8 bytes over zlib-compressed bytes."""
    data = text.encode("utf-8")
    return round(len(data) / len(zlib.compress(data)), 4) if data else 0.0


def verbose_json(t: Transcript, job: TranscriptionJob) -> dict[str, Any]:
    """OpenAI's ``TranscriptionVerbose`` / ``TranslationVerbose``: ``task``, ``language`` (its
    English name: the request's ``language``, the model's only language, ``english`` for a
    translation, else ``unknown``), ``duration``, ``text``, ``segments`` (VAD segment times;
    ``tokens`` empty, ``avg_logprob`` 0 and ``no_speech_prob`` 0: the models report neither),
    ``usage`` (``duration``; transcriptions only)."""
    if job.task == "translate":
        language = "english"
    elif job.language:
        language = _language_name(job.language)
    elif len(job.info.languages) == 1:
        language = _language_name(job.info.languages[0])
    else:
        language = "unknown"
    temperature = float(job.temperature or 0.0)
    segments = [{"id": i, "seek": int(round(start * 100)), "start": round(start, 3), "end": round(end, 3),
                 "text": text, "tokens": [], "temperature": temperature, "avg_logprob": 0.0,
                 "compression_ratio": _compression_ratio(text), "no_speech_prob": 0.0}
                for i, (start, end, text) in enumerate(t.segments)]
    out: dict[str, Any] = {"task": job.task, "language": language, "duration": round(t.seconds, 3),
                           "text": t.text, "segments": segments}
    if job.task == "transcribe":
        out["usage"] = {"type": "duration", "seconds": round(t.seconds, 3)}
    return out


def subtitles(t: Transcript, fmt: str) -> str:
    """``srt`` (``srt.compose``) or ``vtt`` (``webvtt``) subtitles of the segments, one cue each."""
    if fmt == "srt":
        return str(srt.compose([srt.Subtitle(index=i + 1, start=datetime.timedelta(seconds=start),
                                             end=datetime.timedelta(seconds=end), content=text)
                                for i, (start, end, text) in enumerate(t.segments)]))
    vtt = webvtt.WebVTT(captions=[webvtt.Caption(start=str(webvtt.models.Timestamp.from_seconds(start)),
                                                 end=str(webvtt.models.Timestamp.from_seconds(end)), text=text)
                                  for start, end, text in t.segments])
    return str(vtt.content)


def render(t: Transcript, job: TranscriptionJob) -> Response:
    """The response of a whole (not streamed) request in ``job.response_format``."""
    fmt = job.response_format
    if fmt == "json":
        body: dict[str, Any] = {"text": t.text}
        if job.task == "transcribe":
            body["usage"] = {"type": "duration", "seconds": round(t.seconds, 3)}
        return JSONResponse(body)
    if fmt == "verbose_json":
        return JSONResponse(verbose_json(t, job))
    if fmt == "text":
        return PlainTextResponse(t.text + "\n")
    return PlainTextResponse(subtitles(t, fmt))


# --------------------------------------------------------------------------- the routes
async def _read_request(request: Request, task: str) -> tuple[TranslationForm, UploadFile, Any]:
    """The validated form fields, the ``file`` part and the form (to close)."""
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise bad_request("This endpoint takes multipart/form-data (fields 'file', 'model', ...)",
                          code="invalid_content_type")
    form = await read_form(request, max_files=MAX_FORM_FILES, max_fields=MAX_FORM_FIELDS,
                           max_part_size=MAX_FIELD_BYTES)
    try:
        upload: UploadFile | None = None
        fields: dict[str, Any] = {}
        for key, value in form.multi_items():
            if key == "file":
                if not isinstance(value, UploadFile):
                    raise bad_request("'file' must be a file part (an audio file)", param="file",
                                      code="invalid_file")
                upload = value
            elif isinstance(value, UploadFile):
                raise bad_request(f"Unexpected file field '{key}'", param=key)
            elif key in _GRANULARITY_FIELDS and task == "transcribe":
                fields.setdefault("timestamp_granularities", []).append(value)
            elif key in fields:
                raise bad_request(f"Field '{key}' given more than once", param=key)
            else:
                fields[key] = value
        schema = TranscriptionForm if task == "transcribe" else TranslationForm
        try:
            body = schema.model_validate(fields)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
        check_fields(body, request)
        if upload is None:
            raise bad_request("Missing required parameter: 'file'", param="file", code="missing_required_parameter")
        limit = request.app.state.settings.max_upload_bytes
        if upload.size is not None and upload.size > limit:
            raise OpenAIError(413, f"'file' is {upload.size} bytes; at most {limit} (--max-upload-bytes)",
                              param="file", code="payload_too_large")
    except BaseException:
        await form.close()
        raise
    return body, upload, form


async def create_transcription(request: Request, task: str = "transcribe") -> Response:
    """``POST /v1/audio/transcriptions`` (``task`` ``transcribe``) or ``/v1/audio/translations``
    (``translate``). Raises ``OpenAIError`` / ``EngineError`` before any byte is sent."""
    state = request.app.state
    settings = state.settings.transcription
    engine, metrics = state.engine, state.metrics
    body, upload, form = await _read_request(request, task)
    try:
        info = await _resolve(engine, body.model, settings.default_model)
        job = check_job(body, info, task)
        data = await upload.read()
    finally:
        await form.close()
    audio = await off_loop(prepare_audio, data, settings.max_audio_s, job.max_segment_s)
    del data
    mode = "stream" if job.stream else "whole"

    def record(outcome: str) -> None:
        metrics.transcription_requests.labels(info.public_name, job.api, mode, outcome).inc()
        if outcome == "ok":
            metrics.transcribed_audio_seconds.labels(info.public_name).inc(audio.seconds)

    source = segment_source(engine, job)
    concurrency = max(1, settings.concurrency)
    async with AdmittedRequest(state, record, cost=min(max(len(audio.segments), 1), concurrency)) as req:
        if not job.stream:
            joiner = TextJoiner()

            async def attempt() -> None:  # no side effects: retried once if a stage dies under it
                nonlocal joiner
                joiner = TextJoiner()
                async with aclosing(ordered_deltas(source, audio.samples, audio.segments, concurrency)) as deltas:
                    async for i, delta in deltas:
                        joiner.feed(i, delta)

            if not await until_disconnect(request, retry_after_stage_restart(engine, info.name, attempt)):
                req.outcome = "cancelled"
                return _client_gone()
            transcript = transcript_of(joiner, audio)
            return await off_loop(render, transcript, job)

        # ---- stream: wait for the first delta (or the end) so early errors keep their status code
        joiner = TextJoiner()
        deltas = ordered_deltas(source, audio.samples, audio.segments, concurrency)
        first: list[tuple[int, str] | None] = []

        async def first_delta() -> None:
            try:
                first.append(await deltas.__anext__())
            except StopAsyncIteration:
                first.append(None)

        try:
            if not await until_disconnect(request, first_delta()):
                await deltas.aclose()
                req.outcome = "cancelled"
                return _client_gone()
        except BaseException:
            await deltas.aclose()
            raise
        events = req.hand_over(_sse_events(deltas, first[0], joiner, req))
        return sse_response(events, background=BackgroundTask(_close_all, events, req))


def _client_gone() -> Response:
    """What a request whose client left gets (nobody reads it; 499: nginx's "client closed request")."""
    return error_json(499, ErrorDetail(message="Client disconnected", type="invalid_request_error",
                                       code="client_disconnected"))


async def _close_all(events: AsyncGenerator[Any, None], req: AdmittedRequest) -> None:
    await events.aclose()
    await req.close()


async def _sse_events(deltas: AsyncGenerator[tuple[int, str], None], first: tuple[int, str] | None,
                      joiner: TextJoiner, req: AdmittedRequest) -> AsyncGenerator[dict[str, str], None]:
    """``transcript.text.delta`` events in segment order, then ``transcript.text.done`` with the
    whole text; a failure after the first event sends an ``error`` event instead of ``done``
    (the OpenAI SDK raises it as ``APIError``)."""
    def delta_event(text: str) -> dict[str, str]:
        return {"event": "transcript.text.delta",
                "data": json.dumps({"type": "transcript.text.delta", "delta": text}, ensure_ascii=False)}

    try:
        if first is not None:
            out = joiner.feed(*first)
            if out:
                yield delta_event(out)
            async for i, delta in deltas:
                out = joiner.feed(i, delta)
                if out:
                    yield delta_event(out)
    except EngineError as exc:
        logger.warning("transcription stream failed: %s", exc.message)
        req.outcome = "error"
        detail = engine_error_detail(exc).model_dump()
        yield {"event": "error", "data": json.dumps({"type": "error", "error": detail}, ensure_ascii=False)}
        return
    finally:
        await deltas.aclose()
    yield {"event": "transcript.text.done",
           "data": json.dumps({"type": "transcript.text.done", "text": joiner.text}, ensure_ascii=False)}

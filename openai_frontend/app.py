"""FastAPI application factory: routers, OpenAI-style errors, admission control, body limit,
optional API key."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI
from starlette.types import ASGIApp

from omni_triton.media.fetch import UrlFetchPolicy

from .admission import AdmissionController
from .auth import ApiKeyCheck
from .db import Database, default_frontend_id
from .engine import Engine
from .errors import install_error_handlers, install_store_unavailable_handler
from .lora_store import LoraSettings, LoraStore
from .media_store import open_media_url
from .metrics import FrontendMetrics
from .middleware import (
    ApiKey,
    BodySizeLimit,
    BrowserGuard,
    ControlCharsInUrl,
    IgnoredFieldsHeader,
    JsonValueLimit,
    SendTimeout,
    SingleHeaders,
    SpeechFormToJson,
    UnexpectedErrors,
)
from .openapi import install_openapi
from .playground import PREFIX as PLAYGROUND_PREFIX
from .playground import install_playground
from .routers import audio, chat, images, loras, models, observability, realtime, videos
from .schemas import SpeechRequest
from .serving.common import IGNORED_FIELDS_STATE
from .serving.loras import FORM_SLACK_BYTES
from .serving.transcriptions import TranscriptionSettings
from .stage_watch import ServeStatusWatch
from .storage_lock import lock_unless_shared
from .video_jobs import JobSettings, PostgresJobStore, SqliteJobStore, VideoJobs
from .voice_store import PostgresVoiceMeta, VoiceSettings, VoiceStore

logger = logging.getLogger(__name__)

#: ``SpeechRequest`` fields that are text (a multipart part stays a string); the others are read
#: as JSON from a multipart part (``SpeechFormToJson``).
_SPEECH_TEXT_FIELDS = frozenset({"model", "input", "voice", "response_format", "instructions", "stream_format",
                                 "task_type", "language", "ref_audio", "ref_text"})


@dataclass
class Settings:
    """Frontend knobs (all settable from ``python -m openai_frontend``).

    max_inflight: Triton requests (speech, chat choices, completions, images) admitted at once;
        more get 429 + ``Retry-After``.
    default_max_input_chars: input limit for models whose config has no ``max_input_chars``
        (4096 = OpenAI's limit).
    max_body_bytes: requests with a larger body get 413 (``Content-Length`` or, chunked, counted
        while read; 16 MiB: room for a few uploaded images on ``/v1/images/edits``).
    retry_after_s: ``Retry-After`` seconds of a 429.
    max_fanout: Triton requests one HTTP request may become (chat ``n``; completions prompts x
        ``n``); more is a 400. Each counts against ``max_inflight``.
    api_key: when set, every path but ``auth_exempt_paths`` needs ``Authorization: Bearer <key>``
        (or, on a WebSocket, the ``openai-insecure-api-key.<key>`` subprotocol; 401 otherwise;
        never in the URL), and ``/health`` shows its detail only to requests with the key.
        Unset: ``/health`` detail for loopback clients only, and ``BrowserGuard`` refuses
        cross-origin browser writes and DNS-rebound hosts (``middleware.BrowserGuard``).
    allowed_origins: browser origins (``https://app.example.com``) allowed to write to a
        frontend without an API key, and whose hosts may be named in ``Host`` on a loopback
        address; ``("*",)`` switches the browser guard off.
    max_upload_bytes: largest uploaded file part (``/v1/images/edits``); larger is a 413.
    strict_params: unknown request fields are a 400 "Unrecognized request argument" (OpenAI's
        API) instead of being ignored and named in ``X-Ignored-Fields`` (vLLM's server).
    video: the video job store's settings (``openai_frontend.video_jobs.JobSettings``).
    voices: the custom voice store's settings (``openai_frontend.voice_store.VoiceSettings``);
        None: custom voices disabled (``/v1/audio/voices`` still lists the models' voices).
    media_url: where MP4s (``videos/``), voice files (``voices/``) and consent recordings
        (``consents/``) live, an fsspec URL shared by several frontends (``file:///shared/media``,
        ``/shared/media``, ``s3://bucket/prefix``: ``openai_frontend.media_store``); None: in
        the video / voice storage folders (the default, as before).
    batch_concurrency: items of one ``/v1/audio/speech/batch`` synthesised at once.
    media_urls: which http(s) ``image_url`` / ``video_url`` parts the frontend fetches
        (``omni_triton.media.fetch.UrlFetchPolicy``; default: none, data URLs only).
    max_prompt_chars: characters of text one chat / completion / ``/tokenize`` request may carry
        (all messages' text parts, or all prompts, together); more is a 400
        ``prompt_too_long`` before any tokenization (262,144: 4x a 64k-token context).
    max_json_values: values (counted as ``,``, ``{``, ``[`` bytes) one JSON request body may hold;
        more is a 413 before it is parsed (parsing and validating run on the event loop).
    speech_stream_max_pending_chars: text one ``WS /v1/audio/speech/stream`` session may hold
        unspoken (its buffer plus the queued sentences); a message that would exceed it gets an
        ``error`` event (``text_too_long``, ``status_code`` 413) and the socket is closed (1009).
    speech_stream_max_sessions: ``WS /v1/audio/speech/stream`` sessions open at once; one more
        gets an ``error`` event (``too_many_sessions``, ``status_code`` 429) and is closed (1013).
    speech_stream_idle_timeout_s: a speech WebSocket session without a ``session.config`` this
        long after the handshake, or without a message this long while nothing of it is queued
        or being spoken, gets an ``error`` event (``idle_timeout``) and is closed (1008).
    realtime_max_sessions / realtime_max_session_s / realtime_idle_timeout_s /
        realtime_max_event_bytes / realtime_max_buffer_s / realtime_max_items / realtime_max_audio_s:
        the ``WS /v1/realtime`` limits (``serving.realtime``, docs/realtime.md "Limits"): sessions
        open at once, seconds one session lasts, seconds without a client event while no response
        runs, characters of one client event, seconds of uncommitted input audio, conversation
        items and seconds of user audio kept per session.
    send_timeout_s: seconds one ``send()`` of an HTTP response message (a body chunk) may take;
        a client that stops reading for longer gets its response abandoned (streams cancelled,
        admission slot released) and its connection dropped (``middleware.SendTimeout``);
        0: no limit.
    database_url: a PostgreSQL URL (``openai_frontend.db``): video jobs and voice/consent
        metadata live there, shared by every frontend on it (no folder locks; jobs claimed with
        leases). None: SQLite files in the storage folders (one frontend per folder).
    frontend_id: this frontend's id in the shared database's job leases (and logs); None:
        ``<hostname>-<pid>``.
    loras: the LoRA adapter registry's settings (``openai_frontend.lora_store.LoraSettings``,
        docs/lora.md); None: ``/v1/loras`` answers 404 and image requests with ``lora`` 404.
    transcription: ``/v1/audio/transcriptions`` and ``/translations`` settings
        (``serving.transcriptions.TranscriptionSettings``); the ``file`` part is bounded by
        ``max_upload_bytes``.
    """

    max_inflight: int = 16
    default_max_input_chars: int = 4096
    max_body_bytes: int = 16 << 20
    retry_after_s: int = 1
    max_fanout: int = 16
    api_key: str | None = None
    auth_exempt_paths: tuple[str, ...] = ("/health", "/metrics")
    allowed_origins: tuple[str, ...] = ()
    max_upload_bytes: int = 8 << 20
    strict_params: bool = False
    #: video jobs (``/v1/videos``): storage folder, queue bound, retention...; None: disabled
    video: JobSettings | None = None
    #: custom voices (``/v1/audio/voices``): storage folder, clip limits, consent rule; None: disabled
    voices: VoiceSettings | None = None
    #: MP4s, voice files, consent recordings: an fsspec URL; None: the storage folders above
    media_url: str | None = None
    batch_concurrency: int = 4
    #: http(s) media URLs in chat content parts (allow-list, size, time); default: refused
    media_urls: UrlFetchPolicy = field(default_factory=UrlFetchPolicy)
    max_prompt_chars: int = 1 << 18
    max_json_values: int = 1 << 16
    speech_stream_max_pending_chars: int = 1 << 16
    speech_stream_max_sessions: int = 64
    speech_stream_idle_timeout_s: float = 30.0
    realtime_max_sessions: int = 32
    realtime_max_session_s: float = 1800.0
    realtime_idle_timeout_s: float = 120.0
    realtime_max_event_bytes: int = 4 << 20
    realtime_max_buffer_s: float = 60.0
    realtime_max_items: int = 64
    realtime_max_audio_s: float = 600.0
    send_timeout_s: float = 20.0
    database_url: str | None = None
    frontend_id: str | None = None
    #: ``/v1/audio/transcriptions`` / ``translations``: default model, audio length, segment concurrency
    transcription: TranscriptionSettings = field(default_factory=TranscriptionSettings)
    #: LoRA adapters for the diffusion denoisers (``/v1/loras``); None: disabled
    loras: LoraSettings | None = None


class _FrontendApp(FastAPI):
    """FastAPI whose middleware stack is wrapped in ``middleware.SendTimeout``: outside even
    Starlette's own error middleware (which wraps ``send``), so it is handed the server's ``send``
    and can drop the connection of a client that stopped reading."""

    def build_middleware_stack(self) -> ASGIApp:
        settings, metrics = self.state.settings, self.state.metrics
        return SendTimeout(super().build_middleware_stack(), settings.send_timeout_s, metrics.send_timeouts.inc)


def create_app(engine: Engine, settings: Settings | None = None, *, close_engine: bool = True) -> FastAPI:
    """Build the app around ``engine`` (``TritonEngine`` in production, a fake in unit tests).

    Raises:
        StorageLockedError: another process has the video or the voice storage folder open
            (``openai_frontend.storage_lock``): a second frontend on one folder refuses to start.
        openai_frontend.db.DatabaseError: ``settings.database_url`` cannot be reached or migrated.
        MediaUrlError: ``settings.media_url`` cannot be used.
    """
    settings = settings or Settings()
    frontend_id = settings.frontend_id or default_frontend_id()
    media = open_media_url(settings.media_url) if settings.media_url else None
    # the shared database (connected and migrated now: a frontend that cannot reach it does not start)
    database = Database(settings.database_url) if settings.database_url else None
    if database is not None:
        logger.info("frontend %s: video jobs and voices in the shared database", frontend_id)
    # the video folder's lock now, so a second frontend stops here with the holder's pid instead
    # of failing in the lifespan; VideoJobs takes its own reference (shared within the process).
    # A shared database needs none (PostgresJobStore.shared).
    try:
        video_lock = (lock_unless_shared(settings.video.storage_dir,
                                         SqliteJobStore.shared if database is None else PostgresJobStore.shared)
                      if settings.video is not None else None)
    except BaseException:
        if database is not None:
            database.close()
        raise

    # serve's status file (omni_triton.serve.supervisor.ServeStatus): restarts and stub deaths for
    # /health; a stage that died has the in-flight requests it would leave hanging ended.
    watch = ServeStatusWatch.from_env(engine.abort_inflight)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        watch.start()
        replicas = getattr(engine, "replicas", None)  # TritonEngine: its Triton replicas
        if replicas is not None:
            _app.state.metrics.watch_replicas(replicas.all_known)
            await replicas.start()  # first DNS resolution and probes (several replicas), then their loops
        on_demand = getattr(engine, "on_demand", None)  # TritonEngine with --on-demand
        if on_demand is not None:
            on_demand.attach(_app.state.metrics)
            _app.state.metrics.models_pss_mib.set_function(on_demand.resident_pss_mib)
            await on_demand.start()
        if settings.video is not None:
            metrics = _app.state.metrics
            _app.state.video_jobs = jobs = VideoJobs(
                engine, settings.video,
                on_event=lambda _id, outcome: metrics.video_jobs.labels(outcome).inc(),
                on_store_error=lambda operation: metrics.video_store_errors.labels(operation).inc(),
                store=(PostgresJobStore(database, frontend_id, settings.video.lease_s)
                       if database is not None else None),
                media=media)
            metrics.video_store_failing.set_function(lambda: float(jobs.store_error is not None))
            await jobs.start()
        try:
            yield
        finally:
            if _app.state.voice_store is not None:
                _app.state.voice_store.close()
            if _app.state.lora_store is not None:
                _app.state.lora_store.close()
            if getattr(_app.state, "video_jobs", None) is not None:
                await _app.state.video_jobs.stop()
            if video_lock is not None:
                video_lock.release()
            await watch.stop()
            if on_demand is not None:
                await on_demand.stop()
            if close_engine:
                await engine.close()
            if database is not None:
                database.close()

    app = _FrontendApp(title="Omni-Triton OpenAI frontend", lifespan=lifespan)
    app.state.engine = engine
    app.state.serve_watch = watch
    app.state.settings = settings
    app.state.frontend_id = frontend_id
    app.state.database = database
    app.state.api_key_check = ApiKeyCheck(settings.api_key)  # ApiKey and /health share it
    # A store that cannot be opened (a damaged SQLite file, an unwritable folder) is reported on
    # /v1/audio/voices and makes the voice endpoints 503; the rest of the API keeps serving and
    # nothing on disk is touched (no sweep, no rebuild that could lose voices).
    app.state.voice_store, app.state.voice_store_error = None, None
    if settings.voices is not None:
        try:
            app.state.voice_store = VoiceStore(settings.voices,
                                               PostgresVoiceMeta(database) if database is not None else None,
                                               media=media)
        except (sqlite3.DatabaseError, OSError) as exc:
            app.state.voice_store_error = f"{type(exc).__name__}: {exc}"
            logger.error("voice store %s cannot be opened: %s", settings.voices.storage_dir, exc)
        except BaseException:  # StorageLockedError: this frontend does not start
            if video_lock is not None:
                video_lock.release()
            if database is not None:
                database.close()
            raise
    # the LoRA registry: like the voice store, one that cannot be opened makes /v1/loras 503
    app.state.lora_store, app.state.lora_store_error = None, None
    if settings.loras is not None:
        try:
            app.state.lora_store = LoraStore(settings.loras)
        except (sqlite3.DatabaseError, OSError) as exc:
            app.state.lora_store_error = f"{type(exc).__name__}: {exc}"
            logger.error("LoRA registry %s cannot be opened: %s", settings.loras.directory, exc)
    app.state.admission = AdmissionController(settings.max_inflight, settings.retry_after_s)
    app.state.metrics = FrontendMetrics(app.state.admission)
    app.state.started_at = int(time.time())
    install_error_handlers(app)
    if database is not None:
        install_store_unavailable_handler(app, database.unavailable_errors)
    app.include_router(audio.router)
    app.include_router(images.router)
    app.include_router(loras.router)
    app.include_router(videos.router)
    app.include_router(chat.router)
    app.include_router(realtime.router)
    app.include_router(models.router)
    app.include_router(observability.router)
    install_playground(app)  # the browser page at /playground/ (docs/playground.md)
    install_openapi(app)  # /openapi.json describes the forms, media types and error shape too
    # add_middleware wraps: the last added runs first (outermost)
    app.add_middleware(SpeechFormToJson, json_fields=frozenset(SpeechRequest.model_fields) - _SPEECH_TEXT_FIELDS)
    app.add_middleware(JsonValueLimit, limit=settings.max_json_values)
    app.add_middleware(IgnoredFieldsHeader, state_key=IGNORED_FIELDS_STATE)
    lora_upload = ({("POST", "/v1/loras"): max(settings.max_body_bytes, settings.loras.max_upload_bytes
                                                 + FORM_SLACK_BYTES)} if settings.loras is not None else {})
    app.add_middleware(BodySizeLimit, limit=settings.max_body_bytes, overrides=lora_upload)
    app.add_middleware(ControlCharsInUrl)  # before any route reads a path parameter or cursor
    app.add_middleware(ApiKey, check=app.state.api_key_check, exempt=(*settings.auth_exempt_paths, "/", "/playground"),
                       exempt_prefixes=(PLAYGROUND_PREFIX,))  # the page asks for the key itself
    if not settings.api_key:  # with a key, a page cannot authenticate a write it forges
        app.add_middleware(BrowserGuard, allowed_origins=tuple(settings.allowed_origins))
    app.add_middleware(SingleHeaders)  # before any check reads the first Host/Origin/Authorization
    app.add_middleware(UnexpectedErrors)
    return app

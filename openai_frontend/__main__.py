"""``python -m openai_frontend --triton-url localhost:8001 --host 127.0.0.1 --port 9000 [--models a,b]``"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

import uvicorn

from omni_triton import triton_admin
from omni_triton.contracts.lora import lora_dir
from omni_triton.media.fetch import UrlFetchPolicy
from omni_triton.paths import cache_dir
from omni_triton.serve import on_demand

from .app import Settings, create_app
from .auth import browser_ws_sendable, install_log_redaction
from .db import ENV as DATABASE_ENV
from .db import DatabaseError, database_url
from .engine import TritonEngine
from .engine.replicas import parse_target, pinned_index
from .lora_store import LoraSettings
from .media_store import MediaUrlError
from .quiet_server import QuietServer
from .serving.speech import install_quiet_stream_aborted
from .serving.transcriptions import TranscriptionSettings
from .storage_lock import StorageLockedError
from .video_jobs import JobSettings
from .voice_store import VoiceSettings


def on_demand_engine_args(args: argparse.Namespace, pinned: list[str]) -> dict[str, Any]:
    """The ``TritonEngine`` keyword arguments of ``--on-demand`` (``{}`` without it): the policy
    factory (``omni_triton.serve.on_demand``) and each on-demand pipeline's ``ModelInfo`` read
    from its repository config. Reads the configs once, here, before the event loop starts.

    Raises:
        SystemExit: a pipeline (or a model it needs) is in no repository, or a config is invalid.
    """
    names = [n.strip() for n in args.on_demand.split(",") if n.strip()]
    if not names or names == ["none"]:
        return {}
    if "all" in names:
        raise SystemExit("openai_frontend: --on-demand takes pipeline names ('all' is resolved by "
                         "omni-triton serve)")
    from omni_triton.serve import on_demand as od
    from omni_triton.serve.repository import available_models, read_config

    from .engine import model_info_from_config

    repos = [Path(r) for r in args.model_repository] or None
    try:
        graph = od.PipelineGraph.from_repositories(pinned, names, repos)
        paths = available_models(repos)
        offline = {name: model_info_from_config(read_config(paths[name] / "config.pbtxt"), "UNLOADED")
                   for name, p in graph.pipelines.items() if not p.pinned}
    except Exception as exc:  # KeyError, ValueError, OSError, protobuf's ParseError: no start
        raise SystemExit(f"openai_frontend: --on-demand: {exc}") from exc
    budget = args.memory_budget / (1 << 20) if args.memory_budget else None
    keep_alive = None if args.keep_alive < 0 else args.keep_alive

    def policy(control: od.ModelControl) -> od.OnDemandModels:
        return od.OnDemandModels(graph, control, keep_alive_s=keep_alive, memory_budget_mib=budget,
                                 load_timeout_s=args.load_timeout)

    return {"on_demand": policy, "offline": offline}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m openai_frontend", description=__doc__)
    p.add_argument("--triton-url", default="localhost:8001",
                   help="Triton gRPC host:port, or several replicas: host:port,host:port (each request "
                        "goes to the least busy healthy replica that has its model READY) or "
                        "dns:///NAME:PORT (every address NAME resolves to, re-resolved: a headless "
                        "Service). Their restricted admin APIs (repository index, model config) are "
                        "called with the key of env OMNI_TRITON_ADMIN_KEY or the file named by "
                        "OMNI_TRITON_ADMIN_KEY_FILE (omni-triton serve passes it); one key for all")
    p.add_argument("--triton-resolve-interval-s", type=float, default=10.0,
                   help="seconds between DNS resolutions of a dns:/// --triton-url")
    p.add_argument("--triton-health-interval-s", type=float, default=1.0,
                   help="seconds between readiness probes (is_server_ready + repository index) of each "
                        "replica, with several replicas or dns:///; a replica that fails one is drained "
                        "until one passes. One host:port: no probes")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument(
        "--models",
        default=None,
        help="comma-separated Triton models to serve (default: every model in the repository "
        "index; /health then requires all of them READY)",
    )
    p.add_argument("--max-inflight", type=int, default=16,
                   help="admitted Triton requests (speech, chat choices, images); 429 beyond")
    p.add_argument("--default-max-input-chars", type=int, default=4096)
    p.add_argument("--max-body-bytes", type=int, default=16 << 20)
    p.add_argument("--max-upload-bytes", type=int, default=8 << 20,
                   help="largest uploaded file part (image edits); 413 beyond")
    p.add_argument("--max-fanout", type=int, default=16,
                   help="Triton requests one HTTP request may become (chat n, completions prompts x n)")
    p.add_argument("--api-key", default=os.environ.get("OMNI_TRITON_API_KEY") or None,
                   help="require 'Authorization: Bearer <key>' (default: env OMNI_TRITON_API_KEY; "
                        "unset: no key). Prefer the env variable: arguments show in ps")
    p.add_argument("--auth-exempt-paths", default="/health,/metrics",
                   help="comma-separated paths served without the API key ('' : none); /health shows "
                        "only its status to callers without the key")
    p.add_argument("--allowed-origins", default="",
                   help="without an API key, browser pages may write (POST/DELETE, WebSocket) only from "
                        "the server's own origin and these comma-separated origins "
                        "(https://app.example.com); their hosts may also be named in Host on a loopback "
                        "address (DNS-rebinding guard); '*': guard off")
    p.add_argument("--strict-params", action="store_true",
                   help="unknown request fields are a 400 (OpenAI's API) instead of being ignored "
                        "and named in the X-Ignored-Fields header (vLLM's server, the default)")
    p.add_argument("--rpc-timeout", type=float, default=5.0, help="seconds, Triton metadata calls")
    p.add_argument("--video-storage-dir", default=None,
                   help="video jobs: SQLite store + MP4s (default: <cache>/videos/<port>)")
    p.add_argument("--video-max-queued", type=int, default=16, help="queued video jobs; 429 beyond")
    p.add_argument("--video-max-running", type=int, default=4, help="video jobs streamed to Triton at once")
    p.add_argument("--video-retention-s", type=float, default=24 * 3600,
                   help="seconds a finished MP4 is kept; then its job is 'expired' (<= 0: forever)")
    p.add_argument("--video-max-attempts", type=int, default=3,
                   help="starts of one job (resumes after restarts included) before it is failed")
    p.add_argument("--video-stall-timeout-s", type=float, default=600.0,
                   help="a running video job with no progress for this long is stopped and failed "
                        "('stalled'; <= 0: no limit)")
    p.add_argument("--video-purge-after-s", type=float, default=7 * 24 * 3600,
                   help="failed and expired video jobs (row, reference image, files) are deleted this "
                        "long after they failed / expired (<= 0: kept)")
    p.add_argument("--video-max-stored-jobs", type=int, default=10000,
                   help="video jobs of any status kept at once; 400 quota_exceeded beyond")
    p.add_argument("--video-max-stored-bytes", type=int, default=20 << 30,
                   help="bytes of MP4s and stored requests (reference images) kept; 400 quota_exceeded beyond")
    p.add_argument("--video-max-reference-bytes", type=int, default=8 << 20,
                   help="largest stored input_reference (PNG at the video's size); 400 beyond")
    p.add_argument("--voice-storage-dir", default=None,
                   help="custom voices: SQLite store + clips and prompts (default: <cache>/voices/<port>)")
    p.add_argument("--media-url", default=None,
                   help="where MP4s (videos/), voice files (voices/) and consent recordings (consents/) "
                        "live: an fsspec URL several frontends share (file:///shared/media, /shared/media, "
                        "s3://bucket/prefix with s3fs installed); default: in --video-storage-dir and "
                        "--voice-storage-dir")
    p.add_argument("--voice-min-seconds", type=float, default=1.0, help="shortest accepted voice clip")
    p.add_argument("--voice-max-seconds", type=float, default=30.0, help="longest accepted voice clip")
    p.add_argument("--voice-max-upload-bytes", type=int, default=10 << 20,
                   help="largest audio_sample / consent recording (413 beyond)")
    p.add_argument("--voice-consent", choices=("required", "optional"), default="required",
                   help="required: a cloned voice needs the id of a stored consent recording (OpenAI)")
    p.add_argument("--voice-max-voices", type=int, default=1000, help="stored voices; 400 quota_exceeded beyond")
    p.add_argument("--voice-max-consents", type=int, default=1000,
                   help="stored consent recordings; 400 quota_exceeded beyond")
    p.add_argument("--voice-max-stored-bytes", type=int, default=2 << 30,
                   help="bytes of clips, prompts and consent recordings kept; 400 quota_exceeded beyond")
    p.add_argument("--voice-max-prompt-chars", type=int, default=4096,
                   help="characters of a designed voice's prompt; 400 prompt_too_long beyond")
    g = p.add_argument_group("LoRA adapters of the diffusion denoisers (docs/lora.md)")
    g.add_argument("--lora-dir", default=None,
                   help="the LoRA directory shared with the denoisers (adapter files, loras.sqlite); default "
                        "$OMNI_TRITON_LORA_DIR or $OMNI_TRITON_CACHE/loras; 'none': LoRA disabled")
    g.add_argument("--lora-allowed-dirs", default="",
                   help="comma-separated server folders from which POST /v1/loras {\"path\"} and "
                        "/v1/load_lora_adapter may register adapters (symlinks resolved); '': paths refused")
    g.add_argument("--lora-max-bytes", type=int, default=2 << 30, help="largest adapter file (413 beyond)")
    g.add_argument("--lora-max-adapters", type=int, default=256, help="registered adapters at most")
    g.add_argument("--lora-max-stored-bytes", type=int, default=50 << 30, help="bytes of stored adapters at most")
    g.add_argument("--lora-max-rank", type=int, default=256, help="largest LoRA rank accepted")
    g = p.add_argument_group("several frontends on one database (docs/running.md \"Several frontends\")")
    g.add_argument("--database-url", default=None,
                   help=f"PostgreSQL URL (postgresql://user:pw@host:5432/db) holding the video jobs and the "
                        f"voice/consent metadata of every frontend on it (default: env {DATABASE_ENV}; unset: "
                        f"SQLite files in the storage folders, one frontend per folder). Needs --media-url. "
                        f"Prefer the env variable when the URL has a password: arguments show in ps")
    g.add_argument("--video-lease-s", type=float, default=30.0,
                   help="with --database-url: seconds a frontend holds a running video job without renewing "
                        "it (renewed every third of it); a job whose frontend died is taken over by another "
                        "one once it expires. 0: leases never expire (no takeover; for tests)")
    g.add_argument("--frontend-id", default=None,
                   help="with --database-url: this frontend's name in job leases and logs; unique among the "
                        "frontends running at once (default: <hostname>-<pid>)")
    p.add_argument("--batch-concurrency", type=int, default=4,
                   help="items of one /v1/audio/speech/batch synthesised at once")
    p.add_argument("--transcription-model", default="pocketsphinx",
                   help="the model OpenAI's names whisper-1, gpt-4o-transcribe and gpt-4o-mini-transcribe stand "
                        "for on /v1/audio/transcriptions and /translations (docs/transcription.md)")
    p.add_argument("--transcription-max-audio-s", type=float, default=600.0,
                   help="longest upload of /v1/audio/transcriptions and /translations, in seconds of decoded audio")
    p.add_argument("--transcription-concurrency", type=int, default=4,
                   help="segments of one transcription sent to the model at once")
    p.add_argument("--media-url-allowed-hosts", default="",
                   help="comma-separated hosts (or *.domain) whose http(s) image_url/video_url parts are fetched; "
                        "empty (default): data URLs only")
    p.add_argument("--media-url-max-bytes", type=int, default=8 << 20, help="largest fetched media body (413 beyond)")
    p.add_argument("--media-url-timeout", type=float, default=10.0, help="seconds per media fetch, redirects included")
    p.add_argument("--media-url-trusted-networks", default="",
                   help="comma-separated CIDRs fetched although private (default none: public addresses only)")
    p.add_argument("--max-prompt-chars", type=int, default=1 << 18,
                   help="characters of text in one chat/completion/tokenize request (400 prompt_too_long beyond)")
    p.add_argument("--max-json-values", type=int, default=1 << 16,
                   help="values (',', '{', '[' bytes) in one JSON request body (413 beyond, before parsing)")
    p.add_argument("--send-timeout-s", type=float, default=20.0,
                   help="seconds one send of an HTTP response chunk may take; a client that stops reading "
                        "longer has its response abandoned (stream cancelled, slot released) and its "
                        "connection closed (0: no limit)")
    p.add_argument("--speech-stream-max-pending-chars", type=int, default=1 << 16,
                   help="unspoken text one speech WebSocket session may hold (error + close 1009 beyond)")
    p.add_argument("--speech-stream-max-sessions", type=int, default=64,
                   help="speech WebSocket sessions open at once (one more: error too_many_sessions + close 1013)")
    p.add_argument("--speech-stream-idle-timeout-s", type=float, default=30.0,
                   help="close a speech WebSocket session (error idle_timeout + close 1008) without a "
                        "session.config this long after the handshake, or without a message this long "
                        "while it has nothing queued or being spoken")
    p.add_argument("--realtime-max-sessions", type=int, default=32,
                   help="WS /v1/realtime sessions open at once (one more: error too_many_sessions + close 1013)")
    p.add_argument("--realtime-max-session-s", type=float, default=1800.0,
                   help="seconds one realtime session lasts (then error session_expired + close 1008)")
    p.add_argument("--realtime-idle-timeout-s", type=float, default=120.0,
                   help="close a realtime session (error idle_timeout + close 1008) without a client event "
                        "this long while no response runs")
    p.add_argument("--realtime-max-event-bytes", type=int, default=4 << 20,
                   help="characters of one realtime client event (error event_too_large beyond; the session goes on)")
    p.add_argument("--realtime-max-buffer-s", type=float, default=60.0,
                   help="seconds of uncommitted realtime input audio (error input_audio_buffer_full beyond)")
    p.add_argument("--realtime-max-items", type=int, default=64,
                   help="conversation items one realtime session keeps (oldest deleted beyond)")
    p.add_argument("--realtime-max-audio-s", type=float, default=600.0,
                   help="seconds of user audio one realtime conversation keeps (oldest items deleted beyond)")
    g = p.add_argument_group("on-demand models (docs/running.md \"On-demand models\"; omni-triton serve passes these)")
    on_demand.add_arguments(g, "", "comma-separated pipelines (Triton or OpenAI names) loaded on their first "
                            "request and unloaded when idle; served beside --models (which stay loaded: "
                            "pinned). '' or 'none': none")
    g.add_argument("--model-repository", action="append", default=[],
                   help="a model repository to read the pipelines' graph and sizes from (repeatable; "
                        "default: omni-triton's repositories)")
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def shared_database_url(args: argparse.Namespace) -> str | None:
    """The ``--database-url`` (or env) to use, or None for SQLite files.

    Raises:
        SystemExit: the URL is not a PostgreSQL URL, or no ``--media-url`` is given with it
            (frontends sharing a database must share their MP4s, clips and recordings too).
    """
    try:
        url = database_url(args.database_url)
    except DatabaseError as exc:
        raise SystemExit(f"openai_frontend: {exc}") from exc
    if url is not None and not getattr(args, "media_url", None):
        raise SystemExit("openai_frontend: --database-url needs --media-url: frontends that share a database "
                         "must also share their media (MP4s, voice clips, consent recordings), e.g. "
                         "--media-url file:///shared/media or s3://bucket/prefix")
    if args.video_lease_s < 0:
        raise SystemExit("openai_frontend: --video-lease-s must be >= 0 (0: leases never expire)")
    return url


def lora_settings(args: argparse.Namespace) -> LoraSettings | None:
    """The LoRA registry's settings from ``--lora-*`` (None with ``--lora-dir none``)."""
    if (args.lora_dir or "").lower() == "none":
        return None
    return LoraSettings(
        directory=Path(args.lora_dir) if args.lora_dir else lora_dir(),
        allowed_dirs=tuple(Path(d.strip()) for d in args.lora_allowed_dirs.split(",") if d.strip()),
        max_upload_bytes=args.lora_max_bytes, max_loras=args.lora_max_adapters,
        max_stored_bytes=args.lora_max_stored_bytes, max_rank=args.lora_max_rank)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    db_url = shared_database_url(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    if args.api_key and not browser_ws_sendable(args.api_key):
        logging.getLogger("openai_frontend").warning(
            "the API key holds characters a browser cannot send on a WebSocket (only letters, digits and "
            "!#$%%&'*+-.^_`|~): browser pages, the playground's Realtime tab among them, cannot open "
            "/v1/realtime or /v1/audio/speech/stream with it; HTTP clients and SDKs are not affected")
    try:  # never an argument: argv shows in ps
        admin_key = triton_admin.key_from_env()
    except (triton_admin.AdminKeyError, OSError) as exc:
        raise SystemExit(f"openai_frontend: {triton_admin.ENV}/{triton_admin.ENV_FILE}: {exc}") from exc
    try:
        static, dns = parse_target(args.triton_url)
        pinned_index()
    except ValueError as exc:
        raise SystemExit(f"openai_frontend: {exc}") from exc
    wants_on_demand = [n.strip() for n in args.on_demand.split(",") if n.strip() not in ("", "none")]
    if wants_on_demand and (dns is not None or len(static) > 1):
        raise SystemExit("openai_frontend: --on-demand needs a single Triton (one host:port in --triton-url): "
                         "with several replicas each replica's `omni-triton serve --models` decides what it "
                         "holds; use --on-demand none")
    on_demand_args = on_demand_engine_args(args, models or [])
    engine = TritonEngine(args.triton_url, models=models, rpc_timeout_s=args.rpc_timeout,
                          admin_key=admin_key, resolve_interval_s=args.triton_resolve_interval_s,
                          health_interval_s=args.triton_health_interval_s, **on_demand_args)
    settings = Settings(
        max_inflight=args.max_inflight,
        default_max_input_chars=args.default_max_input_chars,
        max_body_bytes=args.max_body_bytes,
        max_upload_bytes=args.max_upload_bytes,
        max_fanout=args.max_fanout,
        api_key=args.api_key,
        auth_exempt_paths=tuple(p.strip() for p in args.auth_exempt_paths.split(",") if p.strip()),
        allowed_origins=tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip()),
        strict_params=args.strict_params,
        media_urls=UrlFetchPolicy(
            allowed_hosts=frozenset(h.strip().lower() for h in args.media_url_allowed_hosts.split(",") if h.strip()),
            max_bytes=args.media_url_max_bytes, timeout_s=args.media_url_timeout,
            trusted_networks=tuple(n.strip() for n in args.media_url_trusted_networks.split(",") if n.strip())),
        video=JobSettings(
            storage_dir=(Path(args.video_storage_dir) if args.video_storage_dir
                         else cache_dir() / "videos" / str(args.port)),
            max_queued=args.video_max_queued, max_running=args.video_max_running,
            retention_s=args.video_retention_s if args.video_retention_s > 0 else None,
            max_attempts=args.video_max_attempts,
            stall_timeout_s=args.video_stall_timeout_s if args.video_stall_timeout_s > 0 else None,
            purge_after_s=args.video_purge_after_s if args.video_purge_after_s > 0 else None,
            max_stored_jobs=args.video_max_stored_jobs, max_stored_bytes=args.video_max_stored_bytes,
            max_reference_bytes=args.video_max_reference_bytes, lease_s=args.video_lease_s),
        voices=VoiceSettings(
            storage_dir=(Path(args.voice_storage_dir) if args.voice_storage_dir
                         else cache_dir() / "voices" / str(args.port)),
            min_seconds=args.voice_min_seconds, max_seconds=args.voice_max_seconds,
            max_upload_bytes=args.voice_max_upload_bytes, require_consent=args.voice_consent == "required",
            max_voices=args.voice_max_voices, max_consents=args.voice_max_consents,
            max_stored_bytes=args.voice_max_stored_bytes, max_prompt_chars=args.voice_max_prompt_chars),
        media_url=args.media_url,
        batch_concurrency=args.batch_concurrency,
        transcription=TranscriptionSettings(default_model=args.transcription_model,
                                            max_audio_s=args.transcription_max_audio_s,
                                            concurrency=max(1, args.transcription_concurrency)),
        max_prompt_chars=args.max_prompt_chars,
        max_json_values=args.max_json_values,
        speech_stream_max_pending_chars=args.speech_stream_max_pending_chars,
        speech_stream_max_sessions=args.speech_stream_max_sessions,
        speech_stream_idle_timeout_s=args.speech_stream_idle_timeout_s,
        realtime_max_sessions=args.realtime_max_sessions,
        realtime_max_session_s=args.realtime_max_session_s,
        realtime_idle_timeout_s=args.realtime_idle_timeout_s,
        realtime_max_event_bytes=args.realtime_max_event_bytes,
        realtime_max_buffer_s=args.realtime_max_buffer_s,
        realtime_max_items=args.realtime_max_items,
        realtime_max_audio_s=args.realtime_max_audio_s,
        send_timeout_s=args.send_timeout_s,
        database_url=db_url,
        frontend_id=args.frontend_id,
        loras=lora_settings(args),
    )
    try:
        app = create_app(engine, settings)
    except (StorageLockedError, DatabaseError, MediaUrlError) as exc:
        sys.exit(f"openai_frontend: not starting: {exc}")
    # a WebSocket message is bounded like an HTTP body (the speech stream checks it again)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level.lower(),
                            ws_max_size=args.max_body_bytes)
    install_log_redaction()  # after uvicorn configured its loggers: no key in any logged URL
    install_quiet_stream_aborted()  # a raw-audio stream aborted on purpose: one warning, no traceback
    server = QuietServer(config)  # uvicorn.Server ticking once a second, not ten times: idle costs nothing
    server.run()
    if not server.started:
        sys.exit(3)  # what uvicorn.run exits with when the server could not start


if __name__ == "__main__":
    main()

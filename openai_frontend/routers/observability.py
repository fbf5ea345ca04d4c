"""``GET /health`` (200 only when Triton is live and every served model is READY, on-demand models
aside: they load at their first request) and ``/metrics``.

``/health``'s detail (models and their states, load errors, ``serve``'s restarts, crash
reasons and stub PIDs) goes only to callers who may see it (:func:`shows_detail`); anyone else
gets ``{"status": ...}`` with the same 200/503."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..auth import ApiKeyCheck, loopback_client
from ..engine import EngineError
from ..errors import public_message
from ..schemas import HealthStatus

router = APIRouter(tags=["observability"])


@router.get("/health", response_model=HealthStatus)
async def health(request: Request) -> JSONResponse:
    engine = request.app.state.engine
    live = await engine.is_live()
    models: dict[str, str] = {}
    reasons: dict[str, str] = {}
    on_demand: set[str] = set()
    message = None
    if live:
        try:
            infos = await engine.list_models()
            models = {m.name: m.state for m in infos}
            reasons = {m.name: m.reason for m in infos if m.reason}
            on_demand = {m.name for m in infos if m.on_demand}
        except EngineError as exc:
            live, message = False, exc.message
    else:
        message = "Triton is not live"
    # on-demand models load at their first request: not READY is their resting state
    not_ready = [name for name, state in models.items() if state != "READY" and name not in on_demand]
    if live and not models:
        message = "no models are served"
    ok = live and bool(models) and not not_ready
    if not_ready:
        message = "models not ready: " + ", ".join(
            f"{n} ({models[n]}" + (f": {reasons[n]}" if n in reasons else "") + ")" for n in not_ready
        )
    status = HealthStatus(
        status="ok" if ok else "unhealthy",
        triton_live=live,
        models=models,
        not_ready=not_ready,
        message=public_message(message) if message else None,  # no file paths
        serve=_serve_status(request),
        database=database.health() if (database := getattr(request.app.state, "database", None)) else None,
    )
    headers = None if ok else {"Retry-After": str(request.app.state.settings.retry_after_s)}
    body = status.model_dump() if shows_detail(request) else {"status": status.status}
    return JSONResponse(body, status_code=200 if ok else 503, headers=headers)


def shows_detail(request: Request) -> bool:
    """Whether ``/health`` answers this caller with its detail. With an API key configured:
    only requests that carry it (``/health`` itself stays open for probes, status only). Without
    one: only loopback clients (the developer's own machine, ``kubectl port-forward``, a compose
    health check); a remote caller of a keyless server learns the status, not PIDs or errors."""
    check: ApiKeyCheck = request.app.state.api_key_check
    if check.enabled:
        return check.authorized(request.scope)
    return loopback_client(request.scope)


def _serve_status(request: Request) -> dict[str, Any] | None:
    """``serve``'s supervision record (restarts, last crash reason, stub reloads), without the
    crash log's path (no file paths in answers)."""
    watch = getattr(request.app.state, "serve_watch", None)
    status = watch.health() if watch is not None else None
    if status and status.get("last_crash"):
        status = {**status, "last_crash": {k: v for k, v in status["last_crash"].items() if k != "log"}}
    return status


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

"""``GET /v1/models``: every served model (OpenAI list format), each with its output
``modalities`` (config parameter ``modalities``; speech models: ``audio``) and its ``state``:
``loaded``, ``loading``, ``unloaded`` (an on-demand model, loaded by its first request) or
``failed`` (with ``reason``). Served models that are not READY are listed too (an on-demand one
unloaded, a pinned one failed): docs/running.md "On-demand models"."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request

from ..engine import ModelInfo, ModelNotFoundError
from ..errors import public_message
from ..schemas import ModelCard, ModelList

router = APIRouter(tags=["models"])

ModelState = Literal["loaded", "loading", "unloaded", "failed"]


def model_state(m: ModelInfo) -> ModelState:
    """``/v1/models``' state of a model from its Triton (or on-demand) state: READY -> loaded,
    LOADING -> loading, FAILED (an on-demand load) -> failed, UNAVAILABLE -> failed unless Triton's
    reason is ``unloaded``; anything else (UNLOADED, MISSING...) -> unloaded."""
    if m.state == "READY":
        return "loaded"
    if m.state == "LOADING":
        return "loading"
    if m.state == "FAILED" or (m.state == "UNAVAILABLE" and m.reason.strip().lower() != "unloaded"):
        return "failed"
    return "unloaded"


def model_endpoints(m: ModelInfo) -> list[str]:
    """The API routes that serve ``m`` as their ``model`` (``ModelCard.endpoints``), from the
    same ``ModelInfo`` predicates the routes check: a model listed for a route is one that route
    accepts. Empty for internal stages (and for a model whose config is not known yet)."""
    routes = []
    if m.is_chat:
        routes.append("/v1/chat/completions")
        if m.can_speak:
            routes.append("/v1/realtime")
    if m.is_completion:
        routes.append("/v1/completions")
    if m.is_speech:
        routes.append("/v1/audio/speech")
    if m.is_transcription:
        routes.append("/v1/audio/transcriptions")
        if m.supports_translation:
            routes.append("/v1/audio/translations")
    if m.is_audio_generation:
        routes.append("/v1/audio/generate")
    if m.is_image:
        routes.append("/v1/images/edits" if m.is_image_edit else "/v1/images/generations")
    if m.is_video:
        routes += ["/v1/videos", "/v1/videos/sync"]
    return routes


def _card(m: ModelInfo, created: int) -> ModelCard:
    state = model_state(m)
    edit = m.is_image_edit
    return ModelCard(id=m.public_name, created=created,
                     modality=m.modality, modalities=list(m.output_modalities) or None,
                     max_model_len=m.max_model_len, state=state,
                     reason=public_message(m.reason) if m.reason and state != "loaded" else None,
                     endpoints=model_endpoints(m) or None,
                     max_input_images=(m.max_input_images or 1) if edit else None,
                     supports_mask=m.supports_mask if edit else None)


@router.get("/v1/models", response_model=ModelList, response_model_exclude_none=True)
async def list_models(request: Request) -> ModelList:
    state = request.app.state
    models = await state.engine.list_models()
    return ModelList(data=[_card(m, state.started_at) for m in models])


@router.get("/v1/models/{model_id}", response_model=ModelCard, response_model_exclude_none=True)
async def retrieve_model(model_id: str, request: Request) -> ModelCard:
    state = request.app.state
    for m in await state.engine.list_models():
        if model_id in (m.name, m.public_name):
            return _card(m, state.started_at)
    raise ModelNotFoundError(f"The model '{model_id}' does not exist", param="model")

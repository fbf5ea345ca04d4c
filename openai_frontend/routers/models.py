"""``GET /v1/models``: the served models that are READY in Triton (OpenAI list format)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..engine import ModelNotFoundError
from ..schemas import ModelCard, ModelList

router = APIRouter(tags=["models"])


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request) -> ModelList:
    state = request.app.state
    models = await state.engine.list_models()
    return ModelList(
        data=[ModelCard(id=m.name, created=state.started_at, modality=m.modality) for m in models if m.ready]
    )


@router.get("/v1/models/{model_id}", response_model=ModelCard)
async def retrieve_model(model_id: str, request: Request) -> ModelCard:
    state = request.app.state
    for m in await state.engine.list_models():
        if m.name == model_id and m.ready:
            return ModelCard(id=m.name, created=state.started_at, modality=m.modality)
    raise ModelNotFoundError(f"The model '{model_id}' does not exist", param="model")

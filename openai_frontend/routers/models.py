"""``GET /v1/models``: the served models that are READY in Triton (OpenAI list format), each
with its output ``modalities`` (config parameter ``modalities``; speech models: ``audio``)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..engine import ModelInfo, ModelNotFoundError
from ..schemas import ModelCard, ModelList

router = APIRouter(tags=["models"])


def _card(m: ModelInfo, created: int) -> ModelCard:
    return ModelCard(id=m.public_name, created=created,
                     modality=m.modality, modalities=list(m.output_modalities) or None,
                     max_model_len=m.max_model_len)


@router.get("/v1/models", response_model=ModelList, response_model_exclude_none=True)
async def list_models(request: Request) -> ModelList:
    state = request.app.state
    models = await state.engine.list_models()
    return ModelList(data=[_card(m, state.started_at) for m in models if m.ready])


@router.get("/v1/models/{model_id}", response_model=ModelCard, response_model_exclude_none=True)
async def retrieve_model(model_id: str, request: Request) -> ModelCard:
    state = request.app.state
    for m in await state.engine.list_models():
        if model_id in (m.name, m.public_name) and m.ready:
            return _card(m, state.started_at)
    raise ModelNotFoundError(f"The model '{model_id}' does not exist", param="model")

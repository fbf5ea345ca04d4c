"""``POST /v1/images/generations`` and ``POST /v1/images/edits``: bindings to ``serving.images``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..schemas import ImageGenerationRequest, ImagesResponse
from ..serving import images

router = APIRouter(tags=["images"])


@router.post("/v1/images/generations", response_model=ImagesResponse)
async def create_image(body: ImageGenerationRequest, request: Request) -> JSONResponse:
    return await images.create_image(body, request)


@router.post("/v1/images/edits", response_model=ImagesResponse)
async def edit_image(request: Request) -> JSONResponse:
    return await images.edit_image(request)

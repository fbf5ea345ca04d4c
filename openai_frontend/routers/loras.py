"""LoRA adapter registry (docs/lora.md): ``/v1/loras`` and vLLM's ``/v1/load_lora_adapter`` /
``/v1/unload_lora_adapter``: bindings to ``serving.loras``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..serving import loras

router = APIRouter(tags=["loras"])


@router.post("/v1/loras")
async def create_lora(request: Request) -> Response:
    return await loras.create_lora(request)


@router.get("/v1/loras")
async def list_loras(request: Request) -> Response:
    return await loras.list_loras(request)


@router.get("/v1/loras/{name}")
async def retrieve_lora(request: Request, name: str) -> Response:
    return await loras.retrieve_lora(request, name)


@router.delete("/v1/loras/{name}")
async def delete_lora(request: Request, name: str) -> Response:
    return await loras.delete_lora(request, name)


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: Request) -> Response:
    return await loras.load_lora_adapter(request)


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: Request) -> Response:
    return await loras.unload_lora_adapter(request)

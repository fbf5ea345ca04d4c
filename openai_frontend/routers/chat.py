"""``POST /v1/chat/completions`` and ``POST /v1/completions``: bindings to ``serving.chat``."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..schemas import ChatCompletionRequest, CompletionRequest
from ..serving import chat

router = APIRouter(tags=["chat"])


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(body: ChatCompletionRequest, request: Request):
    return await chat.create_chat_completion(body, request)


@router.post("/v1/completions", response_model=None)
async def create_completion(body: CompletionRequest, request: Request):
    return await chat.create_completion(body, request)

"""``POST /v1/chat/completions`` and ``POST /v1/completions``: bindings to ``serving.chat``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from ..serving import chat, tokenize

router = APIRouter(tags=["chat"])


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response | dict[str, Any]:
    return await chat.create_chat_completion(body, request)


@router.post("/v1/completions", response_model=None)
async def create_completion(body: CompletionRequest, request: Request) -> Response | dict[str, Any]:
    return await chat.create_completion(body, request)


@router.post("/tokenize", response_model=TokenizeResponse)
async def create_tokenize(body: TokenizeRequest, request: Request) -> Response:
    return await tokenize.tokenize(body, request)


@router.post("/detokenize", response_model=DetokenizeResponse)
async def create_detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    return await tokenize.detokenize(body, request)

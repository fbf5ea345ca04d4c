"""``WS /v1/realtime``: binding to ``serving.realtime`` (the OpenAI Realtime API, docs/realtime.md)."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from ..serving import realtime

router = APIRouter(tags=["realtime"])


@router.websocket("/v1/realtime")
async def realtime_ws(websocket: WebSocket) -> None:
    await realtime.realtime(websocket)

"""``POST /v1/audio/speech`` and ``GET /v1/audio/voices``: bindings to ``serving.speech``."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from ..schemas import SpeechRequest, VoiceList
from ..serving import speech
from ..serving.speech import StreamAborted  # noqa: F401 - raised out of raw-audio bodies

router = APIRouter(tags=["audio"])


@router.post("/v1/audio/speech", response_model=None)
async def create_speech(body: SpeechRequest, request: Request):
    return await speech.create_speech(body, request)


@router.get("/v1/audio/voices", response_model=VoiceList)
async def list_voices(request: Request, model: str | None = Query(default=None)):
    return await speech.list_voices(request.app.state.engine, model)

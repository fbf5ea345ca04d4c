"""``/v1/audio/speech`` (+ ``/batch``, WebSocket ``/stream``), ``/v1/audio/voices``,
``/v1/audio/voice_consents``, ``/v1/audio/transcriptions``, ``/v1/audio/translations`` and
``/v1/audio/generate`` (text-to-audio): bindings to ``serving.speech``, ``serving.speech_stream``,
``serving.voices``, ``serving.transcriptions`` and ``serving.audio_generate``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request, WebSocket
from fastapi.responses import Response

from ..schemas import AudioGenerateRequest, SpeechBatchRequest, SpeechRequest, VoiceList
from ..serving import audio_generate, speech, speech_stream, transcriptions, voices
from ..serving.speech import StreamAborted  # noqa: F401 - raised out of raw-audio bodies

router = APIRouter(tags=["audio"])


@router.post("/v1/audio/speech", response_model=None)
async def create_speech(body: SpeechRequest, request: Request) -> Response:
    return await speech.create_speech(body, request)


@router.post("/v1/audio/speech/batch", response_model=None)
async def create_speech_batch(body: SpeechBatchRequest, request: Request) -> dict[str, Any]:
    return await speech_stream.create_batch(body, request)


@router.websocket("/v1/audio/speech/stream")
async def speech_stream_ws(websocket: WebSocket) -> None:
    await speech_stream.speech_stream(websocket)


@router.post("/v1/audio/transcriptions", response_model=None)
async def create_transcription(request: Request) -> Response:
    return await transcriptions.create_transcription(request, "transcribe")


@router.post("/v1/audio/translations", response_model=None)
async def create_translation(request: Request) -> Response:
    return await transcriptions.create_transcription(request, "translate")


@router.get("/v1/audio/voices", response_model=VoiceList)
async def list_voices(request: Request, model: str | None = Query(default=None)) -> VoiceList:
    return await voices.list_voices(request.app.state, model)


@router.post("/v1/audio/voices", response_model=None)
async def create_voice(request: Request) -> dict[str, Any]:
    return await voices.create_voice(request)


@router.delete("/v1/audio/voices/{voice_id}", response_model=None)
async def delete_voice(request: Request, voice_id: str) -> dict[str, Any]:
    return await voices.delete_voice(request, voice_id)


@router.post("/v1/audio/voice_consents", response_model=None)
async def create_consent(request: Request) -> dict[str, Any]:
    return await voices.create_consent(request)


@router.get("/v1/audio/voice_consents", response_model=None)
async def list_consents(request: Request, after: str | None = Query(default=None),
                        limit: int = Query(default=20, ge=1, le=100)) -> dict[str, Any]:
    return await voices.list_consents(request, after, limit)


@router.get("/v1/audio/voice_consents/{consent_id}", response_model=None)
async def get_consent(request: Request, consent_id: str) -> dict[str, Any]:
    return await voices.get_consent(request, consent_id)


@router.post("/v1/audio/voice_consents/{consent_id}", response_model=None)
async def update_consent(request: Request, consent_id: str) -> dict[str, Any]:
    return await voices.update_consent(request, consent_id)


@router.delete("/v1/audio/voice_consents/{consent_id}", response_model=None)
async def delete_consent(request: Request, consent_id: str) -> dict[str, Any]:
    return await voices.delete_consent(request, consent_id)


@router.post("/v1/audio/generate", response_model=None)
async def create_audio_generation(body: AudioGenerateRequest, request: Request) -> Response:
    return await audio_generate.create_audio(body, request)

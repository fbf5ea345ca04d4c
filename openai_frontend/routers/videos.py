"""``/v1/videos`` (jobs) and ``/v1/videos/sync``: bindings to ``serving.videos``."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from ..serving import videos

router = APIRouter(tags=["videos"])


@router.post("/v1/videos")
async def create_video(request: Request) -> Response:
    return await videos.create_video(request)


@router.post("/v1/videos/sync")
async def create_video_sync(request: Request) -> Response:
    return await videos.create_video_sync(request)


@router.get("/v1/videos")
async def list_videos(request: Request, limit: int = Query(20, ge=1, le=100), after: str | None = None,
                      order: Literal["asc", "desc"] = "desc") -> Response:
    return await videos.list_videos(request, limit, after, order)


@router.get("/v1/videos/{video_id}")
async def retrieve_video(request: Request, video_id: str) -> Response:
    return await videos.retrieve_video(request, video_id)


@router.get("/v1/videos/{video_id}/content")
async def video_content(request: Request, video_id: str, variant: Literal["video"] = "video") -> Response:
    return await videos.video_content(request, video_id, variant)


@router.delete("/v1/videos/{video_id}")
async def delete_video(request: Request, video_id: str) -> Response:
    return await videos.delete_video(request, video_id)

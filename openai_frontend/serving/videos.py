"""``/v1/videos``: asynchronous video jobs (vLLM-Omni's videos API and the OpenAI SDK's
``client.videos``) and ``POST /v1/videos/sync`` (the MP4 bytes in the response).

Request fields (multipart form, or a JSON body): ``prompt`` (required), ``model``, ``seconds``,
``size`` (``WxH``), ``width``, ``height``, ``num_frames``, ``fps``, ``num_inference_steps``,
``guidance_scale``, ``guidance_scale_2``, ``boundary_ratio``, ``flow_shift``, ``seed``,
``negative_prompt``, ``input_reference`` (an image upload: image-to-video models only). Limits
come from the model's config parameters (``docs/video_contracts.md``).

Frames: ``num_frames`` when given (must be ``4k + 1``); else ``seconds * fps`` frames are put in
the MP4 (the model generates the next ``4k + 1`` count and the extra frames are dropped, so the
MP4 lasts exactly ``seconds``); else the model's ``default_frames``. ``seconds`` together with
``num_frames`` must agree at the fps (given or the model's default): else a 400
``conflicting_duration`` (nothing is silently dropped).

Image-to-video: ``input_reference`` (a file part; what the OpenAI SDK's ``videos.create`` sends)
picks the served image-to-video model when ``model`` is absent and is required by one; a
text-to-video model refuses it. The upload is decoded with Pillow (at most the model's
``max_input_image_bytes`` / ``max_input_image_pixels``), EXIF-rotated, converted to RGB,
centre-cropped to the video's aspect ratio and resized to its size (Lanczos, ``ImageOps.fit``:
nothing stretched, so ``WanImageToVideoPipeline``'s own resize is a no-op). Without a size the
video takes the image's aspect ratio at the model's default area (multiples of 16), as the
diffusers Wan I2V example does.
"""

from __future__ import annotations

import math
import secrets
import time
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from omni_triton.contracts import video as vc
from omni_triton.media.image import (
    ImageTooLargeError,
    InvalidImageError,
    decode_image,
    fit_image,
    png_base64,
    size_for_aspect,
)
from omni_triton.media.video import MIME_TYPE, encode_mp4

from ..engine import InferenceError, ModelInfo, VideoJob, parse_size
from ..errors import OpenAIError, bad_request
from ..media_store import MediaFileResponse
from ..offload import off_loop
from ..schemas import Text
from ..video_jobs import COMPLETED, EXPIRED, FAILED, JobQuotaError, VideoJobs, VideoRequest
from .common import AdmittedRequest, ModelKind, read_form, read_json_object, resolve_model, until_disconnect

VIDEO = ModelKind("video", lambda m: m.is_video)
TEXT_TO_VIDEO = ModelKind("text-to-video", lambda m: m.is_video and not m.is_image_to_video)
IMAGE_TO_VIDEO = ModelKind("image-to-video", lambda m: m.is_image_to_video)
#: ``input_reference`` caps when the model's config does not set them
MAX_INPUT_IMAGE_BYTES = 10 << 20
MAX_INPUT_IMAGE_PIXELS = 4096 * 4096
MAX_FORM_FIELDS = 32
MAX_FIELD_BYTES = 64 << 10
MAX_SEED = 2**63 - 1


class VideoCreateForm(BaseModel):
    """The fields of ``POST /v1/videos`` (form strings are coerced to the types below)."""

    model_config = ConfigDict(extra="forbid")

    prompt: Text = Field(min_length=1, max_length=20000)
    model: Text | None = None
    seconds: float | None = Field(default=None, gt=0, le=600, allow_inf_nan=False)
    size: Text | None = None
    width: int | None = Field(default=None, ge=1)
    height: int | None = Field(default=None, ge=1)
    num_frames: int | None = Field(default=None, ge=1)
    fps: int | None = Field(default=None, ge=1)
    num_inference_steps: int | None = Field(default=None, ge=1)
    guidance_scale: float | None = Field(default=None, ge=0, le=vc.MAX_GUIDANCE_SCALE, allow_inf_nan=False)
    guidance_scale_2: float | None = Field(default=None, ge=0, le=vc.MAX_GUIDANCE_SCALE, allow_inf_nan=False)
    boundary_ratio: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    flow_shift: float | None = Field(default=None, gt=0, le=100, allow_inf_nan=False)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    negative_prompt: Text | None = Field(default=None, max_length=20000)


def _param(info: ModelInfo, key: str, default: Any, kind: type[int] | type[float] = int) -> Any:
    try:
        return kind(info.parameters[key]) if info.parameters.get(key) else default
    except ValueError:
        return default


def _size(body: VideoCreateForm, info: ModelInfo, image: NDArray[Any] | None = None) -> tuple[int, int]:
    """(width, height) from ``width``/``height``, else ``size``, else the model's default (for an
    image-to-video request: the image's aspect ratio at the default's area)."""
    default = info.default_size or (32, 32)
    width, height = default
    if image is not None and body.size is None and body.width is None and body.height is None:
        width, height = size_for_aspect(image.shape[1], image.shape[0], default[0] * default[1],
                                        _param(info, "size_multiple", 16), _param(info, "max_size", 1280))
    if body.size is not None:
        parsed = parse_size(body.size)  # ASCII digits only ("²x²" passed str.isdigit, then int() raised)
        if parsed is None:
            raise bad_request(f"size={body.size!r}: must be WIDTHxHEIGHT, e.g. '{default[0]}x{default[1]}'",
                              param="size", code="invalid_size")
        width, height = parsed
    width = body.width if body.width is not None else width
    height = body.height if body.height is not None else height
    multiple = _param(info, "size_multiple", 16)
    max_size = _param(info, "max_size", 1280)
    for name, v in (("width", width), ("height", height)):
        if v < multiple or v > max_size or v % multiple:
            raise bad_request(f"{name}={v}: the model '{info.public_name}' needs a multiple of {multiple} in "
                              f"[{multiple}, {max_size}]", param="size" if body.size and getattr(body, name) is None
                              else name, code="invalid_size")
    return width, height


def _frames(body: VideoCreateForm, info: ModelInfo, fps: int) -> tuple[int, int]:
    """(frames to generate, frames to keep in the MP4)."""
    multiple = _param(info, "frame_multiple", 4)
    max_frames = _param(info, "max_frames", 81)
    if body.num_frames is not None:
        n = body.num_frames
        if (n - 1) % multiple or n > max_frames:
            raise bad_request(f"num_frames={n}: the model '{info.public_name}' needs {multiple}k+1 frames, at most "
                              f"{max_frames}", param="num_frames", code="invalid_num_frames")
        if body.seconds is not None and round(body.seconds * fps) != n:
            given = "" if body.fps is not None else " (the model's default; none was given)"
            raise bad_request(f"seconds={body.seconds:g}, num_frames={n} and fps={fps}{given} conflict: {n} frames "
                              f"at {fps} fps last {n / fps:g} s. Give num_frames (+ fps) or seconds (+ fps), or "
                              f"all three consistent (num_frames = seconds * fps)", param="num_frames",
                              code="conflicting_duration")
        return n, n
    if body.seconds is not None:
        keep = round(body.seconds * fps)
        if keep < 1:
            raise bad_request(f"seconds={body.seconds} at {fps} fps is less than one frame", param="seconds",
                              code="invalid_seconds")
        n = multiple * math.ceil((keep - 1) / multiple) + 1
        if n > max_frames:
            raise bad_request(f"seconds={body.seconds} at {fps} fps needs {n} frames; the model '{info.public_name}' "
                              f"makes at most {max_frames} ({(max_frames / fps):g} s at {fps} fps)",
                              param="seconds", code="invalid_seconds")
        return n, keep
    n = _param(info, "default_frames", multiple + 1)
    return n, n


def plan(body: VideoCreateForm, info: ModelInfo, image: NDArray[Any] | None = None) -> VideoRequest:
    """Validate ``body`` against the model's limits; the job to store and run. ``image``:
    the decoded ``input_reference`` (``uint8 [H, W, 3]``) of an image-to-video request; it is
    fitted to the video's size (:func:`omni_triton.media.image.fit_image`) and stored with the job.

    Raises:
        OpenAIError: 400 naming the first bad field.
    """
    max_fps = _param(info, "max_fps", 60)
    fps = body.fps if body.fps is not None else _param(info, "default_fps", 16)
    if fps > max_fps:
        raise bad_request(f"fps={fps}: at most {max_fps}", param="fps", code="invalid_fps")
    width, height = _size(body, info, image)
    num_frames, keep = _frames(body, info, fps)
    steps = body.num_inference_steps if body.num_inference_steps is not None else _param(info, "default_steps", 4)
    max_steps = _param(info, "max_steps", 50)
    if not vc.MIN_INFERENCE_STEPS <= steps <= max_steps:
        raise bad_request(f"num_inference_steps={steps}: must be in [{vc.MIN_INFERENCE_STEPS}, {max_steps}]",
                          param="num_inference_steps", code="invalid_num_inference_steps")
    if not body.prompt.strip():
        raise bad_request("prompt is empty", param="prompt", code="invalid_value")
    guidance = body.guidance_scale if body.guidance_scale is not None else _param(
        info, "default_guidance_scale", 5.0, float)
    seed = body.seed if body.seed is not None else secrets.randbelow(2**31)  # stored: a resume reuses it
    job = VideoJob(prompt=body.prompt, width=width, height=height, num_frames=num_frames, steps=steps, seed=seed,
                   negative_prompt=body.negative_prompt or "", guidance_scale=guidance,
                   guidance_scale_2=body.guidance_scale_2, boundary_ratio=body.boundary_ratio,
                   flow_shift=body.flow_shift,
                   input_reference=png_base64(fit_image(image, width, height)) if image is not None else None)
    return VideoRequest(model=info.name, job=job, fps=fps, keep_frames=keep)


async def _read_body(request: Request) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The request's fields (multipart form or JSON) and its file parts (name -> bytes; the
    whole body is capped by the frontend's ``--max-body-bytes``)."""
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("application/json"):
        data = await read_json_object(request)
        return {k: v for k, v in data.items() if v is not None}, {}
    if not (content_type.startswith("multipart/form-data") or
            content_type.startswith("application/x-www-form-urlencoded")):
        raise bad_request("POST /v1/videos takes multipart/form-data (or JSON) with 'prompt', ...",
                          code="invalid_content_type")
    form = await read_form(request, max_files=4, max_fields=MAX_FORM_FIELDS, max_part_size=MAX_FIELD_BYTES)
    try:
        fields: dict[str, str] = {}
        files: dict[str, bytes] = {}
        for key, value in form.multi_items():
            if not isinstance(value, str):
                if key in files:
                    raise bad_request(f"File '{key}' given more than once", param=key)
                files[key] = await value.read()
            elif key in fields:
                raise bad_request(f"Field '{key}' given more than once", param=key)
            else:
                fields[key] = value
        return fields, files
    finally:
        await form.close()


def _data_url_bytes(url: Any) -> bytes:
    """The bytes of a ``data:image/...;base64,...`` URL (remote URLs are not fetched).

    Raises:
        OpenAIError: 400 ``invalid_input_reference`` for anything else.
    """
    import base64
    import binascii

    head, sep, payload = url.partition(",") if isinstance(url, str) else ("", "", "")
    if not sep or not head.startswith("data:") or not head.endswith(";base64"):
        raise bad_request("input_reference.image_url must be a data:image/...;base64,... URL (remote URLs are not "
                          "fetched)", param="input_reference", code="invalid_input_reference")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("input_reference.image_url: invalid base64", param="input_reference",
                          code="invalid_input_reference") from None


def decode_reference(data: bytes, info: ModelInfo) -> NDArray[Any]:
    """The ``input_reference`` upload -> ``uint8 [H, W, 3]`` RGB (EXIF orientation applied).

    Raises:
        OpenAIError: 400 ``input_reference_too_large`` over the model's ``max_input_image_bytes``
            or ``max_input_image_pixels``, 400 ``invalid_input_reference`` for anything Pillow
            cannot decode (empty, truncated, not an image).
    """
    max_bytes = _param(info, "max_input_image_bytes", MAX_INPUT_IMAGE_BYTES)
    if len(data) > max_bytes:
        raise bad_request(f"input_reference is {len(data)} bytes; the model '{info.public_name}' "
                          f"takes at most {max_bytes}",
                          param="input_reference", code="input_reference_too_large")
    try:
        return decode_image(data, _param(info, "max_input_image_pixels", MAX_INPUT_IMAGE_PIXELS), exif_transpose=True)
    except ImageTooLargeError as exc:
        raise bad_request(f"input_reference: {exc}", param="input_reference",
                          code="input_reference_too_large") from None
    except InvalidImageError as exc:
        raise bad_request(f"input_reference: {exc}", param="input_reference", code="invalid_input_reference") from None


async def _parse(request: Request) -> VideoRequest:
    fields, files = await _read_body(request)
    if "prompt" not in fields:
        raise bad_request("Missing required parameter: 'prompt'", param="prompt", code="invalid_value")
    if "lora" in fields:
        raise bad_request("'lora' is not supported by this server", param="lora", code="unsupported_parameter")
    for name in files:
        if name != "input_reference":
            raise bad_request(f"Unexpected file field '{name}'", param=name)
    reference = files.get("input_reference")
    url = fields.pop("input_reference[image_url]", None)  # the SDK's {"image_url": ...} in a form
    given = fields.pop("input_reference", None)
    if isinstance(given, dict):  # JSON body: {"image_url": ...}
        url = given.get("image_url")
        if url is None:
            raise bad_request("input_reference: only an uploaded file or {'image_url': 'data:image/...;base64,...'} "
                              "is supported (no file_id)", param="input_reference", code="invalid_input_reference")
    elif given is not None:
        raise bad_request("input_reference must be an image file part (multipart/form-data upload) or "
                          "{'image_url': 'data:...'}", param="input_reference", code="invalid_input_reference")
    if url is not None:
        if reference is not None:
            raise bad_request("input_reference given twice", param="input_reference", code="invalid_input_reference")
        reference = await off_loop(_data_url_bytes, url)
    try:
        body = VideoCreateForm.model_validate(fields)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
    engine = request.app.state.engine
    if body.model is None and reference is not None:
        served = [m for m in await engine.list_models() if m.ready and IMAGE_TO_VIDEO.accepts(m)]
        if not served:
            raise bad_request("'input_reference' needs an image-to-video model and none is served",
                              param="input_reference", code="unsupported_input_reference")
    kind = VIDEO if body.model is not None else IMAGE_TO_VIDEO if reference is not None else TEXT_TO_VIDEO
    info = await resolve_model(engine, body.model, kind)
    if reference is not None and not info.is_image_to_video:
        others = [m.name for m in await engine.list_models() if m.ready and IMAGE_TO_VIDEO.accepts(m)]
        raise bad_request(f"The model '{info.public_name}' is text-to-video and takes no 'input_reference' ("
                          + (f"image-to-video: {', '.join(others)}" if others else "no image-to-video model is served")
                          + ")", param="input_reference", code="unsupported_input_reference")
    if reference is None and info.is_image_to_video:
        raise bad_request(f"The model '{info.public_name}' is image-to-video and needs an 'input_reference' image "
                          "(multipart file part)", param="input_reference", code="missing_input_reference")
    if reference is None:
        return plan(body, info)
    # decode, EXIF-rotate, fit (crop + Lanczos resize) and PNG-encode: off the loop, one call
    return await off_loop(lambda: plan(body, info, decode_reference(reference, info)))


def _jobs(request: Request) -> VideoJobs:
    jobs: VideoJobs | None = getattr(request.app.state, "video_jobs", None)
    if jobs is None:
        raise OpenAIError(503, "video jobs are not enabled on this server", type="server_error",
                          code="videos_disabled")
    return jobs


def _not_found(video_id: str) -> OpenAIError:
    return OpenAIError(404, f"No video found with id '{video_id}'", param="video_id", code="video_not_found")


async def create_video(request: Request) -> JSONResponse:
    """``POST /v1/videos``: queue a job (200 with the ``video`` object, ``status: queued``);
    429 + ``Retry-After`` when ``--video-max-queued`` jobs wait already; 400 ``quota_exceeded``
    when ``--video-max-stored-jobs`` / ``--video-max-stored-bytes`` are reached (retrying does not
    help until jobs are deleted or purged), 400 ``input_reference_too_large`` past
    ``--video-max-reference-bytes``."""
    jobs = _jobs(request)
    req = await _parse(request)
    try:
        rec = await off_loop(jobs.create, req)  # writes the request (reference image) + fsync
    except JobQuotaError as exc:
        request.app.state.metrics.video_requests.labels(req.model, "jobs", "rejected").inc()
        if exc.limit == "max_reference_bytes":
            raise bad_request(str(exc), param="input_reference", code="input_reference_too_large") from None
        raise bad_request(str(exc), code="quota_exceeded") from None
    request.app.state.metrics.video_requests.labels(req.model, "jobs", "ok" if rec else "rejected").inc()
    if rec is None:
        raise OpenAIError(429, f"{jobs.settings.max_queued} video jobs are queued already; retry later",
                          type="rate_limit_error", code="video_queue_full",
                          headers={"Retry-After": str(jobs.settings.retry_after_s)})
    return JSONResponse(jobs.to_openai(rec))


async def retrieve_video(request: Request, video_id: str) -> JSONResponse:
    jobs = _jobs(request)
    rec = await off_loop(jobs.get, video_id)  # a database read; a job past its retention is expired
    if rec is None:
        raise _not_found(video_id)
    return JSONResponse(jobs.to_openai(rec))


async def list_videos(request: Request, limit: int = 20, after: str | None = None, order: str = "desc") -> JSONResponse:
    if not 1 <= limit <= 100:
        raise bad_request(f"limit={limit}: must be in [1, 100]", param="limit", code="invalid_value")
    if order not in ("asc", "desc"):
        raise bad_request(f"order={order!r}: must be 'asc' or 'desc'", param="order", code="invalid_value")
    jobs = _jobs(request)
    try:
        records, more = await off_loop(jobs.store.list, limit, after, order)
    except KeyError:
        raise bad_request(f"after={(after or '')[:64]!r}: no such video", param="after", code="invalid_value") from None
    data = [jobs.to_openai(r) for r in records]
    return JSONResponse({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None, "has_more": more})


async def delete_video(request: Request, video_id: str) -> JSONResponse:
    """``DELETE /v1/videos/{id}``: stops a running job (its denoiser stops at the next step) and
    removes the job and its files."""
    if not await _jobs(request).delete(video_id):
        raise _not_found(video_id)
    return JSONResponse({"id": video_id, "object": "video.deleted", "deleted": True})


async def video_content(request: Request, video_id: str, variant: str = "video") -> Response:
    """``GET /v1/videos/{id}/content``: the MP4 of a completed job, streamed from the media store
    (``Range`` requests answered with 206); 409 while it is queued or running, 410 once expired
    (or its file is gone), 404 unknown, 400 for variants other than ``video``, 400/416 for a bad
    ``Range``."""
    if variant != "video":
        raise bad_request(f"variant={variant!r}: only 'video' is available", param="variant", code="invalid_value")
    jobs = _jobs(request)
    rec = await off_loop(jobs.get, video_id)
    if rec is None:
        raise _not_found(video_id)
    if rec.status == EXPIRED:
        raise OpenAIError(410, rec.error["message"] if rec.error else "the video expired", code="video_expired")
    if rec.status == FAILED:
        raise OpenAIError(409, f"The video job failed: {rec.error['message'] if rec.error else 'unknown'}",
                          code="video_failed")
    if rec.status != COMPLETED:
        raise OpenAIError(409, f"The video is not ready (status {rec.status}, progress {rec.progress}%)",
                          code="video_not_ready")
    mp4 = await off_loop(jobs.video_file, video_id)
    if mp4 is None:
        raise OpenAIError(410, "the video file is gone", code="video_expired")
    _check_range(request.headers.get("range"), mp4.size)
    local = jobs.media.local_path(mp4.key)
    if local is not None:  # a local folder: Starlette's own file response (sendfile where the server has it)
        return FileResponse(local, media_type=MIME_TYPE, filename=f"{video_id}.mp4")
    return MediaFileResponse(jobs.media, mp4, MIME_TYPE, f"{video_id}.mp4")


def _check_range(header: str | None, size: int) -> None:
    """A ``Range`` header that ``FileResponse`` would refuse, refused first in the OpenAI error
    shape (Starlette answers those with a plain-text 400/416 of its own). Parsed by Starlette's
    own parser, so both agree on what is valid.

    Raises:
        OpenAIError: 400 ``invalid_range`` (malformed: ``bytes=²-``, ``bytes=5-1``, not bytes),
            416 ``range_not_satisfiable`` + ``Content-Range: bytes */<size>``.
    """
    if header is None:
        return
    from starlette import responses

    try:
        FileResponse._parse_range_header(header, size)
    except responses.MalformedRangeHeader as exc:
        raise OpenAIError(400, f"Range {header!r}: {exc.content or 'malformed'}", param="Range",
                          code="invalid_range") from None
    except responses.RangeNotSatisfiable:
        raise OpenAIError(416, f"Range {header!r} is outside the {size} bytes of the video", param="Range",
                          code="range_not_satisfiable", headers={"Content-Range": f"bytes */{size}"}) from None


async def create_video_sync(request: Request) -> Response:
    """``POST /v1/videos/sync``: generate now (one admission slot) and answer the MP4 bytes; a
    client that leaves cancels the generation."""
    req = await _parse(request)
    engine = request.app.state.engine
    metrics = request.app.state.metrics
    result: dict[str, Any] = {}

    async def work() -> None:
        frames = None
        async for event in engine.generate_video(req.model, req.job):
            if event.frames is not None:
                frames = event.frames
        if frames is None:  # as TritonEngine.generate_video raises it
            raise InferenceError(f"{req.model}: the stream ended without frames")
        result["frames"] = frames[: req.keep_frames]
        result["data"] = await off_loop(encode_mp4, result["frames"], req.fps)

    def record(outcome: str) -> None:
        metrics.video_requests.labels(req.model, "sync", outcome).inc()

    t0 = time.perf_counter()
    async with AdmittedRequest(request.app.state, record) as admitted:
        if not await until_disconnect(request, work()):
            admitted.outcome = "cancelled"
            return Response(status_code=499)
    return Response(result["data"], media_type=MIME_TYPE,
                    headers={"x-video-frames": str(len(result["frames"])), "x-video-fps": str(req.fps),
                             "x-generation-seconds": f"{time.perf_counter() - t0:.3f}"})

"""``POST /v1/images/generations`` (JSON) and ``POST /v1/images/edits`` (multipart).

Both run a diffusion ensemble (docs/image_contracts.md) through ``Engine.generate_images``: the
``n`` images of a request are ``n`` Triton requests in flight at once (image ``i`` has seed
``seed + i``), so Triton's dynamic batchers batch them with each other and with other clients'
images. The response is OpenAI's ``{created, data: [{b64_json, revised_prompt}], usage}`` plus
``output_format``/``size`` (as gpt-image-1 returns them) and the extensions ``data[].seed`` and
``usage.num_inference_steps``/``usage.denoise_seconds`` (also as ``X-Denoise-Steps`` and
``X-Denoise-Seconds`` headers).
"""

from __future__ import annotations

import asyncio
import dataclasses
import base64
import logging
import secrets
import time

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from omni_triton.media.image import InvalidImageError, UnsupportedImageFormatError, decode_image, encode_image, normalise_format

from ..engine import ImageJob, InvalidRequestError, ModelInfo
from ..errors import OpenAIError, bad_request
from ..schemas import ImageData, ImageGenerationRequest, ImagesResponse, ImageUsage

#: omni_triton.stages.diffusion.MIN_INFERENCE_STEPS (not imported: that module imports torch)
MIN_INFERENCE_STEPS = 2

logger = logging.getLogger(__name__)
router = APIRouter(tags=["images"])

#: prompt length limit (characters; gpt-image-1's documented limit)
MAX_PROMPT_CHARS = 32000


class ImageEditForm(ImageGenerationRequest):
    """The non-file fields of ``POST /v1/images/edits`` (validated like the JSON body of
    generations; ``input_fidelity`` is accepted and ignored)."""

    input_fidelity: str | None = None


async def _resolve_model(engine, name: str | None, edit: bool) -> ModelInfo:
    kind = "image-edit" if edit else "text-to-image"
    if name is None:
        models = [m for m in await engine.list_models()
                  if m.ready and m.is_image and m.is_image_edit == edit]
        if len(models) != 1:
            raise bad_request(f"'model' is required when the server serves {len(models)} {kind} models "
                              f"({', '.join(m.name for m in models) or 'none'})",
                              param="model", code="model_required")
        return models[0]
    info = await engine.get_model(name)
    if not info.is_image or info.is_image_edit != edit:
        raise bad_request(f"The model '{name}' is not a {kind} model", param="model",
                          code="model_not_supported")
    return info


def _size(body: ImageGenerationRequest, info: ModelInfo) -> tuple[int, int]:
    """(width, height) from ``size`` ("WxH" or "auto"), checked against the model."""
    default = info.default_size or (64, 64)
    if body.size is None or body.size == "auto":
        return default
    parts = body.size.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise bad_request(f"Invalid size '{body.size}': expected 'WIDTHxHEIGHT' (e.g. "
                          f"'{default[0]}x{default[1]}') or 'auto'", param="size", code="invalid_size")
    width, height = int(parts[0]), int(parts[1])
    m, top = info.size_multiple, info.max_size or 1024
    for v in (width, height):
        if v < m or v > top or v % m:
            raise bad_request(f"Invalid size '{body.size}': width and height must be multiples of {m} "
                              f"in [{m}, {top}] for the model '{info.name}'", param="size",
                              code="invalid_size")
    return width, height


def _plan(body: ImageGenerationRequest, info: ModelInfo) -> tuple[ImageJob, str]:
    """Validate ``body`` against the model; return the job (without image) and the format."""
    if not body.prompt.strip():
        raise bad_request("'prompt' must not be empty", param="prompt", code="empty_prompt")
    if len(body.prompt) > MAX_PROMPT_CHARS:
        raise bad_request(f"'prompt' is {len(body.prompt)} characters; at most {MAX_PROMPT_CHARS}",
                          param="prompt", code="prompt_too_long")
    if "\x00" in body.prompt or (body.negative_prompt and "\x00" in body.negative_prompt):
        raise bad_request("prompts must not contain NUL characters", param="prompt",
                          code="invalid_characters")
    max_n = info.max_images or 1
    if not 1 <= body.n <= max_n:
        raise bad_request(f"'n' must be between 1 and {max_n} for the model '{info.name}'",
                          param="n", code="invalid_n")
    if body.response_format not in (None, "b64_json"):
        raise bad_request(f"Unsupported response_format '{body.response_format}': only 'b64_json' "
                          "(this server does not host image URLs)", param="response_format",
                          code="unsupported_format")
    if body.stream:
        raise bad_request("Streaming partial images is not supported", param="stream")
    try:
        fmt = normalise_format(body.output_format)
    except UnsupportedImageFormatError as exc:
        raise bad_request(str(exc), param="output_format", code="unsupported_format") from None
    steps = body.num_inference_steps if body.num_inference_steps is not None else (info.default_steps or 2)
    max_steps = info.max_steps or 50
    if not MIN_INFERENCE_STEPS <= steps <= max_steps:
        # one step gives NaN latents in diffusers' flow-match pipelines (a black image)
        raise bad_request(f"'num_inference_steps' must be between {MIN_INFERENCE_STEPS} and {max_steps}",
                          param="num_inference_steps", code="invalid_value")
    width, height = _size(body, info)
    cfg = body.true_cfg_scale if body.true_cfg_scale is not None else (info.default_true_cfg_scale or 4.0)
    job = ImageJob(prompt=body.prompt, width=width, height=height, steps=steps,
                   seed=body.seed if body.seed is not None else secrets.randbits(31), n=body.n,
                   negative_prompt=body.negative_prompt or None, true_cfg_scale=cfg,
                   guidance_scale=body.guidance_scale)
    return job, fmt


async def generate(request: Request, info: ModelInfo, job: ImageJob, fmt: str,
                   compression: int | None, api: str):
    """Run ``job`` on the image model ``info`` under admission control and encode the images.

    Shared by the images APIs and by chat completions on a diffusion model (``api`` labels the
    request metric). Returns ``(images, encoded, steps, seconds)``: the ``GeneratedImage`` list,
    their ``EncodedImage`` files in ``fmt``, the denoising step count and the denoiser seconds
    (images batched together share one denoiser call, whose time is counted once).
    """
    state = request.app.state
    metrics = state.metrics
    try:
        slot = state.admission.acquire()
    except OpenAIError:
        metrics.rejected.inc()
        raise
    outcome = "error"
    try:
        images = await state.engine.generate_images(info.name, job)
        encoded = [await asyncio.to_thread(encode_image, im.pixels, fmt, compression) for im in images]
        outcome = "ok"
    except (OpenAIError, InvalidRequestError):
        outcome = "invalid_input"  # a client error, not a server one
        raise
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    finally:
        metrics.image_requests.labels(info.name, api, outcome).inc()
        slot.release()
    metrics.images.labels(info.name).inc(len(images))
    steps = images[0].steps if images else 0
    # images batched together share one denoiser call: count each call's time once
    seconds = round(sum(set(im.denoise_seconds for im in images)), 6)
    return images, encoded, steps, seconds


async def _run(request: Request, info: ModelInfo, job: ImageJob, fmt: str, compression: int | None,
               api: str) -> JSONResponse:
    images, encoded, steps, seconds = await generate(request, info, job, fmt, compression, api)
    n_chars = len(job.prompt)
    body = ImagesResponse(
        created=int(time.time()),
        data=[ImageData(b64_json=base64.b64encode(e.data).decode("ascii"), revised_prompt=job.prompt,
                        seed=im.seed) for e, im in zip(encoded, images)],
        output_format=fmt,
        size=f"{job.width}x{job.height}",
        usage=ImageUsage(input_tokens=n_chars, total_tokens=n_chars, num_inference_steps=steps,
                         denoise_seconds=seconds),
    )
    return JSONResponse(body.model_dump(), headers={"X-Denoise-Steps": str(steps),
                                                    "X-Denoise-Seconds": f"{seconds:.6f}"})


@router.post("/v1/images/generations", response_model=ImagesResponse)
async def create_image(body: ImageGenerationRequest, request: Request):
    info = await _resolve_model(request.app.state.engine, body.model, edit=False)
    job, fmt = _plan(body, info)
    return await _run(request, info, job, fmt, body.output_compression, "generations")


#: multipart field names of the image files (the OpenAI SDK sends a list as ``image[]``)
_IMAGE_FIELDS = ("image", "image[]")


@router.post("/v1/images/edits", response_model=ImagesResponse)
async def edit_image(request: Request):
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise bad_request("POST /v1/images/edits takes multipart/form-data (fields 'image', "
                          "'prompt', ...)", code="invalid_content_type")
    try:
        form = await request.form()
    except Exception as exc:  # noqa: BLE001 - malformed multipart body
        raise bad_request(f"Malformed multipart body: {exc}", code="invalid_multipart") from None
    try:
        images: list[UploadFile] = []
        mask = None
        fields: dict[str, str] = {}
        for key, value in form.multi_items():
            if key in _IMAGE_FIELDS:
                if not isinstance(value, UploadFile):
                    raise bad_request("'image' must be a file part", param="image", code="invalid_image")
                images.append(value)
            elif key == "mask":
                mask = value
            elif isinstance(value, UploadFile):
                raise bad_request(f"Unexpected file field '{key}'", param=key)
            elif key in fields:
                raise bad_request(f"Field '{key}' given more than once", param=key)
            else:
                fields[key] = value
        if "prompt" not in fields:
            raise bad_request("Missing required parameter: 'prompt'", param="prompt", code="invalid_value")
        try:
            body = ImageEditForm.model_validate({k: v for k, v in fields.items()})
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
        if not images:
            raise bad_request("Missing required parameter: 'image'", param="image", code="invalid_value")
        info = await _resolve_model(request.app.state.engine, body.model, edit=True)
        if mask is not None and not info.supports_mask:
            raise bad_request(f"The model '{info.name}' does not support 'mask' (its pipeline has "
                              "no inpainting)", param="mask", code="unsupported_mask")
        max_inputs = info.max_input_images or 1
        if len(images) > max_inputs:
            raise bad_request(f"The model '{info.name}' takes at most {max_inputs} input image(s); "
                              f"got {len(images)}", param="image", code="too_many_images")
        job, fmt = _plan(body, info)
        data = await images[0].read()
        try:
            pixels = await asyncio.to_thread(decode_image, data)
        except InvalidImageError as exc:
            raise bad_request(str(exc), param="image", code="invalid_image") from None
    finally:
        await form.close()
    job = dataclasses.replace(job, image=pixels)
    return await _run(request, info, job, fmt, body.output_compression, "edits")

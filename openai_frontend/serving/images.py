"""``POST /v1/images/generations`` (JSON) and ``POST /v1/images/edits`` (multipart), and the
images of a chat completion on a diffusion model.

All run a diffusion ensemble (docs/image_contracts.md) through ``Engine.generate_images``: the
``n`` images of a request are ``n`` Triton requests in flight at once (image ``i`` has seed
``seed + i``), so Triton's dynamic batchers batch them with each other and with other clients'
images. The response is OpenAI's ``{created, data: [{b64_json, revised_prompt}], usage}`` plus
``output_format``/``size`` (as gpt-image-1 returns them) and the extensions ``data[].seed`` and
``usage.num_inference_steps``/``usage.denoise_seconds`` (also as ``X-Denoise-Steps`` and
``X-Denoise-Seconds`` headers).
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from numpy.typing import NDArray
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from omni_triton.contracts.image import MIN_INFERENCE_STEPS, diffusers_mask_from_alpha
from omni_triton.media.image import (
    MAX_UPLOAD_PIXELS,
    ImageTooLargeError,
    InvalidImageError,
    MaskWithoutAlphaError,
    UnsupportedImageFormatError,
    decode_image,
    decode_mask_alpha,
    encode_image,
    normalise_format,
)

from ..engine import GeneratedImage, ImageJob, ModelInfo
from ..engine.model_info import parse_size
from ..errors import OpenAIError, bad_request
from ..offload import off_loop
from ..schemas import ImageData, ImageEditForm, ImageGenerationRequest, ImagesResponse, ImageUsage
from . import loras
from .common import (
    IMAGE_EDIT,
    TEXT_TO_IMAGE,
    AdmittedRequest,
    check_fields,
    read_form,
    resolve_model,
    retry_after_stage_restart,
)
from .stage_metrics import image_stages

logger = logging.getLogger(__name__)

#: prompt length limit (characters; gpt-image-1's documented limit)
MAX_PROMPT_CHARS = 32000


def size(body: ImageGenerationRequest, info: ModelInfo) -> tuple[int, int]:
    """(width, height) in pixels from ``size`` ("WxH" or "auto"), checked against the model.

    Raises:
        OpenAIError: 400 ``invalid_size`` (not ``WxH`` with ASCII digits, not a multiple of the
            model's ``size_multiple``, or outside [multiple, ``max_size``]).
    """
    default = info.default_size or (64, 64)
    if body.size is None or body.size == "auto":
        return default
    parsed = parse_size(body.size)
    if parsed is None:
        raise bad_request(f"Invalid size '{body.size}': expected 'WIDTHxHEIGHT' (e.g. "
                          f"'{default[0]}x{default[1]}') or 'auto'", param="size", code="invalid_size")
    width, height = parsed
    m, top = info.size_multiple, info.max_size or 1024
    for v in (width, height):
        if v < m or v > top or v % m:
            raise bad_request(f"Invalid size '{body.size}': width and height must be multiples of {m} "
                              f"in [{m}, {top}] for the model '{info.public_name}'", param="size",
                              code="invalid_size")
    return width, height


def precheck(body: ImageGenerationRequest) -> None:
    """The checks that need no model, made before the model is resolved: resolving an on-demand
    model waits for its load (seconds to a minute), which a malformed request must not cause.

    Raises:
        OpenAIError: 400 ``empty_prompt``, or ``invalid_size`` for a size that is not ``WxH``/``auto``.
    """
    if not body.prompt.strip():
        raise bad_request("'prompt' must not be empty", param="prompt", code="empty_prompt")
    if body.size is not None and body.size != "auto" and parse_size(body.size) is None:
        raise bad_request(f"Invalid size '{body.size}': expected 'WIDTHxHEIGHT' (e.g. '64x64') or 'auto'",
                          param="size", code="invalid_size")


def plan(body: ImageGenerationRequest, info: ModelInfo) -> tuple[ImageJob, str]:
    """Validate ``body`` against the model.

    Returns:
        the job (without condition image) and the output format (``png``/``jpeg``/``webp``).

    Raises:
        OpenAIError: 400 naming the offending field.
    """
    if not body.prompt.strip():
        raise bad_request("'prompt' must not be empty", param="prompt", code="empty_prompt")
    if len(body.prompt) > MAX_PROMPT_CHARS:
        raise bad_request(f"'prompt' is {len(body.prompt)} characters; at most {MAX_PROMPT_CHARS}",
                          param="prompt", code="prompt_too_long")
    max_n = info.max_images or 1
    if not 1 <= body.n <= max_n:
        raise bad_request(f"'n' must be between 1 and {max_n} for the model '{info.public_name}'",
                          param="n", code="invalid_n")
    if body.response_format not in (None, "b64_json"):
        raise bad_request(f"Unsupported response_format '{body.response_format}': only 'b64_json' "
                          "(this server does not host image URLs)", param="response_format",
                          code="unsupported_format")
    if body.stream:
        raise bad_request("Streaming partial images is not supported", param="stream")
    if body.output_format is not None and not body.output_format.strip():
        raise bad_request("'output_format' must not be empty; supported: png, jpeg, webp",
                          param="output_format", code="unsupported_format")
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
    width, height = size(body, info)
    cfg = body.true_cfg_scale if body.true_cfg_scale is not None else (info.default_true_cfg_scale or 4.0)
    job = ImageJob(prompt=body.prompt, width=width, height=height, steps=steps,
                   seed=body.seed if body.seed is not None else secrets.randbits(31), n=body.n,
                   negative_prompt=body.negative_prompt or None, true_cfg_scale=cfg,
                   guidance_scale=body.guidance_scale)
    return job, fmt


#: Largest width/height ratio (either way) of an edit's condition image. The edit pipeline
#: resizes it to ~1 MP at the same ratio (``calculate_dimensions``) and Qwen2.5-VL's image
#: processor refuses ratios above 200 (``smart_resize``); 4096x4 and 2x4096 uploads were 500s.
#: 100 keeps the resized ratio under 200 after rounding to multiples of 32 (the stage checks the
#: resized image itself: omni_triton.stages.qwen_image.check_condition_image).
MAX_CONDITION_ASPECT_RATIO = 100


def check_aspect_ratio(pixels: NDArray[Any], which: str = "The uploaded image") -> None:
    """400 ``invalid_image`` when the ``uint8 [H, W, 3]`` upload is more elongated than
    :data:`MAX_CONDITION_ASPECT_RATIO`; ``which`` names it in the message."""
    h, w = pixels.shape[:2]
    if max(h, w) > MAX_CONDITION_ASPECT_RATIO * min(h, w):
        raise bad_request(f"{which} is {w}x{h}; its aspect ratio must be at most "
                          f"{MAX_CONDITION_ASPECT_RATIO}:1", param="image", code="invalid_image")


#: ``strength`` of an inpaint model whose config has no ``default_strength``:
#: ``QwenImageInpaintPipeline.__call__``'s default
DEFAULT_STRENGTH = 0.6


def decode_mask(data: bytes) -> NDArray[Any]:
    """An OpenAI edit mask file -> the ``MASK`` tensor ``uint8 [H, W]`` (255 = repaint): its alpha
    channel through the safe decoder (``omni_triton.media.image.decode_mask_alpha``, the upload
    pixel limit checked from the header first), then ``diffusers_mask_from_alpha`` (alpha 0 ->
    255). Run off the event loop.

    Raises:
        OpenAIError: 400 ``param: mask``: ``mask_too_large``, ``mask_without_alpha`` or
            ``invalid_mask`` (empty, not a readable image).
    """
    try:
        alpha = decode_mask_alpha(data)
    except ImageTooLargeError as exc:
        raise bad_request(str(exc).replace("uploaded image", "mask"), param="mask", code="mask_too_large") from None
    except MaskWithoutAlphaError as exc:
        raise bad_request(str(exc), param="mask", code="mask_without_alpha") from None
    except InvalidImageError as exc:
        raise bad_request(str(exc).replace("uploaded image", "mask").replace("uploaded file", "mask"),
                          param="mask", code="invalid_mask") from None
    return diffusers_mask_from_alpha(alpha)


async def check_mask_support(request: Request, info: ModelInfo, mask: UploadFile | None,
                             body: ImageEditForm) -> float | None:
    """Whether ``mask`` (the form's ``mask`` part or None) and ``strength`` fit the model.

    Returns:
        the strength to send (the request's, else the model's ``default_strength``) for a mask
        request; None without a mask.

    Raises:
        OpenAIError: 400 ``param: mask``: ``unsupported_mask`` (the model has no
            ``supports_mask``; the message names the served models that have it),
            ``missing_mask`` (an inpaint model without a mask); 400 ``param: strength``
            (``invalid_value``) for ``strength`` without a mask.
    """
    if mask is not None and not info.supports_mask:
        others = sorted(m.public_name for m in await request.app.state.engine.list_models() if m.supports_mask)
        hint = (f"; use {' or '.join(repr(n) for n in others)}" if others
                else "; no served model supports masks")
        raise bad_request(f"The model '{info.public_name}' does not support 'mask' (its pipeline has "
                          f"no inpainting){hint}", param="mask", code="unsupported_mask")
    if mask is None and info.supports_mask:
        raise bad_request(f"The model '{info.public_name}' inpaints: it needs a 'mask' (a PNG with an "
                          "alpha channel, the image's size; alpha 0 marks the area to edit)",
                          param="mask", code="missing_mask")
    if mask is None:
        if body.strength is not None:
            raise bad_request("'strength' applies to masked edits only", param="strength", code="invalid_value")
        return None
    if body.strength is not None:
        return body.strength
    try:
        return float(info.parameters.get("default_strength", DEFAULT_STRENGTH))
    except ValueError:
        return DEFAULT_STRENGTH
#: Decoded pixels of all the condition images of one edit together: what one image may have
#: (``MAX_UPLOAD_PIXELS``, 4096x4096), so a multi-image edit never holds more decoded pixels
#: than a single-image one (~4 bytes per pixel while decoding). Checked from each file's header
#: before it is decoded; the files' bytes are bounded by ``max_upload_bytes`` each and the body
#: cap (``max_body_bytes``, 413) in all.
MAX_EDIT_TOTAL_PIXELS = MAX_UPLOAD_PIXELS


async def too_many_images(engine: Any, info: ModelInfo, count: int) -> OpenAIError:
    """The 400 ``too_many_images`` for ``count`` images on ``info`` (its ``max_input_images``),
    naming the served image-edit models that take more (on-demand ones included)."""
    most = info.max_input_images or 1
    try:
        others = sorted(f"'{m.public_name}' (up to {m.max_input_images})" for m in await engine.list_models()
                        if m.is_image_edit and (m.max_input_images or 1) >= count and m.name != info.name)
    except Exception:  # the hint is a courtesy: the 400 stands without it
        others = []
    hint = (f"; models that take {count}: {', '.join(others)}" if others
            else "; no model served here takes that many")
    return bad_request(f"The model '{info.public_name}' takes at most {most} input image(s); got {count}"
                       + hint, param="image", code="too_many_images")


async def decode_condition_images(uploads: list[UploadFile]) -> list[NDArray[Any]]:
    """Read and decode an edit's condition images, one after the other, each through the safe
    decoder (``decode_image``: header checked before decoding) with at most what is left of
    :data:`MAX_EDIT_TOTAL_PIXELS`, and each checked by :func:`check_aspect_ratio`.

    Raises:
        OpenAIError: 400 ``image_too_large`` (one image over ``MAX_UPLOAD_PIXELS`` or all together
            over ``MAX_EDIT_TOTAL_PIXELS``), ``invalid_image``.
    """
    out: list[NDArray[Any]] = []
    left = MAX_EDIT_TOTAL_PIXELS
    for k, upload in enumerate(uploads):
        which = "The uploaded image" if len(uploads) == 1 else f"Image {k + 1}"
        data = await upload.read()
        try:
            pixels = await off_loop(decode_image, data, left)
        except ImageTooLargeError as exc:
            if k:  # what is left is below one image's limit: say it is the total
                exc = ImageTooLargeError(f"{which} makes the condition images larger than "
                                         f"{MAX_EDIT_TOTAL_PIXELS} pixels in all ({exc})")
            raise bad_request(str(exc), param="image", code="image_too_large") from None
        except InvalidImageError as exc:
            raise bad_request(f"{which}: {exc}" if len(uploads) > 1 else str(exc), param="image",
                              code="invalid_image") from None
        check_aspect_ratio(pixels, which)
        left -= pixels.shape[0] * pixels.shape[1]
        out.append(pixels)
    return out


@dataclass
class ImageResult:
    """Generated images of one request: ``images`` (pixels and seeds), ``encoded``
    (``omni_triton.media.image.EncodedImage`` files), denoising ``steps`` per image and the denoiser
    ``seconds`` (images batched together share one denoiser call, counted once); ``metrics``:
    vLLM-Omni's ``metrics`` object when ``return_stage_metrics`` asked for it, else None."""

    images: list[GeneratedImage]
    encoded: list[Any]
    steps: int
    seconds: float
    metrics: dict[str, Any] | None = None


def pipeline_summary(result: ImageResult, job: ImageJob, stage_metrics: dict[str, Any]) -> dict[str, Any]:
    """An image request's output fields in vLLM-Omni's terms, added to every stage entry of its
    ``stage_metrics`` (all its stages make the image: the client sums their
    ``stage_gen_time_ms`` into the image's generation time) and to the ``metrics`` object:
    ``final_output_type``/``output_unit_type`` ``image``, ``output_unit_count`` (images; on the
    last stage only, so the client's sum counts each image once), ``image_pixels`` (summed,
    last stage), ``denoise_step_latency_ms`` (the denoiser's own per-request
    ``DENOISE_SECONDS`` output over its steps) and ``num_inference_steps``. Returns the fields
    of the last stage."""
    n = len(result.images)
    per_call = result.seconds / max(len(set(im.denoise_seconds for im in result.images)), 1)
    step_ms = round(per_call * 1000 / result.steps, 3) if result.steps else 0.0
    common = {"final_output_type": "image", "output_unit_type": "image", "denoise_step_latency_ms": step_ms,
              "num_inference_steps": result.steps}
    last = {**common, "output_unit_count": n, "image_pixels": n * job.width * job.height}
    keys = sorted(stage_metrics, key=int)
    for key in keys:
        stage_metrics[key].update(last if key == keys[-1] else {**common, "output_unit_count": 0, "image_pixels": 0})
    return last


async def generate(request: Request, info: ModelInfo, job: ImageJob, fmt: str, compression: int | None,
                   api: str, stage_metrics: bool = False) -> ImageResult:
    """Run ``job`` on the image model ``info`` under admission control (``job.n`` units) and
    encode the images in ``fmt``. ``api`` labels the request metric (``generations``, ``edits``,
    ``chat``); ``stage_metrics``: fill ``ImageResult.metrics`` (each ensemble step's own compute per
    image, ``serving.stage_metrics.image_stages``). Raises ``OpenAIError`` (429) / ``EngineError``."""
    state = request.app.state
    metrics = state.metrics

    def record(outcome: str) -> None:
        metrics.image_requests.labels(info.public_name, api, outcome).inc()

    async with AdmittedRequest(state, record, cost=job.n):
        # Seeded images have no side effects: retried once if a stage dies under them.
        images = await retry_after_stage_restart(
            state.engine, info.name, lambda: state.engine.generate_images(info.name, job))
        encoded = [await off_loop(encode_image, im.pixels, fmt, compression) for im in images]
        steps = images[0].steps if images else 0
        seconds = round(sum(set(im.denoise_seconds for im in images)), 6)
        result = ImageResult(images, encoded, steps, seconds)
        if stage_metrics:
            result.metrics = image_stages(info, images)
            result.metrics.update(pipeline_summary(result, job, result.metrics["stage_metrics"]))
    metrics.images.labels(info.public_name).inc(len(images))
    return result


def denoise_headers(result: ImageResult) -> dict[str, str]:
    """``X-Denoise-Steps`` / ``X-Denoise-Seconds`` of an image response."""
    return {"X-Denoise-Steps": str(result.steps), "X-Denoise-Seconds": f"{result.seconds:.6f}"}


async def _respond(request: Request, info: ModelInfo, job: ImageJob, fmt: str, compression: int | None,
                   api: str, stage_metrics: bool = False) -> JSONResponse:
    result = await generate(request, info, job, fmt, compression, api, stage_metrics)
    n_chars = len(job.prompt)
    body = ImagesResponse(
        created=int(time.time()),
        data=[ImageData(b64_json=base64.b64encode(e.data).decode("ascii"), revised_prompt=job.prompt,
                        seed=im.seed) for e, im in zip(result.encoded, result.images, strict=True)],
        output_format=fmt,
        size=f"{job.width}x{job.height}",
        usage=ImageUsage(input_tokens=n_chars, total_tokens=n_chars, num_inference_steps=result.steps,
                         denoise_seconds=result.seconds),
    )
    content = body.model_dump()
    if result.metrics is not None:  # vLLM-Omni: metrics.stage_metrics and stage_durations
        content["metrics"] = result.metrics
        content["stage_durations"] = result.metrics["stage_durations"]
    return JSONResponse(content, headers=denoise_headers(result))


async def with_lora(request: Request, info: ModelInfo, job: ImageJob, lora: Any) -> ImageJob:
    """``job`` with the adapter id and scale of the request's ``lora`` field (docs/lora.md);
    unchanged without one. Raises ``OpenAIError`` (``serving.loras.resolve``)."""
    selected = await loras.resolve(request, info, loras.parse_selection(lora))
    if selected is None:
        return job
    return dataclasses.replace(job, lora_id=selected[0], lora_scale=selected[1])


async def create_image(body: ImageGenerationRequest, request: Request) -> JSONResponse:
    """``POST /v1/images/generations``."""
    check_fields(body, request)
    precheck(body)
    info = await resolve_model(request.app.state.engine, body.model, TEXT_TO_IMAGE)
    job, fmt = plan(body, info)
    job = await with_lora(request, info, job, body.lora)
    return await _respond(request, info, job, fmt, body.output_compression, "generations",
                          body.return_stage_metrics)


#: multipart limits: file parts (images + mask), form fields, bytes of one non-file field
MAX_FORM_FILES = 8
MAX_FORM_FIELDS = 64
MAX_FIELD_BYTES = 256 << 10

#: multipart field names of the image files (the OpenAI SDK sends a list as ``image[]``)
_IMAGE_FIELDS = ("image", "image[]")


async def edit_image(request: Request) -> JSONResponse:
    """``POST /v1/images/edits`` (``multipart/form-data``: ``image`` file part(s), optional
    ``mask``, the generation fields as form fields). Several ``image`` / ``image[]`` parts (the
    OpenAI SDK's ``image=[a, b]``) go to a multi-image model in order, up to its
    ``max_input_images`` (400 ``too_many_images`` beyond, naming the models that take more). With a
    ``mask`` (models with ``supports_mask``: masked inpainting) the mask's fully transparent pixels
    mark the area to repaint (docs/image_contracts.md "Masked inpainting")."""
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise bad_request("POST /v1/images/edits takes multipart/form-data (fields 'image', "
                          "'prompt', ...)", code="invalid_content_type")
    settings = request.app.state.settings
    form = await read_form(request, max_files=MAX_FORM_FILES, max_fields=MAX_FORM_FIELDS,
                           max_part_size=MAX_FIELD_BYTES)
    try:
        images: list[UploadFile] = []
        mask: UploadFile | None = None
        fields: dict[str, str] = {}
        for key, value in form.multi_items():
            if key in _IMAGE_FIELDS:
                if not isinstance(value, UploadFile):
                    raise bad_request("'image' must be a file part", param="image", code="invalid_image")
                images.append(value)
            elif key == "mask":
                if mask is not None:
                    raise bad_request("Field 'mask' given more than once", param="mask", code="invalid_mask")
                if not isinstance(value, UploadFile):
                    raise bad_request("'mask' must be a file part", param="mask", code="invalid_mask")
                mask = value
            elif isinstance(value, UploadFile):
                raise bad_request(f"Unexpected file field '{key}'", param=key)
            elif key in fields:
                raise bad_request(f"Field '{key}' given more than once", param=key)
            else:
                fields[key] = value
        lora_parts: dict[str, Any] = {k[5:-1]: fields.pop(k) for k in list(fields)
                                      if k.startswith("lora[") and k.endswith("]")}
        if lora_parts:  # the SDK's extra_body={"lora": {...}} arrives as lora[name], lora[scale]
            if "lora" in fields:
                raise bad_request("Give 'lora' either as one JSON field or as lora[name]/lora[scale]", param="lora")
            if "scale" in lora_parts:
                try:
                    lora_parts["scale"] = float(lora_parts["scale"])
                except ValueError:
                    raise bad_request("'lora.scale' must be a number", param="lora.scale",
                                      code="invalid_value") from None
            fields["lora"] = lora_parts  # type: ignore[assignment]
        if "prompt" not in fields:
            raise bad_request("Missing required parameter: 'prompt'", param="prompt", code="invalid_value")
        try:
            body = ImageEditForm.model_validate(fields)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
        check_fields(body, request)
        if not images:
            raise bad_request("Missing required parameter: 'image'", param="image", code="invalid_value")
        precheck(body)
        info = await resolve_model(request.app.state.engine, body.model, IMAGE_EDIT)
        strength = await check_mask_support(request, info, mask, body)
        if len(images) > (info.max_input_images or 1):
            raise await too_many_images(request.app.state.engine, info, len(images))
        job, fmt = plan(body, info)
        job = await with_lora(request, info, job, body.lora)
        for upload, param in [(i, "image") for i in images] + ([(mask, "mask")] if mask is not None else []):
            if upload.size is not None and upload.size > settings.max_upload_bytes:
                raise OpenAIError(413, f"The uploaded {param} is {upload.size} bytes; at most "
                                  f"{settings.max_upload_bytes}", param=param, code="payload_too_large")
        pixels, *more = await decode_condition_images(images)
        mask_pixels = None
        if mask is not None:
            mask_pixels = await off_loop(decode_mask, await mask.read())
            if mask_pixels.shape != pixels.shape[:2]:
                raise bad_request(f"The mask is {mask_pixels.shape[1]}x{mask_pixels.shape[0]}; it must have "
                                  f"the image's size {pixels.shape[1]}x{pixels.shape[0]}", param="mask",
                                  code="mask_size_mismatch")
    finally:
        await form.close()
    job = dataclasses.replace(job, image=pixels, more_images=tuple(more), mask=mask_pixels, strength=strength)
    return await _respond(request, info, job, fmt, body.output_compression, "edits",
                          body.return_stage_metrics)

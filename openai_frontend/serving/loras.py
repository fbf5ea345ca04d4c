"""LoRA adapters (docs/lora.md): ``POST/GET /v1/loras``, ``GET/DELETE /v1/loras/{name}``, vLLM's
``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``, and how an image request's ``lora``
field (vLLM-Omni's name: ``{"name", "scale"}``) becomes the ensemble's ``LORA_ID`` + ``LORA_SCALE``.

Registration is a multipart upload (``name``, ``file``: a ``.safetensors``; optional
``adapter_config``: PEFT's JSON) or a JSON ``{"name", "path"}`` naming a server-side file or PEFT
folder under ``--lora-allowed-dirs``. Every check runs before anything is stored
(``openai_frontend.lora_store``); the file work runs off the event loop.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.datastructures import UploadFile

from omni_triton.contracts import lora as cl

from ..engine import ModelInfo
from ..errors import OpenAIError, bad_request
from ..lora_store import (
    MAX_CONFIG_BYTES,
    DuplicateLoraName,
    InvalidLoraName,
    LoraNotFound,
    LoraPathRefused,
    LoraStore,
    LoraStoreError,
    LoraTooLarge,
    LoraUnavailable,
    StoredLora,
)
from ..offload import off_loop
from .common import read_form, read_json_object

logger = logging.getLogger(__name__)

#: slack over ``max_upload_bytes`` a registration body may have (multipart framing, the name and
#: an ``adapter_config``): the body cap of ``POST /v1/loras`` (``app.create_app``)
FORM_SLACK_BYTES = 2 << 20


def store_of(request: Request) -> LoraStore:
    """The app's registry; 503 ``lora_store_unavailable`` when it could not be opened, 404 when
    LoRA is switched off (``--lora-dir none``)."""
    state = request.app.state
    store: LoraStore | None = getattr(state, "lora_store", None)
    if store is None:
        error = getattr(state, "lora_store_error", None)
        if error:
            raise OpenAIError(503, f"The LoRA registry cannot be used: {error}", code="lora_store_unavailable",
                              type="server_error")
        raise OpenAIError(404, "LoRA adapters are disabled on this server", code="lora_disabled")
    return store


def to_http(exc: Exception, param: str | None = None) -> OpenAIError:
    """A registry or file error as the API's error (status by kind, the error's ``code``)."""
    code = getattr(exc, "code", "invalid_lora")
    if isinstance(exc, LoraNotFound):
        return OpenAIError(404, str(exc), param=param, code=code)
    if isinstance(exc, DuplicateLoraName | LoraUnavailable):
        return OpenAIError(409, str(exc), param=param, code=code)
    if isinstance(exc, LoraTooLarge):
        return OpenAIError(413, str(exc), param=param, code=code)
    if isinstance(exc, InvalidLoraName):  # whatever part of the request was being read
        return bad_request(str(exc), param="name", code=code)
    if isinstance(exc, LoraPathRefused):
        return OpenAIError(400, str(exc), param=param or "path", code=code)
    return bad_request(str(exc), param=param, code=code)


_ERRORS = (LoraStoreError, cl.LoraFileError)


async def create_lora(request: Request) -> JSONResponse:
    """``POST /v1/loras``: multipart upload or JSON ``{"name", "path"}``."""
    store = store_of(request)
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        lora = await _upload(request, store)
    elif content_type.startswith("application/json"):
        body = await read_json_object(request)
        unknown = sorted(set(body) - {"name", "path"})
        if unknown:
            raise bad_request(f"Unknown field(s) {unknown}: a JSON registration takes 'name' and 'path'",
                              param=unknown[0])
        for key in ("name", "path"):
            if not isinstance(body.get(key), str):
                raise bad_request(f"Missing required string '{key}'", param=key, code="invalid_value")
        try:
            lora = await off_loop(store.register_path, body["name"], body["path"])
        except _ERRORS as exc:
            raise to_http(exc, "path" if isinstance(exc, cl.LoraFileError) else None) from None
    else:
        raise bad_request("POST /v1/loras takes multipart/form-data (name, file[, adapter_config]) or "
                          "JSON {\"name\", \"path\"}", code="invalid_content_type")
    return JSONResponse(lora.to_openai())


async def _upload(request: Request, store: LoraStore) -> StoredLora:
    limit = store.settings.max_upload_bytes
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit + FORM_SLACK_BYTES:
        raise OpenAIError(413, f"The upload is {length} bytes; adapters are at most {limit} bytes",
                          param="file", code="payload_too_large")
    form = await read_form(request, max_files=2, max_fields=4, max_part_size=MAX_CONFIG_BYTES)
    try:
        name = form.get("name")
        upload = form.get("file")
        config_part = form.get("adapter_config")
        if not isinstance(name, str):
            raise bad_request("Missing required field 'name'", param="name", code="invalid_value")
        if not isinstance(upload, UploadFile):
            raise bad_request("Missing required file part 'file' (a .safetensors LoRA)", param="file",
                              code="invalid_value")
        size = upload.size
        if size is None:
            upload.file.seek(0, 2)
            size = upload.file.tell()
        if size > limit:
            raise OpenAIError(413, f"The adapter file is {size} bytes; at most {limit}", param="file",
                              code="payload_too_large")
        config = None
        if config_part is not None:
            raw = await config_part.read() if isinstance(config_part, UploadFile) else config_part.encode()
            if len(raw) > MAX_CONFIG_BYTES:
                raise bad_request(f"'adapter_config' is larger than {MAX_CONFIG_BYTES} bytes",
                                  param="adapter_config")
            try:
                config = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                raise bad_request("'adapter_config' is not JSON (PEFT's adapter_config.json)",
                                  param="adapter_config", code="invalid_value") from None
            if not isinstance(config, dict):
                raise bad_request("'adapter_config' must be a JSON object", param="adapter_config",
                                  code="invalid_value")
        try:
            return await off_loop(store.register_upload, name, upload.file, size, config)
        except _ERRORS as exc:
            raise to_http(exc, "name" if isinstance(exc, DuplicateLoraName) else "file") from None
    finally:
        await form.close()


async def list_loras(request: Request) -> JSONResponse:
    """``GET /v1/loras``."""
    store = store_of(request)
    loras = await off_loop(store.list_all)
    return JSONResponse({"object": "list", "data": [lo.to_openai() for lo in loras]})


async def retrieve_lora(request: Request, name: str) -> JSONResponse:
    """``GET /v1/loras/{name}``."""
    store = store_of(request)
    try:
        return JSONResponse((await off_loop(store.get, name)).to_openai())
    except LoraNotFound as exc:
        raise to_http(exc, "name") from None


async def delete_lora(request: Request, name: str) -> JSONResponse:
    """``DELETE /v1/loras/{name}``."""
    store = store_of(request)
    try:
        lora = await off_loop(store.delete, name)
    except LoraNotFound as exc:
        raise to_http(exc, "name") from None
    return JSONResponse({"object": "lora.deleted", "name": lora.name, "id": lora.id, "deleted": True})


# --------------------------------------------------------------------------- vLLM's runtime API
async def load_lora_adapter(request: Request) -> PlainTextResponse:
    """vLLM's ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}``: a path registration."""
    store = store_of(request)
    body = await read_json_object(request)
    name, path = body.get("lora_name"), body.get("lora_path")
    if not isinstance(name, str) or not isinstance(path, str):
        raise bad_request("'lora_name' and 'lora_path' are required strings", param="lora_name",
                          code="invalid_value")
    try:
        await off_loop(store.register_path, name, path)
    except _ERRORS as exc:
        raise to_http(exc, "lora_path" if not isinstance(exc, DuplicateLoraName) else "lora_name") from None
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: Request) -> PlainTextResponse:
    """vLLM's ``POST /v1/unload_lora_adapter`` ``{"lora_name"}``."""
    store = store_of(request)
    body = await read_json_object(request)
    name = body.get("lora_name")
    if not isinstance(name, str):
        raise bad_request("'lora_name' is a required string", param="lora_name", code="invalid_value")
    try:
        await off_loop(store.delete, name)
    except LoraNotFound as exc:
        raise to_http(exc, "lora_name") from None
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


# --------------------------------------------------------------------------- image requests
def parse_selection(value: Any) -> tuple[str, float] | None:
    """An image request's ``lora`` field -> ``(name, scale)``; None when absent.

    Accepted: an object ``{"name": str, "scale": number (default 1.0)}`` (vLLM-Omni's ``lora``;
    its ``int_id`` is accepted and ignored), or, in a multipart form, that object as a JSON string.

    Raises:
        OpenAIError: 400 naming ``lora`` / ``lora.name`` / ``lora.scale`` (``lora.path`` refused:
            adapters are registered first, requests never name files).
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise bad_request("'lora' must be an object {\"name\": ..., \"scale\": ...}", param="lora",
                              code="invalid_value") from None
    if not isinstance(value, dict):
        raise bad_request("'lora' must be an object {\"name\": ..., \"scale\": ...}", param="lora",
                          code="invalid_value")
    unknown = sorted(set(value) - {"name", "scale", "int_id", "path"})
    if unknown:
        raise bad_request(f"Unknown field(s) in 'lora': {unknown}", param=f"lora.{unknown[0]}")
    if value.get("path") is not None:
        raise bad_request("'lora.path' is not accepted per request: register the adapter with POST /v1/loras "
                          "(or /v1/load_lora_adapter) and select it by 'lora.name'", param="lora.path",
                          code="unsupported_parameter")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request("'lora.name' is required (a registered adapter's name)", param="lora.name",
                          code="invalid_value")
    scale = value.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        raise bad_request("'lora.scale' must be a number", param="lora.scale", code="invalid_value")
    try:
        return name, cl.check_scale(float(scale))
    except cl.LoraFileError as exc:
        raise bad_request(str(exc), param="lora.scale", code="invalid_value") from None


async def resolve(request: Request, info: ModelInfo, selection: tuple[str, float] | None) -> tuple[str, float] | None:
    """``(adapter id, scale)`` for an image request on ``info``, or None without ``lora``.

    Raises:
        OpenAIError: 400 ``unsupported_parameter`` (the model takes no ``LORA_ID``), 404
            ``lora_not_found``, 409 ``lora_unavailable``, 400 ``lora_incompatible`` (its modules
            do not fit this model's transformer).
    """
    if selection is None:
        return None
    name, scale = selection
    if cl.LORA_ID not in info.inputs:
        raise bad_request(f"The model '{info.public_name}' does not take LoRA adapters", param="lora",
                          code="unsupported_parameter")
    store = store_of(request)
    try:
        lora = await off_loop(store.get, name)
        await off_loop(store.check_for, lora, list(info.stage_models))
    except _ERRORS as exc:
        raise to_http(exc, "lora.name") from None
    return lora.id, scale

"""The frontend's view of Triton: an engine protocol and its ``tritonclient.grpc.aio`` implementation.

Routers only see the ``Engine`` protocol (as in Triton server's ``python/openai`` frontend), so
unit tests can plug in a small fake; the real server path is ``TritonEngine``.

Model metadata comes from Triton itself:
* the repository index gives every model's state (``READY``, ``UNAVAILABLE``, ...);
* ``get_model_config`` gives inputs/outputs and the ``parameters`` documented in
  ``docs/speech_contracts.md`` (``voices``, ``default_voice``, ``sample_rate``,
  ``supports_speed``, ``max_input_chars``).

Images (``generate_images``) are unary ``ModelInfer`` calls on a diffusion ensemble, one per
image, all in flight at once (Triton's dynamic batchers group them); see docs/image_contracts.md.
Chat-contract models (``docs/chat_contracts.md``) also report ``modalities``, ``served_model_name``,
``speaks_for`` and ``max_model_len``; ``generate`` streams one such request (one RPC per choice).

Speech is one ``ModelStreamInfer`` call per HTTP request on a decoupled model: every response
that carries ``AUDIO`` is yielded as soon as it arrives. Closing the iterator (HTTP client gone,
task cancelled, consumer stopped) cancels the gRPC call; Triton's gRPC stream handler then
cancels the in-flight request, which a Python-backend model sees as ``request.is_cancelled()``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol, runtime_checkable

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException

from omni_triton.contracts import INVALID_INPUT_PREFIX

logger = logging.getLogger(__name__)

#: (float32 PCM chunk of shape [T] in [-1, 1], sample rate in Hz)
AudioChunk = tuple[np.ndarray, int]


@dataclass(frozen=True)
class GenerationRequest:
    """One request to a chat-contract model (``docs/chat_contracts.md``).

    Exactly one of ``messages`` (OpenAI chat messages, sent as the ``MESSAGES`` JSON) and
    ``prompt`` (sent as ``PROMPT``) is set. ``sampling`` holds vLLM ``SamplingParams`` names
    (``temperature``, ``top_p``, ``max_tokens``, ``stop``, ``seed``...), sent as the
    ``SAMPLING_PARAMETERS`` JSON with only the keys the client gave. ``modalities`` / ``voice``
    go to speech models only (``MODALITIES`` / ``VOICE``). ``request_id`` is Triton's request id.
    """

    messages: list[dict] | None = None
    prompt: str | None = None
    sampling: dict = field(default_factory=dict)
    modalities: tuple[str, ...] | None = None
    voice: str | None = None
    request_id: str = ""


@dataclass(frozen=True)
class GenerationChunk:
    """One streamed response of a chat-contract model.

    text: text generated since the previous chunk (``TEXT_DELTA``, may be empty).
    finish_reason: None until the last text chunk, then ``stop``, ``length`` or ``abort``.
    prompt_tokens / completion_tokens: prompt length and tokens generated so far (cumulative);
        None when the response did not carry them.
    audio: float32 PCM [T] in [-1, 1] generated since the previous chunk, or None.
    sample_rate: Hz of ``audio`` (``SAMPLE_RATE``), or None.
    """

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    audio: np.ndarray | None = None
    sample_rate: int | None = None


# --------------------------------------------------------------------------- errors
class EngineError(Exception):
    """Base of every error the engine raises; carries the HTTP mapping used by the routers."""

    status_code = 500
    error_type = "server_error"
    code: str | None = "internal_error"

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class TritonUnavailableError(EngineError):
    """Triton cannot be reached (connection refused, shutting down, deadline)."""

    status_code = 503
    error_type = "service_unavailable"
    code = "triton_unavailable"


class ModelNotFoundError(EngineError):
    """The model is not one this frontend serves."""

    status_code = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class ModelNotReadyError(EngineError):
    """The model is served but not READY in Triton (loading, failed, unloaded, missing)."""

    status_code = 503
    error_type = "service_unavailable"
    code = "model_not_ready"


class InvalidRequestError(EngineError):
    """The model rejected the request's content (Triton ``INVALID_ARG``, e.g. a prompt longer
    than the model's context): the client's fault, HTTP 400."""

    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_value"


class InferenceError(EngineError):
    """Triton answered with an error response (the model's ``TritonError``) or the stream broke."""

    status_code = 500
    error_type = "server_error"
    code = "inference_error"


# --------------------------------------------------------------------------- model metadata
@dataclass(frozen=True)
class ModelInfo:
    """What the frontend knows about one served model.

    ``voices``/``default_voice``/``sample_rate``/``supports_speed``/``max_input_chars`` come from
    the model config's ``parameters`` (empty/None when the model is not READY, since Triton only
    returns configs of loaded models).
    """

    name: str
    state: str = "READY"
    reason: str = ""
    inputs: frozenset[str] = field(default_factory=frozenset)
    outputs: frozenset[str] = field(default_factory=frozenset)
    decoupled: bool = False
    voices: tuple[str, ...] = ()
    default_voice: str | None = None
    sample_rate: int | None = None
    supports_speed: bool = False
    max_input_chars: int | None = None
    #: Stage models a BLS model calls (config parameter ``depends_on``): Triton reports a BLS
    #: model READY even when they are not, so the frontend checks them itself.
    depends_on: tuple[str, ...] = ()
    #: image models (diffusion ensembles): the config ``parameters`` of docs/image_contracts.md
    task: str | None = None
    default_size: tuple[int, int] | None = None  # (width, height)
    size_multiple: int = 16
    max_size: int | None = None
    default_steps: int | None = None
    max_steps: int | None = None
    default_true_cfg_scale: float | None = None
    max_images: int | None = None
    max_input_images: int | None = None
    supports_mask: bool = False
    #: Output modalities (config parameter ``modalities``, e.g. ``("text", "audio")``); empty
    #: when the config does not say (speech models: see ``output_modalities``).
    modalities: tuple[str, ...] = ()
    #: The name clients use (config parameter ``served_model_name``); None: the Triton name.
    served_model_name: str | None = None
    #: On a speech twin (``llm_tts``): the text model whose spoken answers it produces.
    speaks_for: str | None = None
    #: Context length in tokens (config parameter ``max_model_len``), if declared.
    max_model_len: int | None = None

    @property
    def ready(self) -> bool:
        return self.state == "READY"

    @property
    def public_name(self) -> str:
        """The id clients see in ``/v1/models`` and send as ``model``."""
        return self.served_model_name or self.name

    @property
    def is_chat(self) -> bool:
        """Implements the chat contract (``docs/chat_contracts.md``): ``MESSAGES`` in,
        ``TEXT_DELTA`` out: servable by ``/v1/chat/completions``."""
        return "MESSAGES" in self.inputs and "TEXT_DELTA" in self.outputs

    @property
    def is_completion(self) -> bool:
        """``PROMPT`` in, ``TEXT_DELTA`` out: servable by ``/v1/completions``."""
        return "PROMPT" in self.inputs and "TEXT_DELTA" in self.outputs

    @property
    def output_modalities(self) -> tuple[str, ...]:
        """What the model can answer with: the ``modalities`` parameter, else ``("audio",)`` for
        a speech model, ``("image",)`` for a diffusion ensemble, ``("text",)`` for a chat/completion
        model, ``()`` for internal stages."""
        if self.modalities:
            return self.modalities
        if self.is_image:
            return ("image",)
        if self.is_speech:
            return ("audio",)
        if self.is_chat or self.is_completion:
            return ("text",)
        return ()

    @property
    def can_speak(self) -> bool:
        """A chat model that can answer with audio (``AUDIO`` out, ``audio`` in its modalities)."""
        return "audio" in self.output_modalities and "AUDIO" in self.outputs

    @property
    def is_speech(self) -> bool:
        """Text in, PCM out (``TEXT`` -> ``AUDIO``): servable by ``/v1/audio/speech``."""
        return "TEXT" in self.inputs and "AUDIO" in self.outputs

    @property
    def is_image(self) -> bool:
        """Prompt in, image out (``PROMPT`` -> ``IMAGE``): servable by ``/v1/images/*``."""
        return "PROMPT" in self.inputs and "IMAGE" in self.outputs

    @property
    def is_image_edit(self) -> bool:
        """An image model that takes a condition image (``INPUT_IMAGE``)."""
        return self.is_image and "INPUT_IMAGE" in self.inputs

    @property
    def modality(self) -> str:
        """``image``, ``audio`` or ``text`` (what ``/v1/models`` reports)."""
        if self.is_image:
            return "image"
        if "AUDIO" in self.outputs:
            return "audio"
        return "text"


def _parse_size(text: str) -> tuple[int, int] | None:
    """``"WxH"`` -> (W, H); ``None`` when not of that form."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def model_info_from_config(config, state: str = "READY", reason: str = "") -> ModelInfo:
    """Build a ``ModelInfo`` from a ``inference.ModelConfig`` protobuf."""
    params = {k: v.string_value.strip() for k, v in config.parameters.items()}
    inputs = frozenset(i.name for i in config.input)
    voices = tuple(v.strip() for v in params.get("voices", "").split(",") if v.strip())
    default_voice = params.get("default_voice") or (voices[0] if voices else None)
    if "supports_speed" in params:
        supports_speed = params["supports_speed"].lower() in ("true", "1", "yes")
    else:
        supports_speed = False

    def _int(key: str) -> int | None:
        try:
            return int(params[key]) if params.get(key) else None
        except ValueError:
            logger.warning("model %s: parameter %s=%r is not an integer", config.name, key, params[key])
            return None

    def _float(key: str) -> float | None:
        try:
            return float(params[key]) if params.get(key) else None
        except ValueError:
            logger.warning("model %s: parameter %s=%r is not a number", config.name, key, params[key])
            return None

    return ModelInfo(
        name=config.name,
        state=state,
        reason=reason,
        inputs=inputs,
        outputs=frozenset(o.name for o in config.output),
        decoupled=bool(config.model_transaction_policy.decoupled),
        voices=voices,
        default_voice=default_voice,
        sample_rate=_int("sample_rate"),
        supports_speed=supports_speed,
        max_input_chars=_int("max_input_chars"),
        depends_on=tuple(d.strip() for d in params.get("depends_on", "").split(",") if d.strip()),
        task=params.get("task") or None,
        default_size=_parse_size(params.get("default_size", "")),
        size_multiple=_int("size_multiple") or 16,
        max_size=_int("max_size"),
        default_steps=_int("default_steps"),
        max_steps=_int("max_steps"),
        default_true_cfg_scale=_float("default_true_cfg_scale"),
        max_images=_int("max_images"),
        max_input_images=_int("max_input_images"),
        supports_mask=params.get("supports_mask", "").lower() in ("true", "1", "yes"),
        modalities=tuple(m.strip().lower() for m in params.get("modalities", "").split(",") if m.strip()),
        served_model_name=params.get("served_model_name") or None,
        speaks_for=params.get("speaks_for") or None,
        max_model_len=_int("max_model_len"),
    )


def _unready_dependencies(info: ModelInfo, states: dict[str, tuple[str, str]]) -> ModelInfo:
    """``info`` itself when all its ``depends_on`` stages are READY, else an UNAVAILABLE copy
    whose reason names the stages that are not."""
    missing = [f"{d} ({states.get(d, ('MISSING', ''))[0]})" for d in info.depends_on
               if states.get(d, ("MISSING", ""))[0] != "READY"]
    if not missing:
        return info
    return ModelInfo(name=info.name, state="UNAVAILABLE",
                     reason="stages not ready: " + ", ".join(missing))


# --------------------------------------------------------------------------- images
@dataclass(frozen=True)
class ImageJob:
    """What to generate: ``n`` images of ``width`` x ``height`` pixels for ``prompt``.

    Image ``i`` uses seed ``seed + i``, so each image equals a single-image request with that
    seed whatever else is batched with it. ``negative_prompt`` ``None`` (or ``""``) turns true CFG
    off; ``image`` (``uint8 [H, W, 3]`` RGB) is the condition image of an edit model.
    """

    prompt: str
    width: int
    height: int
    steps: int
    seed: int
    n: int = 1
    negative_prompt: str | None = None
    true_cfg_scale: float = 4.0
    guidance_scale: float | None = None
    image: np.ndarray | None = None


@dataclass(frozen=True)
class GeneratedImage:
    """One generated image: ``uint8 [H, W, 3]`` RGB pixels, its seed, the denoising steps run and
    the wall time (seconds) of the denoiser call it was part of."""

    pixels: np.ndarray
    seed: int
    steps: int
    denoise_seconds: float


class ImageEngineMixin:
    """``generate_encoded_images`` for any engine that has ``get_model`` and ``generate_images``.

    This is the entry point for APIs that want image *files* rather than pixels (e.g. a chat
    completion on a diffusion model returning an ``image_url`` data URL part).
    """

    async def generate_encoded_images(
        self, model: str, prompt: str, *, n: int = 1, size: tuple[int, int] | None = None,
        output_format: str = "png", output_compression: int | None = None, seed: int | None = None,
        negative_prompt: str | None = None, steps: int | None = None,
        true_cfg_scale: float | None = None, guidance_scale: float | None = None,
    ) -> list:
        """Generate ``n`` images for ``prompt`` on the image model ``model``; return them encoded.

        Args:
            size: (width, height); default the model's ``default_size``.
            output_format: ``png`` / ``jpeg`` / ``webp`` (Pillow).
            seed: image ``i`` uses ``seed + i``; ``None`` picks a random seed.
            steps, true_cfg_scale: default the model's ``default_steps`` /
                ``default_true_cfg_scale``.

        Returns:
            ``list[omni_triton.image.EncodedImage]`` (``data`` bytes, ``fmt``, ``mime_type``);
            a data URL is ``f"data:{e.mime_type};base64,{base64.b64encode(e.data).decode()}"``.

        Raises:
            ``ModelNotFoundError`` / ``ModelNotReadyError`` / ``InvalidRequestError`` (not an image
            model, ``n`` out of range; size or steps out of range are rejected by the model) / ``InferenceError`` / ``TritonUnavailableError``.
        """
        import secrets

        from omni_triton.media.image import encode_image, normalise_format

        info = await self.get_model(model)
        if not info.is_image or info.is_image_edit:
            raise InvalidRequestError(f"The model '{model}' is not a text-to-image model", param="model")
        width, height = size or info.default_size or (64, 64)
        if not 1 <= n <= (info.max_images or 1):
            raise InvalidRequestError(f"n must be between 1 and {info.max_images or 1}", param="n")
        try:
            fmt = normalise_format(output_format)
        except ValueError as exc:
            raise InvalidRequestError(str(exc), param="output_format") from None
        job = ImageJob(
            prompt=prompt, width=width, height=height, n=n,
            steps=steps if steps is not None else (info.default_steps or 2),
            seed=secrets.randbits(31) if seed is None else seed,
            negative_prompt=negative_prompt,
            true_cfg_scale=true_cfg_scale if true_cfg_scale is not None else (info.default_true_cfg_scale or 4.0),
            guidance_scale=guidance_scale,
        )
        images = await self.generate_images(model, job)
        return [await asyncio.to_thread(encode_image, im.pixels, fmt, output_compression) for im in images]


# --------------------------------------------------------------------------- protocol
@runtime_checkable
class Engine(Protocol):
    """What the routers need from a backend."""

    async def is_live(self) -> bool:
        """True when the inference server answers and reports itself live."""

    async def list_models(self) -> list[ModelInfo]:
        """Every served model with its current state (READY or not). Raises ``TritonUnavailableError``."""

    async def get_model(self, name: str) -> ModelInfo:
        """The served, READY model ``name``.

        Raises ``ModelNotFoundError``, ``ModelNotReadyError`` or ``TritonUnavailableError``.
        """

    def synthesize(
        self, model: str, text: str, voice: str | None = None, speed: float | None = None
    ) -> AsyncIterator[AudioChunk]:
        """Stream ``(float32 [T] PCM, sample_rate Hz)`` chunks as the model produces them.

        Closing the iterator early must cancel the request in the server. Raises
        ``InferenceError`` (model error) or ``TritonUnavailableError`` while iterating.
        """

    async def generate_images(self, model: str, job: ImageJob) -> list[GeneratedImage]:
        """Generate ``job.n`` images on the image model ``model`` (all requests in flight at once).

        Raises ``InvalidRequestError`` (the model rejected an input), ``InferenceError``,
        ``ModelNotReadyError`` or ``TritonUnavailableError``.
        """

    def generate(self, model: str, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Stream the chat-contract responses of one request as the model produces them.

        Closing the iterator early must cancel the request in the server (the stage then aborts
        it in its engine). Raises ``InvalidRequestError`` (the model rejected the input),
        ``InferenceError``, ``ModelNotReadyError`` or ``TritonUnavailableError`` while iterating.
        """

    async def close(self) -> None:
        """Release connections."""


# --------------------------------------------------------------------------- Triton
#: Triton 2.51's error when a model's Python stub process died; the model stays READY until it
#: is loaded again (``omni-triton serve`` does that), so the request is retryable: 503.
_STUB_DOWN = "is not healthy"
_UNAVAILABLE_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def _translate(exc: Exception, what: str) -> EngineError:
    """Map tritonclient / gRPC exceptions to typed engine errors."""
    if isinstance(exc, InferenceServerException):
        status = exc.status() or ""
        if any(status.endswith(c.name) for c in _UNAVAILABLE_CODES):
            return TritonUnavailableError(f"Triton is unavailable ({what}): {exc.message()}")
        return InferenceError(f"Triton error ({what}): {exc.message()}")
    if isinstance(exc, grpc.aio.AioRpcError):
        if exc.code() in _UNAVAILABLE_CODES:
            return TritonUnavailableError(f"Triton is unavailable ({what}): {exc.details()}")
        return InferenceError(f"Triton error ({what}): {exc.code().name}: {exc.details()}")
    return InferenceError(f"{what}: {exc}")


class TritonEngine(ImageEngineMixin):
    """``Engine`` over one ``tritonclient.grpc.aio.InferenceServerClient``.

    Args:
        url: Triton gRPC endpoint, ``host:port`` (default port 8001).
        models: names to serve; None serves every model in Triton's repository index.
        rpc_timeout_s: deadline for unary metadata calls (health, index, config).
    """

    def __init__(self, url: str, models: list[str] | None = None, rpc_timeout_s: float = 5.0):
        self.url = url
        self._served = list(dict.fromkeys(models)) if models else None
        self._timeout = rpc_timeout_s
        # Created on first use, inside the event loop that will use it (grpc.aio channels
        # belong to one loop; uvicorn starts its loop after this object is built).
        self._client_obj: grpcclient.InferenceServerClient | None = None
        # name -> ModelInfo of a READY model; dropped when the model is seen not READY (reload)
        self._config_cache: dict[str, ModelInfo] = {}

    @property
    def _client(self) -> grpcclient.InferenceServerClient:
        if self._client_obj is None:
            self._client_obj = grpcclient.InferenceServerClient(url=self.url)
        return self._client_obj

    async def close(self) -> None:
        if self._client_obj is not None:
            await self._client_obj.close()
            self._client_obj = None

    async def is_live(self) -> bool:
        try:
            return bool(await self._client.is_server_live(client_timeout=self._timeout))
        except Exception:  # noqa: BLE001 - any failure means "not live"
            return False

    async def _index(self) -> dict[str, tuple[str, str]]:
        """name -> (state, reason); a model with any READY version counts as READY."""
        try:
            index = await self._client.get_model_repository_index(client_timeout=self._timeout)
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, "repository index") from exc
        states: dict[str, tuple[str, str]] = {}
        for m in index.models:
            prev = states.get(m.name)
            if prev is None or (prev[0] != "READY" and m.state == "READY"):
                # Triton lists models it has not loaded (explicit model control) with no state
                states[m.name] = (m.state or "UNLOADED", m.reason)
        return states

    async def _config(self, name: str, state: str, reason: str) -> ModelInfo:
        cached = self._config_cache.get(name)
        if cached is not None:
            return cached
        try:
            resp = await self._client.get_model_config(name, client_timeout=self._timeout)
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, f"config of {name}") from exc
        info = model_info_from_config(resp.config, state, reason)
        self._config_cache[name] = info
        return info

    async def list_models(self) -> list[ModelInfo]:
        states = await self._index()
        names = self._served if self._served is not None else sorted(states)
        out = []
        for name in names:
            state, reason = states.get(name, ("MISSING", "not in Triton's model repository"))
            if state != "READY":
                self._config_cache.pop(name, None)  # reloaded models may change config
                out.append(ModelInfo(name=name, state=state, reason=reason))
                continue
            try:
                out.append(_unready_dependencies(await self._config(name, state, reason), states))
            except InferenceError as exc:  # unloaded between the two calls
                out.append(ModelInfo(name=name, state="UNAVAILABLE", reason=exc.message))
        return out

    async def get_model(self, name: str) -> ModelInfo:
        if self._served is not None and name not in self._served:
            raise ModelNotFoundError(f"The model '{name}' does not exist", param="model")
        try:
            ready = await self._client.is_model_ready(name, client_timeout=self._timeout)
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, f"readiness of {name}") from exc
        if not ready:
            self._config_cache.pop(name, None)
            states = await self._index()
            if name not in states and self._served is None:
                raise ModelNotFoundError(f"The model '{name}' does not exist", param="model")
            state, reason = states.get(name, ("MISSING", "not in Triton's model repository"))
            raise ModelNotReadyError(
                f"The model '{name}' is not ready in Triton (state {state}"
                + (f": {reason}" if reason else "")
                + ")",
                param="model",
            )
        info = await self._config(name, "READY", "")
        if info.depends_on:
            checked = _unready_dependencies(info, await self._index())
            if not checked.ready:
                raise ModelNotReadyError(
                    f"The model '{name}' is not ready: {checked.reason}", param="model")
        return info

    async def synthesize(
        self, model: str, text: str, voice: str | None = None, speed: float | None = None
    ) -> AsyncIterator[AudioChunk]:
        """One ``ModelStreamInfer`` RPC: send one request, yield each ``AUDIO`` response.

        The request iterator yields the single request and ends, which half-closes the stream;
        Triton finishes the RPC once that request's FINAL flag is out. Every streamed response
        carries ``triton_final_response``, so the last audio response is recognised too.

        Cancellation: ``stream_infer`` returns tritonclient's ``_ResponseIterator`` whose
        ``cancel()`` is ``grpc.aio.Call.cancel()`` (tritonclient 2.73,
        ``tritonclient/grpc/aio/__init__.py``). It is called in ``finally`` whenever the RPC
        has not finished on its own: on ``aclose()`` / ``GeneratorExit`` (consumer stopped), on
        ``CancelledError`` (task cancelled, e.g. HTTP disconnect) and on our own errors.
        """
        info = self._config_cache.get(model)
        inputs_declared = info.inputs if info is not None else frozenset({"TEXT", "VOICE", "SPEED"})
        inputs = [_bytes_input("TEXT", text)]
        if voice is not None and "VOICE" in inputs_declared:
            inputs.append(_bytes_input("VOICE", voice))
        if speed is not None and "SPEED" in inputs_declared:
            t = InferInput("SPEED", [1], "FP32")
            t.set_data_from_numpy(np.array([speed], dtype=np.float32))
            inputs.append(t)
        request_id = uuid.uuid4().hex

        async def _requests():
            yield {"model_name": model, "inputs": inputs, "request_id": request_id}

        call = self._client.stream_infer(_requests())
        finished = False
        try:
            async for result, error in call:
                if error is not None:
                    finished = True  # the request's final response: never cancel an ended stream
                    message = error.message()
                    if _STUB_DOWN in message:  # the launcher reloads the model within seconds
                        raise ModelNotReadyError(f"{model}: {message} (being restarted)",
                                                 param="model")
                    raise InferenceError(f"{model}: {message}")
                response = result.get_response()
                audio = result.as_numpy("AUDIO")
                if audio is not None and audio.size:
                    rate = result.as_numpy("SAMPLE_RATE")
                    sample_rate = int(rate.reshape(-1)[0]) if rate is not None and rate.size else None
                    if sample_rate is None:
                        sample_rate = info.sample_rate if info and info.sample_rate else 0
                    yield np.asarray(audio, dtype=np.float32).reshape(-1), sample_rate
                param = response.parameters.get("triton_final_response")
                if param is not None and param.bool_param:
                    finished = True  # the RPC ends right after; keep reading to its end
            finished = True
        except EngineError:
            raise
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                raise InferenceError(f"{model}: stream cancelled by the server") from exc
            raise _translate(exc, f"stream to {model}") from exc
        except InferenceServerException as exc:
            raise _translate(exc, f"stream to {model}") from exc
        finally:
            if not finished:
                call.cancel()
                logger.debug("cancelled Triton stream %s (%s)", request_id, model)


    async def generate_images(self, model: str, job: ImageJob) -> list[GeneratedImage]:
        """``job.n`` unary ``ModelInfer`` calls on the ensemble ``model``, all in flight at once.

        One request per image (seed ``job.seed + i``) rather than one request with a batch
        dimension of ``n``: each image is then scheduled on its own by Triton's dynamic batchers
        (mixed with other clients' images up to ``max_batch_size``), an ``n`` above a stage's
        ``max_batch_size`` still works, and every image equals the single-image request with its
        seed. A ``TaskGroup`` cancels the others when one fails or the caller is cancelled (client
        disconnect), which cancels their gRPC calls.
        """

        async def one(i: int) -> GeneratedImage:
            try:
                result = await self._client.infer(model, _image_inputs(job, i),
                                                  request_id=f"{uuid.uuid4().hex}-{i}")
            except InferenceServerException as exc:
                message = exc.message() or str(exc)
                if _STUB_DOWN in message:
                    raise ModelNotReadyError(f"{model}: {message} (being restarted)", param="model") from exc
                if (exc.status() or "").endswith("INVALID_ARGUMENT"):
                    raise InvalidRequestError(f"{model}: {message}") from exc
                raise _translate(exc, f"inference on {model}") from exc
            except grpc.aio.AioRpcError as exc:
                raise _translate(exc, f"inference on {model}") from exc
            pixels = result.as_numpy("IMAGE")
            if pixels is None:
                raise InferenceError(f"{model}: no IMAGE in the response")
            steps = result.as_numpy("NUM_STEPS")
            seconds = result.as_numpy("DENOISE_SECONDS")
            return GeneratedImage(
                pixels=np.asarray(pixels, dtype=np.uint8).reshape(pixels.shape[-3:]),
                seed=job.seed + i,
                steps=int(steps.reshape(-1)[0]) if steps is not None else job.steps,
                denoise_seconds=float(seconds.reshape(-1)[0]) if seconds is not None else 0.0,
            )

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(i)) for i in range(job.n)]
        except* EngineError as eg:
            raise eg.exceptions[0] from None
        return [t.result() for t in tasks]


    async def generate(self, model: str, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """One ``ModelStreamInfer`` RPC carrying one chat-contract request; yields every response.

        Errors arrive in-band (an ``error_message`` without a code). The header
        ``triton_grpc_error: true`` would carry the gRPC status instead, but in that mode
        tritonserver 2.51 crashed (SIGSEGV after "HandleCancellation called even when the context
        was not cancelled", server#7368): on BLS error responses in ~200 tries, and on single-stage
        ``llm`` errors while BLS streams ran (newcomer trial, 3 of 3 servers). So a stage's
        ``INVALID_ARG`` is recognised by its message prefix (``INVALID_INPUT_PREFIX``) and becomes
        ``InvalidRequestError`` (HTTP 400); other errors are 500s. Cancellation as in ``synthesize``: closing the generator (or cancelling its task)
        cancels the gRPC call, which Triton turns into ``request.is_cancelled()`` in the stage.
        """
        info = self._config_cache.get(model)
        declared = info.inputs if info is not None else frozenset(
            {"PROMPT", "MESSAGES", "SAMPLING_PARAMETERS", "MODALITIES", "VOICE"})
        inputs = chat_inputs(request, declared)
        request_id = request.request_id or uuid.uuid4().hex

        async def _requests():
            yield {"model_name": model, "inputs": inputs, "request_id": request_id}

        call = self._client.stream_infer(_requests())  # in-band errors: see the docstring
        finished = False
        try:
            async for result, error in call:
                if error is not None:  # in-band error: the request's final response
                    finished = True  # never cancel an ended stream (2.51 may crash, server#7368)
                    raise _stream_error(model, error.message(), None)
                yield chunk_from_result(result, info.sample_rate if info else None)
                param = result.get_response().parameters.get("triton_final_response")
                if param is not None and param.bool_param:
                    finished = True
            finished = True
        except EngineError:
            raise
        except grpc.aio.AioRpcError as exc:
            finished = True  # the RPC has ended with this status: nothing to cancel
            if exc.code() == grpc.StatusCode.CANCELLED:
                raise InferenceError(f"{model}: stream cancelled by the server") from exc
            raise _stream_error(model, exc.details() or "", exc.code()) from exc
        except InferenceServerException as exc:
            raise _translate(exc, f"stream to {model}") from exc
        finally:
            if not finished:
                call.cancel()
                logger.debug("cancelled Triton stream %s (%s)", request_id, model)


def _image_inputs(job: ImageJob, index: int) -> list[InferInput]:
    """The diffusion ensemble's inputs for image ``index`` of ``job`` (docs/image_contracts.md)."""
    inputs = []
    for name, text in (("PROMPT", job.prompt), ("NEGATIVE_PROMPT", job.negative_prompt or "")):
        t = InferInput(name, [1, 1], "BYTES")  # [batch, 1]: the ensembles have max_batch_size > 0
        t.set_data_from_numpy(np.array([[text.encode("utf-8")]], dtype=np.object_))
        inputs.append(t)
    for name, dtype, value in (
        ("HEIGHT", np.int32, job.height), ("WIDTH", np.int32, job.width),
        ("NUM_INFERENCE_STEPS", np.int32, job.steps), ("TRUE_CFG_SCALE", np.float32, job.true_cfg_scale),
        ("GUIDANCE_SCALE", np.float32, job.guidance_scale if job.guidance_scale is not None else 0.0),
        ("SEED", np.int64, job.seed + index),
    ):
        array = np.array([[value]], dtype=dtype)
        t = InferInput(name, list(array.shape), {np.int32: "INT32", np.float32: "FP32", np.int64: "INT64"}[dtype])
        t.set_data_from_numpy(array)
        inputs.append(t)
    if job.image is not None:
        array = np.ascontiguousarray(job.image, dtype=np.uint8)[None]
        t = InferInput("INPUT_IMAGE", list(array.shape), "UINT8")
        t.set_data_from_numpy(array)
        inputs.append(t)
    return inputs


def _stream_error(model: str, message: str, code: grpc.StatusCode | None) -> EngineError:
    """Typed error for a failed chat stream (gRPC status from ``triton_grpc_error`` mode)."""
    if _STUB_DOWN in message:  # the launcher reloads the model within seconds
        return ModelNotReadyError(f"{model}: {message} (being restarted)", param="model")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequestError(message)
    if INVALID_INPUT_PREFIX in message:  # a stage's INVALID_ARG that arrived in-band, code lost
        return InvalidRequestError(message.split(INVALID_INPUT_PREFIX, 1)[1] or message)
    if code in _UNAVAILABLE_CODES or code == grpc.StatusCode.NOT_FOUND:
        # NOT_FOUND: the model was unloaded between the readiness check and the request
        return ModelNotReadyError(f"{model}: {message}", param="model")
    return InferenceError(f"{model}: {message}")


def chat_inputs(request: GenerationRequest, declared: frozenset[str]) -> list[InferInput]:
    """Triton inputs of one chat-contract request (``docs/chat_contracts.md``).

    Optional inputs the model does not declare (``MODALITIES`` / ``VOICE`` on a text-only model)
    are left out rather than sent; ``SAMPLING_PARAMETERS`` is sent only when non-empty.
    """
    if (request.messages is None) == (request.prompt is None):
        raise ValueError("exactly one of messages / prompt must be set")
    if request.messages is not None:
        inputs = [_bytes_input("MESSAGES", json.dumps(request.messages, ensure_ascii=False))]
    else:
        inputs = [_bytes_input("PROMPT", request.prompt)]
    if request.sampling:
        inputs.append(_bytes_input("SAMPLING_PARAMETERS", json.dumps(request.sampling)))
    if request.modalities is not None and "MODALITIES" in declared:
        inputs.append(_bytes_input("MODALITIES", json.dumps(list(request.modalities))))
    if request.voice is not None and "VOICE" in declared:
        inputs.append(_bytes_input("VOICE", request.voice))
    return inputs


def _first(result, name: str):
    arr = result.as_numpy(name)
    if arr is None or arr.size == 0:
        return None
    return arr.reshape(-1)[0]


def chunk_from_result(result, default_rate: int | None = None) -> GenerationChunk:
    """A ``GenerationChunk`` from one tritonclient ``InferResult`` of a chat-contract model."""
    text = _first(result, "TEXT_DELTA")
    reason = _first(result, "FINISH_REASON")
    prompt_tokens = _first(result, "PROMPT_TOKENS")
    completion_tokens = _first(result, "COMPLETION_TOKENS")
    audio = result.as_numpy("AUDIO")
    rate = _first(result, "SAMPLE_RATE")

    def _str(v) -> str:
        if v is None:
            return ""
        return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)

    return GenerationChunk(
        text=_str(text),
        finish_reason=_str(reason) or None,
        prompt_tokens=int(prompt_tokens) if prompt_tokens is not None else None,
        completion_tokens=int(completion_tokens) if completion_tokens is not None else None,
        audio=np.asarray(audio, dtype=np.float32).reshape(-1) if audio is not None and audio.size else None,
        sample_rate=int(rate) if rate is not None else default_rate,
    )


def _bytes_input(name: str, value: str) -> InferInput:
    t = InferInput(name, [1], "BYTES")
    t.set_data_from_numpy(np.array([value.encode("utf-8")], dtype=np.object_))
    return t

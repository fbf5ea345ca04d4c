"""``TritonEngine``: the ``Engine`` protocol over ``tritonclient.grpc.aio``.

Model metadata comes from Triton itself:
* the repository index gives every model's state (``READY``, ``UNAVAILABLE``, ...);
* ``get_model_config`` gives inputs/outputs and the ``parameters`` read by
  ``model_info.model_info_from_config``.

Images (``generate_images``) are unary ``ModelInfer`` calls on a diffusion ensemble, one per
image, all in flight at once (Triton's dynamic batchers group them); see docs/image_contracts.md.
``generate`` streams one chat-contract request (docs/chat_contracts.md; one RPC per choice).

Speech is one ``ModelStreamInfer`` call per HTTP request on a decoupled model: every response
that carries ``AUDIO`` is yielded as soon as it arrives. Closing the iterator (HTTP client gone,
task cancelled, consumer stopped) cancels the gRPC call; Triton's gRPC stream handler then
cancels the in-flight request, which a Python-backend model sees as ``request.is_cancelled()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import re
import sys
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from numpy.typing import NDArray
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException

from omni_triton import triton_admin
from omni_triton.contracts import asr as asr_contract
from omni_triton.contracts import chat as chat_contract
from omni_triton.contracts import image as image_contract
from omni_triton.contracts import qwen3_tts as qwen3_contract
from omni_triton.contracts import speech as speech_contract
from omni_triton.contracts import stable_audio as audio_generate_contract
from omni_triton.contracts import video as video_contract
from omni_triton.contracts.tensors import (
    INVALID_INPUT_PREFIX,
    PACED,
    STAGE_COMPUTE_MS,
    STAGE_METRICS,
    infer_input,
    scalar_array,
    step_compute_output,
    utf8_array,
    wrap_inputs,
)
from omni_triton.media.image import pixels_from_png_base64
from omni_triton.serve import on_demand as od

from .errors import (
    EngineError,
    InferenceError,
    InvalidRequestError,
    ModelLoadFailedError,
    ModelLoadingError,
    ModelNotFoundError,
    ModelNotReadyError,
    ModelTooLargeError,
    StageDownError,
    StageRestartedError,
    TritonUnavailableError,
)
from .model_info import ModelInfo, model_info_from_config, unready_dependencies
from .paced_slots import PacedSlots
from .protocol import (
    AudioChunk,
    AudioGenerateEvent,
    AudioGenerateJob,
    GeneratedImage,
    GenerationChunk,
    GenerationRequest,
    ImageJob,
    SpeechOptions,
    VideoEvent,
    VideoJob,
)
from .replicas import Replica, ReplicaSet, Resolver, pinned_index
from .triton_private import infer_result, open_stream

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------- Triton
#: Triton 2.51's error when a model's Python stub process died; the model stays READY until it
#: is loaded again (``omni-triton serve`` does that), so the request is retryable: 503.
_STUB_DOWN = "is not healthy"
#: A BLS model's call to a stage Triton is reloading (a killed stub): python_backend's
#: "Model 'whisper_decoder' is not ready." reaches the caller in-band
_STAGE_NOT_READY = re.compile(r"Model '[^']+' is not ready")
#: Triton's answer to a restricted call without the right key (omni_triton.triton_admin)
_RESTRICTED = "is restricted, expecting header"
_UNAVAILABLE_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
#: Inputs assumed declared while a model's config is not cached yet (every optional input is sent).
_SPEECH_INPUTS = frozenset({speech_contract.TEXT, speech_contract.VOICE, speech_contract.SPEED})
_CHAT_INPUTS = frozenset({chat_contract.PROMPT, chat_contract.MESSAGES, chat_contract.SAMPLING_PARAMETERS,
                          chat_contract.MODALITIES, chat_contract.VOICE})
_ASR_INPUTS = frozenset({asr_contract.AUDIO, asr_contract.LANGUAGE, asr_contract.PROMPT, asr_contract.TASK})
#: Channel options: tritonclient's defaults (unlimited message sizes) plus a short reconnect
#: backoff. gRPC's default backoff grows to 120 s, so after a tritonserver restart the frontend
#: kept answering 503 for up to 28 s (measured); with these it reconnects within ~1 s of Triton
#: listening again.
CHANNEL_ARGS = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 2**31 - 1),
]


def _translate(exc: Exception, what: str) -> EngineError:
    """Map tritonclient / gRPC exceptions to typed engine errors."""
    if isinstance(exc, InferenceServerException):
        status = exc.status() or ""
        if _RESTRICTED in (exc.message() or ""):
            return TritonUnavailableError(
                f"Triton refused the frontend's admin call ({what}): the frontend lacks the key "
                f"tritonserver was started with (env {triton_admin.ENV} or {triton_admin.ENV_FILE})")
        if any(status.endswith(c.name) for c in _UNAVAILABLE_CODES):
            return TritonUnavailableError(f"Triton is unavailable ({what}): {exc.message()}")
        return InferenceError(f"Triton error ({what}): {exc.message()}")
    if isinstance(exc, grpc.aio.AioRpcError):
        if exc.code() in _UNAVAILABLE_CODES:
            return TritonUnavailableError(f"Triton is unavailable ({what}): {exc.details()}")
        return InferenceError(f"Triton error ({what}): {exc.code().name}: {exc.details()}")
    return InferenceError(f"{what}: {exc}")


#: Triton's own UNAVAILABLE answer (a model it does not have READY): the server answered, the
#: replica is fine; every other UNAVAILABLE is the transport's (refused, reset, closed socket).
_MODEL_UNAVAILABLE = "Request for unknown model"


def _connect_failed(exc: BaseException) -> bool:
    """Whether ``exc`` (tritonclient / gRPC) says the call never got an answer from Triton: status
    ``UNAVAILABLE`` from the transport (connection refused or lost before any response), not
    Triton's own ``UNAVAILABLE`` for a model it lacks. Such a call may be sent to another replica,
    and its replica is drained (``ReplicaSet.mark_down``)."""
    if isinstance(exc, InferenceServerException):
        status, message = exc.status() or "", exc.message() or ""
    elif isinstance(exc, grpc.aio.AioRpcError):
        status, message = exc.code().name, exc.details() or ""
    else:
        return False
    return status.endswith(grpc.StatusCode.UNAVAILABLE.name) and _MODEL_UNAVAILABLE not in message


class _NoResponse(Exception):
    """A stream whose replica could not be reached: it ended with a transport ``UNAVAILABLE``
    before any response (``TritonEngine._stream`` may start it again on another replica)."""

    def __init__(self, error: EngineError):
        super().__init__(error.message)
        self.error = error


#: Seconds an unload may take to release its model (python stubs end their instances) before
#: the policy goes on regardless; polled every :data:`_UNLOAD_POLL_S`.
_UNLOAD_WAIT_S = 120.0
_UNLOAD_POLL_S = 0.25
#: Triton index states of a model that still holds its memory
_HOLDING = frozenset({"READY", "UNLOADING", "LOADING"})


class TritonModelControl:
    """``omni_triton.serve.on_demand.ModelControl`` over ``tritonclient.grpc.aio``: Triton's
    explicit model control (``RepositoryModelLoad`` / ``Unload``, admin key headers), its
    repository index and its statistics. Every call is async: the event loop stays free.

    Args:
        engine: the :class:`TritonEngine` whose client (one gRPC channel) and admin headers it uses.
    """

    def __init__(self, engine: TritonEngine):
        self._engine = engine

    async def load(self, model: str) -> None:
        """Load ``model``; returns when Triton has it READY (no deadline: a load takes as long as
        it takes; waiters time out in the policy, not here).

        Raises:
            ModelLoadError: Triton answered the load with an error (its message: the reason).
            EngineError: Triton unreachable or the admin key refused (``_translate``).
        """
        e = self._engine
        try:
            await e._client.load_model(model, headers=e._admin_headers)
        except InferenceServerException as exc:
            error = _translate(exc, f"load of {model}")
            if isinstance(error, TritonUnavailableError) or _RESTRICTED in (exc.message() or ""):
                raise error from exc
            raise od.ModelLoadError(exc.message() or str(exc)) from exc

    async def unload(self, model: str) -> None:
        """Unload ``model`` (only it) and wait, polling Triton's index every 0.25 s for at most
        120 s, until its state no longer holds memory (Triton's unload returns at once and the
        stubs end in the background). Raises ``EngineError`` (``_translate``)."""
        e = self._engine
        try:
            await e._client.unload_model(model, headers=e._admin_headers, client_timeout=e._timeout)
        except Exception as exc:
            raise _translate(exc, f"unload of {model}") from exc
        deadline = time.monotonic() + _UNLOAD_WAIT_S
        while time.monotonic() < deadline:
            state = (await e._index()).get(model, ("UNLOADED", ""))[0]
            if state not in _HOLDING:
                return
            await asyncio.sleep(_UNLOAD_POLL_S)
        logger.warning("on-demand: %s still %s %.0f s after its unload", model, state, _UNLOAD_WAIT_S)

    async def ready_models(self) -> set[str]:
        """Models Triton's repository index lists READY. Raises ``EngineError``."""
        return {name for name, (state, _) in (await self._engine._index()).items() if state == "READY"}

    async def last_inference(self, models: list[str]) -> dict[str, float]:
        """Model -> wall-clock seconds of its last inference (Triton statistics
        ``last_inference``, ms since the epoch, the latest over versions); never-called or
        unknown models are left out. Raises ``EngineError`` when Triton is unreachable."""
        e = self._engine
        out: dict[str, float] = {}
        for name in models:
            try:
                resp = await e._client.get_inference_statistics(name, client_timeout=e._timeout)
            except InferenceServerException as exc:
                if (exc.status() or "").endswith(tuple(c.name for c in _UNAVAILABLE_CODES)):
                    raise _translate(exc, f"statistics of {name}") from exc
                continue
            last = max((int(m.last_inference) for m in resp.model_stats), default=0)
            if last > 0:
                out[name] = last / 1000.0
        return out


def _make_client(address: str) -> grpcclient.InferenceServerClient:
    """The client (one gRPC channel, :data:`CHANNEL_ARGS`) of the replica at ``address``."""
    return grpcclient.InferenceServerClient(url=address, channel_args=CHANNEL_ARGS)


async def _close_client(client: grpcclient.InferenceServerClient) -> None:
    await client.close()


def _on_demand_error(exc: od.OnDemandError) -> EngineError:
    """The engine error (OpenAI code, HTTP status, ``Retry-After``) of a policy error."""
    if isinstance(exc, od.LoadTimeout):
        return ModelLoadingError(exc.message, param="model", retry_after_s=exc.retry_after_s)
    if isinstance(exc, od.TooLarge):
        return ModelTooLargeError(exc.message, param="model")
    return ModelLoadFailedError(exc.message, param="model", retry_after_s=int(od.FAILED_BACKOFF_S))


class TritonEngine:
    """``Engine`` over one or more Triton replicas, one ``tritonclient.grpc.aio.InferenceServerClient``
    (one gRPC channel) each (:class:`~openai_frontend.engine.replicas.ReplicaSet`).

    Every call goes through the replica set: a unary ``ModelInfer`` is routed per request (least
    outstanding among the healthy replicas with the model READY) and sent once more, to another
    replica, when it could not reach its first one (transport ``UNAVAILABLE``, no response); a
    stream stays on the replica it started on (started again elsewhere only when its replica
    could not be reached before any response); metadata (index, configs, liveness, statistics)
    is merged over the healthy replicas. With one ``host:port`` this is the single Triton of
    before: no probes, no draining.

    Args:
        url: ``--triton-url``: Triton gRPC endpoint(s), ``host:port[,host:port...]`` (default port
            8001) or ``dns:///NAME:PORT`` (every address NAME resolves to; re-resolved).
        models: names to serve; None serves every model in Triton's repository index.
        rpc_timeout_s: deadline for unary metadata calls (health, index, config).
        admin_key: the key of Triton's restricted APIs (``omni_triton.triton_admin``), sent as
            the ``triton-grpc-protocol-omni-triton-admin-key`` metadata on the repository-index and model-config
            calls; ``None`` sends none (a Triton started without the restriction).
        on_demand: a factory of the on-demand policy over this engine's
            :class:`TritonModelControl` (``--on-demand``; docs/running.md "On-demand models");
            its pipelines are served too. ``offline`` maps each on-demand pipeline to its
            ``ModelInfo`` read from the repository (Triton returns configs of loaded models only),
            listed while the pipeline is not loaded. Only with a single replica.
        resolve_interval_s: seconds between DNS resolutions of a ``dns:///`` url.
        health_interval_s: seconds between readiness probes of the replicas (several, or DNS).
        resolver: ``(host, port) -> ["ip:port", ...]`` for ``dns:///`` (tests; default: the
            event loop's ``getaddrinfo``).

    Raises:
        ValueError: a malformed ``url``, ``on_demand`` with more than one replica, or a bad
            ``OMNI_TRITON_PIN_REPLICA`` (test hook, ``replicas.PIN_ENV``).
    """

    def __init__(self, url: str, models: list[str] | None = None, rpc_timeout_s: float = 5.0,
                 admin_key: str | None = None,
                 on_demand: Callable[[TritonModelControl], od.OnDemandModels] | None = None,
                 offline: dict[str, ModelInfo] | None = None, *, resolve_interval_s: float = 10.0,
                 health_interval_s: float = 1.0, resolver: Resolver | None = None):
        self.url = url
        self._timeout = rpc_timeout_s
        self._admin_headers = triton_admin.headers(admin_key, grpc=True) or None
        # Clients are created on first use, inside the event loop that will use them (grpc.aio
        # channels belong to one loop; uvicorn starts its loop after this object is built).
        self.replicas: ReplicaSet[grpcclient.InferenceServerClient] = ReplicaSet(
            url, _make_client, self._probe, _close_client, resolve_interval_s=resolve_interval_s,
            health_interval_s=health_interval_s, resolver=resolver, pin=pinned_index())
        if on_demand is not None and self.replicas.checked:
            raise ValueError("on-demand models need a single Triton replica (each replica's "
                             "omni-triton serve --models decides what it holds)")
        #: the on-demand policy (None: every served model is loaded by ``serve`` at start)
        self.on_demand = on_demand(TritonModelControl(self)) if on_demand is not None else None
        self._offline = dict(offline or {})
        if self.on_demand is not None and models:
            extra = [n for n, p in self.on_demand.graph.pipelines.items() if not p.pinned]
            models = list(models or []) + extra
        self._served = list(dict.fromkeys(models)) if models else None
        # name -> ModelInfo of a READY model; dropped when the model is seen not READY (reload)
        self._config_cache: dict[str, ModelInfo] = {}
        #: Triton name -> served_model_name, kept while a model is unloaded (Triton returns configs
        #: of loaded models only), so its OpenAI name still resolves to a 503, not a 404.
        self._served_names: dict[str, str] = {}
        # request id -> (model, cancel()) of every Triton call in flight; abort_inflight ends the
        # calls of a stage that died, recording request id -> dead stage in _aborted.
        self._inflight: dict[str, tuple[str, Callable[[], object]]] = {}
        self._aborted: dict[str, str] = {}
        #: open PACED streams per model, bounded by each model's ``max_paced_streams``
        self.paced_slots = PacedSlots()

    def _hold(self, model: str) -> contextlib.AbstractContextManager[None]:
        """The on-demand policy's in-flight hold of ``model`` for one Triton call (a busy
        pipeline is never unloaded); a no-op without ``--on-demand``."""
        if self.on_demand is None:
            return contextlib.nullcontext()
        return self.on_demand.in_flight(model)

    @property
    def _client(self) -> grpcclient.InferenceServerClient:
        """The client of the single replica (``TritonModelControl``: on-demand needs one replica)."""
        return self.replicas.replicas[0].client

    async def start(self) -> None:
        """Resolve and probe the replicas once and start their background loops (several
        replicas or DNS; a no-op with one ``host:port``). Called by the app's lifespan; every call
        also does it on first use."""
        await self.replicas.start()

    async def _probe(self, client: grpcclient.InferenceServerClient) -> frozenset[str]:
        """One replica's health probe (``ReplicaSet``): Triton's ``is_server_ready``, then its
        repository index (admin headers); returns the models READY there.

        Raises:
            EngineError: not ready, unreachable, or the admin key refused (``_translate``).
        """
        try:
            ready = await client.is_server_ready(client_timeout=self._timeout)
            index = await client.get_model_repository_index(headers=self._admin_headers,
                                                            client_timeout=self._timeout)
        except Exception as exc:
            raise _translate(exc, "readiness probe") from exc
        if not ready:
            raise TritonUnavailableError("Triton is not ready")
        return frozenset(m.name for m in index.models if m.state == "READY")

    def abort_inflight(self, models: list[str], dead_stage: str) -> int:
        """End every in-flight Triton call on ``models`` because ``dead_stage``'s stub died.

        Triton 2.51 never finishes a request whose stub process died, and the model's reload
        waits for it; so the calls are cancelled here and raise :class:`StageRestartedError`
        (503) in their callers. Called by ``stage_watch.ServeStatusWatch`` (``serve``'s status
        file). Returns the number of calls ended.
        """
        ended = 0
        for request_id, (model, cancel) in list(self._inflight.items()):
            if model in models:
                self._aborted[request_id] = dead_stage
                cancel()
                ended += 1
        if ended:
            logger.warning("ended %d in-flight request(s) on %s: stage %s died", ended,
                           ", ".join(models), dead_stage)
        return ended

    def _stage_restarted(self, request_id: str, model: str) -> StageRestartedError | None:
        """The error for a call that :meth:`abort_inflight` cancelled (not a task cancellation:
        the caller's own cancel, e.g. an HTTP disconnect, stays a ``CancelledError``)."""
        dead = self._aborted.pop(request_id, None)
        task = asyncio.current_task()
        if dead is None or (task is not None and _cancelling(task)):
            return None
        return StageRestartedError(
            f"{model}: its stage {dead} died while this request was running and is being "
            "restarted; retry the request", param="model")

    async def close(self) -> None:
        await self.replicas.close()

    async def is_live(self) -> bool:
        """Whether any healthy replica answers ``is_server_live`` with true."""
        try:
            await self.replicas.start()
        except Exception:
            return False

        async def live(replica: Replica[grpcclient.InferenceServerClient]) -> bool:
            try:
                return bool(await replica.client.is_server_live(client_timeout=self._timeout))
            except Exception as exc:
                if _connect_failed(exc):
                    self.replicas.mark_down(replica, str(exc))
                return False

        return any(await asyncio.gather(*(live(r) for r in self.replicas.healthy())))

    async def _index(self) -> dict[str, tuple[str, str]]:
        """name -> (state, reason), merged over the healthy replicas: a model with any READY
        version on any replica counts as READY.

        Raises:
            EngineError: no healthy replica answered (the first one's error, ``_translate``).
        """
        await self.replicas.start()
        replicas = self.replicas.healthy()
        if not replicas:
            self.replicas.pick(None)  # raises TritonUnavailableError with every replica's reason
        answers = await asyncio.gather(
            *(r.client.get_model_repository_index(headers=self._admin_headers, client_timeout=self._timeout)
              for r in replicas), return_exceptions=True)
        errors = [a for a in answers if isinstance(a, BaseException)]
        for replica, answer in zip(replicas, answers, strict=True):
            if isinstance(answer, BaseException) and _connect_failed(answer):
                self.replicas.mark_down(replica, str(answer))
        if len(errors) == len(answers):
            exc = errors[0]
            if not isinstance(exc, Exception):
                raise exc
            raise _translate(exc, "repository index") from exc
        states: dict[str, tuple[str, str]] = {}
        for index in answers:
            if isinstance(index, BaseException):
                continue
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
        await self.replicas.start()
        replica = self.replicas.pick(name, rotate=False)
        try:
            resp = await replica.client.get_model_config(name, headers=self._admin_headers,
                                                         client_timeout=self._timeout)
        except Exception as exc:
            if _connect_failed(exc):
                self.replicas.mark_down(replica, str(exc))
            raise _translate(exc, f"config of {name}") from exc
        info = model_info_from_config(resp.config, state, reason)
        self._config_cache[name] = info
        if info.served_model_name:
            self._served_names[name] = info.served_model_name
        return info

    async def list_models(self) -> list[ModelInfo]:
        states = await self._index()
        names = self._served if self._served is not None else sorted(states)
        out = []
        for name in names:
            state, reason = states.get(name, ("MISSING", "not in Triton's model repository"))
            if self.on_demand is not None and self.on_demand.is_on_demand(name):
                out.append(await self._on_demand_info(name, state, reason, states))
                continue
            if state != "READY":
                self._config_cache.pop(name, None)  # reloaded models may change config
                out.append(ModelInfo(name=name, state=state, reason=reason,
                                     served_model_name=self._served_names.get(name)))
                continue
            try:
                out.append(unready_dependencies(await self._config(name, state, reason), states))
            except InferenceError as exc:  # unloaded between the two calls
                out.append(ModelInfo(name=name, state="UNAVAILABLE", reason=exc.message))
        return out

    async def _on_demand_info(self, name: str, state: str, reason: str,
                              states: dict[str, tuple[str, str]]) -> ModelInfo:
        """An on-demand pipeline as ``list_models`` shows it: its live ``ModelInfo`` when Triton
        has it READY with its stages, else the repository's (``offline``) with the policy's state
        (``LOADING``, ``UNLOADED``, ``FAILED``) and reason; ``on_demand`` set either way."""
        assert self.on_demand is not None
        policy_state, policy_reason = self.on_demand.state(name)
        if state == "READY" and policy_state != od.State.LOADING:
            try:
                info = unready_dependencies(await self._config(name, state, reason), states)
                if info.ready:
                    return dataclasses.replace(info, on_demand=True)
            except InferenceError:
                pass  # unloaded between the two calls
        self._config_cache.pop(name, None)
        shown = {od.State.LOADING: "LOADING", od.State.FAILED: "FAILED"}.get(policy_state, "UNLOADED")
        base = self._offline.get(name) or ModelInfo(name=name, served_model_name=self._served_names.get(name))
        return dataclasses.replace(base, state=shown, reason=policy_reason, on_demand=True)

    async def _ensure_loaded(self, name: str) -> None:
        """Wait for on-demand pipeline ``name`` to load (``OnDemandModels.ensure_loaded``).

        Raises:
            ModelLoadingError, ModelLoadFailedError, ModelTooLargeError: the policy's errors.
        """
        assert self.on_demand is not None
        try:
            await self.on_demand.ensure_loaded(name)
        except od.OnDemandError as exc:
            raise _on_demand_error(exc) from None

    def offline_model(self, name: str) -> ModelInfo | None:
        """The repository's ``ModelInfo`` of on-demand pipeline ``name`` (Triton or OpenAI name)
        while it is not loaded, else ``None``: lets a route refuse a model of the wrong kind
        (``serving.common.resolve_model``) before :meth:`get_model` loads it, so a request that can
        never succeed neither loads a pipeline nor evicts another (a review finding)."""
        if self.on_demand is None or not self.on_demand.is_on_demand(name):
            return None
        triton = self.on_demand.graph.triton_name(name) or name
        if self.on_demand.state(triton)[0] == od.State.LOADED:
            return None
        return self._offline.get(triton)

    async def get_model(self, name: str) -> ModelInfo:
        if self.on_demand is not None and self.on_demand.is_on_demand(name):
            triton = self.on_demand.graph.triton_name(name) or name
            await self._ensure_loaded(triton)
            try:
                return await self._ready_model(triton)
            except ModelNotReadyError:
                # loaded by the policy but not READY now: tritonserver restarted with the pinned
                # models only (or a stage died); load it again once
                self.on_demand.lost(triton)
                await self._ensure_loaded(triton)
                return await self._ready_model(triton)
        return await self._ready_model(name)

    async def _ready_model(self, name: str) -> ModelInfo:
        """``get_model`` without on-demand loading: the served, READY model ``name``."""
        if self._served is not None and name not in self._served:
            raise ModelNotFoundError(f"The model '{name}' does not exist", param="model")
        await self.replicas.start()
        replica = self.replicas.pick(name, rotate=False)  # one that lists it READY, if any
        try:
            ready = await replica.client.is_model_ready(name, client_timeout=self._timeout)
        except Exception as exc:
            if _connect_failed(exc):
                self.replicas.mark_down(replica, str(exc))
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
            checked = unready_dependencies(info, await self._index())
            if not checked.ready:
                raise ModelNotReadyError(
                    f"The model '{name}' is not ready: {checked.reason}", param="model")
        return info

    def _paced_slot(self, model: str, info: ModelInfo | None, declared: frozenset[str],
                    paced: bool) -> contextlib.AbstractContextManager[bool]:
        """:meth:`PacedSlots.take` for one stream: paced only when asked, declared by the model
        (``PACED``) and under its ``max_paced_streams``; yields whether to send ``PACED``."""
        return self.paced_slots.take(model, paced and PACED in declared,
                                     info.max_paced_streams if info is not None else None)

    async def synthesize(
        self, model: str, text: str, voice: str | None = None, speed: float | None = None,
        options: SpeechOptions | None = None, paced: bool = False,
    ) -> AsyncGenerator[AudioChunk, None]:
        """One ``ModelStreamInfer`` RPC: send one request, yield each ``AUDIO`` response.

        The stream half-closes once that request's final response is in (``_stream``), and
        Triton then finishes the RPC. Every streamed response carries ``triton_final_response``,
        so the last audio response is recognised too.

        ``paced``: the client asked for real-time pacing (``stream_pacing: "realtime"``); sent as
        ``PACED`` to a model that declares it (its scheduler may then compute the stream just
        ahead of playback). Without it nothing is sent and the stream runs as fast as it is made.

        Cancellation: ``stream_infer`` returns tritonclient's ``_ResponseIterator`` whose
        ``cancel()`` is ``grpc.aio.Call.cancel()`` (tritonclient 2.73,
        ``tritonclient/grpc/aio/__init__.py``). It is called in ``finally`` whenever the RPC
        has not finished on its own: on ``aclose()`` / ``GeneratorExit`` (consumer stopped), on
        ``CancelledError`` (task cancelled, e.g. HTTP disconnect) and on our own errors.
        """
        info = self._config_cache.get(model)
        declared = info.inputs if info is not None else _SPEECH_INPUTS
        with self._paced_slot(model, info, declared, paced) as paced:
            inputs = _infer_inputs(speech_contract.speech_inputs(
                text,
                voice=voice if speech_contract.VOICE in declared else None,
                speed=speed if speech_contract.SPEED in declared else None,
                paced=True if paced else None,
            ))
            if options:
                inputs += _infer_inputs(qwen3_speech_inputs(options, declared))
            async for result in self._stream(model, inputs, uuid.uuid4().hex):
                audio = result.as_numpy(speech_contract.AUDIO)
                if audio is not None and audio.size:
                    rate = result.as_numpy(speech_contract.SAMPLE_RATE)
                    sample_rate = int(rate.reshape(-1)[0]) if rate is not None and rate.size else None
                    if sample_rate is None:
                        sample_rate = info.sample_rate if info and info.sample_rate else 0
                    yield np.asarray(audio, dtype=np.float32).reshape(-1), sample_rate

    async def transcribe(self, model: str, audio: NDArray[Any], language: str | None = None,
                         prompt: str | None = None, task: str = "transcribe") -> AsyncGenerator[str, None]:
        """One ``ModelStreamInfer`` RPC on an ASR model (``Engine.transcribe``): ``AUDIO`` plus the
        optional ``LANGUAGE`` / ``PROMPT`` / ``TASK`` the model declares (``asr_inputs``); yields
        each response's ``TEXT_DELTA``. Cancellation and errors as :meth:`synthesize`."""
        info = self._config_cache.get(model)
        declared = info.inputs if info is not None else _ASR_INPUTS
        inputs = _infer_inputs(asr_inputs(audio, language, prompt, task, declared))
        async for result in self._stream(model, inputs, uuid.uuid4().hex):
            delta = _first(result, asr_contract.TEXT_DELTA)
            if delta is not None:
                text = delta.decode("utf-8", errors="replace") if isinstance(delta, bytes) else str(delta)
                if text:
                    yield text

    async def _stream(self, model: str, inputs: list[InferInput],
                      request_id: str) -> AsyncGenerator[grpcclient.InferResult, None]:
        """One ``ModelStreamInfer`` RPC carrying one request; yields each response's
        ``InferResult`` until the request's final response.

        The write side stays open until the final response (or the in-band error, which is
        final) has arrived, and only then half-closes; the RPC then ends with the server's OK.
        tritonserver 2.51's stream handler reads the client's half-close (``Read`` with
        ``rpc_ok=false``) on its handler thread while the response-complete callback of the
        same stream runs on the backend's thread, without a common lock; a request answered at
        once (an ``INVALID_ARG`` from a BLS) put the two side by side, the pattern of the
        tritonserver SIGSEGV in ``TRITONBACKEND_ResponseSend`` -> the gRPC frontend's callback
        (issue 9; server#7368, fixed upstream by #7840 and #8078 after 2.51). Half-closing after
        the final response keeps them apart. The final response is recognised by
        ``triton_final_response``; ``triton_enable_empty_final_response`` makes Triton send it
        even when a stage ends with a FINAL flag and no data (that empty response is not yielded).

        Errors arrive in-band (an ``error_message`` without a code; see ``generate``), are read to
        the end of the RPC and become typed ``EngineError`` s (``_stream_error``). The RPC is
        cancelled in ``finally`` whenever it has not ended on its own (consumer stopped, task
        cancelled, our own error), and never once it has ended: cancelling an ended stream can
        crash tritonserver 2.51 (server#7368).

        Replicas: the stream stays on the replica it started on; one that dies mid-stream ends
        it with ``TritonUnavailableError`` (and is drained). One that could not be reached
        before any response (transport ``UNAVAILABLE``) is drained and the request is started
        once more on another replica, if there is one: nothing was answered yet.
        """
        await self.replicas.start()
        tried: list[Replica[grpcclient.InferenceServerClient]] = []
        replica = self.replicas.pick(model)
        while True:
            try:
                # aclosing: a consumer that stops closes the inner generators at once (their
                # finally cancels the RPC), not whenever the garbage collector finalizes them
                async with contextlib.aclosing(self._stream_on(replica, model, inputs, request_id)) as results:
                    async for result in results:
                        yield result
                return
            except _NoResponse as failed:
                tried.append(replica)
                self.replicas.mark_down(replica, failed.error.message)
                again = self._retry_replica(model, tried)
                if again is None:
                    raise failed.error from failed.__cause__
                logger.warning("stream %s (%s): %s unreachable, starting it on %s", request_id, model,
                               replica.address, again.address)
                replica = again

    def _retry_replica(self, model: str, tried: list[Replica[grpcclient.InferenceServerClient]]
                       ) -> Replica[grpcclient.InferenceServerClient] | None:
        """The replica a call that could not reach ``tried[-1]`` goes to, or None: it was already
        retried once, the set is pinned (test hook) or no other healthy replica is left."""
        if len(tried) > 1 or self.replicas.pin is not None:
            return None
        try:
            return self.replicas.pick(model, exclude=tried)
        except TritonUnavailableError:
            return None

    async def _stream_on(self, replica: Replica[grpcclient.InferenceServerClient], model: str,
                         inputs: list[InferInput], request_id: str) -> AsyncGenerator[grpcclient.InferResult, None]:
        """:meth:`_stream` on ``replica``. Raises :class:`_NoResponse` when the RPC ended with a
        transport ``UNAVAILABLE`` before any response."""
        with self.replicas.use(replica):
            answered = False
            try:
                async with contextlib.aclosing(self._stream_call(replica.client, model, inputs, request_id)) as rs:
                    async for result in rs:
                        answered = True
                        yield result
            except TritonUnavailableError as exc:
                cause = exc.__cause__
                if cause is not None and _connect_failed(cause):
                    if not answered:
                        raise _NoResponse(exc) from cause
                    self.replicas.mark_down(replica, exc.message)
                raise

    async def _stream_call(self, client: grpcclient.InferenceServerClient, model: str, inputs: list[InferInput],
                           request_id: str) -> AsyncGenerator[grpcclient.InferResult, None]:
        """One ``ModelStreamInfer`` RPC on ``client`` (:meth:`_stream`, one replica)."""
        final = asyncio.Event()
        hold = self._hold(model)
        hold.__enter__()  # released in finally: a stream is in flight until it ends or is cancelled
        try:
            call = open_stream(client, model, inputs, request_id, final)
        except BaseException:
            hold.__exit__(None, None, None)
            raise
        finished = False
        error_message = None
        self._inflight[request_id] = (model, call.cancel)
        try:
            async for response in call:
                if response.error_message:  # in-band error: the request's final response
                    error_message = response.error_message
                    final.set()
                    continue
                param = response.infer_response.parameters.get("triton_final_response")
                is_final = param is not None and param.bool_param
                if is_final:
                    final.set()  # half-close now; the RPC ends right after
                    if not response.infer_response.outputs:
                        continue  # the empty final response
                yield infer_result(response)
            finished = True
            if error_message is not None:
                raise _stream_error(model, error_message, None)
        except EngineError:
            raise
        except grpc.aio.AioRpcError as exc:
            finished = True  # the RPC has ended with this status: nothing to cancel
            if exc.code() == grpc.StatusCode.CANCELLED:
                raise InferenceError(f"{model}: stream cancelled by the server") from exc
            raise _stream_error(model, exc.details() or "", exc.code()) from exc
        except InferenceServerException as exc:
            raise _translate(exc, f"stream to {model}") from exc
        except asyncio.CancelledError:
            error = self._stage_restarted(request_id, model)
            if error is None:
                raise
            finished = True  # abort_inflight cancelled it already
            raise error from None
        finally:
            final.set()
            self._inflight.pop(request_id, None)
            self._aborted.pop(request_id, None)
            if not finished:
                call.cancel()
                logger.debug("cancelled Triton stream %s (%s)", request_id, model)
            hold.__exit__(None, None, None)

    async def generate_video(self, model: str, job: VideoJob, request_id: str = "") -> AsyncGenerator[VideoEvent, None]:
        """One ``ModelStreamInfer`` RPC on the video BLS ``model``: a :class:`VideoEvent` per
        finished denoising step, then one with the frames. Closing the iterator (or cancelling
        the task) cancels the RPC, which stops the denoiser at its next step boundary.

        Raises:
            EngineError: as :meth:`_stream`; ``InferenceError`` when the stream ends without frames.
        """
        # the stored reference PNG (up to the model's max_size squared) is decoded off the loop
        image = await asyncio.to_thread(pixels_from_png_base64, job.input_reference) if job.input_reference else None
        inputs = _infer_inputs(video_contract.video_inputs(
            job.prompt, width=job.width, height=job.height, num_frames=job.num_frames, steps=job.steps,
            seed=job.seed, negative_prompt=job.negative_prompt, guidance_scale=job.guidance_scale,
            guidance_scale_2=job.guidance_scale_2, boundary_ratio=job.boundary_ratio, flow_shift=job.flow_shift,
            image=image))
        got_frames = False
        async for result in self._stream(model, inputs, request_id or uuid.uuid4().hex):
            frames = result.as_numpy(video_contract.VIDEO)
            if frames is not None:
                got_frames = True
                steps = result.as_numpy(video_contract.NUM_STEPS)
                seconds = result.as_numpy(video_contract.DENOISE_SECONDS)
                yield VideoEvent(frames=np.asarray(frames, dtype=np.uint8),
                                 num_steps=int(steps.reshape(-1)[0]) if steps is not None else None,
                                 denoise_seconds=float(seconds.reshape(-1)[0]) if seconds is not None else None)
                continue
            step = result.as_numpy(video_contract.STEP)
            if step is not None:
                total = result.as_numpy(video_contract.TOTAL_STEPS)
                yield VideoEvent(step=int(step.reshape(-1)[0]),
                                 total=int(total.reshape(-1)[0]) if total is not None else job.steps)
        if not got_frames:
            raise InferenceError(f"{model}: the stream ended without a video")

    async def generate_audio(self, model: str, job: AudioGenerateJob) -> AsyncGenerator[AudioGenerateEvent, None]:
        """One ``ModelStreamInfer`` RPC on the text-to-audio BLS ``model``: an
        :class:`AudioGenerateEvent` per finished denoising step, then one with the audio. Closing
        the iterator (or cancelling the task) cancels the RPC, which stops the denoiser at its
        next step boundary.

        Raises:
            EngineError: as :meth:`_stream`; ``InferenceError`` when the stream ends without audio.
        """
        ac = audio_generate_contract
        inputs = _infer_inputs(ac.audio_generate_inputs(
            job.prompt, audio_start_s=job.audio_start_s, audio_end_s=job.audio_end_s, steps=job.steps, seed=job.seed,
            guidance_scale=job.guidance_scale, negative_prompt=job.negative_prompt))
        got_audio = False
        async for result in self._stream(model, inputs, uuid.uuid4().hex):
            audio = result.as_numpy(ac.AUDIO)
            if audio is not None:
                got_audio = True
                rate, steps = result.as_numpy(ac.SAMPLE_RATE), result.as_numpy(ac.NUM_STEPS)
                seconds = result.as_numpy(ac.DENOISE_SECONDS)
                yield AudioGenerateEvent(audio=np.asarray(audio, dtype=np.float32),
                                         sample_rate=int(rate.reshape(-1)[0]) if rate is not None else 0,
                                         num_steps=int(steps.reshape(-1)[0]) if steps is not None else None,
                                         denoise_seconds=float(seconds.reshape(-1)[0]) if seconds is not None else None)
                continue
            step = result.as_numpy(ac.STEP)
            if step is not None:
                total = result.as_numpy(ac.TOTAL_STEPS)
                yield AudioGenerateEvent(step=int(step.reshape(-1)[0]),
                                         total=int(total.reshape(-1)[0]) if total is not None else job.steps)
        if not got_audio:
            raise InferenceError(f"{model}: the stream ended without audio")

    async def _unary(self, model: str, inputs: list[InferInput], request_id: str) -> grpcclient.InferResult:
        """One unary ``ModelInfer`` on ``model``; returns its ``InferResult``.

        Registered in flight (``abort_inflight`` ends it with a 503 when a stage dies); a task
        cancellation cancels the call.

        Raises:
            ModelNotReadyError: the stage's stub is down (being restarted).
            InvalidRequestError: the stage answered ``INVALID_ARG`` (or ``invalid input: ...``).
            EngineError: other failures (``_translate``).
        """
        with self._hold(model):
            return await self._unary_call(model, inputs, request_id)

    async def _unary_call(self, model: str, inputs: list[InferInput], request_id: str) -> grpcclient.InferResult:
        """:meth:`_unary` inside its in-flight hold: on the replica :meth:`ReplicaSet.pick` gives,
        and once more on another one when the first could not be reached (transport
        ``UNAVAILABLE``: no response; the replica is drained). Never after Triton answered."""
        await self.replicas.start()
        tried: list[Replica[grpcclient.InferenceServerClient]] = []
        replica = self.replicas.pick(model)
        while True:
            try:
                with self.replicas.use(replica):
                    return await self._infer(replica.client, model, inputs, request_id)
            except TritonUnavailableError as exc:
                if exc.__cause__ is None or not _connect_failed(exc.__cause__):
                    raise
                tried.append(replica)
                self.replicas.mark_down(replica, exc.message)
                again = self._retry_replica(model, tried)
                if again is None:
                    raise
                logger.warning("request %s (%s): %s unreachable, sending it to %s", request_id, model,
                               replica.address, again.address)
                replica = again

    async def _infer(self, client: grpcclient.InferenceServerClient, model: str, inputs: list[InferInput],
                     request_id: str) -> grpcclient.InferResult:
        """One ``ModelInfer`` on ``client`` (:meth:`_unary_call`, one replica)."""
        call = asyncio.ensure_future(client.infer(model, inputs, request_id=request_id))
        self._inflight[request_id] = (model, call.cancel)
        try:
            return await call
        except asyncio.CancelledError:
            call.cancel()
            error = self._stage_restarted(request_id, model)
            if error is None:
                raise
            raise error from None
        except InferenceServerException as exc:
            message = exc.message() or str(exc)
            if _STUB_DOWN in message:
                raise ModelNotReadyError(f"{model}: {message} (being restarted)", param="model") from exc
            if (exc.status() or "").endswith("INVALID_ARGUMENT") or INVALID_INPUT_PREFIX in message:
                raise InvalidRequestError(f"{model}: {message.split(INVALID_INPUT_PREFIX, 1)[-1] or message}") from exc
            raise _translate(exc, f"inference on {model}") from exc
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, f"inference on {model}") from exc
        finally:
            self._inflight.pop(request_id, None)
            self._aborted.pop(request_id, None)

    async def voice_prompt(self, model: str, audio: NDArray[Any], sample_rate: int, ref_text: str | None,
                           x_vector_only: bool) -> tuple[bytes, float]:
        """One unary ``ModelInfer`` on ``qwen3_tts_voice_prompt`` (``Engine.voice_prompt``)."""
        pairs = [(qwen3_contract.REF_AUDIO, np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)),
                 (qwen3_contract.REF_SAMPLE_RATE, scalar_array(int(sample_rate), "INT32")),
                 (qwen3_contract.X_VECTOR_ONLY, scalar_array(bool(x_vector_only), "BOOL"))]
        if ref_text:
            pairs.append((qwen3_contract.REF_TEXT, utf8_array(ref_text)))
        result = await self._unary(model, _infer_inputs(pairs), uuid.uuid4().hex)
        prompt = result.as_numpy(qwen3_contract.VOICE_PROMPT)
        seconds = result.as_numpy(qwen3_contract.REF_SECONDS)
        if prompt is None or not prompt.size:
            raise InferenceError(f"{model}: no {qwen3_contract.VOICE_PROMPT} in the response")
        data = prompt.reshape(-1)[0]
        data = data if isinstance(data, bytes) else bytes(data)
        return data, float(seconds.reshape(-1)[0]) if seconds is not None and seconds.size else len(audio) / sample_rate

    async def generate_images(self, model: str, job: ImageJob) -> list[GeneratedImage]:
        """``job.n`` unary ``ModelInfer`` calls on the ensemble ``model``, all in flight at once.

        One request per image (seed ``job.seed + i``) rather than one request with a batch
        dimension of ``n``: each image is then scheduled on its own by Triton's dynamic batchers
        (mixed with other clients' images up to ``max_batch_size``), an ``n`` above a stage's
        ``max_batch_size`` still works, and every image equals the single-image request with its
        seed. The first failure is raised and the others are cancelled (so are all when the caller
        is cancelled: client disconnect), which cancels their gRPC calls.
        """

        info = self._config_cache.get(model)
        steps_of = info.ensemble_steps if info is not None else ()
        # a multi-image edit ensemble takes INPUT_IMAGES + INPUT_IMAGE_SIZES, even for one image
        multi = (image_contract.INPUT_IMAGES in info.inputs) if info is not None else bool(job.more_images)

        async def one(i: int) -> GeneratedImage:
            start = time.monotonic()
            result = await self._unary(model, _image_inputs(job, i, multi), f"{uuid.uuid4().hex}-{i}")
            wall_s = time.monotonic() - start
            pixels = result.as_numpy(image_contract.IMAGE)
            if pixels is None:
                raise InferenceError(f"{model}: no {image_contract.IMAGE} in the response")
            steps = result.as_numpy(image_contract.NUM_STEPS)
            seconds = result.as_numpy(image_contract.DENOISE_SECONDS)
            return GeneratedImage(
                pixels=np.asarray(pixels, dtype=np.uint8).reshape(pixels.shape[-3:]),
                seed=job.seed + i,
                steps=int(steps.reshape(-1)[0]) if steps is not None else job.steps,
                denoise_seconds=float(seconds.reshape(-1)[0]) if seconds is not None else 0.0,
                stage_compute_ms={step: float(value) for step in steps_of
                                  if (value := _first(result, step_compute_output(step))) is not None},
                wall_s=wall_s,
            )

        # All n in flight; the first failure cancels the rest and is raised as it is. (Not
        # asyncio.TaskGroup/except*: the GPU image's tritonserver Python is 3.10, which has neither.)
        tasks = [asyncio.ensure_future(one(i)) for i in range(job.n)]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


    async def generate(self, model: str, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        """One ``ModelStreamInfer`` RPC carrying one chat-contract request; yields every response.

        Errors arrive in-band (an ``error_message`` without a code). The header
        ``triton_grpc_error: true`` would carry the gRPC status instead, but in that mode
        tritonserver 2.51 crashed (SIGSEGV after "HandleCancellation called even when the context
        was not cancelled", server#7368): on BLS error responses in ~200 tries, and on single-stage
        ``llm`` errors while BLS streams ran (newcomer trial, 3 of 3 servers). So a stage's
        ``INVALID_ARG`` is recognised by its message prefix (``INVALID_INPUT_PREFIX``) and becomes
        ``InvalidRequestError`` (HTTP 400); other errors are 500s. Cancellation as in ``synthesize``:
        closing the generator (or cancelling its task)
        cancels the gRPC call, which Triton turns into ``request.is_cancelled()`` in the stage.
        """
        info = self._config_cache.get(model)
        declared = info.inputs if info is not None else _CHAT_INPUTS
        with self._paced_slot(model, info, declared, request.paced) as paced:
            if paced != request.paced:
                request = dataclasses.replace(request, paced=paced)
            inputs = chat_inputs(request, declared)
            async for result in self._stream(model, inputs, request.request_id or uuid.uuid4().hex):
                yield chunk_from_result(result, info.sample_rate if info else None)


def _image_inputs(job: ImageJob, index: int, multi: bool = False) -> list[InferInput]:
    """The diffusion ensemble's inputs for image ``index`` of ``job`` (docs/image_contracts.md):
    ``contracts.image.image_inputs``, every tensor with the batch dimension 1 (the ensembles have
    ``max_batch_size > 0``), seed ``job.seed + index``, ``INPUT_IMAGE`` only for an edit job;
    ``multi`` (a multi-image edit model): its condition images as INPUT_IMAGES + INPUT_IMAGE_SIZES;
    ``LORA_ID``/``LORA_SCALE`` only with an adapter, ``MASK``/``STRENGTH`` only for an inpaint job."""
    images = job.condition_images
    return _infer_inputs(image_contract.image_inputs(
        job.prompt, width=job.width, height=job.height, steps=job.steps, seed=job.seed + index,
        negative_prompt=job.negative_prompt or "", true_cfg_scale=job.true_cfg_scale,
        guidance_scale=job.guidance_scale if job.guidance_scale is not None else 0.0,
        image=None if multi else job.image,
        images=images if multi and images else None,
        lora_id=job.lora_id, lora_scale=job.lora_scale, mask=job.mask, strength=job.strength,
    ))


def qwen3_speech_inputs(options: SpeechOptions, declared: frozenset[str]) -> list[tuple[str, NDArray[Any]]]:
    """The Qwen3-TTS inputs of ``options`` (``omni_triton.contracts.qwen3_tts``) as ``(name,
    array)`` pairs, only those the model declares (the serving layer has refused the others)."""
    c = qwen3_contract
    pairs: list[tuple[str, NDArray[Any]]] = []
    for name, value in ((c.TASK, options.task), (c.INSTRUCTIONS, options.instructions),
                        (c.LANGUAGE, options.language), (c.REF_TEXT, options.ref_text)):
        if value is not None:
            pairs.append((name, utf8_array(value)))
    if options.voice_prompt is not None:
        pairs.append((c.VOICE_PROMPT, np.array([options.voice_prompt], dtype=np.object_)))
    if options.ref_audio is not None:
        pairs.append((c.REF_AUDIO, np.ascontiguousarray(options.ref_audio, dtype=np.float32).reshape(-1)))
        pairs.append((c.REF_SAMPLE_RATE, scalar_array(int(options.ref_sample_rate or 0), "INT32")))
    if options.x_vector_only is not None:
        pairs.append((c.X_VECTOR_ONLY, scalar_array(bool(options.x_vector_only), "BOOL")))
    return [(n, a) for n, a in pairs if n in declared]


def asr_inputs(audio: NDArray[Any], language: str | None, prompt: str | None, task: str,
               declared: frozenset[str]) -> list[tuple[str, NDArray[Any]]]:
    """The ASR contract's inputs (``omni_triton.contracts.asr.asr_inputs``) as ``(name, array)``
    pairs: ``AUDIO`` FP32 [T] always; ``LANGUAGE`` / ``PROMPT`` BYTES [1] when given and declared;
    ``TASK`` BYTES [1] when not the default ``transcribe`` and declared (a model without ``TASK``
    only transcribes: the serving layer refuses ``translate`` for it first)."""
    pairs = asr_contract.asr_inputs(audio, language or None, prompt or None,
                                    task if task != asr_contract.TASKS[0] else None)
    return [(n, a) for n, a in pairs if n == asr_contract.AUDIO or n in declared]


def _stream_error(model: str, message: str, code: grpc.StatusCode | None) -> EngineError:
    """Typed error for a failed stream: ``message`` of an in-band error (``code`` None) or the
    gRPC status the RPC ended with."""
    if _STUB_DOWN in message:  # the launcher reloads the model within seconds
        # the stub died under this request: serve reloads it (retried once where that is safe)
        return StageDownError(f"{model}: {message} (being restarted)", param="model")
    if _STAGE_NOT_READY.search(message):
        return StageDownError(f"{model}: {message} (a stage it calls is being restarted)", param="model")
    if _MODEL_UNAVAILABLE in message:
        # Triton's own answer for a model it has no READY version of: the model is being
        # reloaded (a killed stub) or was unloaded since the readiness check; not the transport
        return ModelNotReadyError(f"{model}: {message}", param="model")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequestError(message)
    if INVALID_INPUT_PREFIX in message:  # a stage's INVALID_ARG that arrived in-band, code lost
        return InvalidRequestError(message.split(INVALID_INPUT_PREFIX, 1)[1] or message)
    if code in _UNAVAILABLE_CODES:
        return TritonUnavailableError(f"Triton is unavailable (stream to {model}): {message}")
    if code == grpc.StatusCode.NOT_FOUND:
        # the model was unloaded between the readiness check and the request
        return ModelNotReadyError(f"{model}: {message}", param="model")
    return InferenceError(f"{model}: {message}")


def chat_inputs(request: GenerationRequest, declared: frozenset[str]) -> list[InferInput]:
    """Triton inputs of one chat-contract request (``docs/chat_contracts.md``), built by
    ``contracts.chat.chat_inputs``.

    Optional inputs the model does not declare (``MODALITIES`` / ``VOICE`` on a text-only model)
    are left out rather than sent; ``SAMPLING_PARAMETERS`` is sent only when non-empty.

    Raises:
        ValueError: not exactly one of ``request.messages`` / ``request.prompt`` is set.
    """
    if (request.messages is None) == (request.prompt is None):
        raise ValueError("exactly one of messages / prompt must be set")
    return _infer_inputs(chat_contract.chat_inputs(
        messages=request.messages, prompt=request.prompt, sampling=request.sampling,
        modalities=request.modalities, voice=request.voice, declared=declared, paced=request.paced,
    ))


def _first(result: grpcclient.InferResult, name: str) -> Any:
    """The first element of output ``name`` (a numpy scalar: ``np.bytes_`` or a number), None when absent or empty."""
    arr = result.as_numpy(name)
    if arr is None or arr.size == 0:
        return None
    return arr.reshape(-1)[0]


def chunk_from_result(result: grpcclient.InferResult, default_rate: int | None = None) -> GenerationChunk:
    """A ``GenerationChunk`` from one tritonclient ``InferResult`` of a chat-contract model."""
    text = _first(result, chat_contract.TEXT_DELTA)
    reason = _first(result, chat_contract.FINISH_REASON)
    prompt_tokens = _first(result, chat_contract.PROMPT_TOKENS)
    completion_tokens = _first(result, chat_contract.COMPLETION_TOKENS)
    audio = result.as_numpy(chat_contract.AUDIO)
    rate = _first(result, chat_contract.SAMPLE_RATE)
    compute = _first(result, STAGE_COMPUTE_MS)
    stage_metrics = _first(result, STAGE_METRICS)

    def _str(v: object) -> str:
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
        stage_compute_ms=float(compute) if compute is not None else None,
        stage_metrics=_json_object(stage_metrics),
    )


def _json_object(value: object) -> dict[str, Any] | None:
    """A ``STAGE_METRICS`` element parsed (a JSON object), None when absent or malformed (the
    metrics are an extra: a bad payload never fails the request; logged)."""
    if value is None:
        return None
    try:
        parsed = json.loads(value.decode("utf-8") if isinstance(value, bytes) else str(value))
    except (ValueError, UnicodeDecodeError):
        logger.warning("unreadable %s: %r", STAGE_METRICS, value)
        return None
    return parsed if isinstance(parsed, dict) else None


def _cancelling(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` has a cancellation pending (``Task.cancelling()``, Python 3.11+). On 3.10
    (the GPU image's tritonserver Python) there is no such record: False, so a call that
    ``abort_inflight`` ended reads as a stage restart even if its task was also cancelled."""
    if sys.version_info >= (3, 11):
        return task.cancelling() > 0
    return False


#: ``tritonclient`` ``InferInput`` s from a contract builder's ``(name, array)`` pairs.
_infer_inputs = functools.partial(wrap_inputs, make=functools.partial(infer_input, InferInput))

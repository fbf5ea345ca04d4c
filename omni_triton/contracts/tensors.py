"""What every contract is made of: tensor specs, stage contracts, the UTF-8 BYTES helpers and the
base input-error class. Torch-free (numpy only): the OpenAI frontend, the clients, the BLS models
and the stages all import it.

A contract says, per Triton model, which tensors go in and come out (name, Triton datatype,
dims without the batch dimension, optional or not) and whether the model is decoupled
(streams) or dynamically batched. ``tests/unit/test_contracts.py`` checks every ``config.pbtxt``
against its contract, so the names in the code and the configs cannot drift apart.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

#: Start of every INVALID_ARG message a stage sends. Triton 2.51 delivers a streamed error without
#: its code (in-band ``error_message``; the ``triton_grpc_error`` mode that keeps the code crashed
#: tritonserver 2.51 on BLS error responses, server#7368) and turns a BLS stage's INVALID_ARG into
#: INTERNAL, so the OpenAI frontend recognises a client error by this prefix (HTTP 400).
INVALID_INPUT_PREFIX = "invalid input: "

#: any tensor's numpy array (its dtype is the contract's: ``NUMPY_DTYPES``)
Array = NDArray[Any]

# Tensor names shared by several pipelines.
REQUEST_ID = "REQUEST_ID"  #: BYTES [1]: id under which a BLS caller can cancel a stage's stream
VOICE = "VOICE"  #: BYTES [1]
AUDIO = "AUDIO"  #: FP32 [-1]: mono PCM in [-1, 1]
SAMPLE_RATE = "SAMPLE_RATE"  #: INT32 [1]: Hz of AUDIO
#: BOOL [1]: the client plays this stream as it arrives (real time), so a scheduled stage may hold
#: its later chunks back to ``max_lead_ms`` ahead of playback (docs/scheduling.md, "Pacing").
PACED = "PACED"
#: BYTES [1]: why a stream ended (``stop``, ``length``, ``abort``), on its last response; any
#: stage's telemetry reads it (``omni_stage_requests_finished_total``). Chat contracts re-export it.
FINISH_REASON = "FINISH_REASON"
#: FP32 [1]: the stage's own compute for this request so far, in milliseconds (optional output of
#: every stage; sent on each response, cumulative: the last one holds the request's total). Time
#: spent waiting on other stages through BLS is not in it. docs/metrics.md "Per-request stage
#: metrics". Triton 2.51 has no response parameters (from 2.55), hence a tensor.
STAGE_COMPUTE_MS = "STAGE_COMPUTE_MS"
#: BYTES [1]: JSON ``{"stages": [{"stage", "compute_ms", "wall_ms", "calls"}, ...], "own_compute_ms"}``
#: of one request, on a BLS model's last response: the stages it called, each timed by the BLS
#: (``omni_triton.adapters.bls.StageLedger``).
STAGE_METRICS = "STAGE_METRICS"
#: The models that declare ``STAGE_METRICS``: they call other stages and report them per request
#: (the BLS models, and qwen3_omni_talker, which streams qwen3_omni_thinker while speaking). Here,
#: not in a family contract, because the generic BLS helper (``omni_triton.adapters.bls``) asks
#: these callees for it.
REPORTS_STAGE_METRICS = frozenset({"csm", "llm_tts", "qwen3_omni", "qwen2_5_omni", "qwen3_tts", "wan_t2v", "wan_i2v",
                                   "qwen3_omni_talker", "whisper", "stable_audio"})


def step_compute_output(model: str) -> str:
    """The ensemble output that carries step ``model``'s ``STAGE_COMPUTE_MS`` (FP32 [1]):
    ``<MODEL>_COMPUTE_MS``, e.g. ``QWEN_IMAGE_DENOISER_COMPUTE_MS``."""
    return f"{model.upper()}_COMPUTE_MS"


class InputError(ValueError):
    """A request's inputs are wrong: answered with INVALID_ARG (HTTP 400), never INTERNAL.

    Each pipeline has exactly one subclass (``ChatInputError``, ``SpeechInputError``,
    ``ImageInputError``); the adapter bases catch this base class.
    """


#: Triton datatype name -> numpy dtype (BYTES tensors hold ``bytes`` objects).
NUMPY_DTYPES: dict[str, type] = {
    "BYTES": np.object_, "BOOL": np.bool_, "UINT8": np.uint8, "INT32": np.int32, "INT64": np.int64,
    "FP32": np.float32, "FP64": np.float64,
}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a contract.

    Attributes:
        name: the tensor name in ``config.pbtxt``.
        datatype: Triton datatype name (``"BYTES"``, ``"INT32"``, ``"FP32"`` ...); config.pbtxt
            spells it ``TYPE_STRING``, ``TYPE_INT32``, ``TYPE_FP32`` ...
        dims: dims without the batch dimension (``-1``: variable).
        optional: inputs only: the client may leave it out.
    """

    name: str
    datatype: str
    dims: tuple[int, ...] = (1,)
    optional: bool = False

    @property
    def numpy_dtype(self) -> type:
        return NUMPY_DTYPES[self.datatype]


@dataclass(frozen=True)
class StageContract:
    """The tensors of one Triton model and how it is scheduled.

    Attributes:
        inputs, outputs: the model's tensors.
        decoupled: streams responses (``model_transaction_policy { decoupled: true }``).
        batched: dynamically batched (``max_batch_size > 0``, dims then exclude the batch dim).
    """

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    decoupled: bool = False
    batched: bool = False

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]


def utf8_array(value: str) -> Array:
    """``value`` as a BYTES tensor's array: ``np.object_`` [1] holding its UTF-8 bytes.

    Raises:
        UnicodeEncodeError: ``value`` holds a lone surrogate (not encodable as UTF-8).
    """
    return np.array([value.encode("utf-8")], dtype=np.object_)


def first_str(array: Array | None) -> str | None:
    """First element of a BYTES array decoded as UTF-8 (``None`` for ``None`` or an empty array).

    Raises:
        UnicodeDecodeError: the bytes are not UTF-8.
    """
    value = first_value(array)
    if value is None:
        return None
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def first_value(array: ArrayLike | None) -> Any:
    """The first element of ``array`` (any shape, e.g. a ``[1]`` or batched ``[1, 1]`` scalar
    tensor), as numpy holds it; ``None`` for ``None`` or an empty array."""
    if array is None:
        return None
    flat = np.asarray(array).reshape(-1)
    return flat[0] if flat.size else None


def first_int(array: ArrayLike | None) -> int | None:
    """The first element of a scalar tensor (``INT32``/``INT64``/``BOOL`` [1] ...) as a Python
    ``int``; ``None`` for ``None`` or an empty array.

    Raises:
        ValueError, TypeError: the element is no number (e.g. non-numeric BYTES).
    """
    value = first_value(array)
    return None if value is None else int(value)


def first_float(array: ArrayLike | None) -> float | None:
    """The first element of a scalar tensor (``FP32`` [1] ...) as a Python ``float``; ``None``
    for ``None`` or an empty array.

    Raises:
        ValueError, TypeError: the element is no number.
    """
    value = first_value(array)
    return None if value is None else float(value)


def scalar_int(array: ArrayLike | None, name: str, error: type[Exception] = InputError) -> int:
    """:func:`first_int` of tensor ``name`` that must be there: e.g. ``PROMPT_LEN`` or the token
    counts of a stage's response.

    Raises:
        error: ``array`` is ``None`` or empty (``NAME is missing or empty``).
    """
    value = first_int(array)
    if value is None:
        raise error(f"{name} is missing or empty")
    return value


#: Stage-side caps on client text (docs/speech_contracts.md, docs/chat_contracts.md): Triton's
#: inference port is reachable without the frontend, so each stage bounds its own text inputs.
#: Chat/LLM prompt text: the frontend's ``--max-prompt-chars`` default (``Settings.max_prompt_chars``).
MAX_PROMPT_CHARS = 1 << 18
#: MESSAGES is that text plus its JSON framing (roles, quotes, escapes).
MAX_MESSAGES_CHARS = 2 * MAX_PROMPT_CHARS


def media_messages_chars(max_parts: int, max_part_bytes: int) -> int:
    """The MESSAGES cap of a model that takes media parts inline (``qwen3_omni``): the text's cap plus
    ``max_parts`` base64 data URLs of ``max_part_bytes`` decoded bytes each (and their framing)."""
    return MAX_MESSAGES_CHARS + max_parts * (4 * -(-max_part_bytes // 3) + 4096)


#: diffusion (image/video) PROMPT and NEGATIVE_PROMPT: the frontend's ``MAX_NEGATIVE_PROMPT_CHARS``.
MAX_DIFFUSION_PROMPT_CHARS = 32_000
#: UTF-8 spends at most 4 bytes on a character: the byte bound checked before decoding.
UTF8_MAX_BYTES = 4


def bounded_str(array: Array | None, name: str, max_chars: int, error: type[Exception] = InputError,
                limit: str = "max_chars") -> str | None:
    """:func:`first_str` of input ``name``, refused when longer than ``max_chars`` characters.

    The raw bytes are bounded first (``UTF8_MAX_BYTES * max_chars``), so an oversize tensor is
    refused without being decoded. ``limit`` names the bound in the message (e.g. the config
    parameter ``max_input_chars``).

    Raises:
        error: over the byte or the character bound (``invalid input: NAME ...``).
        UnicodeDecodeError: the bytes are not UTF-8.
    """
    value = first_value(array)
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)) and len(value) > UTF8_MAX_BYTES * max_chars:
        raise error(f"{name} has {len(value)} bytes, more than {limit}={max_chars} characters allow "
                    f"({UTF8_MAX_BYTES * max_chars} bytes)")
    text = value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value)
    if len(text) > max_chars:
        raise error(f"{name} has {len(text)} characters, more than {limit}={max_chars}")
    return text


def scalar_array(value: Any, datatype: str) -> Array:
    """A one-element array of Triton datatype ``datatype`` (``"INT32"``, ``"FP32"``, ``"BOOL"``...)."""
    return np.array([value], dtype=NUMPY_DTYPES[datatype])


T = TypeVar("T")


def wrap_inputs(pairs: Iterable[tuple[str, Array]], make: Callable[[str, Array], T]) -> list[T]:
    """Turn ``(name, array)`` pairs into tensors with ``make(name, array)``: e.g.
    ``pb_utils.Tensor`` inside a stub, or :func:`infer_input` for ``tritonclient``."""
    return [make(name, array) for name, array in pairs]


def triton_datatype(array: Array) -> str:
    """The Triton datatype name of a numpy array (``np.object_`` -> ``"BYTES"``).

    Raises:
        KeyError: a dtype no contract uses.
    """
    return {v: k for k, v in NUMPY_DTYPES.items()}[array.dtype.type]


def infer_input(infer_input_cls: Callable[[str, list[int], str], T], name: str, array: Array) -> T:
    """A ``tritonclient`` ``InferInput`` (grpc, grpc.aio or http class passed in) holding ``array``."""
    tensor = infer_input_cls(name, list(array.shape), triton_datatype(array))
    tensor.set_data_from_numpy(array)  # type: ignore[attr-defined]  # tritonclient is untyped
    return tensor


def audio_outputs(audio: Array | None, sample_rate: int) -> dict[str, Array]:
    """The speech part of a streamed response: ``AUDIO`` (FP32 [n] mono PCM, contiguous; an empty
    array when ``audio`` is ``None``, a text-only response) and ``SAMPLE_RATE`` (INT32 [1], Hz)."""
    pcm = np.zeros(0, np.float32) if audio is None else np.ascontiguousarray(audio, dtype=np.float32)
    return {AUDIO: pcm, SAMPLE_RATE: scalar_array(int(sample_rate), "INT32")}

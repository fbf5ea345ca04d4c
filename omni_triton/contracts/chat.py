"""The chat contract (``docs/chat_contracts.md``): what every chat model takes and streams
(``llm``, ``llm_tts``, and the omni BLS models ``qwen3_omni`` and ``qwen2_5_omni``, whose stage
contracts are in ``contracts/llm.py``, ``contracts/qwen3_omni.py``, ``contracts/qwen2_5_omni.py``
and, shared by both omni families, ``contracts/omni_stages.py``).

Inputs of a chat model (BYTES [1], UTF-8): ``PROMPT`` or ``MESSAGES`` (JSON array of OpenAI chat
messages), optional ``SAMPLING_PARAMETERS`` (JSON object, vLLM ``SamplingParams`` names),
``MODALITIES`` (JSON array, subset of ``["text", "audio"]``), ``VOICE``. Outputs of every
streamed response: ``TEXT_DELTA`` (BYTES [1]), ``FINISH_REASON`` (BYTES [1], empty but on the
last response), ``PROMPT_TOKENS`` / ``COMPLETION_TOKENS`` (INT32 [1], cumulative); speaking
models add ``AUDIO`` (FP32 [-1], mono PCM) and ``SAMPLE_RATE`` (INT32 [1], Hz).

Request validation (:func:`parse_messages`, :func:`parse_sampling`, :func:`parse_modalities`) is
written once here for every chat model; every problem is a :class:`ChatInputError`.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from omni_triton.contracts import tensors
from omni_triton.contracts.tensors import (
    AUDIO,
    PACED,
    SAMPLE_RATE,
    VOICE,
    Array,
    InputError,
    TensorSpec,
    first_str,
    scalar_array,
    scalar_int,
    utf8_array,
)

PROMPT = "PROMPT"
MESSAGES = "MESSAGES"
SAMPLING_PARAMETERS = "SAMPLING_PARAMETERS"
MODALITIES = "MODALITIES"
MAX_AUDIO_FRAMES = "MAX_AUDIO_FRAMES"  #: INT32 [1], omni: cap on the talker's codec frames
TEXT_DELTA = "TEXT_DELTA"
FINISH_REASON = tensors.FINISH_REASON  # generic: every stage's telemetry reads it
PROMPT_TOKENS = "PROMPT_TOKENS"
COMPLETION_TOKENS = "COMPLETION_TOKENS"

TEXT_OUTPUTS = (TEXT_DELTA, FINISH_REASON, PROMPT_TOKENS, COMPLETION_TOKENS)
SPEECH_OUTPUTS = (AUDIO, SAMPLE_RATE)


class ChatInputError(InputError):
    """Bad chat request input (Triton INVALID_ARG, HTTP 400 in the frontend)."""


# ----------------------------------------------------------------------------- request parsing

#: Roles accepted in MESSAGES. "developer" is OpenAI's newer name for "system" (mapped to it: the
#: chat templates know system/user/assistant only).
ROLES = ("system", "developer", "user", "assistant")
MODALITY_NAMES = ("text", "audio")

# SAMPLING_PARAMETERS keys and their JSON types (names of vLLM SamplingParams).
SAMPLING_TYPES: dict[str, tuple[type, ...]] = {
    "temperature": (int, float), "top_p": (int, float), "top_k": (int,), "max_tokens": (int,),
    "min_tokens": (int,), "stop": (str, list), "seed": (int,), "ignore_eos": (bool,),
    "presence_penalty": (int, float), "frequency_penalty": (int, float),
    "repetition_penalty": (int, float), "min_p": (int, float),
}

# Value ranges (low, high or None, low bound excluded?) as vLLM's SamplingParams checks them
# (vllm/sampling_params.py ``_verify_args``), checked here so a caller that does not import vLLM
# (llm_tts, the omni thinker) rejects the same requests.
SAMPLING_RANGES: dict[str, tuple[float, float | None, bool]] = {
    "temperature": (0.0, None, False), "top_p": (0.0, 1.0, True), "top_k": (-1, None, False),
    "max_tokens": (1, None, False), "min_tokens": (0, None, False), "min_p": (0.0, 1.0, False),
    "presence_penalty": (-2.0, 2.0, False), "frequency_penalty": (-2.0, 2.0, False),
    "repetition_penalty": (0.0, None, True),
    # vLLM's msgspec serialisation and torch.Generator.manual_seed take a 64-bit int
    "seed": (-(2**63), 2**63 - 1, False),
}


def _json(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ChatInputError(f"{name} is not valid JSON: {exc}") from exc


#: OpenAI content part types carrying media -> the modality the model must accept; the
#: placeholders ``{"type": "audio"|"image"|"video"}`` (data already turned into tensors, what the
#: ``qwen3_omni`` BLS forwards to ``qwen3_omni_thinker``) are accepted for the same modalities.
MEDIA_PART_TYPES = {"input_audio": "audio", "image_url": "image", "video_url": "video"}
PLACEHOLDER_PART_TYPES = ("audio", "image", "video")
#: ``input_audio.format`` values (OpenAI: wav, mp3; decoded by soundfile or PyAV)
INPUT_AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg")


def _media_part(part: dict[str, Any], where: str) -> dict[str, Any]:
    """A validated, normalised media part (only the known fields kept)."""
    kind = part["type"]
    if kind in PLACEHOLDER_PART_TYPES:
        return {"type": kind}
    body = part.get(kind)
    if not isinstance(body, dict):
        raise ChatInputError(f'{where}: a {kind} part needs an object "{kind}"')
    if kind == "input_audio":
        data, fmt = body.get("data"), body.get("format")
        if not isinstance(data, str) or not data:
            raise ChatInputError(f"{where}: input_audio.data must be a non-empty base64 string")
        if fmt not in INPUT_AUDIO_FORMATS:
            raise ChatInputError(f"{where}: input_audio.format {fmt!r} is not one of {', '.join(INPUT_AUDIO_FORMATS)}")
        return {"type": kind, kind: {"data": data, "format": fmt}}
    url = body.get("url")
    if not isinstance(url, str) or not url:
        raise ChatInputError(f"{where}: {kind}.url must be a non-empty string")
    return {"type": kind, kind: {"url": url}}


def part_modality(part: dict[str, Any]) -> str:
    """``text``/``audio``/``image``/``video`` of a content part (any ``type`` spelling above)."""
    kind = str(part.get("type"))
    return MEDIA_PART_TYPES.get(kind, kind)


def parse_messages(text: str, accept: Iterable[str] = ("text",)) -> list[dict[str, Any]]:
    """Validate MESSAGES (JSON array of OpenAI chat messages) into ``[{"role", "content"}]``.

    ``content`` may be a string or a list of parts: ``{"type": "text", "text": ...}`` and, for
    the modalities in ``accept`` (e.g. ``("text", "audio", "image", "video")`` for ``qwen3_omni``),
    ``input_audio`` (``{"data": base64, "format": "wav"|"mp3"|...}``), ``image_url`` /
    ``video_url`` (``{"url": ...}``) or their placeholders ``{"type": "audio"|"image"|"video"}``.
    A message with text parts only gets them joined into one string (as before); a message with
    media keeps its normalised list of parts. An assistant message may have ``content: null``;
    ``developer`` becomes ``system``. Media data is not decoded here (see
    ``omni_triton.media.inputs``).

    Raises:
        ChatInputError: not JSON, empty, unknown role, a part type this model does not accept
            (named in the message), a malformed part.
    """
    accepted = set(accept) | {"text"}
    messages = _json(text, MESSAGES)
    if not isinstance(messages, list) or not messages:
        raise ChatInputError("MESSAGES must be a non-empty JSON array of messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatInputError(f"messages[{i}] must be an object")
        role = message.get("role")
        if role not in ROLES:
            raise ChatInputError(f"messages[{i}].role {role!r} is not one of {', '.join(ROLES)}")
        content = message.get("content")
        if content is None and role == "assistant":
            content = ""
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                where = f"messages[{i}].content[{j}]"
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    parts.append({"type": "text", "text": part["text"]})
                    continue
                modality = part_modality(part) if isinstance(part, dict) else None
                if kind in MEDIA_PART_TYPES or kind in PLACEHOLDER_PART_TYPES:
                    if modality not in accepted:
                        raise ChatInputError(f"{where}: this model does not accept {kind} parts "
                                             f"(it takes: {', '.join(sorted(accepted))})")
                    if role != "user":
                        raise ChatInputError(f"{where}: {kind} parts are only accepted in user messages")
                    parts.append(_media_part(part, where))
                    continue
                if accepted == {"text"}:
                    raise ChatInputError(f"{where}: only text parts "
                                         '({"type": "text", "text": ...}) are supported')
                raise ChatInputError(f"{where}: unknown content part type {kind!r}; this model takes "
                                     + ", ".join(["text"] + [t for t, m in MEDIA_PART_TYPES.items() if m in accepted]))
            content = "".join(p["text"] for p in parts) if all(p["type"] == "text" for p in parts) else parts
        if not isinstance(content, (str, list)):
            raise ChatInputError(f"messages[{i}].content must be a string or a list of content parts")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def media_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The media parts of parsed messages (:func:`parse_messages`), in message order."""
    return [p for m in messages if isinstance(m["content"], list) for p in m["content"] if p["type"] != "text"]


def placeholder_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with every media part replaced by its placeholder (``{"type": "audio"}`` ...):
    what the chat template renders and what ``qwen3_omni`` forwards once the media are tensors."""
    def part(p: dict[str, Any]) -> dict[str, Any]:
        return p if p["type"] == "text" else {"type": part_modality(p)}

    return [m if isinstance(m["content"], str) else {**m, "content": [part(p) for p in m["content"]]}
            for m in messages]


def parse_sampling(text: str | None, supported: Iterable[str] | None = None) -> dict[str, Any]:
    """Validate SAMPLING_PARAMETERS (JSON object) into ``SamplingParams`` keyword arguments.

    Checks names, JSON types (integers must be JSON integers, ``true``/``false`` is no number)
    and value ranges (vLLM's), ``stop`` (a non-empty string or a list of them; returned as a
    list), ``min_tokens <= max_tokens``. ``null`` values are dropped.

    Args:
        text: the JSON text (``None`` or blank: no parameters).
        supported: keys the calling stage implements (default: all of :data:`SAMPLING_TYPES`);
            a known key outside it is rejected as not supported by that model.

    Raises:
        ChatInputError: not a JSON object, unknown or unsupported key, wrong type, out of range.
    """
    if text is None or not text.strip():
        return {}
    params = _json(text, SAMPLING_PARAMETERS)
    if not isinstance(params, dict):
        raise ChatInputError("SAMPLING_PARAMETERS must be a JSON object")
    allowed = set(SAMPLING_TYPES if supported is None else supported)
    out: dict[str, Any] = {}
    for key, value in params.items():
        if value is None:
            continue
        if key not in SAMPLING_TYPES:
            raise ChatInputError(f"unknown sampling parameter {key!r}; known: {', '.join(SAMPLING_TYPES)}")
        if key not in allowed:
            raise ChatInputError(f"sampling parameter {key!r} is not supported by this model; "
                                 f"supported: {', '.join(k for k in SAMPLING_TYPES if k in allowed)}")
        types = SAMPLING_TYPES[key]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise ChatInputError(f"sampling parameter {key} has the wrong type ({type(value).__name__})")
        if key == "stop":
            value = [value] if isinstance(value, str) else cast("list[Any]", value)
            if not all(isinstance(s, str) and s for s in value):
                raise ChatInputError("stop must be a string or a list of strings, none of them empty")
        out[key] = value
    for key, (low, high, low_open) in SAMPLING_RANGES.items():
        if key in out:
            v = out[key]
            if (v <= low if low_open else v < low) or (high is not None and v > high):
                bound = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}]"
                raise ChatInputError(f"sampling parameter {key}={v} is outside {bound}")
    if "min_tokens" in out and "max_tokens" in out and out["min_tokens"] > out["max_tokens"]:
        raise ChatInputError("min_tokens must not exceed max_tokens")
    return out


def parse_modalities(text: str | None, default: Iterable[str] = ("text",)) -> list[str]:
    """MODALITIES (JSON array, a non-empty subset of ``["text", "audio"]``), duplicates dropped.

    Raises:
        ChatInputError: not such an array.
    """
    if text is None or not text.strip():
        return list(default)
    value = _json(text, MODALITIES)
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, str) and v in MODALITY_NAMES for v in value)):
        raise ChatInputError('MODALITIES must be a non-empty JSON array of "text" and/or "audio"')
    return list(dict.fromkeys(value))


def match_voice(voice: str | None, voices: list[str], default: str, case_sensitive: bool = True) -> str:
    """The served voice name for VOICE (``None``/blank: ``default``).

    Raises:
        ChatInputError: not one of ``voices``.
    """
    name = (voice or "").strip() or default
    for v in voices:
        if v == name or (not case_sensitive and v.lower() == name.lower()):
            return v
    raise ChatInputError(f"unknown voice {name!r}; voices: {', '.join(voices)}")


# ------------------------------------------------------------------------------------ builders


def chat_inputs(*, messages: list[dict[str, Any]] | None = None, prompt: str | None = None,
                sampling: dict[str, Any] | None = None, modalities: Iterable[str] | None = None,
                voice: str | None = None, declared: Iterable[str] | None = None,
                raw: dict[str, str] | None = None, paced: bool = False) -> list[tuple[str, Array]]:
    """The inputs of one chat-contract request as ``(name, array)`` pairs, for
    ``tritonclient`` ``InferInput`` or ``pb_utils.Tensor`` (:func:`~omni_triton.contracts.tensors.wrap_inputs`).

    ``messages`` is sent as JSON (UTF-8, not ASCII-escaped); ``SAMPLING_PARAMETERS`` only when
    ``sampling`` is non-empty; ``MODALITIES``/``VOICE`` only when given and, with ``declared``
    (the model's input names), only if the model declares them; ``PACED`` (true) likewise when
    ``paced`` (a streamed answer with audio, played as it arrives). ``raw`` adds BYTES inputs
    verbatim (bad-input tests). Which of PROMPT/MESSAGES is required is the stage's check.

    Raises:
        UnicodeEncodeError: a string holds a lone surrogate.
    """
    known = None if declared is None else set(declared)
    pairs: list[tuple[str, Array]] = []
    if messages is not None:
        pairs.append((MESSAGES, utf8_array(json.dumps(messages, ensure_ascii=False))))
    if prompt is not None:
        pairs.append((PROMPT, utf8_array(prompt)))
    if sampling:
        pairs.append((SAMPLING_PARAMETERS, utf8_array(json.dumps(sampling))))
    if modalities is not None and (known is None or MODALITIES in known):
        pairs.append((MODALITIES, utf8_array(json.dumps(list(modalities)))))
    if voice is not None and (known is None or VOICE in known):
        pairs.append((VOICE, utf8_array(voice)))
    if paced and (known is None or PACED in known):
        pairs.append((PACED, scalar_array(True, "BOOL")))
    for name, value in (raw or {}).items():
        pairs.append((name, utf8_array(value)))
    return pairs


@dataclass(frozen=True)
class TextResponse:
    """One streamed response of a chat model's text (every chat model and the thinker/talker
    stages that stream text): ``TEXT_DELTA`` (BYTES [1]: the new text, may be empty),
    ``FINISH_REASON`` (BYTES [1]: ``""`` but on the last response: ``"stop"``, ``"length"``,
    ``"abort"``), ``PROMPT_TOKENS`` and ``COMPLETION_TOKENS`` (INT32 [1], cumulative counts)."""

    text: str = ""
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def counts(self) -> tuple[int, int]:
        """``(prompt_tokens, completion_tokens)``."""
        return self.prompt_tokens, self.completion_tokens

    def to_tensors(self) -> dict[str, Any]:
        """The response's outputs: the two BYTES as ``str`` (the adapters' response writer encodes
        them as UTF-8 BYTES [1]), the counts as INT32 [1] arrays."""
        return {TEXT_DELTA: self.text, FINISH_REASON: self.finish_reason,
                PROMPT_TOKENS: scalar_array(int(self.prompt_tokens), "INT32"),
                COMPLETION_TOKENS: scalar_array(int(self.completion_tokens), "INT32")}

    @classmethod
    def from_tensors(cls, out: Mapping[str, Array]) -> TextResponse:
        """Read a streamed response of a chat stage (``out``: output name -> array).

        Raises:
            KeyError: one of the four outputs is missing.
            ChatInputError: a count is empty.
            UnicodeDecodeError: the text is not UTF-8.
        """
        return cls(first_str(out[TEXT_DELTA]) or "", first_str(out[FINISH_REASON]) or "",
                   scalar_int(out[PROMPT_TOKENS], PROMPT_TOKENS, ChatInputError),
                   scalar_int(out[COMPLETION_TOKENS], COMPLETION_TOKENS, ChatInputError))


def text_response(text: str = "", finish_reason: str = "", prompt_tokens: int = 0,
                  completion_tokens: int = 0) -> dict[str, Any]:
    """:meth:`TextResponse.to_tensors` of one response (see :class:`TextResponse`)."""
    return TextResponse(text, finish_reason, prompt_tokens, completion_tokens).to_tensors()


def max_audio_frames_input(frames: int) -> tuple[str, Array]:
    """The omni model's optional ``MAX_AUDIO_FRAMES`` input."""
    return MAX_AUDIO_FRAMES, scalar_array(int(frames), "INT32")


# ----------------------------------------------------------------------------------- contracts

def _s(name: str, dims: Iterable[int] = (1,), optional: bool = False) -> TensorSpec:
    return TensorSpec(name, "BYTES", tuple(dims), optional)


#: a chat model's streamed text outputs (:class:`TextResponse`)
TEXT_OUT = (_s(TEXT_DELTA), _s(FINISH_REASON), TensorSpec(PROMPT_TOKENS, "INT32"),
            TensorSpec(COMPLETION_TOKENS, "INT32"))
#: a speaking chat model's audio outputs (:func:`~omni_triton.contracts.tensors.audio_outputs`)
SPEECH_OUT = (TensorSpec(AUDIO, "FP32", (-1,)), TensorSpec(SAMPLE_RATE, "INT32"))
#: the request inputs every chat model takes (PROMPT or MESSAGES, SAMPLING_PARAMETERS)
CHAT_IN = (_s(PROMPT, optional=True), _s(MESSAGES, optional=True), _s(SAMPLING_PARAMETERS, optional=True))

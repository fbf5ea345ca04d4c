"""Request validation and chat templating of the ``llm`` stage (every problem is an
:class:`LlmInputError`, i.e. INVALID_ARG).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class LlmInputError(ValueError):
    """Bad request input (maps to ``TritonError.INVALID_ARG``, HTTP 400 in the frontend)."""


# --------------------------------------------------------------------------- request validation

# Roles accepted in MESSAGES. "developer" is OpenAI's newer name for "system" (mapped to it, the
# SmolLM2 chat template knows system/user/assistant only).
ROLES = ("system", "developer", "user", "assistant")

# SAMPLING_PARAMETERS keys and their JSON types (names of vLLM SamplingParams; the contract lists
# the first eight, the penalties and min_p are passed through as vLLM defines them).
_SAMPLING_TYPES: dict[str, tuple[type, ...]] = {
    "temperature": (int, float), "top_p": (int, float), "top_k": (int,), "max_tokens": (int,),
    "min_tokens": (int,), "stop": (str, list), "seed": (int,), "ignore_eos": (bool,),
    "presence_penalty": (int, float), "frequency_penalty": (int, float),
    "repetition_penalty": (int, float), "min_p": (int, float),
}


# Value ranges (low, high or None, low bound excluded?) as vLLM's SamplingParams checks them
# (vllm/sampling_params.py ``_verify_args``), checked here too so a BLS caller that does not import
# vLLM (llm_tts) rejects the same requests.
_SAMPLING_RANGES: dict[str, tuple[float, float | None, bool]] = {
    "temperature": (0.0, None, False), "top_p": (0.0, 1.0, True), "top_k": (-1, None, False),
    "max_tokens": (1, None, False), "min_tokens": (0, None, False), "min_p": (0.0, 1.0, False),
    "presence_penalty": (-2.0, 2.0, False), "frequency_penalty": (-2.0, 2.0, False),
    "repetition_penalty": (0.0, None, True),
    # vLLM's msgspec serialisation of SamplingParams takes a 64-bit int (OverflowError otherwise)
    "seed": (-(2**63), 2**63 - 1, False),
}


def parse_messages(text: str) -> list[dict[str, str]]:
    """Validate MESSAGES (JSON array of OpenAI chat messages) into ``[{"role", "content"}]``.

    ``content`` may be a string or a list of ``{"type": "text", "text": ...}`` parts (joined);
    an assistant message may have ``content: null``.

    Raises:
        LlmInputError: not JSON, empty, unknown role, non-text content.
    """
    try:
        messages = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LlmInputError(f"MESSAGES is not valid JSON: {exc}") from exc
    if not isinstance(messages, list) or not messages:
        raise LlmInputError("MESSAGES must be a non-empty JSON array of messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise LlmInputError(f"messages[{i}] must be an object")
        role = message.get("role")
        if role not in ROLES:
            raise LlmInputError(f"messages[{i}].role {role!r} is not one of {', '.join(ROLES)}")
        content = message.get("content")
        if content is None and role == "assistant":
            content = ""
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise LlmInputError(f"messages[{i}].content[{j}]: only text parts "
                                        '({"type": "text", "text": ...}) are supported')
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise LlmInputError(f"messages[{i}].content must be a string or a list of text parts")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def parse_sampling_parameters(text: str | None) -> dict[str, Any]:
    """Validate SAMPLING_PARAMETERS (JSON object) into ``SamplingParams`` keyword arguments.

    Checks names, JSON types and value ranges (those of vLLM's ``SamplingParams``, which checks
    them again in :func:`make_sampling_params`).

    Raises:
        LlmInputError: not a JSON object, unknown key, wrong type, value out of range.
    """
    if text is None or not text.strip():
        return {}
    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LlmInputError(f"SAMPLING_PARAMETERS is not valid JSON: {exc}") from exc
    if not isinstance(params, dict):
        raise LlmInputError("SAMPLING_PARAMETERS must be a JSON object")
    out = {}
    for key, value in params.items():
        if value is None:
            continue
        if key not in _SAMPLING_TYPES:
            raise LlmInputError(f"unknown sampling parameter {key!r}; known: {', '.join(_SAMPLING_TYPES)}")
        types = _SAMPLING_TYPES[key]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise LlmInputError(f"sampling parameter {key} has the wrong type ({type(value).__name__})")
        if key == "stop":
            value = [value] if isinstance(value, str) else value
            if not all(isinstance(s, str) for s in value):
                raise LlmInputError("stop must be a string or a list of strings")
        out[key] = value
    for key, (low, high, low_open) in _SAMPLING_RANGES.items():
        if key in out:
            v = out[key]
            if (v <= low if low_open else v < low) or (high is not None and v > high):
                bound = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}]"
                raise LlmInputError(f"sampling parameter {key}={v} is outside {bound}")
    if "min_tokens" in out and "max_tokens" in out and out["min_tokens"] > out["max_tokens"]:
        raise LlmInputError("min_tokens must not exceed max_tokens")
    return out


def make_sampling_params(kwargs: dict[str, Any]):
    """vLLM ``SamplingParams`` streaming deltas (``RequestOutputKind.DELTA``).

    Raises:
        LlmInputError: vLLM rejects a value (e.g. negative temperature, top_p outside (0, 1]).
    """
    from vllm.exceptions import VLLMError
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    try:
        return SamplingParams(**kwargs, output_kind=RequestOutputKind.DELTA)
    except (ValueError, TypeError, VLLMError) as exc:
        raise LlmInputError(f"invalid sampling parameters: {exc}") from exc


@dataclass
class GenerationJob:
    """One validated request: ``prompt_ids`` (token ids, list[int]) and ``sampling`` (keyword
    arguments of ``SamplingParams`` with ``max_tokens`` always set)."""

    request_id: str
    prompt_ids: list[int]
    sampling: dict[str, Any]


def render_chat(tokenizer, messages: list[dict[str, str]]) -> str:
    """The model's chat template applied with ``add_generation_prompt=True`` (as vLLM's OpenAI
    server does), as text."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def build_generation_job(request_id: str, tokenizer, prompt: str | None, messages: str | None,
                         sampling: str | None, max_model_len: int, default_max_tokens: int,
                         check_with_vllm: bool = True) -> GenerationJob:
    """Validate one request and tokenize its prompt.

    Exactly one of ``prompt`` (raw text, tokenized as is) and ``messages`` (JSON, chat template
    applied; the template already holds the special tokens, so none are added) must be given.
    ``max_tokens`` defaults to ``min(default_max_tokens, max_model_len - prompt_len)``; a prompt
    of ``max_model_len`` tokens or more, or ``prompt_len + max_tokens > max_model_len``, is an
    error (as vLLM's OpenAI server does).

    ``check_with_vllm=False`` skips building vLLM's ``SamplingParams`` (for callers that do not
    import vLLM, e.g. the ``llm_tts`` BLS validating before it calls ``llm``).

    Raises:
        LlmInputError: anything wrong with the inputs.
    """
    if (prompt is None) == (messages is None):
        raise LlmInputError("send exactly one of PROMPT and MESSAGES")
    kwargs = parse_sampling_parameters(sampling)
    if messages is not None:
        text = render_chat(tokenizer, parse_messages(messages))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        if not prompt:
            raise LlmInputError("PROMPT is empty")
        ids = tokenizer(prompt)["input_ids"]
    n = len(ids)
    if n >= max_model_len:
        raise LlmInputError(f"the prompt has {n} tokens; this model's context is {max_model_len} "
                            "tokens (prompt + completion)")
    if "max_tokens" in kwargs:
        if n + kwargs["max_tokens"] > max_model_len:
            raise LlmInputError(f"prompt ({n} tokens) + max_tokens ({kwargs['max_tokens']}) exceeds "
                                f"this model's context of {max_model_len} tokens")
    else:
        kwargs["max_tokens"] = min(default_max_tokens, max_model_len - n)
    if check_with_vllm:
        make_sampling_params(kwargs)  # vLLM's own value checks, here so they are INVALID_ARG
    return GenerationJob(request_id=request_id, prompt_ids=list(ids), sampling=kwargs)

"""Request parsing of the omni pipeline.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Sequence

# ------------------------------------------------------------------------------ request parsing


class OmniInputError(ValueError):
    """The request cannot be served as given (Triton INVALID_ARG, HTTP 400)."""


_ROLES = {"system", "user", "assistant"}
_SAMPLING_KEYS = {"temperature", "top_p", "top_k", "max_tokens", "min_tokens", "stop", "seed", "ignore_eos"}


@dataclass
class SamplingSettings:
    """Thinker sampling (vLLM ``SamplingParams`` names). ``temperature`` None or 0 means greedy
    (None: the checkpoint's ``generation_config``, greedy for the tiny model, like vLLM's
    ``generation_config="auto"``). ``top_k`` -1 or 0: disabled."""

    temperature: float | None = None
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 32
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return not self.temperature


def parse_sampling(raw: str | None, default_max_tokens: int) -> SamplingSettings:
    """``SAMPLING_PARAMETERS`` JSON -> :class:`SamplingSettings`; raises :class:`OmniInputError`."""
    s = SamplingSettings(max_tokens=default_max_tokens)
    if raw is None or not str(raw).strip():
        return s
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise OmniInputError(f"SAMPLING_PARAMETERS is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise OmniInputError("SAMPLING_PARAMETERS must be a JSON object")
    unknown = set(obj) - _SAMPLING_KEYS
    if unknown:
        raise OmniInputError(f"unsupported sampling parameters: {', '.join(sorted(unknown))}")

    def num(key, kind, lo=None, hi=None, lo_open=False):
        v = obj.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
            raise OmniInputError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {v!r}")
        v = kind(v)
        if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
            raise OmniInputError(f"{key}={v} is out of range")
        return v

    t = num("temperature", float, 0.0, 2.0)
    s.temperature = t if t is not None else None
    s.top_p = num("top_p", float, 0.0, 1.0, lo_open=True) or s.top_p
    top_k = num("top_k", int, -1)
    s.top_k = -1 if top_k is None else top_k
    mt = num("max_tokens", int, 1)
    s.max_tokens = s.max_tokens if mt is None else mt
    s.min_tokens = num("min_tokens", int, 0) or 0
    if s.min_tokens > s.max_tokens:
        raise OmniInputError(f"min_tokens={s.min_tokens} is greater than max_tokens={s.max_tokens}")
    stop = obj.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(x, str) and x for x in stop)):
        raise OmniInputError("stop must be a list of non-empty strings")
    s.stop = list(stop or [])
    s.seed = num("seed", int, -(2**63), 2**63 - 1)  # torch.Generator.manual_seed: a 64-bit int
    ie = obj.get("ignore_eos", False)
    if not isinstance(ie, bool):
        raise OmniInputError("ignore_eos must be true or false")
    s.ignore_eos = ie
    return s


def parse_messages(raw: str) -> list[dict]:
    """``MESSAGES`` JSON (OpenAI chat messages) -> list of ``{"role", "content"}`` with text content;
    raises :class:`OmniInputError` for empty lists, unknown roles, non-text parts."""
    try:
        msgs = json.loads(raw)
    except ValueError as exc:
        raise OmniInputError(f"MESSAGES is not valid JSON: {exc}") from None
    if not isinstance(msgs, list) or not msgs:
        raise OmniInputError("messages must be a non-empty array")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise OmniInputError(f"messages[{i}]: unknown role {role!r}; expected one of system, user, assistant")
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise OmniInputError(f"messages[{i}]: only text content parts are supported")
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise OmniInputError(f"messages[{i}]: content must be a string or a list of text parts")
        out.append({"role": m["role"], "content": content})
    return out


def parse_modalities(raw: str | None, default: Sequence[str] = ("text", "audio")) -> list[str]:
    """``MODALITIES`` JSON array (subset of text/audio; text is always produced) -> list."""
    if raw is None or not str(raw).strip():
        return list(default)
    try:
        mods = json.loads(raw)
    except ValueError:
        raise OmniInputError(f"MODALITIES is not a JSON array: {raw!r}") from None
    if not isinstance(mods, list) or not mods or not all(m in ("text", "audio") for m in mods):
        raise OmniInputError(f"MODALITIES must be a non-empty subset of [\"text\", \"audio\"], got {raw!r}")
    return list(dict.fromkeys(mods))

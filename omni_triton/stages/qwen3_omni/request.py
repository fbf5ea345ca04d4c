"""Sampling settings of the Qwen3-Omni thinker, from the chat contract's one sampling parser
(``omni_triton.contracts.chat.parse_sampling``): the thinker implements the keys in
:data:`THINKER_SAMPLING_KEYS`; any other known vLLM key is an unsupported-parameter error.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from omni_triton.contracts.chat import ChatInputError, parse_sampling

#: SAMPLING_PARAMETERS keys the thinker's ``generate`` implements.
THINKER_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "min_tokens", "stop", "seed", "ignore_eos")


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


def sampling_settings(raw: str | None, default_max_tokens: int) -> SamplingSettings:
    """``SAMPLING_PARAMETERS`` JSON -> :class:`SamplingSettings` (``max_tokens`` defaults to
    ``default_max_tokens``).

    Raises:
        ChatInputError: what :func:`~omni_triton.contracts.chat.parse_sampling` rejects, or a key
            the thinker does not implement.
    """
    params = parse_sampling(raw, supported=THINKER_SAMPLING_KEYS)
    s = SamplingSettings(**{"max_tokens": default_max_tokens, **params})
    if s.min_tokens > s.max_tokens:  # min_tokens alone against the default max_tokens
        raise ChatInputError(f"min_tokens={s.min_tokens} is greater than max_tokens={s.max_tokens}")
    return s

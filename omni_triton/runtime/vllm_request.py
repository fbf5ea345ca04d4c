"""What one vLLM generation needs: the validated job and its ``SamplingParams`` (shared by the
``llm`` stage, which builds jobs, and :mod:`omni_triton.runtime.vllm_runner`, which runs them)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omni_triton.contracts.chat import ChatInputError


def make_sampling_params(kwargs: dict[str, Any]) -> Any:
    """vLLM ``SamplingParams`` streaming deltas (``RequestOutputKind.DELTA``).

    Raises:
        ChatInputError: vLLM rejects a value (e.g. negative temperature, top_p outside (0, 1]).
    """
    from vllm.exceptions import VLLMError
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    try:
        return SamplingParams(**kwargs, output_kind=RequestOutputKind.DELTA)
    except (ValueError, TypeError, VLLMError) as exc:
        raise ChatInputError(f"invalid sampling parameters: {exc}") from exc


@dataclass
class GenerationJob:
    """One validated request: ``prompt_ids`` (token ids, list[int]) and ``sampling`` (keyword
    arguments of ``SamplingParams`` with ``max_tokens`` always set)."""

    request_id: str
    prompt_ids: list[int]
    sampling: dict[str, Any]

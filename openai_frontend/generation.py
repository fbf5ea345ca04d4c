"""Building blocks of ``/v1/chat/completions`` and ``/v1/completions`` that are not HTTP:
sampling parameters, choice accumulation, merging ``n`` Triton streams, audio framing.

Kept apart from the router so each piece is unit-tested on its own. No torch, no Triton types:
the router hands in ``GenerationChunk`` iterators from the ``Engine``.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from omni_triton.media.audio import encode_audio, float_to_pcm16

from .engine import GenerationChunk
from .schemas import ChatMessage, Usage, _SamplingFields

#: OpenAI chat ``audio.format`` -> ``omni_triton.media.audio`` format name (``pcm16`` is ``pcm``:
#: little-endian int16 mono at the model's rate). ``aac`` has no encoder here (libsndfile).
CHAT_AUDIO_FORMATS = {"wav": "wav", "mp3": "mp3", "flac": "flac", "opus": "opus", "pcm16": "pcm",
                      "aac": "aac"}
#: Formats that can be streamed as audio deltas: OpenAI only streams ``pcm16``; ``wav`` is
#: vLLM-Omni's convention (each delta one complete WAV file; ``AudioStreamEncoder``).
CHAT_STREAM_AUDIO_FORMATS = ("wav", "pcm16")


def sampling_parameters(body: _SamplingFields, token_limit: int | None, index: int = 0) -> dict[str, Any]:
    """The ``SAMPLING_PARAMETERS`` JSON object of choice ``index`` (vLLM ``SamplingParams``
    names, only the keys the client set). With a ``seed``, choice ``i`` gets ``seed + i`` so the
    ``n`` choices differ yet the whole response is reproducible."""
    params: dict[str, Any] = {}
    for key in ("temperature", "top_p", "top_k", "min_tokens", "ignore_eos"):
        value = getattr(body, key)
        if value is not None:
            params[key] = value
    if token_limit is not None:
        params["max_tokens"] = token_limit
    if body.stop_list is not None:
        params["stop"] = body.stop_list
    if body.seed is not None:
        params["seed"] = body.seed + index
    return params


def part_json(part: Any) -> dict[str, Any]:
    """One content part as the chat contract's MESSAGES carries it (declared fields only)."""
    if part.type == "text":
        return {"type": "text", "text": part.text}
    if part.type == "input_audio":
        return {"type": "input_audio",
                "input_audio": {"data": part.input_audio.data, "format": part.input_audio.format}}
    return {"type": part.type, part.type: {"url": getattr(part, part.type).url}}


def message_json(message: ChatMessage) -> dict[str, Any]:
    """One ``MESSAGES`` entry: ``developer`` becomes ``system`` (OpenAI's renaming; chat
    templates such as SmolLM2's ChatML only know ``system``); content is passed as given (media
    parts as their OpenAI JSON, ``detail`` dropped)."""
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role}
    if isinstance(message.content, list):
        out["content"] = [part_json(p) for p in message.content]
    else:
        out["content"] = message.content
    if message.name is not None:
        out["name"] = message.name
    return out


@dataclass
class ChoiceState:
    """Everything one choice has produced so far.

    ``prompt_tokens`` / ``completion_tokens`` keep the last values the stage reported
    (``COMPLETION_TOKENS`` is cumulative). ``audio`` holds float32 PCM chunks, [T] each.
    """

    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    audio: list[NDArray[Any]] = field(default_factory=list)
    sample_rate: int | None = None

    def add(self, chunk: GenerationChunk) -> None:
        if chunk.text:
            self.text.append(chunk.text)
        if chunk.finish_reason:
            self.finish_reason = chunk.finish_reason
        if chunk.prompt_tokens is not None:
            self.prompt_tokens = chunk.prompt_tokens
        if chunk.completion_tokens is not None:
            self.completion_tokens = max(self.completion_tokens, chunk.completion_tokens)
        if chunk.audio is not None and chunk.audio.size:
            self.audio.append(chunk.audio)
        if chunk.sample_rate:
            self.sample_rate = chunk.sample_rate

    @property
    def full_text(self) -> str:
        return "".join(self.text)

    @property
    def samples(self) -> NDArray[Any]:
        return np.concatenate(self.audio) if self.audio else np.zeros(0, np.float32)


def usage_of(states: Sequence[ChoiceState], prompts_per_choice: Sequence[int] | None = None) -> Usage:
    """OpenAI usage: each distinct prompt counted once, completion tokens summed over choices.

    ``prompts_per_choice[i]`` names the prompt of choice ``i`` (completions with a list of
    prompts); None: all choices share one prompt (chat, ``n`` > 1).
    """
    groups = prompts_per_choice if prompts_per_choice is not None else [0] * len(states)
    prompt_tokens: dict[int, int] = {}
    for group, state in zip(groups, states, strict=True):
        if state.prompt_tokens is not None:
            prompt_tokens[group] = state.prompt_tokens
    p = sum(prompt_tokens.values())
    c = sum(s.completion_tokens for s in states)
    return Usage(prompt_tokens=p, completion_tokens=c, total_tokens=p + c)


#: Marker ``merge`` yields as ``(index, END)`` when stream ``index`` has ended.
END = None


async def merge(
    streams: Sequence[AsyncGenerator[GenerationChunk, None]],
) -> AsyncGenerator[tuple[int, GenerationChunk | None], None]:
    """Iterate several generation streams at once: ``(index, chunk)`` in arrival order and
    ``(index, END)`` when stream ``index`` is done.

    Each stream is driven by its own task. The first exception of any stream is re-raised here
    after the others are cancelled; closing this generator early (client gone) cancels every
    task, and each task then closes its stream, which cancels its Triton request.
    """
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def pump(i: int, stream: AsyncGenerator[GenerationChunk, None]) -> None:
        try:
            async for chunk in stream:
                await queue.put((i, chunk, None))
            await queue.put((i, END, None))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await queue.put((i, END, exc))
        finally:
            await stream.aclose()

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            i, chunk, exc = await queue.get()
            if exc is not None:
                raise exc
            if chunk is END:
                remaining -= 1
            yield i, chunk
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class AudioStreamEncoder:
    """``delta.audio.data`` of a streamed chat audio answer, one per PCM chunk, base64:

    * ``pcm16`` (OpenAI's streaming format): the chunk's int16 LE PCM; the deltas concatenated
      are the whole answer's PCM.
    * ``wav`` (vLLM-Omni's convention, also its default): each delta is a complete WAV file of
      its chunk (16-bit mono, written by soundfile), so a client can open every chunk on its own
      (vLLM-Omni's benchmark reads each with ``wave.open``).
    """

    def __init__(self, fmt: str):
        if fmt not in CHAT_STREAM_AUDIO_FORMATS:
            raise ValueError(f"format {fmt!r} cannot be streamed")
        self.fmt = fmt

    def encode(self, samples: NDArray[Any], sample_rate: int) -> str:
        """``samples``: float32 [T] in [-1, 1]; ``sample_rate``: Hz. Returns base64 text."""
        if self.fmt == "wav":
            data = encode_audio(samples, sample_rate, "wav")
        else:
            data = float_to_pcm16(samples)
        return base64.b64encode(data).decode("ascii")


def encode_clip_b64(samples: NDArray[Any], sample_rate: int, fmt: str) -> str:
    """Base64 of one whole clip in chat ``audio.format`` ``fmt`` (framed by libsndfile via
    ``omni_triton.media.audio.encode_audio``; ``pcm16`` is headerless int16 LE)."""
    return base64.b64encode(encode_audio(samples, sample_rate, CHAT_AUDIO_FORMATS[fmt])).decode("ascii")


def now() -> int:
    """Unix time in seconds (``created`` / ``expires_at``)."""
    return int(time.time())

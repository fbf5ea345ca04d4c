"""The items of one Realtime session and how they become the next response's prompt.

Items are messages (``user``, ``assistant``, ``system``); their content parts, stored once in a
naming-neutral form (:class:`Part`):

* ``input_text`` (user/system text), ``input_audio`` (user speech: PCM16 24 kHz, kept with its
  WAV base64 made once off the event loop, the form the omni stage decodes, and its transcript
  once input audio transcription made one);
* ``text`` / ``audio`` (assistant: the text, or the audio's transcript and its length in ms; the
  audio itself is not kept, the prompt carries the transcript).

**Prompt rule** (:func:`select_items`, docs/realtime.md "Context"): every item goes into the
next prompt, in order, as a chat message (user audio as an ``input_audio`` WAV part, assistant
items as their text or transcript, a truncated one as the words heard; for a model without audio
input, user audio as its transcript: docs/realtime.md "Models without audio input"). When the estimate of
the prompt exceeds ``max_model_len - reserve`` (``reserve``: the response's
``max_output_tokens``, else a quarter of the context up to 256 tokens), or holds more audio parts
than the model takes (``max_media_parts``), the **oldest whole items** are left out first; the
newest item is always kept, and a prompt whose newest item alone does not fit fails the response
(``context_length_exceeded``). The estimate (:func:`item_tokens`) is an upper bound: text is
counted with the model's own tokenizer when the frontend can load it (``tokenizer.json`` of the
model's ``assets``, as ``/tokenize`` does: :func:`load_text_counter`), else at 1 token per UTF-8
**byte** (the omni models' tokenizers are byte-level
BPE: every token holds at least one byte, special tokens excepted, and those are counted apart),
``MESSAGE_OVERHEAD_TOKENS`` per message and ``GENERATION_PROMPT_TOKENS`` for the chat template's
markup, and per audio part ``ceil(25 * seconds) + AUDIO_PART_TOKENS`` (25/s: Qwen2.5-Omni's
audio encoder rate; Qwen3-Omni's encoder gives at most 13 per started second, below it).

**Recovery** (:func:`context_error_tokens`, :func:`shrunk_budget`): when the model still refuses
the prompt as too long (its message names the real count), the response is retried once with the
budget scaled by estimate/real, leaving out more old items; a response that fails anyway leaves the
session usable (each prompt is selected afresh).

The session keeps at most ``max_items`` items and ``max_audio_s`` seconds of user audio in
memory; beyond, the oldest whole items are deleted (``conversation.item.deleted``).
"""
from __future__ import annotations

import base64
import binascii
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from omni_triton.media.audio import encode_audio

from ..engine import Engine, ModelInfo
from ..errors import OpenAIError
from ..offload import off_loop
from ..serving.tokenize import load_tokenizer, tokenizer_folder
from .protocol import BYTES_PER_MS, RATE, Naming, RealtimeError, checked_string, new_id

logger = logging.getLogger(__name__)

#: Counts the prompt tokens of a text (the model's tokenizer, or :func:`text_bytes`).
TextCounter = Callable[[str], int]

#: Estimate of prompt tokens, an upper bound for the omni models' byte-level BPE tokenizers and
#: audio encoders (module docstring): text counts 1 token per UTF-8 byte.
AUDIO_TOKENS_PER_S = 25
#: An audio part's fixed cost: ``<|audio_start|>`` / ``<|audio_end|>`` and Qwen3-Omni's last,
#: partial second (up to 13 tokens, ``_get_feat_extract_output_lengths``).
AUDIO_PART_TOKENS = 16
#: Chat-template markup of one message: ``<|im_start|>`` + role + ``\n`` ... ``<|im_end|>\n``
#: (2 special tokens + at most 11 bytes for the longest role, ``assistant``), with a margin.
MESSAGE_OVERHEAD_TOKENS = 16
#: The generation prompt (``<|im_start|>assistant\n``: 1 special token + 10 bytes), with a margin.
GENERATION_PROMPT_TOKENS = 16
#: The model's refusal of a too-long prompt (omni_triton/stages/qwen3_omni/thinker.py,
#: omni_triton/stages/llm/request.py): ``the prompt has N tokens; ...`` or ``prompt (N tokens) +
#: max_tokens (M) exceeds max_model_len=...``.
_CONTEXT_ERROR = re.compile(r"prompt(?: has | \()(\d+) tokens.*(?:context|max_model_len)", re.DOTALL)

PartKind = Literal["input_text", "input_audio", "text", "audio"]


@dataclass
class Part:
    """One content part. ``text``: the text, or an audio part's transcript (None: none).
    ``pcm``: a user audio part's PCM16 24 kHz bytes; ``wav_b64``: the same as a base64 WAV
    (the prompt's ``input_audio`` data, made by :func:`prepare_audio`). ``audio_ms``: the audio's
    length (user audio: of ``pcm``; assistant audio: of what was sent)."""

    kind: PartKind
    text: str | None = None
    pcm: bytes = b""
    wav_b64: str = ""
    audio_ms: int = 0


@dataclass
class Item:
    """One conversation item (``type: "message"``)."""

    id: str
    role: Literal["user", "assistant", "system"]
    parts: list[Part] = field(default_factory=list)
    status: Literal["completed", "incomplete", "in_progress"] = "completed"

    @property
    def audio_ms(self) -> int:
        return sum(p.audio_ms for p in self.parts if p.kind == "input_audio")

    @property
    def media_parts(self) -> int:
        return sum(p.kind == "input_audio" for p in self.parts)


def prepare_audio(pcm: bytes) -> str:
    """Base64 of a WAV file (16-bit mono, 24 kHz) holding ``pcm`` (int16 LE). CPU work linear in
    ``len(pcm)``: run it off the event loop."""
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    return base64.b64encode(encode_audio(samples, RATE, "wav")).decode("ascii")


def decode_b64(data: str, param: str) -> bytes:
    """Strict base64 of PCM16 (an even number of bytes). Raises ``RealtimeError`` ``invalid_base64``
    / ``invalid_audio``. Linear in ``len(data)`` (bounded by the event size limit)."""
    try:
        pcm = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeError(f"'{param}' is not valid base64", "invalid_base64", param) from None
    if len(pcm) % 2:
        raise RealtimeError(f"'{param}' is not 16-bit PCM (an odd number of bytes)", "invalid_audio", param)
    return pcm


def text_bytes(text: str) -> int:
    """UTF-8 bytes of ``text``: an upper bound of its byte-level BPE tokens."""
    return len(text.encode("utf-8", "surrogatepass"))


#: The loaded text counters, by Triton model name (:func:`load_text_counter`).
_COUNTERS: dict[str, TextCounter] = {}


async def load_text_counter(engine: Engine, info: ModelInfo) -> None:
    """Load (once per model; off the event loop) the model's tokenizer for :func:`text_counter`:
    that of its ``assets`` folder or its first ``depends_on`` stage with a ``tokenizer.json``
    (``serving.tokenize.tokenizer_folder``). Without one (or when it fails to load) the counter is
    :func:`text_bytes`."""
    if info.name in _COUNTERS:
        return
    try:
        tok = await off_loop(load_tokenizer, str(await tokenizer_folder(engine, info)))
    except (OpenAIError, OSError, ValueError, RuntimeError) as exc:
        logger.info("realtime: no tokenizer for %s (%s); prompts are estimated at 1 token per UTF-8 byte",
                     info.name, exc)
        _COUNTERS[info.name] = text_bytes
        return
    tokenizer = tok.tokenizer

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids) if text else 0

    _COUNTERS[info.name] = count


def text_counter(model: str) -> TextCounter:
    """The counter :func:`load_text_counter` loaded for ``model``, else :func:`text_bytes`."""
    return _COUNTERS.get(model, text_bytes)


def item_tokens(item: Item, count: TextCounter = text_bytes, audio_as_text: bool = False) -> int:
    """Upper bound of ``item``'s prompt tokens (module docstring), its text counted by ``count``
    (``audio_as_text``: user audio counted as its transcript, as :func:`messages_of` sends it).
    CPU work linear in the item's text (a tokenizer: run it off the event loop)."""
    tokens = MESSAGE_OVERHEAD_TOKENS
    for p in item.parts:
        if p.kind == "input_audio" and not audio_as_text:
            tokens += math.ceil(p.audio_ms / 1000 * AUDIO_TOKENS_PER_S) + AUDIO_PART_TOKENS
        else:
            tokens += count(prompt_text(p))
    return tokens


def text_tokens(text: str, count: TextCounter = text_bytes) -> int:
    """Upper bound of the fixed part of a prompt: the system message of ``text`` (the
    instructions; none when empty) and the generation prompt."""
    return GENERATION_PROMPT_TOKENS + (MESSAGE_OVERHEAD_TOKENS + count(text) if text else 0)


def check_max_output_tokens(value: int | None, max_model_len: int | None, param: str) -> None:
    """Refuse a ``max_output_tokens`` that leaves no room for a prompt: at most ``max_model_len``
    minus the smallest prompt (:func:`text_tokens` + one empty message). Raises ``RealtimeError``
    ``invalid_value`` naming ``max_model_len``; None (``inf``) or an unknown context passes."""
    if value is None or not max_model_len:
        return
    most = max_model_len - text_tokens("") - MESSAGE_OVERHEAD_TOKENS
    if value > most:
        raise RealtimeError(f"'{param}' is {value} but this model's context is max_model_len={max_model_len} "
                            f"tokens: at most {max(most, 0)}, to leave room for the prompt", "invalid_value", param)


def context_error_tokens(message: str) -> int | None:
    """The real prompt length named by the model's refusal of a too-long prompt
    (``_CONTEXT_ERROR``), or None when ``message`` is not such a refusal."""
    m = _CONTEXT_ERROR.search(message)
    return int(m.group(1)) if m else None


def shrunk_budget(budget: int, fixed: int, estimate: int, actual: int) -> int:
    """The item budget of a retry after the model counted ``actual`` tokens for a prompt estimated
    at ``estimate`` (items + the ``fixed`` part, :func:`text_tokens`) when the items had ``budget``:
    the room ``budget + fixed`` scaled by ``estimate / actual`` (the model's real tokens per
    estimated token), less the fixed part, and always below the items' estimate that was sent, so
    at least one more old item is left out."""
    if actual <= 0 or estimate <= 0:
        return budget
    return min(math.floor((budget + fixed) * estimate / actual) - fixed, estimate - fixed - 1, budget - 1)


def prompt_text(part: Part) -> str:
    return part.text or ""


def select_items(items: list[Item], budget: int, max_media_parts: int | None,
                 count: TextCounter = text_bytes, audio_as_text: bool = False) -> list[Item]:
    """The newest items that fit ``budget`` tokens (their text counted by ``count``) and
    ``max_media_parts`` audio parts, in order: the oldest whole items are left out first (module
    docstring). Raises ``RealtimeError`` ``context_length_exceeded`` when the newest item alone
    does not fit."""
    kept: list[Item] = []
    tokens = media = 0
    for item in reversed(items):
        t, m = item_tokens(item, count, audio_as_text), 0 if audio_as_text else item.media_parts
        if tokens + t > budget or (max_media_parts is not None and media + m > max_media_parts):
            break
        kept.append(item)
        tokens, media = tokens + t, media + m
    if items and not kept:
        need = item_tokens(items[-1], count, audio_as_text)
        raise RealtimeError(f"The newest conversation item needs about {need} tokens; the "
                            f"model's context leaves {budget} for the prompt", "context_length_exceeded")
    return kept[::-1]


def messages_of(items: list[Item], instructions: str, audio_as_text: bool = False) -> list[dict[str, Any]]:
    """The chat ``MESSAGES`` (docs/chat_contracts.md) of ``items`` after a system message with
    ``instructions``. Assistant items without text (cancelled before any) are left out.
    ``audio_as_text`` (a model without audio input): each user audio part is sent as a text part
    holding its transcript (a part without one is left out, a message left empty too)."""
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    for item in items:
        if item.role == "user":
            parts: list[dict[str, Any]] = []
            for p in item.parts:
                if p.kind == "input_audio" and audio_as_text:
                    if p.text:
                        parts.append({"type": "text", "text": p.text})
                elif p.kind == "input_audio":
                    parts.append({"type": "input_audio", "input_audio": {"data": p.wav_b64, "format": "wav"}})
                elif p.text:
                    parts.append({"type": "text", "text": p.text})
            if parts:
                out.append({"role": "user", "content": parts})
        else:
            text = "".join(prompt_text(p) for p in item.parts)
            if text:
                out.append({"role": item.role, "content": text})
    return out


# --------------------------------------------------------------------------- JSON
def part_json(part: Part, naming: Naming) -> dict[str, Any]:
    """A content part as the protocol shows it (audio data left out, as OpenAI's events do)."""
    if part.kind == "input_text":
        return {"type": "input_text", "text": part.text or ""}
    if part.kind == "input_audio":
        return {"type": "input_audio", "transcript": part.text}
    if part.kind == "text":
        return {"type": naming.out_text, "text": part.text or ""}
    return {"type": naming.out_audio, "transcript": part.text or ""}


def item_json(item: Item, naming: Naming) -> dict[str, Any]:
    """An item as the protocol shows it (``realtime.item``)."""
    return {"id": item.id, "object": "realtime.item", "type": "message", "role": item.role, "status": item.status,
            "content": [part_json(p, naming) for p in item.parts]}


_USER_PARTS: dict[str, PartKind] = {"input_text": "input_text", "input_audio": "input_audio", "text": "input_text"}
_ASSISTANT_PARTS: dict[str, PartKind] = {"output_text": "text", "text": "text", "output_audio": "audio",
                                         "audio": "audio"}


def parse_item(raw: Any, max_text_chars: int) -> Item:
    """An item of ``conversation.item.create`` (``type: "message"``; roles ``user`` with
    ``input_text`` / ``input_audio`` parts, ``assistant`` with ``output_text`` / ``text`` /
    ``output_audio`` / ``audio`` parts (audio parts carry their ``transcript``), ``system`` with
    ``input_text``). ``input_audio`` data is base64 PCM16 24 kHz (decoded here: the caller runs
    this off the event loop when the event is large). Raises ``RealtimeError``."""
    if not isinstance(raw, dict):
        raise RealtimeError("'item' must be an object", "invalid_type", "item")
    if raw.get("type", "message") != "message":
        raise RealtimeError(f"Items of type {str(raw.get('type'))[:40]!r} are not supported (no tools); "
                            "only 'message'", "unsupported_item_type", "item.type")
    role = raw.get("role")
    if role not in ("user", "assistant", "system"):
        raise RealtimeError("'item.role' must be 'user', 'assistant' or 'system'", "invalid_value", "item.role")
    item_id = raw.get("id")
    if item_id is not None and (not isinstance(item_id, str) or not 0 < len(item_id) <= 64):
        raise RealtimeError("'item.id' must be a string of 1 to 64 characters", "invalid_value", "item.id")
    content = raw.get("content")
    if not isinstance(content, list) or not content:
        raise RealtimeError("'item.content' must be a non-empty list", "invalid_value", "item.content")
    if len(content) > 16:
        raise RealtimeError("'item.content' has more than 16 parts", "invalid_value", "item.content")
    table = _ASSISTANT_PARTS if role == "assistant" else _USER_PARTS
    parts = []
    for i, c in enumerate(content):
        where = f"item.content.{i}"
        bad_system = role == "system" and isinstance(c, dict) and c.get("type") != "input_text"
        if not isinstance(c, dict) or c.get("type") not in table or bad_system:
            raise RealtimeError(f"'{where}.type' must be one of {', '.join(sorted(table))} for a {role} item"
                                if role != "system" else f"'{where}.type' must be 'input_text' for a system item",
                                "invalid_value", f"{where}.type")
        kind = table[c["type"]]
        if kind == "input_audio":
            data = c.get("audio")
            if not isinstance(data, str) or not data:
                raise RealtimeError(f"'{where}.audio' must be base64 PCM16 24 kHz audio", "invalid_value",
                                    f"{where}.audio")
            pcm = decode_b64(data, f"{where}.audio")
            if len(pcm) < 100 * BYTES_PER_MS:
                raise RealtimeError(f"'{where}.audio' holds less than 100 ms of audio", "invalid_value",
                                    f"{where}.audio")
            parts.append(Part("input_audio", pcm=pcm, wav_b64=prepare_audio(pcm), audio_ms=len(pcm) // BYTES_PER_MS))
        elif kind == "audio":
            transcript = c.get("transcript", "")
            parts.append(Part("audio", text=checked_string(transcript, f"{where}.transcript", max_text_chars)))
        else:
            parts.append(Part(kind, text=checked_string(c.get("text"), f"{where}.text", max_text_chars)))
    return Item(item_id or new_id("item"), role, parts)


def heard_prefix(transcript: str, kept_ms: int, total_ms: int) -> str:
    """The words of ``transcript`` the listener heard when its audio (``total_ms`` long) was cut
    at ``kept_ms``: the same share of its words (the pipeline has no word timing; documented
    approximation, docs/realtime.md "Truncation")."""
    if total_ms <= 0 or kept_ms >= total_ms:
        return transcript
    words = transcript.split()
    return " ".join(words[:int(len(words) * kept_ms / total_ms)])

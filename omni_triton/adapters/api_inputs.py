"""Reading the OpenAI-level request inputs that stages of several families share: the chat text
inputs (``PROMPT``, ``MESSAGES``, ``SAMPLING_PARAMETERS``: ``llm``, ``llm_tts``, ``qwen3_omni``,
``qwen2_5_omni``) and a speech ``TEXT`` (``piper``, ``csm``), each bounded by its cap before decoding.
Stub-only (reads ``pb_utils`` requests through ``triton_io``)."""
from __future__ import annotations

from omni_triton.adapters.triton_io import optional_str_input
from omni_triton.contracts import chat as ch
from omni_triton.contracts import speech as sp
from omni_triton.contracts.tensors import MAX_MESSAGES_CHARS, MAX_PROMPT_CHARS, utf8_array

#: chat text inputs and their stage-side caps in characters (bytes bounded before decoding)
_CHAT_TEXT = ((ch.PROMPT, MAX_PROMPT_CHARS), (ch.MESSAGES, MAX_MESSAGES_CHARS),
              (ch.SAMPLING_PARAMETERS, MAX_PROMPT_CHARS))


def read_chat_request(request, messages_chars: int = MAX_MESSAGES_CHARS) -> tuple[str | None, str | None, str | None]:
    """PROMPT, MESSAGES, SAMPLING_PARAMETERS of a chat request (``None`` where absent).

    Each is refused (``ChatInputError``) over its cap: ``MAX_PROMPT_CHARS`` (the frontend's
    ``--max-prompt-chars`` default; MESSAGES ``messages_chars``: twice that, for its JSON framing,
    plus the inline media parts of a model that takes them, ``media_messages_chars``).

    Raises:
        UnicodeDecodeError: not UTF-8 (answered as INVALID_ARG).
        ChatInputError: over a cap.
    """
    return tuple(optional_str_input(request, n, messages_chars if n == ch.MESSAGES else cap, ch.ChatInputError)
                 for n, cap in _CHAT_TEXT)


def chat_request_pairs(values: tuple[str | None, str | None, str | None]) -> list:
    """The given ones of :func:`read_chat_request`'s values as ``(name, array)`` inputs of a stage."""
    return [(n, utf8_array(v)) for n, v in zip((n for n, _ in _CHAT_TEXT), values, strict=False) if v is not None]


def request_text(request, name: str, max_input_chars: int) -> str | None:
    """A speech text input (``str``, None when absent).

    Raises:
        SpeechInputError: over the model's ``max_input_chars`` (config parameter).
        UnicodeDecodeError: not UTF-8 (answered as INVALID_ARG).
    """
    return optional_str_input(request, name, max_input_chars, sp.SpeechInputError, "max_input_chars")

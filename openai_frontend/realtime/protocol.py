"""The wire shapes of the Realtime API: two event namings, the session configuration, errors.

One session engine speaks two namings of the same protocol (docs/realtime.md):

* **GA** (``client.realtime.connect`` of openai >= 1.107, 3.57 here): ``session.update`` carries
  ``{"type": "realtime", "output_modalities", "instructions", "audio": {"input": {"format":
  {"type": "audio/pcm", "rate": 24000}, "turn_detection"}, "output": {"format", "voice"}},
  "max_output_tokens"}``; deltas are ``response.output_text.delta``,
  ``response.output_audio.delta``, ``response.output_audio_transcript.delta``; assistant content
  parts are ``output_text`` / ``output_audio``.
* **beta** (the ``OpenAI-Beta: realtime=v1`` handshake header, ``client.beta.realtime.connect``):
  ``modalities``, ``voice``, ``input_audio_format`` / ``output_audio_format`` (``"pcm16"``),
  ``turn_detection``, ``temperature``, ``max_response_output_tokens``; deltas are
  ``response.text.delta``, ``response.audio.delta``, ``response.audio_transcript.delta``;
  assistant content parts are ``text`` / ``audio``.

Audio is PCM 16-bit little-endian mono at 24 kHz both ways (the only format this server takes:
``audio/pcm`` rate 24000 / ``pcm16``; G.711 is refused with ``unsupported_audio_format``).

Every problem with a client event is a :class:`RealtimeError` and goes to the client as the
protocol's error event (:func:`error_event`): ``{"type": "error", "event_id", "error": {"type",
"code", "message", "param", "event_id"}}``.
"""
from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

#: Sample rate of all Realtime audio, both ways (OpenAI: pcm16 / audio/pcm at 24 kHz).
RATE = 24000
#: Bytes per millisecond of that audio (16-bit mono).
BYTES_PER_MS = RATE * 2 // 1000

#: OpenAI's bounds of ``max_output_tokens`` / ``max_response_output_tokens`` (an int 1..4096 or "inf").
MAX_OUTPUT_TOKENS = 4096


def new_id(prefix: str) -> str:
    """A fresh id as OpenAI spells them: ``event_...``, ``item_...``, ``resp_...``, ``sess_...``."""
    return f"{prefix}_{secrets.token_hex(10)}"


class RealtimeError(Exception):
    """A client event that cannot be served: sent as an ``error`` event.

    Args:
        message: for the client.
        code: OpenAI's code when it has one (``invalid_value``, ``unknown_parameter``,
            ``input_audio_buffer_commit_empty``, ...).
        param: the offending field as a dotted path (``session.audio.input.format``), or None.
        error_type: ``invalid_request_error`` (the client's fault) or ``server_error``.
        fatal: the session is closed after the event (a limit: ``close_code`` says which).
        close_code: the WebSocket close code when fatal (1008 policy, 1009 too big, 1013 try later).
    """

    def __init__(self, message: str, code: str, param: str | None = None, *,
                 error_type: str = "invalid_request_error", fatal: bool = False, close_code: int = 1008):
        super().__init__(message)
        self.message, self.code, self.param = message, code, param
        self.error_type, self.fatal, self.close_code = error_type, fatal, close_code


def error_event(exc: RealtimeError, client_event_id: str | None = None) -> dict[str, Any]:
    """The ``error`` server event of ``exc`` (same shape in both namings); ``client_event_id``:
    the ``event_id`` of the client event that caused it, if it had one."""
    return {"type": "error", "event_id": new_id("event"),
            "error": {"type": exc.error_type, "code": exc.code, "message": exc.message, "param": exc.param,
                      "event_id": client_event_id}}


# --------------------------------------------------------------------------- namings
@dataclass(frozen=True)
class Naming:
    """The event and content-part names of one protocol version."""

    beta: bool
    text_delta: str
    text_done: str
    audio_delta: str
    audio_done: str
    transcript_delta: str
    transcript_done: str
    #: assistant content part types in items: text, audio
    out_text: str
    out_audio: str


GA = Naming(False, "response.output_text.delta", "response.output_text.done", "response.output_audio.delta",
            "response.output_audio.done", "response.output_audio_transcript.delta",
            "response.output_audio_transcript.done", "output_text", "output_audio")
BETA = Naming(True, "response.text.delta", "response.text.done", "response.audio.delta", "response.audio.done",
              "response.audio_transcript.delta", "response.audio_transcript.done", "text", "audio")


def naming_of(openai_beta_header: str | None) -> Naming:
    """BETA when the handshake's ``OpenAI-Beta`` header names ``realtime=v1``, else GA."""
    values = [v.strip().lower() for v in (openai_beta_header or "").split(",")]
    return BETA if "realtime=v1" in values else GA


# --------------------------------------------------------------------------- session configuration
@dataclass(frozen=True)
class TurnDetection:
    """``server_vad`` settings (OpenAI's fields and defaults); ``omni_triton.media.vad.VADConfig``
    takes the first three."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True


@dataclass(frozen=True)
class TranscriptionConfig:
    """``input_audio_transcription`` (beta) / ``audio.input.transcription`` (GA): the model that
    transcribes committed user audio (an OpenAI name such as ``whisper-1`` is the server's
    default transcription model, as on ``/v1/audio/transcriptions``), the ``language``
    (ISO-639-1) and the ``prompt`` (spelling hints), both optional. Checked against the model
    by the session (``serving.transcriptions.transcription_job``)."""

    model: str = "whisper-1"
    language: str | None = None
    prompt: str | None = None

    def json(self) -> dict[str, Any]:
        """As ``session.created`` / ``session.updated`` show it."""
        return {"model": self.model, "language": self.language, "prompt": self.prompt}


@dataclass(frozen=True)
class SessionConfig:
    """A session's settings, the same for both namings.

    ``audio_out``: answers are audio with a transcript (GA ``output_modalities ["audio"]``, beta
    ``modalities ["text", "audio"]``); False: text only. ``voice``: as the client named it (an
    OpenAI name or one of the model's voices; resolved per response). ``max_output_tokens``: None
    is ``"inf"`` (the model's own limit). ``truncation``: ``"auto"`` drops the oldest whole items
    that do not fit the context (docs/realtime.md), ``"disabled"`` fails the response instead.
    """

    instructions: str = ""
    audio_out: bool = True
    voice: str = "alloy"
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    max_output_tokens: int | None = None
    temperature: float | None = None
    truncation: Literal["auto", "disabled"] = "auto"
    #: input audio transcription; None: off (docs/realtime.md "Input audio transcription")
    transcription: TranscriptionConfig | None = None


def _obj(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RealtimeError(f"'{param}' must be an object", "invalid_type", param)
    return value


def _check_keys(obj: Mapping[str, Any], allowed: frozenset[str], param: str) -> None:
    for key in obj:
        if key not in allowed:
            raise RealtimeError(f"Unknown parameter: '{param}.{str(key)[:64]}'.", "unknown_parameter",
                                f"{param}.{str(key)[:64]}")


def checked_string(value: Any, param: str, max_chars: int) -> str:
    """``value`` if it is a str of at most ``max_chars`` characters of valid Unicode without NUL.

    Raises:
        RealtimeError: ``invalid_type``, ``string_above_max_length`` or ``invalid_characters``
            (``param`` names the field).
    """
    if not isinstance(value, str):
        raise RealtimeError(f"'{param}' must be a string", "invalid_type", param)
    if len(value) > max_chars:
        raise RealtimeError(f"'{param}' is {len(value)} characters; at most {max_chars}", "string_above_max_length",
                            param)
    if "\x00" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise RealtimeError(f"'{param}' must be valid Unicode text without NUL", "invalid_characters", param)
    return value


def _bool(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        raise RealtimeError(f"'{param}' must be a boolean", "invalid_type", param)
    return value


def _number(value: Any, param: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RealtimeError(f"'{param}' must be a number within [{low:g}, {high:g}]", "invalid_value", param)
    return float(value)


def _int(value: Any, param: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RealtimeError(f"'{param}' must be an integer within [{low}, {high}]", "invalid_value", param)
    return value


def parse_max_tokens(value: Any, param: str) -> int | None:
    """``max_output_tokens``: an int 1..4096, or ``"inf"`` (None)."""
    if value == "inf":
        return None
    return _int(value, param, 1, MAX_OUTPUT_TOKENS)


def parse_modalities(value: Any, param: str) -> bool:
    """Whether ``output_modalities`` / ``modalities`` asks for audio (``["audio"]``,
    ``["text", "audio"]``) or text only (``["text"]``)."""
    if not isinstance(value, list) or not value or any(m not in ("text", "audio") for m in value):
        raise RealtimeError(f"'{param}' must be a non-empty list of 'text' and 'audio'", "invalid_value", param)
    return "audio" in value


def parse_turn_detection(value: Any, param: str, current: TurnDetection | None) -> TurnDetection | None:
    """``turn_detection``: null (the client commits) or ``{"type": "server_vad", ...}`` (fields
    left out keep OpenAI's defaults). ``semantic_vad`` needs a turn model this server does not
    have: ``unsupported_turn_detection``."""
    if value is None:
        return None
    obj = _obj(value, param)
    _check_keys(obj, frozenset({"type", "threshold", "prefix_padding_ms", "silence_duration_ms", "create_response",
                                "interrupt_response", "idle_timeout_ms", "eagerness"}), param)
    kind = obj.get("type", "server_vad")
    if kind != "server_vad":
        raise RealtimeError(f"turn_detection type {str(kind)[:32]!r} is not supported; use 'server_vad' or null",
                            "unsupported_turn_detection", f"{param}.type")
    if obj.get("idle_timeout_ms") is not None:
        raise RealtimeError("turn_detection.idle_timeout_ms is not supported", "unsupported_turn_detection",
                            f"{param}.idle_timeout_ms")
    base = TurnDetection()
    out: dict[str, Any] = {}
    if "threshold" in obj:
        out["threshold"] = _number(obj["threshold"], f"{param}.threshold", 0.0, 1.0)
    for key in ("prefix_padding_ms", "silence_duration_ms"):
        if key in obj:
            out[key] = _int(obj[key], f"{param}.{key}", 0, 10_000)
    for key in ("create_response", "interrupt_response"):
        if key in obj:
            out[key] = _bool(obj[key], f"{param}.{key}")
    return replace(base, **out)


def _format_ga(value: Any, param: str) -> None:
    obj = _obj(value, param)
    _check_keys(obj, frozenset({"type", "rate"}), param)
    if obj.get("type", "audio/pcm") != "audio/pcm" or obj.get("rate", RATE) != RATE:
        raise RealtimeError("Only audio/pcm at 24000 Hz is supported", "unsupported_audio_format", param)


def _format_beta(value: Any, param: str) -> None:
    if value != "pcm16":
        raise RealtimeError("Only pcm16 (24 kHz) is supported", "unsupported_audio_format", param)


def _voice(value: Any, param: str) -> str:
    if isinstance(value, dict):  # GA: {"id": "..."} (custom voice id)
        value = value.get("id")
    return checked_string(value, param, 64)


#: Fields accepted and not used (the answer does not depend on them); docs/realtime.md.
_IGNORED_GA = frozenset({"include", "tracing", "prompt", "tool_choice", "parallel_tool_calls", "reasoning",
                         "object", "id", "expires_at", "client_secret"})
_IGNORED_BETA = frozenset({"tracing", "tool_choice", "input_audio_noise_reduction", "speed", "object", "id",
                           "expires_at", "client_secret", "include"})


def _tools(value: Any, param: str) -> None:
    if value not in (None, []):
        raise RealtimeError("Tools are not supported by this server", "unsupported_tools", param)


def parse_transcription(value: Any, param: str, max_chars: int) -> TranscriptionConfig | None:
    """``{"model", "language", "prompt"}`` (all optional; ``model`` defaults to ``whisper-1``)
    or null (off). Types and lengths are checked here (``prompt`` at most ``max_chars``); the
    model, language and prompt against the served models by the session, as
    ``/v1/audio/transcriptions`` checks its form."""
    if value is None:
        return None
    obj = _obj(value, param)
    _check_keys(obj, frozenset({"model", "language", "prompt"}), param)
    model = checked_string(obj.get("model", "whisper-1"), f"{param}.model", 256)
    language = prompt = None
    if obj.get("language") is not None:
        language = checked_string(obj["language"], f"{param}.language", 16).strip().lower() or None
    if obj.get("prompt") is not None:
        prompt = checked_string(obj["prompt"], f"{param}.prompt", max_chars) or None
    return TranscriptionConfig(model=model, language=language, prompt=prompt)


def apply_session_update(config: SessionConfig, session: Any, naming: Naming, model_names: frozenset[str],
                         max_instructions_chars: int) -> SessionConfig:
    """``config`` with the fields of a ``session.update``'s ``session`` applied (the others
    kept); nothing is applied when any field is bad.

    Raises:
        RealtimeError: an unknown field, a bad value, or a feature this server lacks (tools,
            semantic VAD, G.711, another model).
    """
    obj = _obj(session, "session")
    out: dict[str, Any] = {}
    if "model" in obj and obj["model"] not in model_names:
        raise RealtimeError("The session's model is the one named in the URL; it cannot change", "invalid_value",
                            "session.model")
    if "instructions" in obj:
        out["instructions"] = checked_string(obj["instructions"], "session.instructions", max_instructions_chars)
    if "tools" in obj:
        _tools(obj["tools"], "session.tools")
    if naming.beta:
        _check_keys(obj, frozenset({"model", "instructions", "tools", "modalities", "voice", "input_audio_format",
                                    "output_audio_format", "turn_detection", "input_audio_transcription",
                                    "temperature", "max_response_output_tokens"}) | _IGNORED_BETA, "session")
        if "modalities" in obj:
            out["audio_out"] = parse_modalities(obj["modalities"], "session.modalities")
        if "voice" in obj:
            out["voice"] = _voice(obj["voice"], "session.voice")
        for key in ("input_audio_format", "output_audio_format"):
            if key in obj:
                _format_beta(obj[key], f"session.{key}")
        if "turn_detection" in obj:
            out["turn_detection"] = parse_turn_detection(obj["turn_detection"], "session.turn_detection",
                                                         config.turn_detection)
        if "input_audio_transcription" in obj:
            out["transcription"] = parse_transcription(obj["input_audio_transcription"],
                                                       "session.input_audio_transcription", max_instructions_chars)
        if "temperature" in obj:
            out["temperature"] = _number(obj["temperature"], "session.temperature", 0.0, 2.0)
        if "max_response_output_tokens" in obj:
            out["max_output_tokens"] = parse_max_tokens(obj["max_response_output_tokens"],
                                                        "session.max_response_output_tokens")
        return replace(config, **out)
    _check_keys(obj, frozenset({"type", "model", "instructions", "tools", "output_modalities", "audio",
                                "max_output_tokens", "truncation"}) | _IGNORED_GA, "session")
    if obj.get("type", "realtime") != "realtime":
        raise RealtimeError("Only realtime sessions are served here (type 'realtime')", "invalid_value",
                            "session.type")
    if "output_modalities" in obj:
        out["audio_out"] = parse_modalities(obj["output_modalities"], "session.output_modalities")
    if "max_output_tokens" in obj:
        out["max_output_tokens"] = parse_max_tokens(obj["max_output_tokens"], "session.max_output_tokens")
    if "truncation" in obj:
        if obj["truncation"] not in ("auto", "disabled"):
            raise RealtimeError("truncation must be 'auto' or 'disabled'", "invalid_value", "session.truncation")
        out["truncation"] = obj["truncation"]
    if "audio" in obj:
        audio = _obj(obj["audio"], "session.audio")
        _check_keys(audio, frozenset({"input", "output"}), "session.audio")
        if "input" in audio:
            inp = _obj(audio["input"], "session.audio.input")
            _check_keys(inp, frozenset({"format", "turn_detection", "transcription", "noise_reduction"}),
                        "session.audio.input")
            if "format" in inp:
                _format_ga(inp["format"], "session.audio.input.format")
            if "turn_detection" in inp:
                out["turn_detection"] = parse_turn_detection(inp["turn_detection"],
                                                             "session.audio.input.turn_detection",
                                                             config.turn_detection)
            if "transcription" in inp:
                out["transcription"] = parse_transcription(inp["transcription"], "session.audio.input.transcription",
                                                           max_instructions_chars)
        if "output" in audio:
            output = _obj(audio["output"], "session.audio.output")
            _check_keys(output, frozenset({"format", "voice", "speed"}), "session.audio.output")
            if "format" in output:
                _format_ga(output["format"], "session.audio.output.format")
            if "voice" in output:
                out["voice"] = _voice(output["voice"], "session.audio.output.voice")
    return replace(config, **out)


def _turn_json(td: TurnDetection | None) -> dict[str, Any] | None:
    if td is None:
        return None
    return {"type": "server_vad", "threshold": td.threshold, "prefix_padding_ms": td.prefix_padding_ms,
            "silence_duration_ms": td.silence_duration_ms, "create_response": td.create_response,
            "interrupt_response": td.interrupt_response}


def session_json(config: SessionConfig, naming: Naming, session_id: str, model: str,
                 expires_at: int) -> dict[str, Any]:
    """The ``session`` object of ``session.created`` / ``session.updated`` in ``naming``."""
    max_tokens: int | str = "inf" if config.max_output_tokens is None else config.max_output_tokens
    transcription = config.transcription.json() if config.transcription is not None else None
    if naming.beta:
        return {"id": session_id, "object": "realtime.session", "model": model,
                "modalities": ["text", "audio"] if config.audio_out else ["text"],
                "instructions": config.instructions, "voice": config.voice, "input_audio_format": "pcm16",
                "output_audio_format": "pcm16", "input_audio_transcription": transcription,
                "turn_detection": _turn_json(config.turn_detection), "tools": [], "tool_choice": "auto",
                "temperature": config.temperature if config.temperature is not None else 0.8,
                "max_response_output_tokens": max_tokens, "expires_at": expires_at}
    fmt = {"type": "audio/pcm", "rate": RATE}
    return {"type": "realtime", "object": "realtime.session", "id": session_id, "model": model,
            "output_modalities": ["audio"] if config.audio_out else ["text"],
            "instructions": config.instructions,
            "audio": {"input": {"format": fmt, "transcription": transcription, "noise_reduction": None,
                                "turn_detection": _turn_json(config.turn_detection)},
                      "output": {"format": fmt, "voice": config.voice, "speed": 1.0}},
            "tools": [], "tool_choice": "auto", "max_output_tokens": max_tokens, "truncation": config.truncation,
            "expires_at": expires_at}

"""Torch-free parts of the Qwen3-TTS stages: the validated request, the form rule and the voice
prompt bytes (contract: ``omni_triton.contracts.qwen3_tts``)."""
from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np

from omni_triton.contracts.qwen3_tts import TASKS, Qwen3TtsInputError

MAX_TEXT_CHARS = 2000


@dataclass
class VoicePrompt:
    """The package's ``VoiceClonePromptItem`` fields as numpy: ``ref_code`` int64 [T, Q] (None in
    x-vector-only mode), ``ref_spk_embedding`` float32 [D], the two modes, ``ref_text``."""

    ref_code: np.ndarray | None
    ref_spk_embedding: np.ndarray
    x_vector_only_mode: bool
    icl_mode: bool
    ref_text: str | None = None

    def to_bytes(self) -> bytes:
        """``np.savez`` archive (the contract's VOICE_PROMPT bytes)."""
        buf = io.BytesIO()
        np.savez(buf, ref_code=np.zeros((0, 0), np.int64) if self.ref_code is None else self.ref_code.astype(np.int64),
                 ref_spk_embedding=self.ref_spk_embedding.astype(np.float32),
                 x_vector_only_mode=np.bool_(self.x_vector_only_mode), icl_mode=np.bool_(self.icl_mode),
                 ref_text=np.str_(self.ref_text or ""))
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> VoicePrompt:
        """Inverse of :meth:`to_bytes`.

        Raises:
            Qwen3TtsInputError: not such an archive.
        """
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                code = z["ref_code"]
                return cls(None if code.size == 0 else code.astype(np.int64), z["ref_spk_embedding"].astype(np.float32),
                           bool(z["x_vector_only_mode"]), bool(z["icl_mode"]), str(z["ref_text"]) or None)
        except Exception as exc:
            raise Qwen3TtsInputError(f"VOICE_PROMPT is not a voice prompt archive: {exc}") from None


@dataclass
class Qwen3TtsRequest:
    """One validated synthesis request for a talker form.

    task: ``custom_voice`` | ``voice_design`` | ``base``; speaker (custom_voice), instructions
    (custom_voice style / voice_design description), voice_prompt (base), max_new_tokens (cap on
    codec frames, 12.5 per second)."""

    task: str
    text: str
    language: str = "Auto"
    speaker: str | None = None
    instructions: str | None = None
    voice_prompt: VoicePrompt | None = None
    max_new_tokens: int = 200
    extra: dict = field(default_factory=dict)
    first_chunk_frames: int | None = None  # the BLS's first chunk: frames of the first CODES response


def choose_task(task: str | None, voice: str | None, instructions: str | None, has_prompt: bool) -> str:
    """The form, from TASK or (left out) from what is given (contract docstring).

    Raises:
        Qwen3TtsInputError: unknown TASK.
    """
    if task:
        if task not in TASKS:
            raise Qwen3TtsInputError(f"TASK must be one of {', '.join(TASKS)}, got {task!r}")
        return task
    if has_prompt:
        return "base"
    if instructions and not voice:
        return "voice_design"
    return "custom_voice"


def validate_request(req: Qwen3TtsRequest, speakers, languages, max_frames_cap: int = 4096) -> Qwen3TtsRequest:
    """Check one request against the loaded forms' speakers and languages (case-insensitive).

    Raises:
        Qwen3TtsInputError: empty/oversize text, unknown speaker or language, a form without what it needs.
    """
    if not req.text or not req.text.strip():
        raise Qwen3TtsInputError("TEXT must not be empty")
    if len(req.text) > MAX_TEXT_CHARS:
        raise Qwen3TtsInputError(f"TEXT is longer than {MAX_TEXT_CHARS} characters")
    if req.language.lower() != "auto" and req.language.lower() not in languages:
        raise Qwen3TtsInputError(f"unknown LANGUAGE {req.language!r}; known: Auto, {', '.join(sorted(languages))}")
    if req.task == "custom_voice":
        if not req.speaker or req.speaker.lower() not in speakers:
            raise Qwen3TtsInputError(f"unknown VOICE {req.speaker!r}; known: {', '.join(sorted(speakers))}")
    elif req.task == "voice_design":
        if not req.instructions:
            raise Qwen3TtsInputError("voice_design needs INSTRUCTIONS (the voice description)")
    elif req.voice_prompt is None:
        raise Qwen3TtsInputError("base (voice cloning) needs VOICE_PROMPT or REF_AUDIO")
    if not 1 <= req.max_new_tokens <= max_frames_cap:
        raise Qwen3TtsInputError(f"MAX_FRAMES must be in [1, {max_frames_cap}], got {req.max_new_tokens}")
    return req

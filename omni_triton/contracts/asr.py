"""The ASR contract (``docs/transcription.md``): what every speech-recognition model takes and
streams (``whisper``, the Whisper architecture's BLS over ``whisper_encoder`` -> ``whisper_decoder``;
``pocketsphinx``, CMU Sphinx's US-English model shipped in the ``pocketsphinx`` wheel).

A model transcribes one *segment*: ``AUDIO`` (FP32 [-1], mono PCM in [-1, 1] at 16 kHz, at most
the model's ``max_audio_s`` seconds; the OpenAI frontend cuts longer uploads at pauses with
``omni_triton.media.vad.speech_segments``), with optional ``LANGUAGE`` (BYTES [1], ISO-639-1,
e.g. ``"en"``), ``PROMPT`` (BYTES [1], OpenAI's ``prompt``: earlier text or spellings to follow)
and ``TASK`` (BYTES [1], ``transcribe`` or ``translate``: to English). It is decoupled: one or
more responses each carrying ``TEXT_DELTA`` (BYTES [1], the text since the previous response; a
model that cannot stream sends the whole text once), then the final flag.

Config ``parameters`` the frontend reads: ``task`` = ``"transcription"``, ``sample_rate``
(``"16000"``), ``max_audio_s``, ``languages`` (comma list of ISO-639-1 codes the model knows),
``supports_translation`` (``"true"``/``"false"``). Every input problem is an
:class:`ASRInputError` (INVALID_ARG, HTTP 400).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from omni_triton.contracts.tensors import AUDIO, Array, InputError, StageContract, TensorSpec, utf8_array

LANGUAGE = "LANGUAGE"  #: BYTES [1], optional: ISO-639-1 code of the speech
PROMPT = "PROMPT"  #: BYTES [1], optional: OpenAI ``prompt`` (earlier text, spellings)
TASK = "TASK"  #: BYTES [1], optional: one of :data:`TASKS`
TEXT_DELTA = "TEXT_DELTA"  #: BYTES [1]: the transcript since the previous response

#: ``TASK`` values: ``transcribe`` (the default) keeps the spoken language; ``translate`` answers in
#: English (OpenAI ``/v1/audio/translations``), only on a model with ``supports_translation``.
TASKS = ("transcribe", "translate")
#: Hz of ``AUDIO``: Whisper's feature extractor and CMU Sphinx's US-English acoustic model both take 16 kHz.
SAMPLE_RATE = 16000
#: The frontend's task tag of an ASR model (config parameter ``task``).
MODEL_TASK = "transcription"
#: Longest ``PROMPT``, in characters (Whisper keeps the last 224 prompt tokens; a few characters each).
MAX_PROMPT_CHARS = 2000


class ASRInputError(InputError):
    """The segment cannot be transcribed as given: empty or too long audio, an unknown language,
    a task the model has not, a prompt too long."""


@dataclass(frozen=True)
class ASRRequest:
    """One validated segment to transcribe.

    Attributes:
        audio: float32 [T] mono PCM in [-1, 1] at :data:`SAMPLE_RATE` Hz, 0 < T.
        language: ISO-639-1 code, or None (the model's default / its own detection).
        prompt: OpenAI ``prompt``, or None.
        task: one of :data:`TASKS`.
    """

    audio: NDArray[np.float32]
    language: str | None
    prompt: str | None
    task: str


def parse_asr_request(audio: NDArray[np.float32] | None, language: str | None, prompt: str | None,
                      task: str | None, *, languages: Sequence[str], supports_translation: bool,
                      max_audio_s: float) -> ASRRequest:
    """Validate one segment's inputs (the stage side; the frontend checks the same before sending).

    Args:
        audio: float32 [T] at 16 kHz (a BYTES-free FP32 tensor's array), or None.
        language: ISO-639-1 code or None/"" (default); compared lower-cased.
        prompt: None/"" or at most :data:`MAX_PROMPT_CHARS` characters.
        task: None/"" (``transcribe``) or one of :data:`TASKS`.
        languages: the codes the model knows (config ``languages``).
        supports_translation: config ``supports_translation``.
        max_audio_s: config ``max_audio_s``: the longest segment, seconds.

    Raises:
        ASRInputError: empty audio, more than ``max_audio_s`` seconds, non-finite samples, an
            unknown language, an unknown task, ``translate`` on a model without it, a prompt too long.
    """
    if audio is None or audio.size == 0:
        raise ASRInputError(f"{AUDIO} is empty: nothing to transcribe")
    samples = np.asarray(audio, dtype=np.float32).reshape(-1)
    if samples.size > int(max_audio_s * SAMPLE_RATE):
        raise ASRInputError(f"{AUDIO} is {samples.size / SAMPLE_RATE:.1f} s; this model transcribes at most "
                            f"{max_audio_s:g} s per request (cut longer audio into segments)")
    if not np.isfinite(samples).all():
        raise ASRInputError(f"{AUDIO} holds NaN or infinite samples")
    lang = (language or "").strip().lower() or None
    if lang is not None and lang not in languages:
        raise ASRInputError(f"language {language!r} is not one this model knows: {', '.join(languages)}")
    chosen = (task or "").strip() or "transcribe"
    if chosen not in TASKS:
        raise ASRInputError(f"task {task!r} is not one of {', '.join(TASKS)}")
    if chosen == "translate" and not supports_translation:
        raise ASRInputError("this model cannot translate (supports_translation is false): use a model that can, "
                            "or /v1/audio/transcriptions")
    text_prompt = prompt or None
    if text_prompt is not None and len(text_prompt) > MAX_PROMPT_CHARS:
        raise ASRInputError(f"prompt is {len(text_prompt)} characters; at most {MAX_PROMPT_CHARS}")
    return ASRRequest(samples, lang, text_prompt, chosen)


def asr_inputs(audio: NDArray[np.float32], language: str | None = None, prompt: str | None = None,
               task: str | None = None) -> list[tuple[str, Array]]:
    """The ``(name, array)`` inputs of one ASR request, optional ones only when given
    (``audio``: float32 [T] at 16 kHz; it is sent as FP32 [T])."""
    pairs: list[tuple[str, Array]] = [(AUDIO, np.ascontiguousarray(audio, dtype=np.float32).reshape(-1))]
    if language:
        pairs.append((LANGUAGE, utf8_array(language)))
    if prompt:
        pairs.append((PROMPT, utf8_array(prompt)))
    if task:
        pairs.append((TASK, utf8_array(task)))
    return pairs


#: what a client sends every ASR model, and what it streams back
ASR = StageContract((TensorSpec(AUDIO, "FP32", (-1,)), TensorSpec(LANGUAGE, "BYTES", optional=True),
                     TensorSpec(PROMPT, "BYTES", optional=True), TensorSpec(TASK, "BYTES", optional=True)),
                    (TensorSpec(TEXT_DELTA, "BYTES"),), decoupled=True)

#: model name -> contract of the client-facing ASR models (the ``whisper_encoder`` /
#: ``whisper_decoder`` stage tensors are the whisper family's own: ``contracts/whisper.py``).
#: Registered in ``omni_triton.contracts.CONTRACTS`` with the model folders.
CONTRACTS = {"whisper": ASR, "pocketsphinx": ASR}

"""The Qwen3-TTS contract, client-facing part (issue 11): what the OpenAI frontend and clients send
to the ``qwen3_tts`` BLS model and to ``qwen3_tts_voice_prompt``.

Qwen3-TTS (the official ``qwen-tts`` package, ``Qwen3TTSForConditionalGeneration``) comes in three
forms, each its own checkpoint (``tts_model_type``):

- ``custom_voice``: a named built-in speaker (``VOICE``), steered by ``INSTRUCTIONS``;
- ``voice_design``: a voice described in words (``INSTRUCTIONS`` is the description);
- ``base``: zero-shot cloning from a reference clip, either precomputed (``VOICE_PROMPT``, the
  bytes ``qwen3_tts_voice_prompt`` returned at voice upload) or per request (``REF_AUDIO`` +
  ``REF_SAMPLE_RATE`` + ``REF_TEXT``).

``qwen3_tts`` (decoupled) streams ``AUDIO`` (FP32 [-1], mono PCM in [-1, 1]) and ``SAMPLE_RATE``
(INT32 [1], Hz), like every speech model (``omni_triton.contracts.speech``). ``TASK`` chooses the
form; left out, it follows from what is given (``VOICE_PROMPT``/``REF_AUDIO`` -> ``base``, else
``INSTRUCTIONS`` without ``VOICE`` -> ``voice_design``, else ``custom_voice``).

``qwen3_tts_voice_prompt`` (not decoupled) computes a clone prompt once: ``REF_AUDIO`` +
``REF_SAMPLE_RATE`` (+ ``REF_TEXT`` for ICL mode, or ``X_VECTOR_ONLY``) -> ``VOICE_PROMPT``
(BYTES [1], opaque to the frontend: an ``np.savez`` archive of the package's
``VoiceClonePromptItem`` fields ``ref_code`` int64 [T, Q], ``ref_spk_embedding`` fp32 [D],
``x_vector_only_mode``, ``icl_mode``, ``ref_text``) and ``REF_SECONDS`` (FP32 [1], clip length).
The frontend stores those bytes beside the uploaded clip and sends them back as ``VOICE_PROMPT``.

Every input problem is a :class:`Qwen3TtsInputError` (sent as ``invalid input: ...`` -> 400).
The stage-internal tensors (talker, code2wav) are defined beside the stages.
"""
from __future__ import annotations

from omni_triton.contracts.speech import MAX_FRAMES, TEXT
from omni_triton.contracts.tensors import AUDIO, PACED, SAMPLE_RATE, VOICE, Array, InputError, StageContract, TensorSpec

TASK = "TASK"  #: BYTES [1]: "custom_voice" | "voice_design" | "base"
INSTRUCTIONS = "INSTRUCTIONS"  #: BYTES [1]: style instruction (custom_voice) or voice description (voice_design)
LANGUAGE = "LANGUAGE"  #: BYTES [1]: e.g. "English", "Chinese", "Auto" (the package's language names)
VOICE_PROMPT = "VOICE_PROMPT"  #: BYTES [1]: opaque clone prompt from qwen3_tts_voice_prompt
REF_AUDIO = "REF_AUDIO"  #: FP32 [-1]: reference clip, mono PCM in [-1, 1]
REF_SAMPLE_RATE = "REF_SAMPLE_RATE"  #: INT32 [1]: Hz of REF_AUDIO (any rate; the stage resamples)
REF_TEXT = "REF_TEXT"  #: BYTES [1]: transcript of REF_AUDIO (ICL cloning)
X_VECTOR_ONLY = "X_VECTOR_ONLY"  #: BOOL [1]: clone from the speaker embedding only (no REF_TEXT needed)
REF_SECONDS = "REF_SECONDS"  #: FP32 [1]: length of the reference clip, seconds

TASKS = ("custom_voice", "voice_design", "base")


class Qwen3TtsInputError(InputError):
    """A Qwen3-TTS request or voice clip that cannot be used as given."""


_AUDIO_OUT = (TensorSpec(AUDIO, "FP32", (-1,)), TensorSpec(SAMPLE_RATE, "INT32"))
_REF = (TensorSpec(REF_AUDIO, "FP32", (-1,), optional=True), TensorSpec(REF_SAMPLE_RATE, "INT32", optional=True),
        TensorSpec(REF_TEXT, "BYTES", optional=True), TensorSpec(X_VECTOR_ONLY, "BOOL", optional=True))

QWEN3_TTS = StageContract(
    (TensorSpec(TEXT, "BYTES"), TensorSpec(TASK, "BYTES", optional=True), TensorSpec(VOICE, "BYTES", optional=True),
     TensorSpec(INSTRUCTIONS, "BYTES", optional=True), TensorSpec(LANGUAGE, "BYTES", optional=True),
     TensorSpec(VOICE_PROMPT, "BYTES", optional=True)) + _REF
    + (TensorSpec(MAX_FRAMES, "INT32", optional=True), TensorSpec(PACED, "BOOL", optional=True)),
    _AUDIO_OUT, decoupled=True)
QWEN3_TTS_VOICE_PROMPT = StageContract(
    tuple(TensorSpec(t.name, t.datatype, t.dims, optional=t.name != REF_AUDIO and t.name != REF_SAMPLE_RATE)
          for t in _REF),
    (TensorSpec(VOICE_PROMPT, "BYTES"), TensorSpec(REF_SECONDS, "FP32")))

#: client-facing models; the qwen3tts stages add theirs when they land.
CLIENT_CONTRACTS = {"qwen3_tts": QWEN3_TTS, "qwen3_tts_voice_prompt": QWEN3_TTS_VOICE_PROMPT}

# ------------------------------------------------------------------ stage-internal (qwen3tts)
# ``qwen3_tts_talker`` (decoupled, batched decoding across requests inside the stage): the
# request's form and conditioning -> CODES int64 [n, G] responses (one per generated frame,
# G = code groups), then an empty FINAL; REQUEST_ID lets the BLS caller cancel on 2.51.
# ``qwen3_tts_code2wav`` (dynamic batching, ragged): CODES int64 [1, T, G] + LEFT_CONTEXT int32
# [1, 1] (+ DUE_MS fp32 [1, 1]: ms until the chunk's decoding is due; the decoder takes the most
# urgent chunk first) -> AUDIO fp32 [1, samples] of the frames after the left context (1920
# samples/frame).
from omni_triton.contracts.codec import CODES, DUE_MS, FIRST_CHUNK_FRAMES, LEFT_CONTEXT  # noqa: E402
from omni_triton.contracts.tensors import REQUEST_ID  # noqa: E402

QWEN3_TTS_TALKER = StageContract(
    (TensorSpec(TEXT, "BYTES"), TensorSpec(TASK, "BYTES"), TensorSpec(VOICE, "BYTES", optional=True),
     TensorSpec(INSTRUCTIONS, "BYTES", optional=True), TensorSpec(LANGUAGE, "BYTES", optional=True),
     TensorSpec(VOICE_PROMPT, "BYTES", optional=True), TensorSpec(MAX_FRAMES, "INT32", optional=True),
     TensorSpec(REQUEST_ID, "BYTES", optional=True), TensorSpec(FIRST_CHUNK_FRAMES, "INT32", optional=True)),
    (TensorSpec(CODES, "INT64", (-1, -1)),), decoupled=True)
QWEN3_TTS_CODE2WAV = StageContract((TensorSpec(CODES, "INT64", (-1, -1)), TensorSpec(LEFT_CONTEXT, "INT32"),
                                    TensorSpec(DUE_MS, "FP32", optional=True)),
                                   (TensorSpec(AUDIO, "FP32", (-1,)),), batched=True)

#: every Qwen3-TTS model (client-facing and stage-internal) -> contract.
CONTRACTS = {**CLIENT_CONTRACTS, "qwen3_tts_talker": QWEN3_TTS_TALKER, "qwen3_tts_code2wav": QWEN3_TTS_CODE2WAV}


def qwen3_tts_inputs(text: str, task: str | None = None, voice: str | None = None, instructions: str | None = None,
                     language: str | None = None, voice_prompt: bytes | None = None, ref_audio: Array | None = None,
                     ref_sample_rate: int | None = None, ref_text: str | None = None, x_vector_only: bool | None = None,
                     max_frames: int | None = None, paced: bool = False) -> list[tuple[str, Array]]:
    """The inputs of one ``qwen3_tts`` request as ``(name, array)`` pairs (absent ones left out).
    ``paced``: the client plays the stream in real time (``PACED`` true: low-water chunks,
    docs/scheduling.md); sent only when true."""
    import numpy as np

    from omni_triton.contracts.tensors import scalar_array, utf8_array

    pairs = [(TEXT, utf8_array(text))]
    for name, value in ((TASK, task), (VOICE, voice), (INSTRUCTIONS, instructions), (LANGUAGE, language),
                        (REF_TEXT, ref_text)):
        if value is not None:
            pairs.append((name, utf8_array(value)))
    if voice_prompt is not None:
        pairs.append((VOICE_PROMPT, np.array([voice_prompt], dtype=np.object_)))
    if ref_audio is not None:
        pairs.append((REF_AUDIO, np.asarray(ref_audio, np.float32).reshape(-1)))
    if ref_sample_rate is not None:
        pairs.append((REF_SAMPLE_RATE, scalar_array(int(ref_sample_rate), "INT32")))
    if x_vector_only is not None:
        pairs.append((X_VECTOR_ONLY, np.array([bool(x_vector_only)], np.bool_)))
    if max_frames is not None:
        pairs.append((MAX_FRAMES, scalar_array(int(max_frames), "INT32")))
    if paced:
        pairs.append((PACED, scalar_array(True, "BOOL")))
    return pairs

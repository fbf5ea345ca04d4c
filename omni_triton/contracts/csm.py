"""The CSM pipeline's stage contracts (``docs/speech_contracts.md``): ``csm`` (BLS; the speech
contract of ``omni_triton.contracts.speech``, API name ``tts``) -> ``csm_talker`` (codec frames) ->
``csm_code2wav`` (PCM).

``csm_talker`` takes ``TEXT``, ``SPEAKER`` (INT32 [1], CSM speaker id), ``MAX_FRAMES`` /
``MIN_FRAMES``, ``REQUEST_ID``, ``PACED`` and streams ``CODES`` (``contracts/codec.py``);
``csm_code2wav`` is the chunked codec decoder of ``contracts/codec.py``. Input problems are
:class:`~omni_triton.contracts.speech.SpeechInputError`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from omni_triton.contracts.codec import CODE2WAV, CODES, FIRST_CHUNK_FRAMES, MIN_FRAMES
from omni_triton.contracts.speech import AUDIO_OUT, MAX_FRAMES, PIPER_TTS, TEXT, SpeechInputError
from omni_triton.contracts.tensors import (
    PACED,
    REQUEST_ID,
    Array,
    StageContract,
    TensorSpec,
    first_int,
    first_str,
    scalar_array,
    utf8_array,
)

SPEAKER = "SPEAKER"  #: INT32 [1]: CSM speaker id


@dataclass(frozen=True)
class FrameBudget:
    """How many codec frames a ``csm`` request may generate when the client sets no MAX_FRAMES.

    A fixed cap cut every long input at the same length (100 frames = 8 s, whatever the text);
    the budget follows the input instead: ``max(floor, ceil(len(text) * frames_per_char))``.
    At 12.5 frames/s, 2.5 frames per character is 5 characters per second, slower than slow
    speech (~12-15 characters per second), so a real talker ends on its own end-of-audio first.

    Raises:
        ValueError: non-positive parameters.
    """

    frames_per_char: float = 2.5
    floor: int = 100

    def __post_init__(self) -> None:
        if self.frames_per_char <= 0 or self.floor < 1:
            raise ValueError(f"frame budget needs frames_per_char > 0 and floor >= 1, got {self}")

    def for_text(self, text: str) -> int:
        """The cap on codec frames for ``text``."""
        return max(self.floor, math.ceil(len(text) * self.frames_per_char))


@dataclass(frozen=True)
class CsmToTalker:
    """The ``csm`` BLS -> ``csm_talker`` hand-off: the validated request the talker turns into
    codec frames.

    Attributes:
        text: ``TEXT``, the text to speak (non-empty).
        speaker: ``SPEAKER`` (INT32 [1]), the CSM speaker id (absent: 0).
        max_frames: ``MAX_FRAMES`` (INT32 [1]), the cap on codec frames (None: the talker's default).
        min_frames: ``MIN_FRAMES`` (INT32 [1]), the floor (None: the talker's default).
        paced: ``PACED`` (BOOL [1]) sent, true: the stream is played as it arrives.
        first_chunk_frames: ``FIRST_CHUNK_FRAMES`` (INT32 [1]), the BLS's first chunk for this
            request (None: the talker's config ``first_chunk_frames``).
    """

    text: str
    speaker: int = 0
    max_frames: int | None = None
    min_frames: int | None = None
    paced: bool = False
    first_chunk_frames: int | None = None

    def to_tensors(self) -> list[tuple[str, Array]]:
        """The talker's inputs as ``(name, array)`` pairs: TEXT, SPEAKER, then MAX_FRAMES,
        MIN_FRAMES and PACED where given/true."""
        pairs = [(TEXT, utf8_array(self.text)), (SPEAKER, scalar_array(int(self.speaker), "INT32"))]
        if self.max_frames is not None:
            pairs.append((MAX_FRAMES, scalar_array(int(self.max_frames), "INT32")))
        if self.min_frames is not None:
            pairs.append((MIN_FRAMES, scalar_array(int(self.min_frames), "INT32")))
        if self.paced:
            pairs.append((PACED, scalar_array(True, "BOOL")))
        if self.first_chunk_frames is not None:
            pairs.append((FIRST_CHUNK_FRAMES, scalar_array(int(self.first_chunk_frames), "INT32")))
        return pairs

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Array]) -> CsmToTalker:
        """The hand-off from the talker's inputs (``tensors``: the present ones, name -> array).

        Raises:
            SpeechInputError: TEXT missing or empty, FIRST_CHUNK_FRAMES < 1.
            UnicodeDecodeError: TEXT is not UTF-8.
        """
        text = first_str(tensors.get(TEXT))
        if not text:
            raise SpeechInputError("csm_talker: TEXT is required")
        speaker = first_int(tensors.get(SPEAKER))
        first = first_int(tensors.get(FIRST_CHUNK_FRAMES))
        if first is not None and first < 1:
            raise SpeechInputError(f"csm_talker: FIRST_CHUNK_FRAMES must be >= 1, got {first}")
        return cls(text, 0 if speaker is None else speaker, first_int(tensors.get(MAX_FRAMES)),
                   first_int(tensors.get(MIN_FRAMES)), bool(first_int(tensors.get(PACED)) or False), first)


#: csm_talker's inputs that :meth:`CsmToTalker.from_tensors` reads
TALKER_INPUT_NAMES = (TEXT, SPEAKER, MAX_FRAMES, MIN_FRAMES, PACED, FIRST_CHUNK_FRAMES)

CSM = StageContract(PIPER_TTS.inputs + (TensorSpec(MAX_FRAMES, "INT32", optional=True),), AUDIO_OUT, decoupled=True)
CSM_TALKER = StageContract(
    (TensorSpec(TEXT, "BYTES"), TensorSpec(SPEAKER, "INT32", optional=True),
     TensorSpec(MAX_FRAMES, "INT32", optional=True), TensorSpec(MIN_FRAMES, "INT32", optional=True),
     TensorSpec(REQUEST_ID, "BYTES", optional=True), TensorSpec(PACED, "BOOL", optional=True),
     TensorSpec(FIRST_CHUNK_FRAMES, "INT32", optional=True)),
    (TensorSpec(CODES, "INT64", (-1, -1)),), decoupled=True)
CSM_CODE2WAV = CODE2WAV

#: model name -> contract, for the models of this pipeline in ``model_repository/``.
CONTRACTS = {"csm": CSM, "csm_talker": CSM_TALKER, "csm_code2wav": CSM_CODE2WAV}

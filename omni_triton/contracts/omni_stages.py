"""The thinker -> talker stage tensors shared by both omni families (``qwen3_omni``,
``qwen2_5_omni``; by role, like ``adapters/omni_stages.py``). ``docs/omni_pipeline.md``.

A thinker asked for them (``TALKER_INPUTS``) ends its stream with the talker's inputs, under the
same names: ``SEQUENCE`` (INT64 [L]: prompt + generated ids), ``PROMPT_LEN`` (INT32 [1]),
``THINKER_EMBEDS`` / ``THINKER_HIDDEN`` (FP32 [L-1, H]: input embedding, and hidden state at the
talker's accept layer, of every token fed to the thinker) and ``TTS_EMBEDS`` (FP32 [3, H]:
embeddings of tts_bos, tts_eos, tts_pad).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from omni_triton.contracts.chat import ChatInputError
from omni_triton.contracts.speech import MAX_FRAMES
from omni_triton.contracts.tensors import (
    VOICE,
    Array,
    TensorSpec,
    first_int,
    first_str,
    scalar_array,
    scalar_int,
    utf8_array,
)

TALKER_INPUTS = "TALKER_INPUTS"  #: BOOL [1]: ask the thinker for the talker's inputs
SEQUENCE = "SEQUENCE"  #: INT64 [L]: prompt + generated ids
PROMPT_LEN = "PROMPT_LEN"  #: INT32 [1]
THINKER_EMBEDS = "THINKER_EMBEDS"  #: FP32 [L-1, H]: input embedding of every token fed to the thinker
THINKER_HIDDEN = "THINKER_HIDDEN"  #: FP32 [L-1, H]: hidden state at the talker's accept layer
TTS_EMBEDS = "TTS_EMBEDS"  #: FP32 [3, H]: embeddings of tts_bos, tts_eos, tts_pad

TALKER_TENSORS = (SEQUENCE, PROMPT_LEN, THINKER_EMBEDS, THINKER_HIDDEN, TTS_EMBEDS)
#: the thinker's outputs that are the talker's inputs
TALKER_IN = (TensorSpec(SEQUENCE, "INT64", (-1,)), TensorSpec(PROMPT_LEN, "INT32"),
             TensorSpec(THINKER_EMBEDS, "FP32", (-1, -1)), TensorSpec(THINKER_HIDDEN, "FP32", (-1, -1)),
             TensorSpec(TTS_EMBEDS, "FP32", (3, -1)))


@dataclass(frozen=True)
class ThinkerToTalker:
    """The thinker -> talker hand-off (vLLM-Omni's ``thinker2talker``): what a thinker's last
    response carries for the talker (``TALKER_TENSORS``) and what the BLS adds to it.

    Attributes:
        sequence: INT64 [L], prompt + generated token ids.
        prompt_len: the prompt's length in tokens (``PROMPT_LEN`` INT32 [1]).
        embeds: FP32 [L-1, H], the input embedding of every token fed to the thinker.
        hidden: FP32 [L-1, H], the hidden state at the talker's accept layer.
        tts_embeds: FP32 [3, H], embeddings of tts_bos, tts_eos, tts_pad.
        voice: ``VOICE`` (None: the talker's default).
        max_frames: ``MAX_FRAMES``, the cap on codec frames (None: the talker's default).
        media: ``(tensor name, array)`` inputs of the talker for a multimodal prompt (Qwen3-Omni's
            ``TALKER_MEDIA_TENSORS``: the media positions for the talker's rope).
    """

    sequence: Array
    prompt_len: int
    embeds: Array
    hidden: Array
    tts_embeds: Array
    voice: str | None = None
    max_frames: int | None = None
    media: tuple[tuple[str, Array], ...] = field(default=())

    @property
    def generated_tokens(self) -> int:
        """Tokens the thinker generated (``len(sequence) - prompt_len``). The talker needs at
        least two: the reference conditions on the first generated token's states."""
        return int(len(self.sequence)) - int(self.prompt_len)

    def to_tensors(self) -> list[tuple[str, Array]]:
        """The talker's inputs as ``(name, array)`` pairs: the five ``TALKER_TENSORS`` (dtypes as
        the contract says; no copy when they already have them), then VOICE, the media inputs and
        MAX_FRAMES where given."""
        pairs = [(SEQUENCE, np.asarray(self.sequence, np.int64)),
                 (PROMPT_LEN, scalar_array(int(self.prompt_len), "INT32")),
                 (THINKER_EMBEDS, np.asarray(self.embeds, np.float32)),
                 (THINKER_HIDDEN, np.asarray(self.hidden, np.float32)),
                 (TTS_EMBEDS, np.asarray(self.tts_embeds, np.float32))]
        if self.voice is not None:
            pairs.append((VOICE, utf8_array(self.voice)))
        pairs += list(self.media)
        if self.max_frames is not None:
            pairs.append((MAX_FRAMES, scalar_array(int(self.max_frames), "INT32")))
        return pairs

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Array], media_names: Iterable[str] = ()) -> ThinkerToTalker:
        """Read the hand-off from a thinker's response or a talker's inputs (``tensors``: name ->
        array); VOICE, MAX_FRAMES and the tensors of ``media_names`` are taken when present. The
        arrays are copies (writable, whatever buffer Triton handed over), in the contract's dtypes.

        Raises:
            KeyError: one of the five ``TALKER_TENSORS`` is missing.
            ChatInputError: ``PROMPT_LEN`` is empty.
        """
        return cls(sequence=np.array(tensors[SEQUENCE], np.int64).reshape(-1),
                   prompt_len=scalar_int(tensors[PROMPT_LEN], PROMPT_LEN, ChatInputError),
                   embeds=np.array(tensors[THINKER_EMBEDS], np.float32),
                   hidden=np.array(tensors[THINKER_HIDDEN], np.float32),
                   tts_embeds=np.array(tensors[TTS_EMBEDS], np.float32),
                   voice=first_str(tensors.get(VOICE)), max_frames=first_int(tensors.get(MAX_FRAMES)),
                   media=tuple((n, tensors[n]) for n in media_names if n in tensors))

    def thinker_outputs(self) -> dict[str, Array]:
        """The five ``TALKER_TENSORS`` as a thinker's response carries them."""
        return dict(self.to_tensors()[:len(TALKER_TENSORS)])


def thinker_to_talker(thinker_outputs: Mapping[str, Array], voice: str | None = None,
                      media: Iterable[tuple[str, Array]] = (), max_frames: int | None = None) -> ThinkerToTalker:
    """The talker's hand-off from a thinker's final response: its ``TALKER_TENSORS`` plus the
    request's ``voice``, talker ``media`` inputs and ``max_frames``.

    Raises:
        KeyError: the response lacks a talker tensor (the thinker was not asked for them).
        ChatInputError: ``PROMPT_LEN`` is empty.
    """
    handoff = ThinkerToTalker.from_tensors({n: thinker_outputs[n] for n in TALKER_TENSORS})
    return ThinkerToTalker(handoff.sequence, handoff.prompt_len, handoff.embeds, handoff.hidden, handoff.tts_embeds,
                           voice, max_frames, tuple(media))

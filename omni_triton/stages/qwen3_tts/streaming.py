"""Torch-free streaming helpers of the ``qwen3_tts`` BLS: the chunk schedule after a clone
prompt's reference codes, and the codec chunk check of ``qwen3_tts_code2wav``."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omni_triton.contracts.qwen3_tts import Qwen3TtsInputError
from omni_triton.stages.chunking import ChunkSchedule


@dataclass
class ContextSchedule(ChunkSchedule):
    """A :class:`ChunkSchedule` whose first ``context`` frames are context only (a base-form clone
    prompt's ``ref_code``: the package decodes ``ref_code + generated`` and cuts the reference's
    samples; streaming decodes the generated frames with reference frames as left context). The
    first chunk after them is still the small one (time to first packet)."""

    context: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.context < 0:
            raise ValueError("context must be >= 0")
        self.emitted = self.context

    def _next_size(self) -> int:
        return self.first_chunk_frames if self.emitted == self.context else self.chunk_frames


def validate_chunk(codes: np.ndarray, left, num_groups: int, codebook_size: int) -> tuple[np.ndarray, int]:
    """One ``qwen3_tts_code2wav`` request: CODES [1, T, G] (or [T, G]) int64 + LEFT_CONTEXT ->
    ``(codes [T, G], left)``.

    Raises:
        Qwen3TtsInputError: wrong shape, codes outside [0, codebook_size), left context not in [0, T).
    """
    codes = np.asarray(codes)
    if codes.ndim == 3 and codes.shape[0] == 1:
        codes = codes[0]
    if codes.ndim != 2 or codes.shape[1] != num_groups or codes.shape[0] == 0:
        raise Qwen3TtsInputError(f"CODES must be [T >= 1, {num_groups}], got {list(codes.shape)}")
    if codes.min() < 0 or codes.max() >= codebook_size:
        raise Qwen3TtsInputError(f"CODES must lie in [0, {codebook_size})")
    left = int(np.asarray(left).reshape(-1)[0])
    if not 0 <= left < len(codes):
        raise Qwen3TtsInputError(f"LEFT_CONTEXT must be in [0, {len(codes)}), got {left}")
    return codes.astype(np.int64), left

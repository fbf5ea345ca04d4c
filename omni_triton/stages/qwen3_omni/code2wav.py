"""Qwen3-Omni code2wav stage: codec frames with left context -> 24 kHz float32 PCM.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from omni_triton.checkpoints.common import read_manifest
from omni_triton.stages.csm.code2wav import decode_ragged

# ---------------------------------------------------------------------------------- code2wav


class OmniCode2Wav:
    """Qwen3-Omni code2wav: int64 [T, G] codec frames -> float32 24 kHz PCM, chunk by chunk.

    ``samples_per_frame`` = ``total_upsample`` (1920). A decode of n frames gives
    ``n * spf - trailing_loss`` samples (the causal transposed convs of the decoder blocks trim
    the samples that need the next frame; 555 for upsample_rates 8,5,4,3), measured at load time.
    Chunks with left context keep :func:`keep_new_samples`, so the concatenated chunks tile the
    one-shot decode. Batched decode right-pads to the longest item: every layer is causal up to
    that trimmed tail, so padding does not reach the kept samples (see the unit tests).
    """

    def __init__(self, code2wav, sampling_rate: int = 24000):
        self.code2wav = code2wav.eval()
        cfg = code2wav.config
        self.sampling_rate = int(sampling_rate)
        self.samples_per_frame = int(code2wav.total_upsample)
        self.num_code_groups = int(cfg.num_quantizers)
        self.codebook_size = int(cfg.codebook_size)
        with torch.inference_mode():
            n = self.code2wav(torch.zeros((1, self.num_code_groups, 2), dtype=torch.long)).shape[-1]
        self.trailing_loss = 2 * self.samples_per_frame - int(n)

    @classmethod
    def from_pretrained(cls, model_dir, device: str = "cpu") -> OmniCode2Wav:
        from transformers import Qwen3OmniMoeForConditionalGeneration

        model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir).to(device).eval()
        sr = read_manifest(model_dir).get("sampling_rate", 24000)
        return cls(model.code2wav, sr)

    def output_samples(self, n_frames: int, left_context: int) -> int:
        """Samples :meth:`decode` returns for a chunk."""
        lo = left_context * self.samples_per_frame - (self.trailing_loss if left_context > 0 else 0)
        return max(n_frames * self.samples_per_frame - self.trailing_loss - max(lo, 0), 0)

    def decode(self, codes_list: Sequence[np.ndarray],
               left_context_list: Sequence[int] | None = None) -> list[np.ndarray]:
        """Decode a batch in one forward pass: ``[T_i, G]`` int arrays (0 allowed) -> float32 PCM of
        each item's new frames (:func:`keep_new_samples`). Codes outside [0, codebook_size) raise."""
        return decode_ragged(codes_list, left_context_list, self.num_code_groups, self.codebook_size,
                             self.samples_per_frame, lambda codes: self.code2wav(codes)[:, 0],
                             trailing_loss=self.trailing_loss)

    def decode_reference(self, codes: np.ndarray) -> np.ndarray:
        """The reference's own decode: ``code2wav.chunked_decode(codes, chunk_size=300,
        left_context_size=25)`` as ``Qwen3OmniMoeForConditionalGeneration.generate`` calls it."""
        with torch.inference_mode():
            t = torch.from_numpy(np.asarray(codes, np.int64)).T[None]
            return self.code2wav.chunked_decode(t, chunk_size=300, left_context_size=25)[0, 0].float().numpy()

"""Mimi code2wav: ragged batches of codec frames ``np.int64 [T_i, K]`` with left context ->
``np.float32`` mono PCM, only the new samples of each chunk.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from omni_triton.checkpoints.csm import CODEC_SUBDIR
from omni_triton.stages.chunking import validate_chunk  # noqa: F401 (re-exported: shared by the codec families)

# ------------------------------------------------------------------------------------- code2wav


class CodecDecoder:
    """Mimi decoder (``MimiModel.decode``): codec frames -> 24 kHz float32 PCM.

    Batched decode right-pads to the longest request. Mimi's decoder is causal (causal convs and
    transposed convs trimmed on the right, causal sliding-window attention), so right padding leaves
    the earlier samples unchanged mathematically. Measured in float32 on CPU: batched vs one-by-one
    differ by <= 3e-7 (peak ~0.45); padding one item alone changes it by 7e-8 and batching
    equal-length items without padding by 1.6e-7, i.e. shape-dependent kernel rounding, so grouping
    by length would not be bit-exact either and padding is kept
    (``tests/unit/test_codec_tts.py::test_batched_padded_decode_equals_one_by_one``).
    """

    def __init__(self, codec):
        self.codec = codec.eval()
        cfg = codec.config
        self.sampling_rate = int(cfg.sampling_rate)
        self.frame_rate = float(cfg.frame_rate)
        self.samples_per_frame = int(round(self.sampling_rate / self.frame_rate))
        self.num_codebooks = int(cfg.num_quantizers)
        self.codebook_size = int(cfg.codebook_size)

    @classmethod
    def from_pretrained(cls, model_dir, device: str = "cpu") -> CodecDecoder:
        """``model_dir`` is a Mimi checkpoint, or a CSM checkpoint (its ``codec/`` subfolder, else
        the ``codec_model`` inside the CSM weights)."""
        from transformers import AutoConfig, CsmForConditionalGeneration, MimiModel

        model_dir = Path(model_dir)
        if (model_dir / CODEC_SUBDIR / "config.json").is_file():
            model_dir = model_dir / CODEC_SUBDIR
        if AutoConfig.from_pretrained(model_dir).model_type == "mimi":
            codec = MimiModel.from_pretrained(model_dir)
        else:
            codec = CsmForConditionalGeneration.from_pretrained(model_dir).codec_model
        return cls(codec.to(device))

    def decode(self, codes_list: Sequence[np.ndarray],
               left_context_list: Sequence[int] | None = None) -> list[np.ndarray]:
        """Decode a batch in ONE Mimi forward pass.

        codes_list: ``[T_i, num_codebooks]`` int arrays (T_i may differ; 0 allowed).
        left_context_list: frames at the start of each item that are context only.
        Returns ``np.float32 [(T_i - left_i) * samples_per_frame]`` per item.
        """
        return decode_ragged(codes_list, left_context_list, self.num_codebooks, self.codebook_size,
                             self.samples_per_frame,
                             lambda codes: self.codec.decode(codes).audio_values[:, 0])


def decode_ragged(codes_list: Sequence[np.ndarray], left_context_list: Sequence[int] | None,
                  num_codebooks: int, codebook_size: int, samples_per_frame: int,
                  forward: Callable[[torch.Tensor], torch.Tensor], trailing_loss: int = 0) -> list[np.ndarray]:
    """Decode chunks of different lengths in ONE forward pass of a causal codec decoder.

    The items (``[T_i, num_codebooks]`` int arrays, T_i may be 0) are right-padded to the longest
    and stacked as int64 ``[n, num_codebooks, T_max]`` for ``forward``, which returns PCM
    ``[n, S]``; each item keeps the samples of its new frames (:func:`keep_new_samples`). Right
    padding cannot reach earlier samples of a causal decoder (the kept tail trimmed by
    ``trailing_loss`` samples included). Shared by Mimi (``CodecDecoder``) and Qwen3-Omni's
    code2wav (``qwen3_omni.OmniCode2Wav``).

    Returns: ``np.float32 [(T_i - left_i) * samples_per_frame]`` per item (empty for T_i = 0).
    Raises: ``ValueError`` for codes outside [0, codebook_size).
    """
    n = len(codes_list)
    left = [0] * n if left_context_list is None else [int(x) for x in left_context_list]
    lens = [int(np.asarray(c).shape[0]) for c in codes_list]
    out: list[np.ndarray] = [np.zeros(0, np.float32) for _ in range(n)]
    tmax = max(lens, default=0)
    if tmax == 0:
        return out
    batch = np.zeros((n, tmax, num_codebooks), np.int64)
    for i, c in enumerate(codes_list):
        c = np.asarray(c, dtype=np.int64).reshape(-1, num_codebooks)
        if c.size and (c.min() < 0 or c.max() >= codebook_size):
            raise ValueError(f"codes must lie in [0, {codebook_size}), got [{c.min()}, {c.max()}]")
        batch[i, : c.shape[0]] = c
    with torch.inference_mode():
        audio = forward(torch.from_numpy(batch).transpose(1, 2)).float().numpy()  # [n, S]
    for i in range(n):
        if lens[i]:
            out[i] = keep_new_samples(audio[i], lens[i], left[i], samples_per_frame, trailing_loss)
    return out


def keep_new_samples(audio: np.ndarray, n_frames: int, left_context: int, samples_per_frame: int,
                     trailing_loss: int = 0) -> np.ndarray:
    """The PCM of the new frames of one chunk decoded with left context.

    ``audio`` is the decoder output for ``n_frames`` frames (possibly longer: right padding of a
    batch), whose first ``left_context`` frames were context only. A causal decoder emits
    ``n_frames * samples_per_frame - trailing_loss`` valid samples: ``trailing_loss`` > 0 for
    decoders whose causal transposed convs trim the samples that still need the next frame
    (Qwen3-Omni code2wav); those samples come from the next chunk, whose left context covers them,
    so a chunk with context keeps ``[left*spf - trailing_loss, n*spf - trailing_loss)``: the
    concatenated chunks then tile exactly the samples one decode of all frames gives.
    Returns ``np.float32 [(n_frames - left_context) * spf]`` (minus ``trailing_loss`` for a chunk
    without context). Mimi (``trailing_loss=0``) keeps ``[left*spf, n*spf)``.
    """
    lo = left_context * samples_per_frame - (trailing_loss if left_context > 0 else 0)
    hi = n_frames * samples_per_frame - trailing_loss
    return np.ascontiguousarray(audio[max(lo, 0):max(hi, 0)], dtype=np.float32)

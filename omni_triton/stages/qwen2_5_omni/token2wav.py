"""Qwen2.5-Omni token2wav stage: codec ids int64 [T] -> 24 kHz float32 PCM, whole utterance.

Whole-utterance, not chunked: the DiT is not causal. Each of its layers attends within block
distance [-look_backward, +look_ahead] (blocks of ``block_size`` 24 mel frames; real model: 2 blocks
back, 1 ahead) and the mel comes out of an RK4 ODE solve of ``num_steps`` 10 (4 DiT evaluations per
step, each with CFG), every evaluation feeding the next: a mel frame depends on codes ~40 blocks
(~9.6 s) ahead, so a chunk decoded without its right context is a different solve, and the noise
of a chunked solve would be drawn per chunk. Qwen's own streaming (and vLLM-Omni's) accept that
difference; this pipeline keeps equality with ``generate`` and decodes once the talker is done.
"""
from __future__ import annotations

import threading

import numpy as np
import torch

from omni_triton.checkpoints.common import read_manifest
from omni_triton.contracts.chat import ChatInputError


class Qwen25Token2Wav:
    """``model.token2wav`` (DiT + BigVGAN) and the voices of ``spk_dict.pt``.

    ``samples_per_code`` = DiT ``repeats`` (2) x BigVGAN upsampling (240) = 480 at 24 kHz.
    ``max_codes`` = DiT ``max_position_embeddings`` / ``repeats``. The DiT draws its initial noise
    with ``torch.randn`` from the global generator; :meth:`synthesize` seeds it with
    ``torch.manual_seed(seed)`` inside ``torch.random.fork_rng`` (the process's own stream is left
    as it was), one call at a time per object.
    """

    def __init__(self, token2wav, speaker_map: dict, sampling_rate: int = 24000, num_steps: int = 10,
                 guidance_scale: float = 0.5, sway_coefficient: float = -1.0):
        self.token2wav = token2wav.float().eval()
        self.speakers = speaker_map
        self.sampling_rate = int(sampling_rate)
        dit = token2wav.config.dit_config
        self.repeats = int(dit.repeats)
        self.num_embeds = int(dit.num_embeds)
        self.max_codes = int(dit.max_position_embeddings) // self.repeats
        bigvgan = token2wav.config.bigvgan_config
        self.samples_per_code = self.repeats * int(np.prod(bigvgan.upsample_rates))
        self.kwargs = dict(num_steps=int(num_steps), guidance_scale=float(guidance_scale),
                           sway_coefficient=float(sway_coefficient))
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, model_dir, device: str = "cpu", **kwargs) -> Qwen25Token2Wav:
        from omni_triton.stages.qwen2_5_omni.thinker import load_model

        model = load_model(model_dir, audio=True, device=device)
        sr = read_manifest(model_dir).get("sampling_rate", 24000)
        return cls(model.token2wav, model.speaker_map, sr, **kwargs)

    def voice(self, name: str) -> str:
        """The ``spk_dict`` key for ``name`` (case-insensitive). Raises :class:`ChatInputError`."""
        for key in self.speakers:
            if key.lower() == str(name).lower():
                return key
        raise ChatInputError(f"unknown voice {name!r}; available: {', '.join(self.speakers)}")

    def validate(self, codes: np.ndarray) -> np.ndarray:
        """int64 [T] codes with 1 <= T <= ``max_codes`` and ids in [0, num_embeds]; else ChatInputError."""
        codes = np.asarray(codes).reshape(-1)
        if codes.size < 1 or codes.size > self.max_codes:
            raise ChatInputError(f"token2wav takes 1..{self.max_codes} codes, got {codes.size}")
        if codes.min() < 0 or codes.max() > self.num_embeds:
            raise ChatInputError(f"codec ids must be in [0, {self.num_embeds}]")
        return codes.astype(np.int64)

    def synthesize(self, codes: np.ndarray, voice: str, seed: int) -> np.ndarray:
        """float32 PCM [T * samples_per_code] in [-1, 1] of codec ids int64 [T] in ``voice``, the
        DiT's noise drawn after ``torch.manual_seed(seed)``: equal to what ``generate`` returns when
        the same seed was set just before it (greedy thinker and talker draw no random numbers)."""
        codes = self.validate(codes)
        spk = self.speakers[self.voice(voice)]
        cond = spk["cond"].float().expand(1, -1)
        ref_mel = spk["ref_mel"].float().expand(1, -1, -1)
        with self._lock, torch.inference_mode(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            wav = self.token2wav(torch.from_numpy(codes)[None], conditioning=cond, reference_mel=ref_mel, **self.kwargs)
        return wav.reshape(-1).float().numpy()

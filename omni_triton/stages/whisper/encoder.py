"""Whisper's encoder side: 16 kHz PCM -> log-mel features (``WhisperFeatureExtractor``, padded to
the model's 30 s window) -> the encoder's last hidden state, a batch of requests in one forward pass."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from numpy.typing import NDArray


class WhisperEncoderRunner:
    """The feature extractor and encoder of one Whisper checkpoint.

    Attributes:
        sampling_rate: Hz of the audio it takes (16000).
        max_audio_s: the feature window, seconds (``chunk_length``, 30): longer audio is cut by the
            feature extractor, so the stages refuse it before.
    """

    def __init__(self, model, feature_extractor):
        self.model = model
        self.encoder = model.get_encoder()
        self.fe = feature_extractor
        self.sampling_rate = int(feature_extractor.sampling_rate)
        self.max_audio_s = float(feature_extractor.chunk_length)

    @classmethod
    def from_pretrained(cls, path: Path) -> WhisperEncoderRunner:
        """Load ``WhisperForConditionalGeneration`` and its ``WhisperFeatureExtractor`` from ``path``
        (eval mode, float32)."""
        from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

        model = WhisperForConditionalGeneration.from_pretrained(path).eval()
        return cls(model, WhisperFeatureExtractor.from_pretrained(path))

    def features(self, audio: NDArray[np.float32]) -> NDArray[np.float32]:
        """Log-mel features float32 [num_mel_bins, 3000] of ``audio`` (float32 [T] at 16 kHz, padded
        or cut to the 30 s window), exactly what ``WhisperProcessor(audio).input_features[0]`` is."""
        return self.fe(np.asarray(audio, dtype=np.float32), sampling_rate=self.sampling_rate,
                       return_tensors="np").input_features[0].astype(np.float32)

    @torch.inference_mode()
    def encode(self, audios: list[NDArray[np.float32]]) -> list[NDArray[np.float32]]:
        """The encoder's last hidden state float32 [source_positions (1500), d_model] of each audio
        (float32 [T] at 16 kHz), all in one forward pass."""
        if not audios:
            return []
        feats = torch.from_numpy(np.stack([self.features(a) for a in audios]))
        hidden = self.encoder(input_features=feats).last_hidden_state
        return [h.numpy().astype(np.float32) for h in hidden]

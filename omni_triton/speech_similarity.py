"""Is this audio the speech of a reference rendering of the same text? (tests and benchmarks)

A served voice is checked against the same voice run in-process on the same text. A stochastic
voice (Piper samples phoneme durations and noise) never repeats a waveform, so the comparison
uses three properties that a rendering of the same words keeps and a tone or noise does not:

- **duration**: ``len(audio) / len(reference)``. Piper's sampled durations vary it by about
  +-4% (measured on these voices); MP3 padding adds ~50 ms.
- **spectral envelope**: Pearson correlation of the long-term average spectrum in 40 log-mel
  bands (60 Hz - 8 kHz). Measured: the same text again 0.992-1.0; another text by the same
  voice 0.90-0.96; a 440 Hz tone 0.86-0.91; pink noise 0.86-0.89.
- **dynamics**: standard deviation of the frame energy (dB, 100 ms blocks) relative to the
  reference's. Speech alternates syllables and pauses; a steady tone or noise is flat. Measured:
  the same text 0.85-1.09; tone and pink noise <= 0.02.

The spectrogram comes from ``transformers.audio_utils`` (numpy; no extra dependency).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: defaults of :func:`speech_mismatches` (see the module docstring for the measurements)
DURATION_TOLERANCE = 0.15
MIN_ENVELOPE_CORRELATION = 0.97
DYNAMICS_RANGE = (0.5, 2.0)
N_MELS = 40
MEL_RANGE_HZ = (60.0, 8000.0)
HOP_S = 0.0125
WINDOW_S = 0.046
BLOCK_S = 0.1


def mel_power_spectrogram(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mel power spectrogram of mono PCM.

    Args:
        audio: ``[num_samples]`` float PCM in [-1, 1].
        sample_rate: Hz (>= 16000, so the 8 kHz top band exists).

    Returns:
        ``np.float64 [N_MELS, num_frames]`` power per mel band (Slaney mel scale, Hann window of
        ~46 ms, hop 12.5 ms).

    Raises:
        ValueError: ``audio`` is not 1-D or shorter than one window.
    """
    from transformers.audio_utils import mel_filter_bank, spectrogram, window_function

    audio = np.asarray(audio, dtype=np.float64)
    n_fft = int(2 ** round(np.log2(WINDOW_S * sample_rate)))
    if audio.ndim != 1 or audio.size < n_fft:
        raise ValueError(f"need 1-D audio of at least {n_fft} samples, got shape {audio.shape}")
    filters = mel_filter_bank(num_frequency_bins=n_fft // 2 + 1, num_mel_filters=N_MELS,
                              min_frequency=MEL_RANGE_HZ[0], max_frequency=min(MEL_RANGE_HZ[1], sample_rate / 2),
                              sampling_rate=sample_rate, norm="slaney", mel_scale="slaney")
    return spectrogram(audio, window_function(n_fft, "hann"), frame_length=n_fft,
                       hop_length=int(HOP_S * sample_rate), power=2.0, mel_filters=filters)


@dataclass(frozen=True)
class SpeechSimilarity:
    """How closely audio follows a reference rendering of the same text.

    Attributes:
        duration_ratio: ``len(audio) / len(reference)``.
        envelope_correlation: Pearson correlation of the long-term log-mel spectra, in [-1, 1].
        dynamics_ratio: std of the audio's block energies (dB) / the reference's.
    """

    duration_ratio: float
    envelope_correlation: float
    dynamics_ratio: float


def _long_term_log_spectrum(mel: np.ndarray) -> np.ndarray:
    return 10 * np.log10(mel.mean(axis=1) + 1e-12)


def _block_energy_std_db(mel: np.ndarray) -> float:
    energy = mel.sum(axis=0)
    per_block = max(1, int(round(BLOCK_S / HOP_S)))
    blocks = energy[: energy.size // per_block * per_block].reshape(-1, per_block).mean(axis=1)
    if blocks.size < 2:
        blocks = energy
    return float(np.std(10 * np.log10(blocks + 1e-12)))


def speech_similarity(audio: np.ndarray, reference: np.ndarray, sample_rate: int) -> SpeechSimilarity:
    """Compare ``audio`` with ``reference`` (both mono float PCM at ``sample_rate`` Hz).

    Raises:
        ValueError: either is not 1-D or shorter than one analysis window.
    """
    mel_a, mel_r = mel_power_spectrogram(audio, sample_rate), mel_power_spectrogram(reference, sample_rate)
    envelope = float(np.corrcoef(_long_term_log_spectrum(mel_a), _long_term_log_spectrum(mel_r))[0, 1])
    ref_dynamics = _block_energy_std_db(mel_r)
    return SpeechSimilarity(
        duration_ratio=float(np.asarray(audio).size / np.asarray(reference).size),
        envelope_correlation=envelope,
        dynamics_ratio=_block_energy_std_db(mel_a) / ref_dynamics if ref_dynamics > 0 else float("inf"),
    )


def speech_mismatches(audio: np.ndarray, reference: np.ndarray, sample_rate: int,
                      duration_tolerance: float = DURATION_TOLERANCE,
                      min_envelope_correlation: float = MIN_ENVELOPE_CORRELATION,
                      dynamics_range: tuple[float, float] = DYNAMICS_RANGE) -> list[str]:
    """Reasons why ``audio`` is not a rendering of the reference's speech; empty when it is.

    Args:
        audio, reference: mono float PCM in [-1, 1] at ``sample_rate`` Hz.
        duration_tolerance: allowed relative difference of the lengths.
        min_envelope_correlation: lowest accepted spectral-envelope correlation.
        dynamics_range: accepted ``dynamics_ratio`` interval.
    """
    s = speech_similarity(audio, reference, sample_rate)
    problems = []
    if abs(s.duration_ratio - 1) > duration_tolerance:
        problems.append(f"duration {s.duration_ratio:.2f}x the reference's (tolerance {duration_tolerance:.0%})")
    if s.envelope_correlation < min_envelope_correlation:
        problems.append(f"spectral envelope correlation {s.envelope_correlation:.3f} < {min_envelope_correlation}")
    if not dynamics_range[0] <= s.dynamics_ratio <= dynamics_range[1]:
        problems.append(f"energy dynamics {s.dynamics_ratio:.2f}x the reference's (accepted {dynamics_range})")
    return problems

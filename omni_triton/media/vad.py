"""Voice activity detection: the Realtime API's ``server_vad`` turn detection and the segmentation
of uploads for transcription, both on Google WebRTC's VAD (the ``webrtcvad-wheels`` package).

Why WebRTC's VAD: a GMM classifier in C, with no weights to load and no torch (the OpenAI
frontend, which runs it, never imports torch), about 10 microseconds per 30 ms frame on one core,
deterministic. silero-vad (a small neural network, more robust to noise) needs torch through its
package, and as a Triton stage it would cost a gRPC round trip per 30 ms frame of every session.

WebRTC's VAD classifies 10, 20 or 30 ms frames of 16-bit mono PCM at 8, 16, 32 or 48 kHz as
speech or not, with an aggressiveness mode 0..3 (3 rejects the most non-speech). On top of it:

* OpenAI's ``threshold`` (0..1, higher needs clearer speech) picks the mode:
  ``min(3, int(threshold * 4))`` (0.5, OpenAI's default, is mode 2).
* Speech *starts* when :data:`START_WINDOW_FRAMES` frames in a row hold at least
  :data:`START_RATIO` of speech frames (the smoothing of py-webrtcvad's own example: a lone
  click is not speech). The event's position is the window's first speech frame minus
  ``prefix_padding_ms``, clipped at 0 (OpenAI: ``audio_start_ms`` "includes the prefix_padding_ms").
* Speech *stops* after ``silence_duration_ms`` of frames without speech; the event's position is
  where that silence ended (OpenAI: ``audio_end_ms`` "includes the min silence duration").

Other sample rates (the Realtime API's 24 kHz pcm16) are resampled to 16 kHz with soxr
(:class:`~omni_triton.media.audio.StreamResampler`); positions are in milliseconds of the input.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from omni_triton.media.audio import StreamResampler, float_to_pcm16

#: Rates WebRTC's VAD takes as they are; other rates go through soxr to :data:`VAD_RATE`.
NATIVE_RATES = (8000, 16000, 32000, 48000)
VAD_RATE = 16000
#: Speech starts when this many consecutive frames (150 ms at 30 ms) ...
START_WINDOW_FRAMES = 5
#: ... hold at least this share of speech frames (4 of 5).
START_RATIO = 0.8


@dataclass(frozen=True)
class VADConfig:
    """OpenAI's ``server_vad`` fields (Realtime API ``turn_detection``) and the frame size.

    Attributes:
        threshold: 0..1; higher needs clearer speech (mapped to WebRTC's mode 0..3, module doc).
        prefix_padding_ms: audio kept before the detected speech start, ms (OpenAI default 300).
        silence_duration_ms: silence that ends speech, ms (OpenAI default 500; it answers sooner
            with less, and cuts pauses inside a sentence with too little).
        frame_ms: WebRTC frame, 10, 20 or 30 ms.

    Raises:
        ValueError: a field out of range (constructing it).
    """

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    frame_ms: int = 30

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be within [0, 1], got {self.threshold}")
        if not 0 <= self.prefix_padding_ms <= 10_000:
            raise ValueError(f"prefix_padding_ms must be within [0, 10000], got {self.prefix_padding_ms}")
        if not 0 <= self.silence_duration_ms <= 10_000:
            raise ValueError(f"silence_duration_ms must be within [0, 10000], got {self.silence_duration_ms}")
        if self.frame_ms not in (10, 20, 30):
            raise ValueError(f"frame_ms must be 10, 20 or 30, got {self.frame_ms}")

    @property
    def mode(self) -> int:
        """WebRTC's aggressiveness for :attr:`threshold`: ``min(3, int(threshold * 4))``."""
        return min(3, int(self.threshold * 4))


@dataclass(frozen=True)
class VADEvent:
    """A change of state.

    Attributes:
        kind: ``speech_started`` or ``speech_stopped``.
        audio_ms: position in the audio fed so far, ms (speech_started: minus the prefix padding).
    """

    kind: Literal["speech_started", "speech_stopped"]
    audio_ms: int


class StreamingVAD:
    """Speech start/stop over a stream of 16-bit PCM chunks of any size (one session's audio).

    ``feed`` costs O(len(chunk)) and keeps O(1) state (at most one frame of leftover samples, the
    start window); it never holds the audio.
    """

    def __init__(self, sample_rate: int, config: VADConfig | None = None) -> None:
        """Args:
            sample_rate: Hz of the PCM that :meth:`feed` gets (any positive rate).
            config: detection settings (OpenAI's defaults when None).

        Raises:
            ValueError: a non-positive rate.
        """
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {sample_rate}")
        self.sample_rate = int(sample_rate)
        self.config = config or VADConfig()
        self._rate = self.sample_rate if self.sample_rate in NATIVE_RATES else VAD_RATE
        self._frame_bytes = self._rate * self.config.frame_ms // 1000 * 2
        self.reset()

    def reset(self) -> None:
        """Forget the state and restart positions at 0 (after ``input_audio_buffer.clear``, or a new turn)."""
        import webrtcvad

        self._vad = webrtcvad.Vad(self.config.mode)  # its noise model adapts: a new one forgets it
        self._resampler = None if self._rate == self.sample_rate else StreamResampler(self.sample_rate, self._rate)
        self._odd = b""  # an odd trailing byte of the input (half a sample), resampled path only
        self._pending = b""
        self._frames = 0  # frames classified so far
        self._window: deque[tuple[int, bool]] = deque(maxlen=START_WINDOW_FRAMES)
        self._speaking = False
        self._silent_frames = 0

    @property
    def speaking(self) -> bool:
        """True between a ``speech_started`` and its ``speech_stopped``."""
        return self._speaking

    def _ms(self, frames: int) -> int:
        return frames * self.config.frame_ms

    def feed(self, pcm16: bytes) -> list[VADEvent]:
        """Classify the complete frames in ``pcm16`` (int16 little-endian mono at ``sample_rate``).

        Returns the events those frames caused, in order (usually none). A trailing partial
        frame waits for the next chunk.
        """
        if self._resampler is not None:
            data = self._odd + pcm16
            cut = len(data) // 2 * 2
            self._odd = data[cut:]
            samples = np.frombuffer(data[:cut], dtype="<i2").astype(np.float32) / 32768.0
            pcm16 = float_to_pcm16(self._resampler.process(samples))
        data = self._pending + pcm16
        events: list[VADEvent] = []
        whole = len(data) // self._frame_bytes * self._frame_bytes
        for offset in range(0, whole, self._frame_bytes):
            speech = self._vad.is_speech(data[offset:offset + self._frame_bytes], self._rate)
            event = self._step(speech)
            if event is not None:
                events.append(event)
        self._pending = data[whole:]
        return events

    def _step(self, speech: bool) -> VADEvent | None:
        index = self._frames
        self._frames += 1
        cfg = self.config
        if not self._speaking:
            self._window.append((index, speech))
            voiced = [i for i, s in self._window if s]
            if len(self._window) == START_WINDOW_FRAMES and len(voiced) >= START_RATIO * START_WINDOW_FRAMES:
                self._speaking, self._silent_frames = True, 0
                self._window.clear()
                return VADEvent("speech_started", max(0, self._ms(voiced[0]) - cfg.prefix_padding_ms))
            return None
        self._silent_frames = 0 if speech else self._silent_frames + 1
        if self._ms(self._silent_frames) >= max(cfg.silence_duration_ms, cfg.frame_ms):
            self._speaking, self._silent_frames = False, 0
            return VADEvent("speech_stopped", self._ms(self._frames))
        return None


def speech_segments(audio: NDArray[np.float32], sample_rate: int, *, max_segment_s: float,
                    config: VADConfig | None = None) -> list[tuple[int, int]]:
    """Where ``audio`` holds speech, as segments short enough for one ASR request.

    Args:
        audio: float32 [T] mono in [-1, 1] at ``sample_rate`` Hz.
        sample_rate: Hz.
        max_segment_s: the longest segment, seconds (the model's ``max_audio_s``; Whisper 30).
        config: detection settings; ``prefix_padding_ms`` pads each side of a segment (OpenAI's
            defaults when None).

    Returns:
        ``[(start, end), ...]`` sample offsets into ``audio``, in order, not overlapping, each at
        most ``max_segment_s`` long (a longer stretch of speech is cut at its quietest
        ``frame_ms`` frame past the segment's middle), empty when nothing is speech.

    Raises:
        ValueError: ``max_segment_s`` under one second, a bad rate.
    """
    cfg = config or VADConfig()
    if max_segment_s < 1.0:
        raise ValueError(f"max_segment_s must be at least 1 s, got {max_segment_s}")
    samples = np.asarray(audio, dtype=np.float32).reshape(-1)
    vad = StreamingVAD(sample_rate, cfg)
    spans: list[tuple[int, int]] = []
    start_ms: int | None = None
    for event in vad.feed(float_to_pcm16(samples)):
        if event.kind == "speech_started":
            start_ms = event.audio_ms
        elif start_ms is not None:
            spans.append((start_ms, event.audio_ms))
            start_ms = None
    # a stop position already holds silence_duration_ms of silence: keep prefix_padding_ms of it
    total_ms = samples.size * 1000 // sample_rate
    closed = [(s, min(total_ms, max(s, e - cfg.silence_duration_ms) + cfg.prefix_padding_ms)) for s, e in spans]
    if start_ms is not None:  # speech runs to the end of the audio: no silence was counted, keep it all
        closed.append((start_ms, total_ms))
    out: list[tuple[int, int]] = []
    for s_ms, e_ms in closed:
        start, end = s_ms * sample_rate // 1000, e_ms * sample_rate // 1000
        if out and start <= out[-1][1]:  # padding made two spans touch: merge them
            start = out.pop()[0]
        out.append((start, samples.size if e_ms == total_ms else end))
    return [piece for s, e in out for piece in _cut(samples, s, e, sample_rate, max_segment_s, cfg.frame_ms)]


def _cut(samples: NDArray[np.float32], start: int, end: int, rate: int, max_s: float,
         frame_ms: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut into pieces of at most ``max_s`` seconds, each cut at the lowest-energy
    frame of the second half of the piece (a pause between words rather than inside one)."""
    limit = int(max_s * rate)
    frame = max(1, rate * frame_ms // 1000)
    pieces = []
    while end - start > limit:
        lo, hi = start + limit // 2, start + limit - frame
        n = max(1, (hi - lo) // frame)
        energy = np.square(samples[lo:lo + n * frame].reshape(n, frame)).sum(axis=1)
        cut = lo + int(np.argmin(energy)) * frame + frame // 2
        pieces.append((start, cut))
        start = cut
    pieces.append((start, end))
    return pieces

"""What a client playing a streamed answer in real time would have heard: underruns and continuity.

Pure arithmetic on (arrival time, duration) pairs of the audio chunks of one stream; the stages
feed it as they send (``omni_triton.adapters.telemetry``), and the same model serves clients and
benchmarks. Model (vLLM-Omni's audio metrics; a player with no jitter buffer): playback starts
when the first chunk arrives; chunk ``k`` is due when everything before it has been played; if
it arrives later than that, the player stalls (underrun) for the difference and playback resumes
on arrival.
"""
from __future__ import annotations

from dataclasses import dataclass, field

#: A stall longer than this breaks continuity (seconds; vLLM-Omni's continuity threshold).
CONTINUITY_STALL_S = 0.100


@dataclass
class PlaybackClock:
    """Accumulates one stream's chunks.

    Attributes:
        start: when the request arrived (seconds, any monotonic clock).
        first_audio: arrival of the first non-empty chunk (``None`` before), same clock.
        audio_s: seconds of audio received so far.
        underrun_s: total seconds the player would have stalled after the first chunk.
        longest_stall_s: the longest single stall (seconds).
    """

    start: float
    first_audio: float | None = None
    audio_s: float = 0.0
    underrun_s: float = 0.0
    longest_stall_s: float = 0.0
    _play_end: float = field(default=0.0, repr=False)  # when the audio received so far ends playing

    def add(self, now: float, samples: int, sample_rate: int) -> None:
        """A chunk of ``samples`` samples at ``sample_rate`` Hz arrived at ``now`` (seconds).

        Raises:
            ValueError: ``sample_rate`` <= 0 or ``samples`` < 0.
        """
        if sample_rate <= 0 or samples < 0:
            raise ValueError("sample_rate must be > 0 and samples >= 0")
        if samples == 0:
            return
        duration = samples / sample_rate
        if self.first_audio is None:
            self.first_audio, self._play_end = now, now
        stall = max(0.0, now - self._play_end)
        self.underrun_s += stall
        self.longest_stall_s = max(self.longest_stall_s, stall)
        self._play_end = max(self._play_end, now) + duration
        self.audio_s += duration

    @property
    def play_end(self) -> float | None:
        """When the audio received so far ends playing (same clock), ``None`` before any."""
        return None if self.first_audio is None else self._play_end

    @property
    def ttfp_s(self) -> float | None:
        """Time to first audio packet (seconds from ``start``), ``None`` without audio."""
        return None if self.first_audio is None else self.first_audio - self.start

    def rtf(self, end: float) -> float | None:
        """Real-time factor: processing time (``start`` -> ``end``) / seconds of audio; ``None``
        without audio. Below 1: faster than real time."""
        return None if self.audio_s <= 0 else (end - self.start) / self.audio_s

    @property
    def continuous(self) -> bool:
        """No stall longer than :data:`CONTINUITY_STALL_S`."""
        return self.longest_stall_s <= CONTINUITY_STALL_S

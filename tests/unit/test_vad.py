"""Server VAD and transcription segmentation (omni_triton.media.vad) on the real Piper voice with
silence around it, at 16 and 24 kHz, fed whole and in odd-sized chunks."""
from __future__ import annotations

import numpy as np
import pytest

from omni_triton.media.audio import float_to_pcm16, resample
from omni_triton.media.vad import StreamingVAD, VADConfig, speech_segments


@pytest.fixture(scope="module")
def spoken():
    """(audio float32 [T], rate, speech start s, speech end s): 1 s silence, a sentence, 1.5 s silence."""
    from omni_triton.paths import model_dir
    from omni_triton.stages.piper import PiperSpeaker, discover_voices

    voices = discover_voices(model_dir("piper-voices"))
    if not voices:
        pytest.skip("Piper voice not prepared (omni-triton prepare --models piper_tts)")
    sentences = list(PiperSpeaker(voices).synthesize("The capital of France is Paris."))
    rate = sentences[0].sample_rate
    speech = np.concatenate([s.audio for s in sentences])
    lead, tail = np.zeros(rate, np.float32), np.zeros(int(1.5 * rate), np.float32)
    return np.concatenate([lead, speech, tail]), rate, 1.0, 1.0 + speech.size / rate


@pytest.mark.parametrize("rate", [16000, 24000])
def test_speech_starts_and_stops_around_the_sentence(spoken, rate):
    audio, source_rate, begin_s, end_s = spoken
    pcm = float_to_pcm16(resample(audio, source_rate, rate))
    cfg = VADConfig(prefix_padding_ms=300, silence_duration_ms=500)
    events = StreamingVAD(rate, cfg).feed(pcm)
    assert [e.kind for e in events] == ["speech_started", "speech_stopped"], events
    # start: the first voiced frame minus the prefix padding (Piper's own lead-in is a few tens of ms)
    expected_start = begin_s * 1000 - cfg.prefix_padding_ms
    assert expected_start - 60 <= events[0].audio_ms <= expected_start + 200
    # stop: the sentence's end plus the silence duration
    expected_stop = end_s * 1000 + cfg.silence_duration_ms
    assert expected_stop - 300 <= events[1].audio_ms <= expected_stop + 120


def test_chunk_sizes_do_not_change_the_events(spoken):
    audio, source_rate, _, _ = spoken
    pcm = float_to_pcm16(resample(audio, source_rate, 24000))
    whole = StreamingVAD(24000).feed(pcm)
    vad, pieces, rng, at = StreamingVAD(24000), [], np.random.default_rng(0), 0
    while at < len(pcm):
        step = int(rng.integers(1, 5000))
        pieces += vad.feed(pcm[at:at + step])
        at += step
    assert [(e.kind, e.audio_ms) for e in pieces] == [(e.kind, e.audio_ms) for e in whole]


def test_silence_and_a_click_are_not_speech():
    rate = 16000
    quiet = np.zeros(2 * rate, np.float32)
    quiet[rate:rate + 80] = 0.9  # a 5 ms click
    assert StreamingVAD(rate).feed(float_to_pcm16(quiet)) == []
    assert speech_segments(quiet, rate, max_segment_s=30) == []


def test_reset_restarts_positions(spoken):
    audio, source_rate, _, _ = spoken
    pcm = float_to_pcm16(resample(audio, source_rate, 16000))
    vad = StreamingVAD(16000)
    first = vad.feed(pcm)
    vad.reset()
    assert vad.feed(pcm) == first


def test_segments_cover_the_speech_and_respect_the_longest(spoken):
    audio, rate, begin_s, end_s = spoken
    (start, end), = speech_segments(audio, rate, max_segment_s=30)
    assert start / rate <= begin_s and end / rate >= end_s - 0.05
    assert start / rate >= begin_s - 0.5 and end / rate <= end_s + 0.5
    three = np.concatenate([audio] * 3)
    pieces = speech_segments(three, rate, max_segment_s=30)
    assert len(pieces) == 3 and all(b > a for a, b in pieces)
    short = speech_segments(np.concatenate([audio[int(begin_s * rate):int(end_s * rate)]] * 4), rate, max_segment_s=3)
    assert all((e - s) / rate <= 3 for s, e in short) and short[0][0] == 0
    assert all(short[i][1] == short[i + 1][0] for i in range(len(short) - 1)), "pieces of one stretch touch"


@pytest.mark.parametrize("field, value", [("threshold", 1.5), ("prefix_padding_ms", -1),
                                          ("silence_duration_ms", 20_000), ("frame_ms", 25)])
def test_config_out_of_range_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        VADConfig(**{field: value})


def test_threshold_maps_to_webrtc_modes():
    assert [VADConfig(threshold=t).mode for t in (0.0, 0.3, 0.5, 0.8, 1.0)] == [0, 1, 2, 3, 3]


def test_speech_that_runs_to_the_end_keeps_its_end(spoken):
    audio, rate, begin_s, end_s = spoken
    cut = audio[: int(end_s * rate)]  # no silence after the sentence
    (start, end), = speech_segments(cut, rate, max_segment_s=30)
    assert end == cut.size, "the last word must not be cut off"

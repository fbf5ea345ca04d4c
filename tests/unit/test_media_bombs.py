"""Decompression bombs against the one audio decoder (``omni_triton.media.audio.decode_audio``),
the one image decoder (``omni_triton.media.image.open_image``) and the chat video sampler
(``omni_triton.media.inputs.sample_video_frames``), issue 23 item 2: each bomb is refused and the
decoding process's peak RSS grows by at most 100 MB. The decoders run in one fresh interpreter
per test (``media_bombs.decode_in_subprocess``) so the peak is the decoder's own.

Bombs: ``tests/unit/media_bombs.py`` (FLAC, FLAC without a length, OGG Vorbis, OGG Opus, MP3,
WAV at 1 Hz, PNG, PNG with zTXt, GIF, MP4). On ``main`` before the fix the audio and video calls
grew the RSS by 146 MB to 1.3 GB each (the images were already refused from the header;
docs/voices.md "Decompression-safe decoding").
"""
from __future__ import annotations

import pytest
from media_bombs import AUDIO_BOMBS, IMAGE_BOMBS, MB, bomb, decode_in_subprocess

RSS_BOUND = 100 * MB
#: the voice store's limits (30 s, 24 kHz): the strictest caller; chat audio takes 60 s at 16 kHz
DECODE = "audio.decode_audio(payload, 24000, audio.AudioLimits(max_seconds=30.0))"
#: the same with the header check switched off: only the bounded block decoding stands
DECODE_BLIND = "(setattr(audio, '_check_header', lambda *a: None), " + DECODE + ")"


def _assert_refused(results: dict, expect: str) -> None:
    report = {name: (outcome[:90], round(growth / MB, 1)) for name, (outcome, growth) in results.items()}
    for name, (outcome, growth) in results.items():
        assert outcome.startswith(expect), (name, report)
        assert growth <= RSS_BOUND, (name, report)


def test_audio_bombs_are_refused_by_their_header_with_bounded_memory():
    results = decode_in_subprocess([(n, DECODE, bomb(n)) for n in AUDIO_BOMBS])
    _assert_refused(results, "AudioDecodeError")
    for name, (outcome, _) in results.items():  # refused before decoding (a FLAC without a length: while)
        assert ("its header says" in outcome or "sample rate of 1 Hz" in outcome
                or name == "flac_unknown_length"), (name, outcome)


def test_audio_decoding_stops_at_the_limit_when_the_header_lies():
    """A header saying less than the stream holds (or nothing): the block decoder stops itself."""
    results = decode_in_subprocess([(n, DECODE_BLIND, bomb(n)) for n in AUDIO_BOMBS])
    _assert_refused(results, "AudioDecodeError")
    for name, (outcome, _) in results.items():
        assert "over the limit of 30 s" in outcome, (name, outcome)


def test_image_bombs_are_refused_from_the_header():
    results = decode_in_subprocess([(n, "image.decode_image(payload)", bomb(n)) for n in IMAGE_BOMBS]
                                   + [(f"chat {n}", "inputs.decode_image(payload, 'i', 4096 * 4096)", bomb(n))
                                      for n in IMAGE_BOMBS])
    _assert_refused({n: r for n, r in results.items() if not n.startswith("chat") and n != "png_text"},
                    "ImageTooLargeError")
    _assert_refused({"png_text": results["png_text"]}, "InvalidImageError")  # too much text: not readable
    assert results["png_text"][1] <= 16 * MB, results["png_text"]  # Pillow's own text limit let 66 MB in
    _assert_refused({n: r for n, r in results.items() if n.startswith("chat")}, "MediaInputError")
    assert all("over the limit" in outcome or "too large" in outcome for name, (outcome, _) in results.items()
               if not name.endswith("png_text")), results
    assert "9000x9000 = 81000000 pixels is over the limit" in results["png_81mp"][0]  # our check, not Pillow's


def test_video_bomb_is_refused_from_the_stream_header():
    call = "inputs.sample_video_frames(payload, 'v', inputs.MediaLimits())"
    results = decode_in_subprocess([("mp4", call, bomb("mp4"))])
    _assert_refused(results, "MediaInputError")
    assert "2048x2048 frames are over the limit" in results["mp4"][0]


def test_video_stream_probing_is_bounded_too():
    """``av.open`` probes the stream (FFmpeg decodes a frame to learn its format) before any
    header is readable here: an 8192x8192 H.264 frame is 100 MB of YUV; FFmpeg's ``max_pixels``
    makes that probe refuse it (157 MB of growth without it)."""
    from media_bombs import mp4_bomb

    results = decode_in_subprocess([("mp4 8192", "inputs.sample_video_frames(payload, 'v', inputs.MediaLimits())",
                                     mp4_bomb(8192, 2))])
    _assert_refused(results, "MediaInputError")


def test_video_frames_are_checked_as_decoded():
    """The stream header is not the only guard: a frame bigger than the limit is refused when it
    is decoded (a stream can change size mid-way; here the header check is passed by making the
    header limit (``max_image_pixels``) loose and the frame limit strict)."""
    from media_bombs import mp4_bomb

    from omni_triton.media.inputs import MediaInputError, MediaLimits, sample_video_frames

    data = mp4_bomb(64, 4)
    frames, _ = sample_video_frames(data, "v", MediaLimits(max_video_pixels=64 * 64))
    assert len(frames) == 4 and frames[0].shape == (64, 64, 3)
    with pytest.raises(MediaInputError, match="64x64 frames are over the limit of 4095"):
        sample_video_frames(data, "v", MediaLimits(max_video_pixels=64 * 64 - 1))


@pytest.mark.parametrize("limits, code", [
    (dict(max_channels=1), "invalid_audio"),
    (dict(max_sample_rate=16000), "invalid_audio"),
    (dict(min_sample_rate=48000), "invalid_audio"),
    (dict(min_seconds=3.0), "audio_too_short"),
    (dict(max_seconds=1.5), "audio_too_long"),
])
def test_audio_limits_each_refuse(limits, code):
    import io

    import numpy as np
    import soundfile as sf

    from omni_triton.media.audio import AudioDecodeError, AudioLimits, decode_audio

    buf = io.BytesIO()
    sf.write(buf, np.zeros((44100 * 2, 2), np.float32), 44100, format="FLAC")
    ok = decode_audio(buf.getvalue(), 24000)
    assert ok.channels == 2 and ok.source_rate == 44100 and ok.seconds == 2.0 and ok.samples.shape == (48000,)
    with pytest.raises(AudioDecodeError) as err:
        decode_audio(buf.getvalue(), 24000, AudioLimits(**limits))
    assert err.value.code == code

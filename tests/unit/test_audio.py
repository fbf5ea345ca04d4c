"""omni_triton.audio: PCM conversion, whole-clip encoding, streaming WAV header."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np
import pytest
import soundfile as sf

from omni_triton.media import audio

SR = 22050


def tone(n=SR // 2, sr=SR, amp=0.5):
    t = np.arange(n) / sr
    return (amp * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def test_float_to_pcm16_scale_clip_nan():
    x = np.array([0.0, 1.0, -1.0, 0.5, 2.0, -3.0, np.nan], dtype=np.float32)
    pcm = np.frombuffer(audio.float_to_pcm16(x), dtype="<i2")
    assert pcm.tolist() == [0, 32767, -32767, 16384, 32767, -32767, 0]


def test_float_to_pcm16_length_and_dtype():
    x = tone(1000)
    b = audio.float_to_pcm16(x)
    assert len(b) == 2 * 1000
    assert audio.float_to_pcm16(np.zeros(0, np.float32)) == b""


def test_wav_roundtrip_matches_pcm_bytes():
    x = tone()
    data = audio.encode_audio(x, SR, "wav")
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    y, sr = sf.read(io.BytesIO(data), dtype="int16")
    assert sr == SR
    assert y.tobytes() == audio.float_to_pcm16(x)


def test_flac_lossless_roundtrip():
    x = tone()
    data = audio.encode_audio(x, SR, "flac")
    assert data[:4] == b"fLaC"
    y, sr = sf.read(io.BytesIO(data), dtype="int16")
    assert sr == SR and y.tobytes() == audio.float_to_pcm16(x)


def test_pcm_is_headerless():
    x = tone(100)
    assert audio.encode_audio(x, SR, "pcm") == audio.float_to_pcm16(x)


@pytest.mark.skipif("mp3" not in audio.SUPPORTED_FORMATS, reason="libsndfile without mp3")
def test_mp3_decodes_to_same_length_roughly():
    x = tone(SR)
    data = audio.encode_audio(x, SR, "mp3")
    y, sr = sf.read(io.BytesIO(data))
    assert sr == SR
    assert abs(len(y) - len(x)) < SR // 10  # encoder padding only


@pytest.mark.skipif("opus" not in audio.SUPPORTED_FORMATS, reason="libsndfile without opus")
def test_opus_needs_opus_rate():
    with pytest.raises(audio.UnsupportedFormatError, match="22050"):
        audio.encode_audio(tone(), 22050, "opus")
    data = audio.encode_audio(tone(24000, 24000), 24000, "opus")
    assert data[:4] == b"OggS"
    y, sr = sf.read(io.BytesIO(data))
    assert sr == 24000 and len(y) > 0


def test_aac_unsupported_names_supported_formats():
    assert "aac" not in audio.SUPPORTED_FORMATS
    with pytest.raises(audio.UnsupportedFormatError) as err:
        audio.get_format("aac")
    for name in ("wav", "pcm", "flac"):
        assert name in str(err.value)


def test_streaming_wav_header_fields():
    h = audio.streaming_wav_header(SR)
    assert len(h) == 44
    riff_size, = struct.unpack("<I", h[4:8])
    data_size, = struct.unpack("<I", h[40:44])
    channels, rate, byte_rate, align, bits = struct.unpack("<HIIHH", h[22:36])
    assert (channels, rate, byte_rate, align, bits) == (1, SR, SR * 2, 2, 16)
    assert h[36:40] == b"data"
    assert data_size == 0xFFFFFFDA and riff_size == data_size + 36 == 0xFFFFFFFE


def test_streamed_wav_is_readable_and_equals_whole_clip_payload():
    chunks = [tone(1000), tone(2500), tone(10)]
    stream = audio.streaming_wav_header(SR) + b"".join(audio.float_to_pcm16(c) for c in chunks)
    y, sr = sf.read(io.BytesIO(stream), dtype="int16")
    whole = np.concatenate(chunks)
    assert sr == SR and y.tobytes() == audio.float_to_pcm16(whole)
    # stdlib reader too: reads until the end of the stream
    with wave.open(io.BytesIO(stream)) as w:
        assert w.getframerate() == SR
        assert w.readframes(10**9) == audio.float_to_pcm16(whole)
    # the payload equals the payload of the non-streamed WAV
    assert audio.encode_audio(whole, SR, "wav")[44:] == stream[44:]

"""Decompression bombs for the media decoders' tests (issue 23 item 2), each written by the real
library of its format (soundfile, Pillow, PyAV) and, where a header is made to lie, patched in one
documented field. Sizes are chosen so that main's decoders before the fix grew the decoding
process by 146 MB to 1.3 GB on each audio and video bomb (the tests' bound is 100 MB), while
every builder runs in about a second.

Also :func:`decode_in_subprocess`: decoder calls in a fresh interpreter, each with the peak RSS
growth it caused (Linux ``VmHWM``, reset through ``/proc/self/clear_refs``), which catches a
peak that is freed before the call returns.
"""
from __future__ import annotations

import functools
import io
from fractions import Fraction

import numpy as np

MB = 1 << 20


def _sf_bomb(fmt: str, subtype: str | None, channels: int, rate: int, seconds: int) -> bytes:
    """``seconds`` of silence, ``channels`` channels at ``rate`` Hz, written second by second."""
    import soundfile as sf

    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", rate, channels, format=fmt, subtype=subtype) as f:
        second = np.zeros((rate, channels), np.float32)
        for _ in range(seconds):
            f.write(second)
    return buf.getvalue()


def flac_bomb() -> bytes:
    """FLAC, 8 channels at 48 kHz, 200 s of silence: ~80 KB that decode to 307 MB of float32."""
    return _sf_bomb("FLAC", "PCM_16", 8, 48000, 200)


def flac_unknown_length_bomb() -> bytes:
    """:func:`flac_bomb` whose STREAMINFO says "total samples unknown" (0): a header with no
    length at all, so only a decoder that counts what it decodes can stop it."""
    data = bytearray(flac_bomb())
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # STREAMINFO first; body at byte 8
    data[8 + 13] &= 0xF0  # the 36-bit total: low 4 bits of body byte 13 + bytes 14..17
    data[8 + 14:8 + 18] = b"\0\0\0\0"
    return bytes(data)


def ogg_vorbis_bomb() -> bytes:
    """OGG Vorbis, 8 channels at 48 kHz, 120 s of silence: ~20 KB -> 184 MB of float32."""
    return _sf_bomb("OGG", "VORBIS", 8, 48000, 120)


def ogg_opus_bomb() -> bytes:
    """OGG Opus, 8 channels at 48 kHz, 100 s of silence: ~100 KB -> 154 MB of float32."""
    return _sf_bomb("OGG", "OPUS", 8, 48000, 100)


def mp3_bomb() -> bytes:
    """MP3, stereo at 48 kHz, 600 s of silence (~2.4 MB -> 230 MB of float32): 10 s written by
    libsndfile, its first frame (the Xing/Info header that states the length) dropped, the rest
    repeated 60 times (MP3 frames stand alone: a valid stream whose length only decoding or a
    size/bitrate estimate tells)."""
    ten = _sf_bomb("MP3", "MPEG_LAYER_III", 2, 48000, 10)
    second_frame = ten.index(b"\xff\xfb", 4)
    return ten[second_frame:] * 60


def wav_low_rate_bomb() -> bytes:
    """WAV, mono 16-bit at 1 Hz, 4000 frames (8 KB): 4000 s of "audio" whose resampling to 24
    kHz makes 96 M samples (384 MB); the old consent path, without a length limit, did it."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.zeros(4000, np.int16), 1, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def png_bomb(side: int = 20000) -> bytes:
    """PNG, ``side`` x ``side`` 1-bit zeros: ~50 KB whose pixels are 400 MP (1.2 GB as RGB) at
    the default size (over Pillow's own 179 MP guard too)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (side, side)).save(buf, "PNG")
    return buf.getvalue()


def png_81mp_bomb() -> bytes:
    """PNG, 9000 x 9000 1-bit zeros (~10 KB, 243 MB as RGB): under Pillow's 89 MP warning, so
    only the decoder's own header check refuses it."""
    return png_bomb(9000)


def png_text_bomb() -> bytes:
    """An 8x8 PNG carrying 200 zTXt chunks of 1 MB of zeros each (~210 KB): Pillow decompresses
    text chunks while opening, up to its own 64 MB limit."""
    import struct
    import zlib

    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (8, 8)).save(buf, "PNG")
    png = buf.getvalue()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    text = zlib.compress(b"\0" * ((1 << 20) - 1), 9)
    chunks = b"".join(chunk(b"zTXt", f"k{i}".encode() + b"\0\0" + text) for i in range(200))
    at = png.index(b"IDAT") - 4  # before the first IDAT: read by Image.open
    return png[:at] + chunks + png[at:]


def gif_bomb() -> bytes:
    """GIF whose logical screen says 64 x 64 and whose first frame says 8000 x 8000 (64 MP:
    under Pillow's own 179 MP guard): a header that lies about the size the decode will have."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("P", (64, 64)).save(buf, "GIF")
    data = bytearray(buf.getvalue())
    at = data.index(b"\x2c", 13)  # the image descriptor: ',' x y w h (little-endian uint16)
    data[at + 5:at + 7] = (8000).to_bytes(2, "little")
    data[at + 7:at + 9] = (8000).to_bytes(2, "little")
    return bytes(data)


def mp4_bomb(size: int = 2048, frames: int = 16) -> bytes:
    """MP4 (H.264), ``frames`` black ``size`` x ``size`` frames at 2 fps: ~20 KB whose 16
    sampled frames are 16 x 12.6 MB of RGB at the default size (each frame under the old
    per-image limit of 4096 x 4096, so only a per-frame video limit refuses it)."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(2, 1))
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "51"}
        frame = av.VideoFrame(size, size, "yuv420p")
        for plane in frame.planes:
            plane.update(bytes(plane.buffer_size))
        for k in range(frames):
            frame.pts = k
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


AUDIO_BOMBS = {"flac": flac_bomb, "flac_unknown_length": flac_unknown_length_bomb, "ogg_vorbis": ogg_vorbis_bomb,
               "ogg_opus": ogg_opus_bomb, "mp3": mp3_bomb, "wav_1hz": wav_low_rate_bomb}
IMAGE_BOMBS = {"png": png_bomb, "png_81mp": png_81mp_bomb, "png_text": png_text_bomb, "gif": gif_bomb}
BUILDERS = {**AUDIO_BOMBS, **IMAGE_BOMBS, "mp4": mp4_bomb}
MIME = {"flac": "audio/flac", "flac_unknown_length": "audio/flac", "ogg_vorbis": "audio/ogg", "ogg_opus": "audio/ogg",
        "mp3": "audio/mpeg", "wav_1hz": "audio/wav", "png": "image/png", "png_81mp": "image/png",
        "png_text": "image/png", "gif": "image/gif", "mp4": "video/mp4"}


_CHILD = """
import io, pickle, sys
import numpy, soundfile, av, PIL.Image, soxr
from omni_triton.media import audio, image, inputs
def status():
    out = {}
    for line in open('/proc/self/status'):
        key, _, value = line.partition(':')
        if key in ('VmRSS', 'VmHWM'):
            out[key] = int(value.split()[0]) * 1024
    return out
results = {}
for name, call, payload in pickle.load(sys.stdin.buffer):
    open('/proc/self/clear_refs', 'w').write('5')
    before = status()['VmRSS']
    try:
        eval(call)
        outcome = 'ACCEPTED'
    except Exception as exc:
        outcome = type(exc).__name__ + ': ' + str(exc)
    results[name] = (outcome, status()['VmHWM'] - before)
    del payload
sys.stdout.buffer.write(pickle.dumps(results))
"""


def decode_in_subprocess(cases: list[tuple[str, str, bytes]]) -> dict[str, tuple[str, int]]:
    """Run each ``(name, call, payload)``: the Python expression ``call`` (names: ``audio``,
    ``image``, ``inputs`` from ``omni_triton.media``; ``payload``: the bytes) in one fresh
    interpreter whose imports are done first. Returns ``{name: (outcome, growth)}``: outcome is
    ``ACCEPTED`` or ``<exception type>: <message>``, growth the bytes its peak RSS rose above its
    RSS just before that call (``VmHWM`` reset per call)."""
    import pickle
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _CHILD], input=pickle.dumps(cases), capture_output=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    return pickle.loads(out.stdout)


@functools.cache
def bomb(name: str) -> bytes:
    """The bomb ``name`` of :data:`BUILDERS`, built once per test session."""
    return BUILDERS[name]()


__all__ = ["AUDIO_BOMBS", "BUILDERS", "IMAGE_BOMBS", "MIME", "MB", "bomb", "decode_in_subprocess"]

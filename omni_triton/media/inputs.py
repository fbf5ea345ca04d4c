"""Decoding of chat *input* media (OpenAI content parts ``input_audio``, ``image_url``,
``video_url``): base64 / data URLs -> bytes -> PCM, RGB images and sampled video frames.

Torch-free (soundfile, PyAV, Pillow, soxr, numpy): used by the ``omni`` BLS model before the
Qwen3-Omni processor runs, and by the frontend's checks. Every refusal is a
:class:`MediaInputError` (a :class:`~omni_triton.contracts.tensors.InputError`: HTTP 400 /
Triton INVALID_ARG) whose message names the part.
"""
from __future__ import annotations

import base64
import binascii
import io
import re
from dataclasses import dataclass

import numpy as np

from omni_triton.contracts.tensors import InputError


class MediaInputError(InputError):
    """An input media part cannot be used: bad base64 / data URL, not decodable, over a limit."""


@dataclass(frozen=True)
class MediaLimits:
    """Limits on one request's input media (units in the names).

    ``max_part_bytes``: decoded bytes of one part; ``max_audio_seconds``: one audio clip;
    ``max_image_pixels``: width*height of one image (checked from the header, before decoding:
    Pillow's decompression-bomb guard, tightened); ``max_video_seconds`` / ``max_video_frames``:
    the span decoded and the frames kept; ``video_fps``: frames sampled per second;
    ``max_parts``: media parts per request.
    """

    max_part_bytes: int = 16 * 1024 * 1024
    max_audio_seconds: float = 60.0
    max_image_pixels: int = 4096 * 4096
    max_video_seconds: float = 30.0
    max_video_frames: int = 16
    video_fps: float = 2.0
    max_parts: int = 8


_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,",
                       re.IGNORECASE)


def b64decode(text: str, what: str, max_bytes: int) -> bytes:
    """Strict base64 (RFC 4648 alphabet, padding checked; whitespace ignored) -> bytes.

    Raises:
        MediaInputError: not base64, empty, or more than ``max_bytes`` decoded bytes.
    """
    if not isinstance(text, str) or not text:
        raise MediaInputError(f"{what}: empty or missing base64 data")
    if len(text) * 3 // 4 > max_bytes + 3:
        raise MediaInputError(f"{what}: {len(text) * 3 // 4} bytes is over the limit of {max_bytes} bytes")
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MediaInputError(f"{what}: invalid base64 ({exc})") from None
    if not data:
        raise MediaInputError(f"{what}: empty data")
    if len(data) > max_bytes:
        raise MediaInputError(f"{what}: {len(data)} bytes is over the limit of {max_bytes} bytes")
    return data


def parse_data_url(url: str, what: str, max_bytes: int) -> tuple[str, bytes]:
    """``data:<mime>[;params];base64,<data>`` -> ``(mime, bytes)`` (mime lower-case, may be "").

    Raises:
        MediaInputError: not a base64 data URL, or what :func:`b64decode` rejects.
    """
    m = _DATA_URL.match(url or "")
    if not m or not m.group("b64"):
        raise MediaInputError(f"{what}: expected a base64 data URL (data:<mime>;base64,...)")
    return (m.group("mime") or "").lower(), b64decode(url[m.end():], what, max_bytes)


def decode_audio(data: bytes, what: str, sample_rate: int, max_seconds: float) -> np.ndarray:
    """Encoded audio (WAV/FLAC/OGG through soundfile, else MP3/AAC/... through PyAV) -> float32
    mono PCM [S] in [-1, 1] at ``sample_rate`` Hz (channels averaged, soxr resampling).

    Raises:
        MediaInputError: not decodable as audio, no samples, longer than ``max_seconds``.
    """
    pcm, rate = _decode_soundfile(data)
    if pcm is None:
        pcm, rate = _decode_av_audio(data, what, max_seconds)
    if pcm.size == 0:
        raise MediaInputError(f"{what}: the audio has no samples")
    if pcm.shape[0] / rate > max_seconds:
        raise MediaInputError(f"{what}: {pcm.shape[0] / rate:.1f} s of audio is over the limit of {max_seconds:g} s")
    mono = pcm.mean(axis=1) if pcm.ndim == 2 else pcm
    mono = np.ascontiguousarray(mono, dtype=np.float32)
    if rate != sample_rate:
        import soxr

        mono = soxr.resample(mono, rate, sample_rate).astype(np.float32)
    return mono


def _decode_soundfile(data: bytes):
    import soundfile as sf

    try:
        pcm, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception:  # soundfile raises LibsndfileError/RuntimeError/TypeError on non-audio
        return None, 0
    return pcm, int(rate)


def _decode_av_audio(data: bytes, what: str, max_seconds: float):
    import av

    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise MediaInputError(f"{what}: not an audio file (no audio stream)")
            stream = container.streams.audio[0]
            rate = int(stream.rate or stream.codec_context.sample_rate or 0)
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            chunks, n = [], 0
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    arr = out.to_ndarray().reshape(-1)
                    chunks.append(arr)
                    n += arr.size
                if rate and n / rate > max_seconds:
                    raise MediaInputError(f"{what}: the audio is over the limit of {max_seconds:g} s")
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
    except MediaInputError:
        raise
    except Exception as exc:  # av.error.InvalidDataError and friends
        raise MediaInputError(f"{what}: not a decodable audio file ({type(exc).__name__})") from None
    if not rate:
        raise MediaInputError(f"{what}: the audio has no sample rate")
    pcm = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    return pcm.astype(np.float32)[:, None], rate


def decode_image(data: bytes, what: str, max_pixels: int):
    """Encoded image (PNG/JPEG/WebP/GIF/BMP: what Pillow reads) -> RGB ``PIL.Image``; the size
    is checked from the header before the pixels are decoded.

    Raises:
        MediaInputError: not an image, or more than ``max_pixels`` pixels.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data))
        w, h = img.size
        if w * h > max_pixels:
            raise MediaInputError(f"{what}: {w}x{h} = {w * h} pixels is over the limit of {max_pixels} pixels")
        img.load()
        return img.convert("RGB")
    except MediaInputError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise MediaInputError(f"{what}: not a decodable image ({type(exc).__name__})") from None


def sample_video_frames(data: bytes, what: str, limits: MediaLimits) -> tuple[list[np.ndarray], float]:
    """Encoded video (what PyAV/FFmpeg reads: MP4, WebM, ...) -> RGB frames uint8 [H, W, 3]
    sampled at ``limits.video_fps`` (the first frame at or after each ``k / fps`` s), at most
    ``limits.max_video_frames`` of them from the first ``limits.max_video_seconds`` s, and the
    frame rate actually sampled (frames per second of video, for the processor's
    ``video_second_per_grid``). The audio track is not used (``use_audio_in_video=False``).

    Raises:
        MediaInputError: not a video, no frames, frames over ``max_image_pixels``.
    """
    import av

    step = 1.0 / limits.video_fps
    frames: list[np.ndarray] = []
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise MediaInputError(f"{what}: not a video file (no video stream)")
            stream = container.streams.video[0]
            w, h = stream.codec_context.width, stream.codec_context.height
            if w * h > limits.max_image_pixels:
                raise MediaInputError(f"{what}: {w}x{h} frames are over the limit of {limits.max_image_pixels} pixels")
            next_t = 0.0
            for frame in container.decode(stream):
                t = float(frame.time) if frame.time is not None else len(frames) * step
                if t > limits.max_video_seconds or len(frames) >= limits.max_video_frames:
                    break
                if t + 1e-6 >= next_t:
                    frames.append(frame.to_ndarray(format="rgb24"))
                    next_t += step
    except MediaInputError:
        raise
    except Exception as exc:
        raise MediaInputError(f"{what}: not a decodable video ({type(exc).__name__})") from None
    if not frames:
        raise MediaInputError(f"{what}: the video has no frames")
    return frames, float(limits.video_fps)

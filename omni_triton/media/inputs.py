"""Decoding of chat *input* media (OpenAI content parts ``input_audio``, ``image_url``,
``video_url``): base64 / data URLs -> bytes -> PCM, RGB images and sampled video frames.

Torch-free (soundfile, PyAV, Pillow, soxr, numpy): used by the ``qwen3_omni`` BLS model before the
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
    Pillow's decompression-bomb guard, tightened); ``max_video_pixels``: width*height of a video
    frame (header and every decoded frame; with ``max_video_frames`` it bounds the frames held:
    16 x 1920x1080 RGB = 100 MB); ``max_video_seconds`` / ``max_video_frames``: the span decoded
    and the frames kept; ``video_fps``: frames sampled per second; ``max_parts``: media parts per
    request.
    """

    max_part_bytes: int = 16 * 1024 * 1024
    max_audio_seconds: float = 60.0
    max_image_pixels: int = 4096 * 4096
    max_video_pixels: int = 1920 * 1080
    max_video_seconds: float = 30.0
    max_video_frames: int = 16
    video_fps: float = 2.0
    max_parts: int = 8


#: demuxers PyAV may use for a client's video (refused before probing otherwise): those whose
#: streams are known from the header, so FFmpeg's ``max_pixels`` reaches the probing decoders
#: (MPEG-PS/TS and FLV create theirs while probing, unbounded)
VIDEO_FORMATS = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,avi,ogg"
#: frames decoded per second of the sampled span at most (a stream whose timestamps never
#: advance is cut there instead of being decoded to its end)
MAX_DECODED_FPS = 240


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
    """Encoded audio (WAV/FLAC/OGG/MP3 through soundfile, MP4/AAC/WebM... through PyAV) -> float32
    mono PCM [S] in [-1, 1] at ``sample_rate`` Hz: :func:`omni_triton.media.audio.decode_audio`
    (header checked first, decoding stopped at ``max_seconds``).

    Raises:
        MediaInputError: not decodable as audio, no samples, longer than ``max_seconds``, a rate
            or channel count outside ``AudioLimits``.
    """
    from omni_triton.media.audio import AudioDecodeError, AudioLimits
    from omni_triton.media.audio import decode_audio as decode

    try:
        return decode(data, sample_rate, AudioLimits(max_seconds=max_seconds)).samples
    except AudioDecodeError as exc:
        raise MediaInputError(f"{what}: {exc}") from None


def decode_image(data: bytes, what: str, max_pixels: int):
    """Encoded image (PNG/JPEG/WebP/GIF/BMP) -> RGB ``PIL.Image``:
    :func:`omni_triton.media.image.open_image` (the size checked from the header before the
    pixels are decoded; the first frame of an animation only).

    Raises:
        MediaInputError: not an image, or more than ``max_pixels`` pixels.
    """
    from omni_triton.media.image import ImageTooLargeError, InvalidImageError, open_image

    try:
        return open_image(data, max_pixels)
    except ImageTooLargeError as exc:
        raise MediaInputError(f"{what}: {exc}") from None
    except InvalidImageError as exc:
        raise MediaInputError(f"{what}: not a decodable image ({exc})") from None


def sample_video_frames(data: bytes, what: str, limits: MediaLimits) -> tuple[list[np.ndarray], float]:
    """Encoded video (what PyAV/FFmpeg reads of :data:`VIDEO_FORMATS`: MP4, WebM, ...) -> RGB
    frames uint8 [H, W, 3] sampled at ``limits.video_fps`` (the first frame at or after each
    ``k / fps`` s), at most ``limits.max_video_frames`` of them from the first
    ``limits.max_video_seconds`` s, and the frame rate actually sampled (frames per second of
    video, for the processor's ``video_second_per_grid``). The audio track is not used
    (``use_audio_in_video=False``).

    Bounded by the limits, not by the container: the frame size is checked on the stream header
    before decoding and on every decoded frame (a stream may change size mid-way); only sampled
    frames are converted to RGB; decoding stops after the span, after ``max_video_frames`` kept
    frames, or after ``max_video_seconds * MAX_DECODED_FPS`` decoded frames, whichever comes first.

    Raises:
        MediaInputError: not a video, no frames, frames over ``max_video_pixels`` or
            ``max_image_pixels``.
    """
    import av

    step = 1.0 / limits.video_fps
    cap = min(limits.max_image_pixels, limits.max_video_pixels)
    max_decoded = int(limits.max_video_seconds * MAX_DECODED_FPS) + 1
    frames: list[np.ndarray] = []

    def too_large(w: int, h: int) -> MediaInputError:
        return MediaInputError(f"{what}: {w}x{h} frames are over the limit of {cap} pixels")

    try:
        # max_pixels: FFmpeg's own per-frame cap, for the decoders that av.open's stream probing
        # (avformat_find_stream_info) runs before any header can be read here
        container = av.open(io.BytesIO(data), mode="r",
                            options={"format_whitelist": VIDEO_FORMATS, "max_pixels": str(cap)})
    except Exception as exc:
        raise MediaInputError(f"{what}: not a video file of {VIDEO_FORMATS} ({type(exc).__name__})") from None
    try:
        with container:
            if not container.streams.video:
                raise MediaInputError(f"{what}: not a video file (no video stream)")
            stream = container.streams.video[0]
            w, h = stream.codec_context.width, stream.codec_context.height
            if w * h > cap:
                raise too_large(w, h)
            stream.codec_context.options = {"max_pixels": str(cap)}  # the decoder refuses bigger frames itself
            next_t, decoded = 0.0, 0
            for frame in container.decode(stream):
                decoded += 1
                if frame.width * frame.height > cap:
                    raise too_large(frame.width, frame.height)
                t = float(frame.time) if frame.time is not None else len(frames) * step
                if t > limits.max_video_seconds or len(frames) >= limits.max_video_frames or decoded > max_decoded:
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

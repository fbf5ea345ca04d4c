"""MP4 (H.264) encoding and decoding of ``uint8 [F, H, W, 3]`` RGB frames with PyAV (the libx264
in PyAV's wheels; no hand-written muxing). Torch-free: the frontend encodes its videos here.
"""
from __future__ import annotations

import io
import os
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

MIME_TYPE = "video/mp4"


class InvalidVideoError(ValueError):
    """Frames that cannot be encoded (shape, dtype, odd size for 4:2:0) or bytes that are no video."""


def _check(frames: np.ndarray, fps: int) -> None:
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3 or frames.shape[0] < 1:
        raise InvalidVideoError(f"frames must be uint8 [F, H, W, 3], got {frames.dtype} {list(frames.shape)}")
    if frames.shape[1] % 2 or frames.shape[2] % 2:
        raise InvalidVideoError(f"H.264 4:2:0 needs an even size, got {frames.shape[2]}x{frames.shape[1]}")
    if not isinstance(fps, (int, np.integer)) or fps < 1:
        raise InvalidVideoError(f"fps={fps}: must be a positive integer")


def encode_mp4(frames: np.ndarray, fps: int, crf: int = 18) -> bytes:
    """Encode ``frames`` (``uint8 [F, H, W, 3]`` RGB) as an H.264 MP4 at ``fps`` frames per
    second: frame ``i`` has pts ``i`` in a ``1/fps`` time base, so the container holds ``F``
    frames lasting ``F / fps`` seconds. ``yuv420p`` (what players expect), ``crf`` quality.

    Raises:
        InvalidVideoError: see :func:`_check`.
    """
    import av

    frames = np.asarray(frames)
    _check(frames, fps)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(int(fps), 1))
        stream.width, stream.height = int(frames.shape[2]), int(frames.shape[1])
        stream.pix_fmt = "yuv420p"
        # the frames' time base is 1/fps for good: the MP4 muxer replaces the stream's own time
        # base when it writes the header (at the first packet, after x264's 40-frame lookahead),
        # and frames stamped with that one after it had pts far too small (EINVAL past 41 frames)
        time_base = Fraction(1, int(fps))
        stream.time_base = time_base
        stream.options = {"crf": str(crf)}
        for i, pixels in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
            frame.pts = i
            frame.time_base = time_base
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def write_atomic(path: Path | str, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically and durably: a temporary file
    ``.<name>.<random>.tmp`` in the same folder, fsync, ``os.replace``, then an fsync of the
    folder (so the rename itself survives a power loss). A reader sees the old file, no file, or
    the whole new one; never a part. The frontend's media store writes every local file here.

    Raises:
        OSError: the write failed; the temporary file is removed and ``path`` is unchanged.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


@dataclass(frozen=True)
class DecodedVideo:
    """What a container holds: ``frames`` ``uint8 [F, H, W, 3]``, ``fps`` (the stream's average
    rate), ``duration_s`` (container duration) and the codec name."""

    frames: np.ndarray
    fps: float
    duration_s: float
    codec: str


def decode_video(data: bytes) -> DecodedVideo:
    """Decode every frame of a video file's bytes (tests, clients).

    Raises:
        InvalidVideoError: not a decodable video.
    """
    import av

    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            stream = container.streams.video[0]
            frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])
            duration = container.duration / 1e6 if container.duration else float(stream.duration * stream.time_base)
            return DecodedVideo(frames, float(stream.average_rate), duration, stream.codec_context.name)
    except (av.FFmpegError, IndexError, ValueError) as exc:
        raise InvalidVideoError(f"not a decodable video: {exc}") from exc

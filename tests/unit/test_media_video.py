"""MP4 encoding with PyAV: frame count, fps, duration, size survive a decode; atomic writes."""
import os

import numpy as np
import pytest

pytest.importorskip("av")

from omni_triton.media.video import InvalidVideoError, decode_video, encode_mp4, write_atomic


def _frames(n=9, h=32, w=48):
    # smooth gradients (moving): H.264 keeps them close, unlike white noise
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([np.stack([(x * 5 + i * 10) % 256, (y * 7) % 256, np.full_like(x, 40 * i % 256)], -1)
                     for i in range(n)]).astype(np.uint8)


# 45 and 81: past x264's 40-frame lookahead packets are muxed while frames are still sent (the
# muxer had replaced the stream's time base by then: every video over 41 frames was a 500)
@pytest.mark.parametrize("fps,n", [(8, 9), (24, 17), (16, 1), (8, 45), (16, 81)])
def test_mp4_holds_the_frames_at_the_fps(fps, n):
    frames = _frames(n)
    data = encode_mp4(frames, fps)
    assert data[4:8] == b"ftyp"
    video = decode_video(data)
    assert video.codec == "h264"
    assert video.frames.shape == frames.shape
    assert video.fps == fps
    assert video.duration_s == pytest.approx(n / fps, abs=1e-3)
    assert np.abs(video.frames.astype(int) - frames).mean() < 8  # lossy, but the same picture


@pytest.mark.parametrize("bad", [np.zeros((0, 32, 32, 3), np.uint8), np.zeros((2, 32, 32, 3), np.float32),
                                 np.zeros((2, 31, 32, 3), np.uint8), np.zeros((2, 32, 32), np.uint8)])
def test_unencodable_frames_are_refused(bad):
    with pytest.raises(InvalidVideoError):
        encode_mp4(bad, 8)
    with pytest.raises(InvalidVideoError):
        encode_mp4(_frames(2), 0)


def test_garbage_is_not_a_video():
    with pytest.raises(InvalidVideoError):
        decode_video(b"not an mp4 at all")


def test_write_atomic_replaces_whole_files_and_leaves_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "videos" / "a.mp4"
    write_atomic(target, b"first")
    write_atomic(target, b"second")
    assert target.read_bytes() == b"second" and os.listdir(target.parent) == ["a.mp4"]

    def boom(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_atomic(target, b"third")
    assert target.read_bytes() == b"second" and os.listdir(target.parent) == ["a.mp4"]

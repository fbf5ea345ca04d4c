"""The playground's Video tab in Chromium against the real stack: a job's progress bar moves with
the job's own progress, the finished MP4 plays in the page's <video> (and is a real MP4: PyAV
decodes the bytes the page fetched), a running job is cancelled from the page, and the job list
shows the jobs with their states."""
from __future__ import annotations

import io
import time

import httpx
import pytest

from tests.helpers.playground import open_tab, shot

pytestmark = pytest.mark.e2e

STATUS = "[data-testid=video-status]"
PROGRESS = "[data-testid=video-progress]"
PLAYER = "[data-testid=video-player]"


def _fill(page, frames: int, steps: int, size: str) -> None:
    page.wait_for_selector("[data-testid=video-model] option[value=wan_t2v]", state="attached")
    page.fill("[data-testid=video-frames]", str(frames))
    page.fill("[data-testid=video-steps]", str(steps))
    page.fill("[data-testid=video-size]", size)
    page.fill("[data-testid=video-fps]", "8")
    page.fill("[data-testid=video-seed]", "3")


def _player(page) -> dict:
    return page.evaluate("(() => { const v = document.querySelector('[data-testid=video-player]');"
                         " return {t: v.currentTime, d: v.duration, ready: v.readyState, w: v.videoWidth,"
                         " src: v.src, paused: v.paused}; })()")


def test_progress_moves_and_the_mp4_plays(page, stack, artifact_dir, first_output):
    open_tab(page, "video")
    # 81 frames x 50 steps at 128x128: several seconds of denoising on the tiny Wan2.2
    _fill(page, 81, 50, "128x128")
    page.click("[data-testid=video-create]")
    seen: list[tuple[str, int]] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        state, value, bar = page.evaluate(
            "[document.querySelector('[data-testid=video-status]').dataset.state,"
            " document.querySelector('[data-testid=video-progress]').dataset.value,"
            " document.querySelector('[data-testid=video-progress]').value]")
        value = int(value)
        assert value == bar, (value, bar)  # the bar itself shows the job's progress
        if not seen or seen[-1] != (state, value):
            seen.append((state, value))
        if state in ("completed", "failed"):
            break
        time.sleep(0.05)
    assert seen[-1] == ("completed", 100), seen
    moving = sorted({v for s, v in seen if s == "in_progress" and 0 < v < 100})
    assert len(moving) >= 2, f"the progress bar did not move through two values below 100: {seen}"
    assert [v for _, v in seen] == sorted(v for _, v in seen), f"progress went back: {seen}"
    job_id = page.text_content("[data-testid=video-id]")

    # the MP4 plays: time advances in the <video>, from a blob: URL (the key never in a URL)
    page.wait_for_selector(f"{PLAYER}[data-job-id='{job_id}']", state="attached", timeout=60_000)
    deadline = time.monotonic() + 60
    first = None
    while time.monotonic() < deadline:
        p = _player(page)
        if p["ready"] >= 2 and p["t"] > 0:
            first = first or p
            if p["t"] > first["t"]:
                break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the video did not play: {_player(page)}")
    assert p["src"].startswith("blob:") and p["w"] == 128 and p["d"] > 0, p
    assert float(page.get_attribute("[data-testid=video-ttfp]", "data-seconds")) > 0
    # the click -> the MP4 playing, for this test's long job (81 frames, 50 steps, 128x128)
    first_output["video_81x128x128_50_steps"] = round(float(page.get_attribute("[data-testid=video-ttfp]",
                                                                               "data-seconds")), 3)

    # the bytes the page played are an MP4 of the job (PyAV decodes them)
    av = pytest.importorskip("av")
    mp4 = httpx.get(f"{stack.frontend_url}/v1/videos/{job_id}/content", timeout=60).content
    assert int(page.get_attribute(PLAYER, "data-bytes")) == len(mp4)
    with av.open(io.BytesIO(mp4)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 81 and frames[0].shape == (128, 128, 3)

    # the job list shows it completed
    page.click("[data-testid=video-jobs-refresh]")
    page.wait_for_selector(f"[data-testid=video-jobs] tr[data-id='{job_id}'][data-state=completed]")
    shot(page, artifact_dir, "video")
    assert not page.errors, page.errors


def test_cancel_a_running_job(page, stack):
    open_tab(page, "video")
    # a long job (81 frames x 50 steps at 320x320): cancelled while it runs
    _fill(page, 81, 50, "320x320")
    page.click("[data-testid=video-create]")
    page.wait_for_selector(f"{STATUS}[data-state=in_progress]", timeout=120_000)
    job_id = page.text_content("[data-testid=video-id]")
    page.wait_for_selector(f"[data-testid=video-jobs] tr[data-id='{job_id}']", timeout=10_000)
    page.click("[data-testid=video-cancel]")
    page.wait_for_selector(f"{STATUS}[data-state=cancelled]", timeout=30_000)
    assert page.is_disabled("[data-testid=video-cancel]")
    # the server agrees: the job is gone (DELETE stops and removes a running job) ...
    assert httpx.get(f"{stack.frontend_url}/v1/videos/{job_id}", timeout=10).status_code == 404
    # ... and the list no longer shows it
    page.wait_for_selector(f"[data-testid=video-jobs] tr[data-id='{job_id}']", state="detached", timeout=10_000)
    # the bar stays where the job was stopped
    assert int(page.get_attribute(PROGRESS, "data-value")) < 100
    assert not page.errors, page.errors

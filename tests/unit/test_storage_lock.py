"""One frontend per storage folder (openai_frontend.storage_lock): a second process on a video or
voice folder refuses to start with a message naming the folder and the holder's pid, and a
holder killed with SIGKILL leaves the folder free, so ``omni-triton serve`` can restart a dead
frontend (its ``Frontend`` class, the real ``python -m openai_frontend``, no Triton needed)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from omni_triton.serve.process import free_port
from omni_triton.serve.server import Frontend
from openai_frontend.storage_lock import LOCK_FILE, StorageLock, StorageLockedError
from openai_frontend.video_jobs import JobSettings, VideoJobs
from openai_frontend.voice_store import VoiceSettings, VoiceStore

HOLDER = """
import sys, time
from openai_frontend.storage_lock import StorageLock
locks = [StorageLock(folder) for folder in sys.argv[1:]]
print("held", flush=True)
time.sleep(600)
"""


def _hold(*folders) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, *map(str, folders)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def test_a_second_process_is_refused_until_the_holder_dies(tmp_path):
    videos, voices = tmp_path / "videos", tmp_path / "voices"
    holder = _hold(videos, voices)
    try:
        with pytest.raises(StorageLockedError) as info:
            StorageLock(videos)
        assert info.value.holder_pid == holder.pid
        assert str(videos) in str(info.value) and f"process {holder.pid}" in str(info.value)
        with pytest.raises(StorageLockedError):
            VideoJobs(None, JobSettings(storage_dir=videos))
        with pytest.raises(StorageLockedError):
            VoiceStore(VoiceSettings(storage_dir=voices))
        assert not (voices / "voices.sqlite").exists()  # refused before opening or sweeping anything
    finally:
        _kill(holder)  # SIGKILL: no clean-up ran, the kernel released the flock
    store = VoiceStore(VoiceSettings(storage_dir=voices))
    jobs = VideoJobs(None, JobSettings(storage_dir=videos))
    assert (videos / LOCK_FILE).read_text().strip() == str(os.getpid())
    store.close()
    import asyncio

    asyncio.run(jobs.stop())


def test_within_one_process_the_lock_is_shared_and_released_with_the_last_holder(tmp_path):
    a = StorageLock(tmp_path)
    b = StorageLock(tmp_path)  # a second store object in this process: no error
    a.release()
    a.release()  # idempotent
    probe = subprocess.run([sys.executable, "-c", HOLDER, str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert probe.returncode != 0 and "StorageLockedError" in probe.stderr  # still held by b
    b.release()
    holder = _hold(tmp_path)  # free now
    _kill(holder)


def _listening(url: str) -> bool:
    try:
        return httpx.get(url + "/metrics", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _wait_listening(frontend: Frontend, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not _listening(frontend.url):
        assert frontend.proc.poll() is None, f"the frontend exited with {frontend.proc.returncode}"
        assert time.monotonic() < end, "the frontend did not start"
        time.sleep(0.1)


def test_a_second_frontend_refuses_to_start_and_a_killed_one_restarts(tmp_path):
    args = ["--video-storage-dir", str(tmp_path / "videos"), "--voice-storage-dir", str(tmp_path / "voices")]
    first = Frontend(f"127.0.0.1:{free_port()}", port=free_port(), extra_args=args, log_path=tmp_path / "first.log")
    first.start()
    try:
        _wait_listening(first)
        second = Frontend(first.triton_grpc_url, port=free_port(), extra_args=args, log_path=tmp_path / "second.log")
        second.start()
        assert second.proc.wait(timeout=60) == 1
        log = (tmp_path / "second.log").read_text()
        assert f"the storage folder {tmp_path / 'videos'} is in use by process {first.proc.pid}" in log, log
        assert "Traceback" not in log
        # serve's restart of a frontend that died (SIGKILL: no shutdown ran)
        os.killpg(first.proc.pid, signal.SIGKILL)
        first.proc.wait(timeout=10)
        first.start()
        _wait_listening(first)
    finally:
        first.stop()

"""ServeStatusWatch reads serve's status file (written by omni_triton.serve.supervisor.ServeStatus) and
fires once per new stub death with the affected models; a death already in the file when the
frontend starts is not re-fired."""
from __future__ import annotations

import os
import time

from omni_triton.serve.supervisor import ServeStatus
from openai_frontend.stage_watch import ServeStatusWatch


def _bump(path):
    # mtime granularity: make each write visibly newer
    t = time.time() + _bump.n
    _bump.n += 1
    os.utime(path, (t, t))


_bump.n = 1


def test_fires_once_per_new_stub_death(tmp_path):
    status = ServeStatus(tmp_path / "status.json")
    status.write(state="ready", last_stub_death={"at": 1.0, "model": "old", "affected": ["old"]})
    fired = []
    watch = ServeStatusWatch(status.path, lambda affected, dead: fired.append((affected, dead)))
    watch.poll()
    assert fired == [] and watch.health()["state"] == "ready"  # predates the frontend

    status.write(last_stub_death={"at": 2.0, "model": "llm", "affected": ["llm", "llm_tts"]})
    _bump(status.path)
    watch.poll()
    watch.poll()  # unchanged file: no second call
    assert fired == [(["llm", "llm_tts"], "llm")]

    status.write(restarts=1)  # another change without a new death
    _bump(status.path)
    watch.poll()
    assert len(fired) == 1 and watch.health()["restarts"] == 1


def test_no_file_means_nothing_to_watch(tmp_path):
    watch = ServeStatusWatch(None)
    watch.poll()
    assert watch.health() is None
    watch = ServeStatusWatch(tmp_path / "missing.json")
    watch.poll()
    assert watch.health() is None


def test_serves_pipe_says_when_to_read_and_nothing_polls(tmp_path):
    """With serve's pipe (OMNI_TRITON_SERVE_STATUS_FD) the watcher reads the file when serve
    writes a byte after its status write, and runs no polling task (an idle frontend wakes for
    nothing, issue 28 item 4)."""
    import asyncio

    status = ServeStatus(tmp_path / "status.json")
    status.write(state="ready")
    read_end, write_end = os.pipe()
    status.listeners.append(lambda: os.write(write_end, b"\n"))
    fired = []

    async def main():
        watch = ServeStatusWatch(status.path, lambda affected, dead: fired.append(dead),
                                 interval_s=3600, notify_fd=read_end)
        watch.start()
        assert watch._task is None, "it polls"
        status.write(last_stub_death={"at": 2.0, "model": "llm", "affected": ["llm"]})  # same mtime tick or not
        for _ in range(200):
            if fired:
                break
            await asyncio.sleep(0.01)
        await watch.stop()

    try:
        asyncio.run(main())
    finally:
        os.close(read_end)
        os.close(write_end)
    assert fired == ["llm"]

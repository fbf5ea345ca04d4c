"""omni_triton.serve.stubs.StubTracker on real processes, without tritonserver: this test process
plays the server, and its "stubs" are Python processes started as ``triton_python_backend_stub``
(a symlink to this Python) on ``<repo>/<model>/1/model.py``, each starting a child that maps a
/dev/shm file, like vLLM's EngineCore. A stub killed with SIGKILL wakes its pidfd, and its
orphaned child and /dev/shm file are removed."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import psutil
import pytest

from omni_triton.serve.stubs import StubTracker

STUB = textwrap.dedent('''\
    import mmap, subprocess, sys, time
    CHILD = """
    import mmap, sys, time
    f = open(sys.argv[1], "w+b"); f.truncate(4096); m = mmap.mmap(f.fileno(), 4096)
    print("mapped", flush=True)
    time.sleep(3600)
    """
    child = subprocess.Popen([sys.executable, "-c", CHILD, sys.argv[2]], stdout=subprocess.PIPE)
    child.stdout.readline()
    print(child.pid, flush=True)
    time.sleep(3600)
    ''')


@pytest.fixture
def stubs(tmp_path):
    """start(model) -> (Popen of a fake stub, its child's pid, its child's /dev/shm file)."""
    binary = tmp_path / "bin" / "triton_python_backend_stub"
    binary.parent.mkdir()
    binary.symlink_to(sys.executable)
    started = []

    def start(model: str):
        script = tmp_path / "repo" / model / "1" / "model.py"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(STUB)
        shm = f"/dev/shm/omni-triton-test-{uuid.uuid4().hex[:8]}"
        proc = subprocess.Popen([str(binary), str(script), f"region-{model}", shm],
                                stdout=subprocess.PIPE, text=True)
        child = int(proc.stdout.readline())
        started.append((proc, child, shm))
        return proc, child, shm

    yield start
    for proc, child, shm in started:
        for pid in (proc.pid, child):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        if os.path.exists(shm):
            os.unlink(shm)


def test_a_killed_stub_wakes_its_pidfd_and_its_family_is_reaped(stubs):
    tracker = StubTracker(os.getpid())
    piper, piper_child, piper_shm = stubs("piper")
    llm, llm_child, llm_shm = stubs("llm")
    new = tracker.scan()
    assert sorted(s.model for s in new) == ["llm", "piper"] and tracker.alive() == {"llm": 1, "piper": 1}
    assert tracker.scan() == []  # known: not new again
    stub = tracker.stubs[piper.pid]
    assert stub.region == "region-piper" and piper_shm in stub.shm
    assert piper_child in {pid for pid, _ in stub.children}

    poller = select.poll()
    for fd in tracker.fds():
        poller.register(fd, select.POLLIN)
    assert poller.poll(0) == []  # nothing to see while they live
    os.kill(piper.pid, signal.SIGKILL)  # a zombie until this "server" reaps it: still a death
    assert len(poller.poll(10_000)) == 1, "the pidfd did not wake on the stub's death"
    (gone,) = tracker.exited()
    assert gone.model == "piper" and tracker.alive() == {"llm": 1} and tracker.exited() == []
    report = tracker.reap(gone)
    assert report["killed"] == [piper_child] and report["shm_removed"] == [piper_shm]
    assert not psutil.pid_exists(piper_child) or psutil.Process(piper_child).status() == psutil.STATUS_ZOMBIE
    assert not os.path.exists(piper_shm)
    assert os.path.exists(llm_shm) and psutil.pid_exists(llm_child)  # the other family is untouched
    tracker.close()


def test_a_stub_killed_before_any_scan_is_not_adopted(stubs):
    """A zombie stub (killed, not yet reaped by its server) has no command line: it is not taken
    for a live stub (StubWatch then reports its model unseen)."""
    tracker = StubTracker(os.getpid())
    proc, _, _ = stubs("piper")
    os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert tracker.scan() == [] and tracker.alive() == {}

"""Waiting for an ``omni-triton serve`` started by a test (tests/e2e: the session stack of
conftest.py, the on-demand stack of test_on_demand_served.py)."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest


def wait_healthy(proc: subprocess.Popen, url: str, log_path: Path, timeout_s: float) -> None:
    """Poll ``url``/health once a second until it answers 200.

    Fails the test (``pytest.fail``, with the end of ``log_path``) when ``proc`` exits first or
    ``timeout_s`` seconds pass.
    """
    deadline = time.monotonic() + timeout_s
    with httpx.Client() as http:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"omni-triton serve exited ({proc.returncode}):\n{log_path.read_text()[-8000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"stack not ready in time:\n{log_path.read_text()[-8000:]}")
            try:
                if http.get(f"{url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)

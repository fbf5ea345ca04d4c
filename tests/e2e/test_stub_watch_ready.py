"""serve watches the stubs of the models Triton reports READY, not of its start list (issue 28
item 2, docs/architecture.md "Supervision"): the frontend loads and unloads models on demand
through Triton's repository API. A model unloaded through that API stays unloaded (serve neither
reloads it nor reports a death), and a model loaded through it after start is watched: its
stub, killed with SIGKILL, is reported and the model reloaded.

Run alone under the server lock with a small stack, e.g.
``OMNI_TRITON_E2E_MODELS=piper,csm,llm,llm_tts flock /tmp/omni-server.lock .venv/bin/python -m
pytest -q tests/e2e/test_stub_watch_ready.py``.
"""
from __future__ import annotations

import os
import signal
import time

import httpx
import psutil
import pytest
from conftest import wait_for_stub_death_report

pytestmark = pytest.mark.e2e

#: light models to load after start, the first one not loaded yet is taken (with the full e2e
#: stack all are loaded: the test unloads its model first)
LATE_CANDIDATES = ("qwen_image_vae_decoder", "wan_t2v_vae_decoder", "csm_code2wav")


def _ready(stack, model: str) -> bool:
    return httpx.get(f"{stack.triton_http_url}/v2/models/{model}/ready", timeout=10).status_code == 200


def _repository(stack, model: str, action: str) -> None:
    r = httpx.post(f"{stack.triton_http_url}/v2/repository/models/{model}/{action}",
                   headers=stack.admin_headers, timeout=600)
    assert r.status_code == 200, r.text


def _stub_pids(stack, model: str) -> list[int]:
    return [p.pid for p in psutil.Process(stack.triton_pid).children()
            if (cmd := _cmdline(p)) and cmd[0].endswith("triton_python_backend_stub")
            and f"/{model}/" in cmd[1]]


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _serve_log_since(stack, offset: int) -> str:
    with open(stack.log_path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def test_a_model_unloaded_through_the_api_stays_unloaded(stack):
    model = "piper"
    assert _ready(stack, model)
    log_from = os.path.getsize(stack.log_path)
    stubs = _stub_pids(stack, model)
    _repository(stack, model, "unload")
    try:
        stack.wait_until(lambda: not _ready(stack, model), f"{model} did not unload", 120)
        stack.wait_until(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                                         for p in stubs), f"{model}'s stubs did not exit", 60)
        time.sleep(5)  # ten supervision ticks: a reload would have started
        log = _serve_log_since(stack, log_from)
        assert not _ready(stack, model), f"serve loaded {model} again:\n{log}"
        assert f"reloading {model}" not in log and f"stub process of {model} died" not in log, log
        assert f"stubs of {model} exited as it unloaded" in log, log
    finally:
        _repository(stack, model, "load")
    stack.wait_until(lambda: _ready(stack, model), f"{model} did not load again", 120)


@pytest.mark.kills_stub(*LATE_CANDIDATES)
def test_a_model_loaded_through_the_api_after_start_is_watched(stack):
    model = next((m for m in LATE_CANDIDATES if not _ready(stack, m)), LATE_CANDIDATES[0])
    was_loaded = _ready(stack, model)
    if was_loaded:  # the full stack: every candidate is loaded; load one anew
        _repository(stack, model, "unload")
        stack.wait_until(lambda: not _ready(stack, model), f"{model} did not unload", 120)
    _repository(stack, model, "load")
    try:
        stack.wait_until(lambda: len(_stub_pids(stack, model)) == 1, f"{model}'s stub did not start", 120)
        (stub,) = _stub_pids(stack, model)
        time.sleep(2)  # serve sees the load in Triton's log and takes the stub's family
        log_from = os.path.getsize(stack.log_path)
        os.kill(stub, signal.SIGKILL)
        wait_for_stub_death_report(stack, model, log_from)
        stack.wait_until(lambda: f"{model} reloaded" in _serve_log_since(stack, log_from),
                         f"serve did not reload {model}", 120)
        stack.wait_until(lambda: _ready(stack, model) and _stub_pids(stack, model) not in ([], [stub]),
                         f"{model} is not READY with a new stub", 60)
        health = httpx.get(f"{stack.frontend_url}/health", timeout=10).json()
        assert health["serve"]["last_stub_death"]["model"] == model, health
        assert health["serve"]["stub_reloads"].get(model, 0) >= 1, health
    finally:
        _repository(stack, model, "load" if was_loaded else "unload")  # as the session had it

"""End-to-end fixtures: the real ``omni-triton serve`` (tritonserver + OpenAI frontend) once per session.

The server runs exactly as a user starts it (``python -m omni_triton serve``), on free ports, with
the speech models. Teardown sends SIGTERM and checks that no process the launcher started
(tritonserver, Python stubs, the frontend) is left behind.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
import psutil
import pytest

from omni_triton.launcher import free_port

E2E_MODELS = os.environ.get("OMNI_TRITON_E2E_MODELS", "piper_tts,tts,llm,llm_tts,omni,qwen_image,qwen_image_edit")  # dev knob: fewer models
READY_TIMEOUT_S = 600


@dataclass
class Stack:
    """Addresses of the running stack."""

    frontend_url: str  # http://127.0.0.1:PORT
    triton_http_url: str  # http://127.0.0.1:PORT (KServe v2 HTTP)
    triton_grpc_url: str  # 127.0.0.1:PORT (KServe v2 gRPC)
    metrics_url: str  # http://127.0.0.1:PORT/metrics (Triton's Prometheus endpoint)
    log_path: str
    triton_pid: int

    @staticmethod
    def wait_until(condition, failure: str, timeout_s: float = 60.0) -> None:
        """Poll ``condition()`` every 0.1 s; fail with ``failure`` after ``timeout_s``. A bound on
        waiting for an event, not a timing assertion."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, failure
            time.sleep(0.1)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of one metric on Triton's metrics endpoint whose labels include
        ``labels`` (e.g. over all instances of a model); 0 if absent."""
        text = httpx.get(self.metrics_url, timeout=10).text
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
            if all(found.get(k) == v for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    ports = {name: free_port() for name in ("http", "grpc", "metrics", "frontend")}
    cmd = [
        sys.executable, "-m", "omni_triton", "serve", "--models", E2E_MODELS,
        "--port", str(ports["frontend"]),
        "--triton-http-port", str(ports["http"]),
        "--triton-grpc-port", str(ports["grpc"]),
        "--triton-metrics-port", str(ports["metrics"]),
        "--ready-timeout", str(READY_TIMEOUT_S),
    ]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{ports['frontend']}"
    deadline = time.monotonic() + READY_TIMEOUT_S + 60
    shm_regions: set[str] = set()
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"omni-triton serve exited ({proc.returncode}):\n{log_path.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"stack not ready in time:\n{log_path.read_text()}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        started = psutil.Process(proc.pid).children(recursive=True)
        tritons = [p for p in started if p.name() == "tritonserver"]
        assert len(tritons) == 1, [p.name() for p in started]
        shm_regions |= _stub_shm_regions(started)
        yield Stack(
            frontend_url=url,
            triton_http_url=f"http://127.0.0.1:{ports['http']}",
            triton_grpc_url=f"127.0.0.1:{ports['grpc']}",
            metrics_url=f"http://127.0.0.1:{ports['metrics']}/metrics",
            log_path=str(log_path),
            triton_pid=tritons[0].pid,
        )
    finally:
        started = []
        try:
            started = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        shm_regions |= _stub_shm_regions(started)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        log.close()
        _, alive = psutil.wait_procs(started, timeout=10)
        for p in alive:
            p.kill()
        assert not alive, f"processes left behind after SIGTERM: {[(p.pid, p.name()) for p in alive]}"
        assert code == 0, f"omni-triton serve exited with {code}:\n{log_path.read_text()[-3000:]}"
        leaked = [r for r in shm_regions if os.path.exists(f"/dev/shm/{r}")]
        assert not leaked, f"shared-memory regions left in /dev/shm: {leaked}"


def _stub_shm_regions(processes) -> set[str]:
    """Shared-memory region names of Triton Python stubs (their argv[2])."""
    regions = set()
    for p in processes:
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if len(cmd) > 2 and cmd[0].endswith("triton_python_backend_stub"):
            regions.add(cmd[2])
    return regions

"""End-to-end fixtures: the real ``omni-triton serve`` (tritonserver + OpenAI frontend) once per session.

The server runs exactly as a user starts it (``python -m omni_triton serve``), on free ports, with
the speech models. Teardown sends SIGTERM and checks that no process the launcher started
(tritonserver, Python stubs, the frontend) is left behind.

A crash fails the run: ``serve`` restarts a tritonserver that died and reloads a model whose stub
process died, so requests after the restart succeed and would hide it. After every test (and at
session teardown) a :class:`~tests.helpers.crash_watch.CrashWatch` looks for the traces a crash
leaves since the previous check (module-scoped fixtures included): serve's tritonserver child is
not the one the session started (or is missing), serve's restart lines or stub death reports in
its log, tritonserver's own ``Signal (N) received`` line, and a new
``tritonserver-<http port>.log.crash-<n>`` file in the cache's ``logs/`` folder. A test that kills
or unloads stubs on purpose names their models, ``@pytest.mark.kills_stub("piper")``: only
those deaths are excused (a tritonserver restart never is).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from clients.bench_common import metric_total
from omni_triton import triton_admin
from omni_triton.contracts import lora as lora_contract
from omni_triton.paths import cache_dir
from omni_triton.serve.process import free_port
from tests.helpers.crash_watch import CrashWatch, crash_logs
from tests.helpers.serve_process import wait_healthy

E2E_MODELS = os.environ.get(  # dev knob: fewer models
    "OMNI_TRITON_E2E_MODELS",
    "piper,csm,llm,llm_tts,qwen3_omni,qwen_image,qwen_image_edit,qwen_image_inpaint,wan_t2v,wan_i2v,"
    "qwen3_tts,qwen2_5_omni,whisper,pocketsphinx,stable_audio")
# qwen_image_edit_plus (5 stub processes, ~3.3 GB RSS) is not in the default session: with it the
# session peaked at 23.5 of 24 GB here. scripts/test.sh runs its e2e files (test_images_edit_plus.py,
# test_lora_served_inpaint_edit_plus.py) in a second session of their own.
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
    serve_pid: int = 0  # the ``omni-triton serve`` process
    triton_log: str = ""  # tritonserver's own log (``<cache>/logs/tritonserver-<http port>.log``)
    admin_key: str = ""  # the key of Triton's restricted APIs (serve got it in OMNI_TRITON_ADMIN_KEY)
    lora_dir: str = ""  # the LoRA directory of this session (OMNI_TRITON_LORA_DIR)
    lora_sources: str = ""  # the folder --lora-allowed-dirs names

    @property
    def admin_headers(self) -> dict[str, str]:
        """Headers for Triton's restricted APIs (repository load/unload/index, model config, ...)."""
        return triton_admin.headers(self.admin_key)

    @property
    def grpc_admin_headers(self) -> dict[str, str]:
        """The same for ``tritonclient.grpc`` calls (``headers=``; Triton prefixes gRPC's name)."""
        return triton_admin.headers(self.admin_key, grpc=True)

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
        return metric_total(httpx.get(self.metrics_url, timeout=10).text, name, **labels)

    def in_progress(self, model: str) -> float:
        """Requests a stage has accepted and not yet finished, over all its instances: the stage
        gauges ``omni_stage_requests_running`` + ``omni_stage_requests_waiting`` (docs/metrics.md)."""
        return self.metric("omni_stage_requests_running", model=model) + \
            self.metric("omni_stage_requests_waiting", model=model)


def wait_for_stub_death_report(stack, model: str, since: int, timeout_s: float = 120.0) -> None:
    """Wait until serve has logged the death of ``model``'s stub after byte ``since`` of its log
    (the size before the kill): a ``kills_stub`` test's own effect. serve reports a death before
    it reloads the model (``serve.supervisor.StubWatch``, since stop 19; before, a death could be reported a
    tick after the reload); the wait keeps the report in this test, never the next one, which
    would fail on it (CI11 and CI16: test_videos after test_speech_piper's kill)."""
    deadline = time.monotonic() + timeout_s
    needle = f"the stub process of {model} died".encode()
    while True:
        with open(stack.log_path, "rb") as f:
            f.seek(since)
            if needle in f.read():
                return
        assert time.monotonic() < deadline, f"serve never reported the death of {model}'s stub"
        time.sleep(0.5)


def pytest_configure(config):
    config.addinivalue_line("markers", "kills_stub(*models): the test kills or unloads the stub processes of "
                                       "these models on purpose (serve reloading them is expected)")


def _excused_stubs(request) -> tuple[str, ...]:
    """The models a ``kills_stub`` test names (it must name at least one)."""
    marker = request.node.get_closest_marker("kills_stub")
    if marker is None:
        return ()
    assert marker.args, f"{request.node.nodeid}: name the models whose stubs it kills: @pytest.mark.kills_stub('m')"
    return tuple(marker.args)


@pytest.fixture(autouse=True)
def _fail_on_crash(request):
    """After each test that used the server: fail it if tritonserver crashed or a stub died since
    the previous check (``serve`` restarted it; see the module docstring). The window starts
    where the previous test's check stopped, so deaths in module-scoped fixtures count too."""
    if "stack" not in request.fixturenames:
        yield
        return
    request.getfixturevalue("stack")
    watch = request.config.stash[_CRASH_WATCH]
    excused = _excused_stubs(request)
    yield
    evidence = watch.check(excused_stubs=excused)
    assert not evidence, "tritonserver crashed or a stub died during this test:\n" + "\n".join(evidence)


_CRASH_WATCH = pytest.StashKey[CrashWatch]()


@pytest.fixture(scope="session")
def stack(tmp_path_factory, request):
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    # this session's LoRA directory (registry + adapter files; the denoisers read it through the
    # same environment variable), not the shared cache's
    lora_dir, lora_sources = tmp_path_factory.mktemp("loras"), tmp_path_factory.mktemp("lora-sources")
    ports = {name: free_port() for name in ("http", "grpc", "metrics", "frontend")}
    cmd = [
        # read now, not at import: tests/e2e/playground/conftest.py sets its own default
        sys.executable, "-m", "omni_triton", "serve", "--models", os.environ.get("OMNI_TRITON_E2E_MODELS", E2E_MODELS),
        "--on-demand", "none",  # every model of the session loaded at start, as before issue 28
        "--port", str(ports["frontend"]),
        "--triton-http-port", str(ports["http"]),
        "--triton-grpc-port", str(ports["grpc"]),
        "--triton-metrics-port", str(ports["metrics"]),
        "--ready-timeout", str(READY_TIMEOUT_S),
        # the video job store of this session (SQLite + MP4s), not one in the shared cache
        f"--frontend-arg=--video-storage-dir={tmp_path_factory.mktemp('videos')}",
        # and its voices and consents (the fuzzer of test_malformed.py creates and deletes some)
        f"--frontend-arg=--voice-storage-dir={tmp_path_factory.mktemp('voices')}",
        # LoRA adapters may be registered by path from this folder (test_lora_served.py)
        f"--frontend-arg=--lora-allowed-dirs={lora_sources}",
    ]
    triton_log = cache_dir() / "logs" / f"tritonserver-{ports['http']}.log"  # TritonServer's default
    old_crash_logs = crash_logs(triton_log)
    log = open(log_path, "wb")
    admin_key = triton_admin.new_key()  # known to the tests: serve takes it from its environment
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**os.environ, triton_admin.ENV: admin_key, lora_contract.ENV: str(lora_dir)})
    url = f"http://127.0.0.1:{ports['frontend']}"
    shm_regions: set[str] = set()
    shm_before = set(os.listdir("/dev/shm"))
    try:
        wait_healthy(proc, url, log_path, READY_TIMEOUT_S + 60)
        started = psutil.Process(proc.pid).children(recursive=True)
        tritons = [p for p in started if p.name() == "tritonserver"]
        assert len(tritons) == 1, [p.name() for p in started]
        shm_regions |= _stub_shm_regions(started)
        session = Stack(
            frontend_url=url,
            triton_http_url=f"http://127.0.0.1:{ports['http']}",
            triton_grpc_url=f"127.0.0.1:{ports['grpc']}",
            metrics_url=f"http://127.0.0.1:{ports['metrics']}/metrics",
            log_path=str(log_path),
            triton_pid=tritons[0].pid,
            serve_pid=proc.pid,
            triton_log=str(triton_log),
            admin_key=admin_key,
            lora_dir=str(lora_dir),
            lora_sources=str(lora_sources),
        )
        watch = CrashWatch(str(log_path), str(triton_log), proc.pid, tritons[0].pid, old_crash_logs)
        request.config.stash[_CRASH_WATCH] = watch
        yield session
        # What no test checked (after the last one: a module fixture's teardown) fails the
        # session, and so does a tritonserver crash anywhere in it.
        evidence = list(dict.fromkeys(watch.check() + watch.whole_session()))
        assert not evidence, "tritonserver crashed or a stub died during this session:\n" + "\n".join(evidence)
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
        # vLLM's shared-memory queues of the engines this session started (stubs killed on
        # purpose included): serve removes them when their processes are gone.
        engine_shm = sorted(f for f in set(os.listdir("/dev/shm")) - shm_before if f.startswith("psm_"))
        assert not engine_shm, f"vLLM shared memory left in /dev/shm: {engine_shm}"
        # No request was left in flight for good: Triton's shutdown waits --exit-timeout-secs for
        # in-flight inferences and names the models still holding some when it gives up (every
        # CI run until stop 19: qwen_image_edit, 2 bad images of test_malformed; see its ensemble).
        stuck = _in_flight_at_exit(Path(triton_log))
        assert not stuck, f"requests still in flight when tritonserver gave up waiting: {stuck}"


def _in_flight_at_exit(triton_log: Path) -> list[str]:
    """The ``Model '<m>' (version <v>) has <n> in-flight inferences`` lines Triton logged at the
    last second of its exit timeout ("Timeout 0"), i.e. requests that never ended."""
    try:
        lines = triton_log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    stuck, last_second = [], False
    for line in lines:
        if "Timeout 0: Found" in line:
            last_second = "in-flight inferences" in line
        elif last_second and "in-flight inferences" in line:
            stuck.append(line.split("] ", 1)[-1].strip('"'))
        elif last_second:
            last_second = False
    return stuck


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

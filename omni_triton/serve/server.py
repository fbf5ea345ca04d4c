"""The two children ``serve`` runs: :class:`TritonServer` and the OpenAI :class:`Frontend`.

:class:`TritonServer` starts tritonserver (found by :mod:`omni_triton.serve.install`) in its own
process group on the model repositories with ``--model-control-mode=explicit`` and only the
requested models (plus the models they depend on, :func:`~omni_triton.serve.repository.resolve_models`),
waits for READY, and on failure raises :class:`ServerStartError` naming the failing model with its
error lines. :meth:`TritonServer.stop` terminates the whole process group (stubs and any engine
children), so nothing is left behind. It also watches its Python-backend stub processes (which
died, what they left behind) for :mod:`omni_triton.serve.supervisor`.

Triton's administrative APIs (model repository: load/unload; model config; shared memory; trace;
logging) are restricted to a key (:mod:`omni_triton.triton_admin`): :class:`TritonServer` holds
it, sends it on its own repository calls and hands it to :class:`Frontend`. Its HTTP, gRPC and
metrics endpoints bind to 127.0.0.1 unless told otherwise.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

from omni_triton import triton_admin
from omni_triton.paths import cache_dir, model_repositories, server_run_dir
from omni_triton.serve.install import find_tritonserver, server_env
from omni_triton.serve.process import (
    ServerStartError,
    check_ports_free,
    child_setup,
    open_run_log,
    stop_process_group,
)
from omni_triton.serve.repository import available_models, read_config, resolve_models
from omni_triton.serve.stubs import StubTracker

#: environment variable naming the status pipe's read end in the frontend
#: (``openai_frontend.stage_watch.NOTIFY_FD_ENV``; serve does not import the frontend)
NOTIFY_FD_ENV = "OMNI_TRITON_SERVE_STATUS_FD"

__all__ = ["Frontend", "ServerStartError", "TritonServer", "missing_instances"]


def missing_instances(expected: dict[str, int], alive: dict[str, int]) -> list[str]:
    """Models with fewer live stub processes than instances (a model of 4 instances that lost one
    stub is as broken for the requests routed to it as one that lost all)."""
    return [m for m, n in expected.items() if alive.get(m, 0) < n]

# Lines a CPU-only tritonserver always logs; they never explain a failure.
_CPU_NOISE = ("CudaDriverHelper has not been initialized", "Failed to initialize NVML")
#: Triton's model lifecycle lines (model_lifecycle.cc, INFO level, logged with --log-verbose=0)
_LIFECYCLE_LINE = re.compile(rb"(?:loading: |successfully loaded '|successfully unloaded '|failed to load ')"
                             rb"([\w.-]+)")
_MODEL_LINE = re.compile(r"^\|\s*(?P<model>[\w.-]+)\s*\|\s*\d+\s*\|\s*(?P<status>.*?)\s*\|?\s*$")


class TritonServer:
    """One tritonserver process serving a chosen set of models.

    Args:
        models: models to load (dependencies are added, see :func:`resolve_models`).
        http_port, grpc_port, metrics_port: Triton's ports (KServe v2 HTTP/gRPC, Prometheus).
        log_path: file receiving the server's stdout+stderr.
        exit_timeout: ``--exit-timeout-secs`` (how long Triton waits for in-flight requests).
        extra_args: more tritonserver flags.
        repositories: model repositories (default: this checkout's ``model_repository`` and
            ``ensembles``).
        host: address Triton's HTTP and gRPC endpoints bind to. Default 127.0.0.1: Triton is
            not exposed beyond this machine unless asked (``0.0.0.0``, e.g. a Kubernetes pod whose
            frontend runs in another pod).
        metrics_host: address of the metrics endpoint (default ``host``; a container may open
            only this one to its Prometheus).
        admin_key: the key of Triton's restricted APIs (:mod:`omni_triton.triton_admin`);
            default a fresh random one. Kept across restarts of this server.
        restrict_apis: start Triton with the restricted-API flags (default). ``False`` only for
            tests that show what the restriction prevents.
    """

    def __init__(self, models: list[str], http_port: int = 8000, grpc_port: int = 8001,
                 metrics_port: int = 8002, log_path: Path | None = None,
                 exit_timeout: int = 10, extra_args: list[str] | None = None,
                 repositories: list[Path] | None = None, host: str = "127.0.0.1",
                 metrics_host: str | None = None, admin_key: str | None = None,
                 restrict_apis: bool = True):
        self.host = host
        self.metrics_host = metrics_host or host
        self.admin_key = triton_admin.check_key(admin_key) if admin_key else triton_admin.new_key()
        self.restrict_apis = restrict_apis
        self.repositories = repositories or model_repositories()
        self.models = resolve_models(models, self.repositories)
        self.http_port, self.grpc_port, self.metrics_port = http_port, grpc_port, metrics_port
        # One log per server (by HTTP port), so concurrent servers never overwrite each other's.
        self.log_path = log_path or cache_dir() / "logs" / f"tritonserver-{http_port}.log"
        # the admin key for local tools (perf_analyzer, tests): 0600, removed by stop()
        self.admin_key_path = cache_dir() / "run" / f"triton-admin-key-{http_port}"
        self.exit_timeout = exit_timeout
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None
        self._http_client: httpx.Client | None = None
        self.install = find_tritonserver()
        #: the stubs of the running server process (None before start())
        self.stubs: StubTracker | None = None
        self._python: dict[str, bool] = {}
        self._instance_counts: dict[str, int] = {}
        self._log_offset, self._fatal_signal = 0, None  # poll_log(): log bytes read, fatal line seen
        self._model_events: set[str] = set()  # models of the lifecycle lines poll_log() read

    @property
    def _connect_host(self) -> str:
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host

    @property
    def http_url(self) -> str:
        return f"http://{self._connect_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self._connect_host}:{self.grpc_port}"

    @property
    def admin_headers(self) -> dict[str, str]:
        """HTTP headers a call to one of Triton's restricted APIs needs (repository, config, ...)."""
        return triton_admin.headers(self.admin_key)

    def command(self) -> list[str]:
        """The full tritonserver command line."""
        cmd = [str(self.install.server)]
        for repo in self.repositories:
            if repo.is_dir() and any(repo.glob("*/config.pbtxt")):
                cmd.append(f"--model-repository={repo}")
        cmd += [
            f"--backend-directory={self.install.backend_dir}",
            "--model-control-mode=explicit",
            *[f"--load-model={m}" for m in self.models],
            f"--http-address={self.host}",
            f"--grpc-address={self.host}",
            f"--metrics-address={self.metrics_host}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            f"--exit-timeout-secs={self.exit_timeout}",
            "--log-verbose=0",
            *(triton_admin.server_flags(self.admin_key) if self.restrict_apis else []),
            *self.extra_args,
        ]
        return cmd

    def start(self) -> None:
        """Start tritonserver in its own process group, output to :attr:`log_path`.

        Raises:
            ServerStartError: one of its ports is already in use.
        """
        check_ports_free({"Triton HTTP": self.http_port, "Triton gRPC": self.grpc_port,
                          "Triton metrics": self.metrics_port})
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        triton_admin.write_key_file(self.admin_key_path, self.admin_key)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=server_env(self.install), preexec_fn=child_setup,
        )
        log.close()
        self._log_offset, self._fatal_signal, self._model_events = 0, None, set()
        self.stubs = StubTracker(self.proc.pid)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def poll_log(self) -> None:
        """Read what the server appended to its log since the last call (nothing or a few bytes
        when idle: one open, seek and read): remember its first ``Signal (N) received.`` line
        (:meth:`fatal_signal`) and the models of its lifecycle lines (:meth:`model_events`)."""
        start = max(0, self._log_offset - 64)  # a line split across two reads
        try:
            with open(self.log_path, "rb") as log:
                log.seek(start)
                chunk = log.read()
        except FileNotFoundError:
            return
        seen = self._log_offset - start  # bytes of chunk read before: a match ending there is old
        self._log_offset = start + len(chunk)
        if self._fatal_signal is None:
            m = re.search(rb"Signal \(\d+\) received\.?", chunk)
            if m:
                self._fatal_signal = m.group(0).decode()
        self._model_events |= {m.group(1).decode(errors="replace")
                               for m in _LIFECYCLE_LINE.finditer(chunk) if m.end() > seen}

    def model_events(self) -> set[str]:
        """The models Triton logged a load or unload of (``loading: m:1``, ``successfully loaded
        'm'``, ``successfully unloaded 'm' ...``, ``failed to load 'm' ...``) since the last call:
        ``serve``'s cue that the set of stubs changed (a model the frontend loaded on demand, or
        unloaded), read from the log it already follows for :meth:`fatal_signal`."""
        self.poll_log()
        events, self._model_events = self._model_events, set()
        return events

    def fatal_signal(self) -> str | None:
        """The first ``Signal (N) received.`` line this server wrote to its log, or None.

        tritonserver prints that line from its SIGSEGV/SIGABRT handler, and normally exits right
        after. In CI run 4 of issue 9 one did not: after a SIGSEGV its gRPC port was closed and
        every stub had died, but the process stayed, so ``serve`` (which watched only the exit)
        neither restarted nor counted it and every later request failed. The log is read
        incrementally (:meth:`poll_log`: only what was appended since the last read).
        """
        if self._fatal_signal is None:
            self.poll_log()
        return self._fatal_signal

    def failure_report(self) -> str:
        """Failing models and their error lines, from the server log's model table and errors."""
        text = self.log_text()
        lines = text.splitlines()
        failing = []
        for line in lines:
            m = _MODEL_LINE.match(line)
            if m and m.group("model") in self.models and not m.group("status").startswith("READY"):
                failing.append(f"  {m.group('model')}: {m.group('status')}")
        errors = [ln for ln in lines
                  if (re.match(r"^E\d{4}", ln) or "Traceback" in ln or "Error" in ln)
                  and not any(noise in ln for noise in _CPU_NOISE)]
        report = []
        if failing:
            report.append("models that failed to load:\n" + "\n".join(failing))
        if errors:
            report.append("error lines from the server log:\n" + "\n".join(errors[-40:]))
        if not report:
            report.append("last lines of the server log:\n" + "\n".join(lines[-40:]))
        return "\n".join(report) + f"\n(full log: {self.log_path})"

    @property
    def _http(self) -> httpx.Client:
        """One HTTP client for every poll of this server (a new ``httpx.get`` client per call cost
        ~49 ms of CPU against ~2.5 ms reused, measured here: ~20% of a core while serve waited
        for READY with two polls every 0.5 s)."""
        if self._http_client is None:
            self._http_client = httpx.Client()
        return self._http_client

    def model_states(self) -> dict[str, tuple[str, str]]:
        """Model -> (state, reason) from Triton's repository index.

        Raises:
            httpx.HTTPError: no answer, or an error status.
            ValueError: the answer is not JSON.
        """
        r = self._http.post(f"{self.http_url}/v2/repository/index", json={}, timeout=5,
                            headers=self.admin_headers)
        r.raise_for_status()  # an error answer is no index (httpx.HTTPStatusError)
        return {m["name"]: (m.get("state", ""), m.get("reason", "")) for m in r.json()}

    def wait_ready(self, timeout: float = 600.0, should_stop=lambda: False) -> None:
        """Block until the server and every loaded model is READY.

        Raises:
            ServerStartError: the server exited, a model became UNAVAILABLE, ``timeout``
                seconds passed, or ``should_stop()`` became true; the message names the failing
                model(s) and their errors.
        """
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if should_stop():
                raise ServerStartError("stopped while waiting for tritonserver to be READY")
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"tritonserver exited with code {self.proc.returncode} while loading "
                    f"{', '.join(self.models)}\n{self.failure_report()}"
                )
            try:
                if self._http.get(f"{self.http_url}/v2/health/ready", timeout=2).status_code == 200:
                    states = self.model_states()
                    if all(states.get(m, ("",))[0] == "READY" for m in self.models):
                        return
                    bad = {m: s for m, s in states.items() if s[0] == "UNAVAILABLE" and m in self.models}
                    if bad:
                        detail = "\n".join(f"  {m}: {reason}" for m, (_, reason) in bad.items())
                        raise ServerStartError(f"models failed to load:\n{detail}\n{self.failure_report()}")
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise ServerStartError(
            f"tritonserver not ready after {timeout:.0f} s\n{self.failure_report()}"
        )

    def ready_models(self) -> set[str]:
        """Models Triton's repository index reports READY now (one HTTP call to the server).

        Raises:
            httpx.HTTPError: the server did not answer.
        """
        return {m for m, (state, _) in self.model_states().items() if state == "READY"}

    def is_python(self, model: str) -> bool:
        """Whether ``model`` runs in Python-backend stubs (not an ensemble); read from its config
        once. False for a model in no repository."""
        if model not in self._python:
            path = available_models(self.repositories).get(model)
            self._python[model] = path is not None and read_config(path / "config.pbtxt").backend == "python"
        return self._python[model]

    def instances(self, model: str) -> int:
        """Stub processes ``model`` runs: the sum of its instance_group counts (1 if none)."""
        if model not in self._instance_counts:
            config = read_config(available_models(self.repositories)[model] / "config.pbtxt")
            self._instance_counts[model] = sum(g.count or 1 for g in config.instance_group) or 1
        return self._instance_counts[model]

    def models_without_stub(self, ready: set[str]) -> list[str]:
        """Python-backend models of ``ready`` (the models Triton reports READY) with fewer live
        stubs than instances (killed, crashed, OOM; as of the last :meth:`scan_stubs` and
        ``stubs.exited()``).

        Triton 2.51 keeps such a model READY and fails each request with "Stub process ... is
        not healthy" until the model is loaded again; a model of 4 instances that lost one stub
        is as broken for the requests routed to it as one that lost all.
        """
        if self.stubs is None or self.proc is None or self.proc.poll() is not None:
            return []
        expected = {m: self.instances(m) for m in sorted(ready) if self.is_python(m)}
        return missing_instances(expected, self.stubs.alive())

    def scan_stubs(self, refresh: set[str] = frozenset()) -> list:
        """Find the server's new stubs and their families (:meth:`StubTracker.scan
        <omni_triton.serve.stubs.StubTracker.scan>`; ``refresh``: models whose families'
        /dev/shm files are read again). Returns the new stubs."""
        if self.stubs is None or self.proc is None or self.proc.poll() is not None:
            return []
        return self.stubs.scan(refresh)

    def reap_exited_stubs(self) -> list[dict]:
        """The stubs that exited since the last call, each with its family dealt with: the
        descendants it left running killed, its /dev/shm files removed
        (:meth:`StubTracker.reap <omni_triton.serve.stubs.StubTracker.reap>`; one dict per stub:
        ``{"model", "stub_pid", "killed": [pid], "shm_removed": [path]}``). Whether that exit was
        a death or its model's unload is for the caller to tell (Triton's index)."""
        if self.stubs is None:
            return []
        return [self.stubs.reap(stub) for stub in self.stubs.exited()]

    def stub_fds(self) -> list[int]:
        """pidfds of the live stubs (readable once one exits): what ``serve`` waits on."""
        return self.stubs.fds() if self.stubs is not None else []

    def kill_stubs(self, model: str) -> list[int]:
        """SIGKILL every stub process of ``model`` (serve then reloads it); returns their pids."""
        import psutil

        killed = []
        if self.stubs is None:
            return killed
        self.scan_stubs()
        for stub in list(self.stubs.stubs.values()):
            if stub.model != model:
                continue
            try:
                proc = psutil.Process(stub.pid)
                if proc.create_time() == stub.created:
                    proc.kill()
                    killed.append(stub.pid)
            except psutil.Error:
                continue
        return killed

    def reload(self, model: str) -> None:
        """Unload and load ``model`` through Triton's repository API (restarts its stubs).

        A plain ``load`` of a loaded model whose files did not change is a no-op in Triton, so
        the model is unloaded first; requests in between get "model not ready" (503 from the
        frontend) instead of "stub not healthy".

        Raises:
            ServerStartError: Triton refused or failed to unload or load it.
        """
        repo = f"{self.http_url}/v2/repository/models/{model}"
        r = httpx.post(f"{repo}/unload", timeout=600, headers=self.admin_headers)
        if r.status_code != 200:
            raise ServerStartError(f"unloading {model} failed: {r.text}")
        deadline = time.monotonic() + 120
        while self._http.get(f"{self.http_url}/v2/models/{model}/ready", timeout=5).status_code == 200:
            if time.monotonic() > deadline:
                raise ServerStartError(f"{model} did not unload within 120 s")
            time.sleep(0.2)
        r = httpx.post(f"{repo}/load", timeout=600, headers=self.admin_headers)
        if r.status_code != 200:
            raise ServerStartError(f"loading {model} again failed: {r.text}")

    def stop(self) -> None:
        """Stop the server and everything in its process group (stubs, engine children), then
        remove shared-memory regions its stubs left in /dev/shm (a killed stub leaks its own)."""
        if self.proc is not None:
            if self.proc.poll() is None and self.stubs is not None:
                # the /dev/shm files its stubs and engines map now
                self.stubs.scan(refresh={s.model for s in self.stubs.stubs.values()})
            stop_process_group(self.proc, timeout=self.exit_timeout + 10)
            shutil.rmtree(server_run_dir(self.proc.pid), ignore_errors=True)
            self.admin_key_path.unlink(missing_ok=True)
            if self.stubs is not None:
                for region in self.stubs.regions:
                    (Path("/dev/shm") / region).unlink(missing_ok=True)
                # vLLM's shared-memory queues (psm_*) outlive an engine that was stopped by
                # killing it (finalize reaps it within ~2 s): every process that mapped them is
                # gone now.
                for path in self.stubs.shm_paths():
                    Path(path).unlink(missing_ok=True)
                self.stubs.close()
        if self._http_client is not None:  # its pooled connections went with the server
            self._http_client.close()
            self._http_client = None

    def __enter__(self) -> TritonServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Frontend:
    """The OpenAI frontend (``python -m openai_frontend``) as a child process.

    Args:
        triton_grpc_url: ``host:port`` of Triton's gRPC endpoint.
        host, port: where the frontend listens.
        models: Triton models the frontend serves (all READY ones when empty).
        log_path: file receiving its output (``None``: inherit the launcher's stdout).
        extra_args: more ``openai_frontend`` flags.
        env: more environment variables for it.
        admin_key: the key of Triton's restricted APIs (:attr:`TritonServer.admin_key`), passed
            in the frontend's environment (``OMNI_TRITON_ADMIN_KEY``; never on its argv, which
            other local users can read). Without it, the frontend inherits this process's.
    """

    def __init__(self, triton_grpc_url: str, host: str = "127.0.0.1", port: int = 9000,
                 models: list[str] | None = None, log_path: Path | None = None,
                 extra_args: list[str] | None = None, env: dict[str, str] | None = None,
                 admin_key: str | None = None):
        self.triton_grpc_url, self.host, self.port = triton_grpc_url, host, port
        self.env = {**(env or {}), **({triton_admin.ENV: admin_key} if admin_key else {})}
        self.models = models or []
        self.log_path = log_path
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None
        self._notify_w: int | None = None  # write end of the status pipe of the running frontend

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    def command(self) -> list[str]:
        """The frontend's command line (no secret on it: keys travel in :attr:`env`)."""
        cmd = [sys.executable, "-m", "openai_frontend", "--triton-url", self.triton_grpc_url,
               "--host", self.host, "--port", str(self.port)]
        if self.models:
            cmd += ["--models", ",".join(self.models)]
        return cmd + self.extra_args

    def start(self) -> None:
        """Start the frontend in its own process group.

        Raises:
            ServerStartError: its port is already in use.
        """
        check_ports_free({"frontend": self.port})
        cmd = self.command()
        out = None
        if self.log_path is not None:
            out = open_run_log(self.log_path, f"frontend on port {self.port}")
        self._close_notify()
        read_end, self._notify_w = os.pipe()
        os.set_blocking(self._notify_w, False)
        try:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if out else None,
                                         stdin=subprocess.DEVNULL, preexec_fn=child_setup,
                                         pass_fds=(read_end,),
                                         env={**os.environ, **self.env, NOTIFY_FD_ENV: str(read_end)})
        finally:
            os.close(read_end)
            if out:
                out.close()

    def notify(self) -> None:
        """Tell the frontend that serve's status file changed (a byte on the pipe whose read end
        it got as ``OMNI_TRITON_SERVE_STATUS_FD``): it re-reads the file then, and never polls
        it. A full pipe (the frontend is not reading) or a dead frontend is no error."""
        if self._notify_w is None:
            return
        try:
            os.write(self._notify_w, b"\n")
        except OSError:  # BlockingIOError (full: it will read what is there), BrokenPipeError
            pass

    def _close_notify(self) -> None:
        if self._notify_w is not None:
            os.close(self._notify_w)
            self._notify_w = None

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until ``GET /health`` answers 200.

        Raises:
            ServerStartError: the frontend exited or did not become healthy in time.
        """
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout
        last = ""
        key = os.environ.get("OMNI_TRITON_API_KEY")  # in case /health is not exempt
        with httpx.Client(headers={"Authorization": f"Bearer {key}"} if key else None) as http:
            while time.monotonic() < deadline:  # one client for every poll (TritonServer._http)
                if self.proc.poll() is not None:
                    raise ServerStartError(f"OpenAI frontend exited with code {self.proc.returncode}")
                try:
                    r = http.get(f"{self.url}/health", timeout=2)
                    if r.status_code == 200:
                        return
                    last = r.text
                except httpx.HTTPError as exc:
                    last = str(exc)
                time.sleep(0.3)
        raise ServerStartError(f"OpenAI frontend not healthy after {timeout:.0f} s: {last}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc, timeout=10)
        self._close_notify()

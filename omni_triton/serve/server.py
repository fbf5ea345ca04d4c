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
    shm_files,
    stop_process_group,
)
from omni_triton.serve.repository import available_models, read_config, resolve_models

__all__ = ["Frontend", "ServerStartError", "TritonServer", "missing_instances"]


def missing_instances(expected: dict[str, int], alive: dict[str, int]) -> list[str]:
    """Models with fewer live stub processes than instances (a model of 4 instances that lost one
    stub is as broken for the requests routed to it as one that lost all)."""
    return [m for m, n in expected.items() if alive.get(m, 0) < n]

# Lines a CPU-only tritonserver always logs; they never explain a failure.
_CPU_NOISE = ("CudaDriverHelper has not been initialized", "Failed to initialize NVML")
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
        self.install = find_tritonserver()
        self._shm_regions: set[str] = set()
        # (stub pid, start time) -> {"model", "children": {(pid, start time)}, "shm": {path}}
        self._families: dict[tuple[int, float], dict] = {}
        self._python_models: list[str] | None = None
        self._instance_counts: dict[str, int] = {}
        self._log_offset, self._fatal_signal = 0, None  # fatal_signal(): log bytes read, line seen

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
        self._log_offset, self._fatal_signal = 0, None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def fatal_signal(self) -> str | None:
        """The first ``Signal (N) received.`` line this server wrote to its log, or None.

        tritonserver prints that line from its SIGSEGV/SIGABRT handler, and normally exits right
        after. In CI run 4 of issue 9 one did not: after a SIGSEGV its gRPC port was closed and
        every stub had died, but the process stayed, so ``serve`` (which watched only the exit)
        neither restarted nor counted it and every later request failed. The log is read
        incrementally (only what was appended since the last call).
        """
        if self._fatal_signal is None:
            start = max(0, self._log_offset - 64)  # a line split across two reads
            try:
                with open(self.log_path, "rb") as log:
                    log.seek(start)
                    chunk = log.read()
            except FileNotFoundError:
                return None
            self._log_offset = start + len(chunk)
            m = re.search(rb"Signal \(\d+\) received\.?", chunk)
            if m:
                self._fatal_signal = m.group(0).decode()
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

    def model_states(self) -> dict[str, tuple[str, str]]:
        """Model -> (state, reason) from Triton's repository index."""
        r = httpx.post(f"{self.http_url}/v2/repository/index", json={}, timeout=5,
                       headers=self.admin_headers)
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
                if httpx.get(f"{self.http_url}/v2/health/ready", timeout=2).status_code == 200:
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

    def python_models(self) -> list[str]:
        """Loaded models that run in a Python-backend stub process (not ensembles); read from the
        configs once, not on every health poll."""
        if self._python_models is None:
            paths = available_models(self.repositories)
            self._python_models = [m for m in self.models
                                   if read_config(paths[m] / "config.pbtxt").backend == "python"]
        return self._python_models

    def models_without_stub(self) -> list[str]:
        """Python-backend models whose stub process is gone (killed, crashed, OOM).

        Triton 2.51 keeps such a model READY and fails each request with "Stub process ... is
        not healthy" until the model is loaded again.
        """

        if self.proc is None or self.proc.poll() is not None:
            return []
        alive: dict[str, int] = {}
        for cmd in self._stub_cmdlines():
            name = Path(cmd[1]).parent.parent.name
            alive[name] = alive.get(name, 0) + 1
        return missing_instances({m: self._instances(m) for m in self.python_models()}, alive)

    def _instances(self, model: str) -> int:
        """Stub processes ``model`` runs: the sum of its instance_group counts (1 if none)."""
        if model not in self._instance_counts:
            config = read_config(available_models(self.repositories)[model] / "config.pbtxt")
            self._instance_counts[model] = sum(g.count or 1 for g in config.instance_group) or 1
        return self._instance_counts[model]

    def kill_stubs(self, model: str) -> list[int]:
        """SIGKILL every stub process of ``model`` (serve then reloads it); returns their pids."""
        import psutil

        killed = []
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return killed
        for child in children:
            try:
                cmd = child.cmdline()
                if len(cmd) > 2 and cmd[0].endswith("triton_python_backend_stub") \
                        and Path(cmd[1]).parent.parent.name == model:
                    child.kill()
                    killed.append(child.pid)
            except psutil.Error:
                continue
        return killed

    def track_stub_families(self) -> list[dict]:
        """Remember every live stub's descendants (e.g. vLLM's EngineCore) and the /dev/shm files
        they map; for each stub that died since the last call, kill its remembered descendants
        that still run (same pid and start time: never a reused pid) and remove their /dev/shm
        files.

        A stub killed with SIGKILL leaves its children orphaned in the server's process group,
        where they live (~3 GB for vLLM) until the server stops; called every second by
        ``serve``.

        Returns:
            one dict per dead stub: ``{"model", "stub_pid", "killed": [pid], "shm_removed": [path]}``.
        """
        import psutil

        if self.proc is None or self.proc.poll() is not None:
            return []
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return []
        live = {}
        for child in children:
            try:
                cmd = child.cmdline()
                if len(cmd) > 2 and cmd[0].endswith("triton_python_backend_stub"):
                    live[(child.pid, child.create_time())] = (Path(cmd[1]).parent.parent.name, child)
            except psutil.Error:
                continue
        families = self._families
        for key, (model, stub) in live.items():
            family = families.setdefault(key, {"model": model, "children": set(), "shm": set()})
            try:
                descendants = stub.children(recursive=True)
            except psutil.Error:
                continue
            family["shm"].update(shm_files(stub.pid))  # e.g. vLLM's psm_* message queues
            for d in descendants:
                try:
                    family["children"].add((d.pid, d.create_time()))
                except psutil.Error:
                    continue
                family["shm"].update(shm_files(d.pid))
        reports = []
        for key in [k for k in families if k not in live]:
            family = families.pop(key)
            killed, removed = [], []
            for pid, created in family["children"]:
                try:
                    proc = psutil.Process(pid)
                    if proc.create_time() == created:
                        proc.kill()
                        killed.append(pid)
                except psutil.Error:
                    continue
            if killed:
                psutil.wait_procs([psutil.Process(p) for p in killed if psutil.pid_exists(p)],
                                  timeout=5)
            for path in family["shm"]:
                try:
                    Path(path).unlink()
                    removed.append(path)
                except OSError:
                    pass
            reports.append({"model": family["model"], "stub_pid": key[0], "killed": killed,
                            "shm_removed": removed})
        return reports

    def _stub_cmdlines(self) -> list[list[str]]:
        """Command lines of the server's live stub processes; remembers their shared-memory
        regions (argv[2]) so :meth:`stop` can remove what a killed stub leaves in /dev/shm."""
        import psutil

        cmds = []
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return cmds
        for child in children:
            try:
                cmd = child.cmdline()
            except psutil.Error:
                continue
            # argv: stub <repo>/<model>/<version>/model.py <shm region> <sizes> <parent pid> ...
            if len(cmd) > 2 and cmd[0].endswith("triton_python_backend_stub"):
                cmds.append(cmd)
                self._shm_regions.add(cmd[2])
        return cmds

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
        while httpx.get(f"{self.http_url}/v2/models/{model}/ready", timeout=5).status_code == 200:
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
            if self.proc.poll() is None:
                self._stub_cmdlines()
                self.track_stub_families()  # the /dev/shm files its stubs and engines map now
            stop_process_group(self.proc, timeout=self.exit_timeout + 10)
            shutil.rmtree(server_run_dir(self.proc.pid), ignore_errors=True)
            self.admin_key_path.unlink(missing_ok=True)
            for region in self._shm_regions:
                (Path("/dev/shm") / region).unlink(missing_ok=True)
            # vLLM's shared-memory queues (psm_*) outlive an engine that was stopped by killing
            # it (finalize reaps it within ~2 s): every process that mapped them is gone now.
            for family in self._families.values():
                for path in family["shm"]:
                    Path(path).unlink(missing_ok=True)
            self._families = {}

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
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if out else None,
                                     stdin=subprocess.DEVNULL, preexec_fn=child_setup,
                                     env={**os.environ, **self.env})
        if out:
            out.close()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until ``GET /health`` answers 200.

        Raises:
            ServerStartError: the frontend exited or did not become healthy in time.
        """
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(f"OpenAI frontend exited with code {self.proc.returncode}")
            try:
                key = os.environ.get("OMNI_TRITON_API_KEY")  # in case /health is not exempt
                r = httpx.get(f"{self.url}/health", timeout=2,
                              headers={"Authorization": f"Bearer {key}"} if key else None)
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

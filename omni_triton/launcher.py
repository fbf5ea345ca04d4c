"""Start and stop a real ``tritonserver`` (plus the OpenAI frontend) for Omni-Triton.

What the launcher does, in order (each step is a function, usable from tests):

1. :func:`find_tritonserver` locates a server: ``$OMNI_TRITON_SERVER``, ``tritonserver`` on PATH,
   ``/opt/tritonserver`` (NGC container), or the binary inside the ``nvidia-pytriton`` wheel.
2. :func:`assemble_backend_dir` builds a ``backends/python`` folder for the *running* interpreter
   (``libtriton_python.so``, ``triton_python_backend_utils.py`` and the stub built for this Python
   version) when the server comes from the wheel.
3. :func:`server_env` makes the stubs use this virtualenv: ``VIRTUAL_ENV``/``PATH``, and
   ``LD_LIBRARY_PATH`` starting with the LIBDIR of the interpreter that made the venv (the 3.11
   stub embeds Debian's libpython while a pyenv venv's stdlib needs its own: ``ssl`` fails with
   ``undefined symbol: _PyModule_Add`` otherwise, docs/architecture.md "Environment facts"), then the wheel's libs.
4. :class:`TritonServer` starts the server in its own process group on the model repositories
   with ``--model-control-mode=explicit`` and only the requested models (plus the models they
   depend on), waits for READY, and on failure raises :class:`ServerStartError` naming the
   failing model with its error lines. :meth:`TritonServer.stop` terminates the whole process
   group (stubs and any engine children), so nothing is left behind.

Triton's administrative APIs (model repository: load/unload; model config; shared memory; trace;
logging) are restricted to a key (:mod:`omni_triton.triton_admin`): :class:`TritonServer` holds
it, sends it on its own repository calls and hands it to :class:`Frontend`. Its HTTP, gRPC and
metrics endpoints bind to 127.0.0.1 unless told otherwise.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from omni_triton import triton_admin
from omni_triton.paths import cache_dir, model_repositories, server_run_dir

_PR_SET_PDEATHSIG = 1


class ServerStartError(RuntimeError):
    """tritonserver (or the frontend) did not become ready; the message names the failing model."""


@dataclass
class TritonInstall:
    """A located Triton server.

    Attributes:
        server: path of the ``tritonserver`` binary.
        backend_dir: folder passed as ``--backend-directory`` (holds ``python/``).
        lib_dirs: extra folders for ``LD_LIBRARY_PATH`` (the wheel's bundled libraries).
    """

    server: Path
    backend_dir: Path
    lib_dirs: list[Path] = field(default_factory=list)


def _python_tag() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _pytriton_root() -> Path | None:
    """``<site-packages>/pytriton`` of the nvidia-pytriton wheel, found without importing it
    (importing pytriton needs dependencies we install without; we only want its server files)."""
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def assemble_backend_dir(wheel_triton: Path, dest: Path | None = None) -> Path:
    """Create ``<dest>/python`` with the wheel's Python backend and the stub for this interpreter.

    Args:
        wheel_triton: ``<site-packages>/pytriton/tritonserver``.
        dest: where to build it (default ``<cache>/backends``). Idempotent: links are refreshed.

    Returns:
        The backend directory to pass as ``--backend-directory``.

    Raises:
        FileNotFoundError: the wheel has no stub for this Python version.
    """
    dest = dest or cache_dir() / "backends"
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    stub = wheel_triton / "python_backend_stubs" / _python_tag() / "triton_python_backend_stub"
    if not stub.exists():
        raise FileNotFoundError(f"nvidia-pytriton has no Python backend stub for Python {_python_tag()}")
    sources = {
        "libtriton_python.so": wheel_triton / "backends" / "python" / "libtriton_python.so",
        "triton_python_backend_utils.py": wheel_triton / "backends" / "python" / "triton_python_backend_utils.py",
        "triton_python_backend_stub": stub,
    }
    for name, src in sources.items():
        link = python_dir / name
        if link.is_symlink() or link.exists():
            if link.is_symlink() and Path(os.readlink(link)) == src:
                continue
            link.unlink()
        link.symlink_to(src)
    return dest


def find_tritonserver() -> TritonInstall:
    """Locate a tritonserver and the backend directory to use with it.

    Search order: ``$OMNI_TRITON_SERVER`` (path of the binary), ``tritonserver`` on PATH,
    ``/opt/tritonserver/bin/tritonserver``, then the ``nvidia-pytriton`` wheel.

    Raises:
        FileNotFoundError: no server found.
    """
    candidates = [os.environ.get("OMNI_TRITON_SERVER"), shutil.which("tritonserver"),
                  "/opt/tritonserver/bin/tritonserver"]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            server = Path(candidate).resolve()
            return TritonInstall(server=server, backend_dir=server.parent.parent / "backends")
    root = _pytriton_root()
    if root is not None and (root / "tritonserver" / "bin" / "tritonserver").exists():
        wheel_triton = root / "tritonserver"
        libs = root.parent / "nvidia_pytriton.libs"
        return TritonInstall(
            server=wheel_triton / "bin" / "tritonserver",
            backend_dir=assemble_backend_dir(wheel_triton),
            lib_dirs=[libs] if libs.exists() else [],
        )
    raise FileNotFoundError(
        "no tritonserver found: install the project (it pulls nvidia-pytriton), put tritonserver "
        "on PATH, or set OMNI_TRITON_SERVER"
    )


def server_env(install: TritonInstall, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver so its Python stubs run inside this virtualenv.

    Sets ``VIRTUAL_ENV``/``PATH`` to the running interpreter's environment, puts the interpreter's
    LIBDIR and the wheel's libraries first on ``LD_LIBRARY_PATH``, passes ``OMNI_TRITON_CACHE``
    and limits BLAS/OpenMP threads to one per process (2-core machines, docs/architecture.md "Environment facts").
    """
    env = dict(os.environ if base is None else base)
    venv = Path(sys.prefix)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    lib_dirs = [sysconfig.get_config_var("LIBDIR")] + [str(p) for p in install.lib_dirs]
    if env.get("LD_LIBRARY_PATH"):
        lib_dirs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(d for d in lib_dirs if d)
    env["OMNI_TRITON_CACHE"] = str(cache_dir())
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.setdefault(var, "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


# ---------------------------------------------------------------------------- model selection


def _read_config(config_path: Path):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(config_path.read_text(), model_config_pb2.ModelConfig())


def available_models(repositories: list[Path] | None = None) -> dict[str, Path]:
    """Model name -> model folder for every ``<repo>/<name>/config.pbtxt``."""
    found: dict[str, Path] = {}
    for repo in repositories or model_repositories():
        if not repo.is_dir():
            continue
        for config in sorted(repo.glob("*/config.pbtxt")):
            found[config.parent.name] = config.parent
    return found


def model_parameters(model_path: Path) -> dict[str, str]:
    """The ``parameters`` map of a model's ``config.pbtxt`` as plain strings."""
    config = _read_config(model_path / "config.pbtxt")
    return {k: v.string_value for k, v in config.parameters.items()}


def dependencies(model_path: Path) -> list[str]:
    """Models a model needs loaded: ensemble steps, plus a BLS model's ``depends_on`` parameter."""
    config = _read_config(model_path / "config.pbtxt")
    deps = [step.model_name for step in config.ensemble_scheduling.step]
    extra = config.parameters["depends_on"].string_value if "depends_on" in config.parameters else ""
    deps += [d.strip() for d in extra.split(",") if d.strip()]
    return deps


def frontend_models(models: list[str], repositories: list[Path] | None = None) -> list[str]:
    """``models`` plus the models their configs name in the ``frontend_companions`` parameter:
    models the OpenAI frontend calls itself although the user did not name them (``qwen3_tts``
    names ``qwen3_tts_voice_prompt``, which computes a clone prompt at voice upload). Without
    them, ``serve --models qwen3_tts`` loaded the companion (a dependency) but the frontend,
    told only the named models, answered voice uploads with ``voice_cloning_unavailable``."""
    paths = available_models(repositories)
    out = list(dict.fromkeys(models))
    for model in list(out):
        if model not in paths:
            continue
        config = _read_config(paths[model] / "config.pbtxt")
        extra = config.parameters["frontend_companions"].string_value if "frontend_companions" in config.parameters else ""
        out += [c.strip() for c in extra.split(",") if c.strip() and c.strip() not in out]
    return out


def stream_callees(model: str, loaded: list[str], repositories: list[Path] | None = None) -> list[str]:
    """The loaded decoupled models that BLS model ``model`` calls (its ``depends_on``).

    When ``model``'s stub dies while one of them streams to it, python_backend 2.51 blocks that
    callee's next response forever (the server waits for the dead stub to take it), and with it
    every other request of the callee: ``serve`` restarts these too.
    """
    paths = available_models(repositories)
    if model not in paths:
        return []
    config = _read_config(paths[model] / "config.pbtxt")
    if config.backend != "python" or "depends_on" not in config.parameters:
        return []
    callees = [d.strip() for d in config.parameters["depends_on"].string_value.split(",") if d.strip()]
    return [c for c in callees if c in loaded and c in paths
            and _read_config(paths[c] / "config.pbtxt").model_transaction_policy.decoupled]


def missing_instances(expected: dict[str, int], alive: dict[str, int]) -> list[str]:
    """Models with fewer live stub processes than instances (a model of 4 instances that lost one
    stub is as broken for the requests routed to it as one that lost all)."""
    return [m for m, n in expected.items() if alive.get(m, 0) < n]


def dependents(model: str, loaded: list[str], repositories: list[Path] | None = None) -> list[str]:
    """``model`` and every model of ``loaded`` that needs it, directly or through others
    (ensembles and BLS models whose requests hang when ``model``'s stub dies)."""
    paths = available_models(repositories)
    needs = {m: set(dependencies(paths[m])) for m in loaded if m in paths}
    hit, changed = {model}, True
    while changed:
        changed = False
        for m, deps in needs.items():
            if m not in hit and deps & hit:
                hit.add(m)
                changed = True
    return [m for m in loaded if m in hit] or [model]


def resolve_models(names: list[str], repositories: list[Path] | None = None) -> list[str]:
    """Requested models plus their dependencies, dependencies first.

    Raises:
        KeyError: a name (or a dependency) is not in any model repository.
    """
    models = available_models(repositories)
    order: list[str] = []

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name in order:
            return
        if name not in models:
            known = ", ".join(sorted(models))
            raise KeyError(f"unknown model {name!r}" + (f" (needed by {chain[-1]})" if chain else "")
                           + f"; known models: {known}")
        for dep in dependencies(models[name]):
            if dep not in chain:
                visit(dep, chain + (name,))
        order.append(name)

    for name in names:
        visit(name, ())
    return order


# ---------------------------------------------------------------------------- processes


def _child_setup() -> None:
    """In the child: new process group, and SIGTERM when the launcher dies (Linux prctl)."""
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def stop_process_group(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM a child started with :func:`_child_setup`, wait, then SIGKILL its whole group.

    The group holds everything the child started (Triton stubs, engine workers), so the final
    SIGKILL leaves no orphan even when the child exits before its children do.
    """
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def kill_process_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s whole process group now, without the SIGTERM and wait of
    :func:`stop_process_group` (for a server that is wedged after a fatal signal); the caller
    sees the exit at its next ``poll()``."""
    try:
        os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
    except ProcessLookupError:
        pass


def check_ports_free(ports: dict[str, int]) -> None:
    """Raise :class:`ServerStartError` naming every port (by role) that something already uses.

    Without this check a second server would fail to bind while the launcher's readiness probe
    talked to whatever already listens there.
    """
    import socket

    busy = []
    for role, port in ports.items():
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                busy.append(f"{role} port {port}")
    if busy:
        raise ServerStartError(f"already in use: {', '.join(busy)} (another server running? "
                               "pick other ports with the --*-port options)")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shm_files(pid: int) -> set[str]:
    """Files under /dev/shm that process ``pid`` maps (from /proc/<pid>/maps); empty if gone."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return {line.split(None, 5)[5].strip() for line in maps
                    if " /dev/shm/" in line and len(line.split(None, 5)) == 6}
    except OSError:
        return set()


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
            env=server_env(self.install), preexec_fn=_child_setup,
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
                                   if _read_config(paths[m] / "config.pbtxt").backend == "python"]
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
            config = _read_config(available_models(self.repositories)[model] / "config.pbtxt")
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
            family["shm"].update(_shm_files(stub.pid))  # e.g. vLLM's psm_* message queues
            for d in descendants:
                try:
                    family["children"].add((d.pid, d.create_time()))
                except psutil.Error:
                    continue
                family["shm"].update(_shm_files(d.pid))
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

    def __enter__(self) -> "TritonServer":
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
                                     stdin=subprocess.DEVNULL, preexec_fn=_child_setup,
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


class RestartBackoff:
    """Delay before the next tritonserver restart: ``initial_s`` doubling per consecutive crash up
    to ``max_s``; back to ``initial_s`` once a server has run ``reset_after_s`` without dying.

    ``serve`` never gives up while the user has not stopped it: the delay keeps a server that
    crashes at start-up from spinning the CPU, nothing more.
    """

    def __init__(self, initial_s: float = 1.0, max_s: float = 30.0, reset_after_s: float = 300.0):
        self.initial_s, self.max_s, self.reset_after_s = initial_s, max_s, reset_after_s
        self._next = initial_s

    def delay(self, ran_for_s: float) -> float:
        """Seconds to wait before restarting a server that ran ``ran_for_s`` seconds."""
        if ran_for_s >= self.reset_after_s:
            self._next = self.initial_s
        delay, self._next = self._next, min(self._next * 2, self.max_s)
        return delay


@dataclass
class ServeStatus:
    """What ``serve`` knows about its tritonserver, written as JSON to :attr:`path` after every
    change (atomically: a temporary file renamed) so the OpenAI frontend's ``/health`` can show it
    (the frontend gets the path in ``OMNI_TRITON_SERVE_STATUS``).

    Attributes:
        state: ``starting``, ``ready`` or ``restarting``.
        restarts: tritonserver restarts since ``serve`` started.
        last_crash: ``{"at": unix seconds, "exit_code": int, "reason": str, "log": path}`` of the
            last tritonserver death, or ``None``.
        stub_reloads: model -> times its stub process died and the model was reloaded.
        last_stub_death: ``{"at", "model", "affected": [models whose in-flight requests hang on
            it], "killed_children": [pid], "shm_removed": n}`` or ``None``. The frontend fails
            the in-flight requests of the ``affected`` models when this changes (Triton 2.51
            never completes the requests of a dead stub).
    """

    path: Path
    state: str = "starting"
    restarts: int = 0
    last_crash: dict | None = None
    stub_reloads: dict = field(default_factory=dict)
    last_stub_death: dict | None = None

    def write(self, **changes) -> None:
        import json

        for key, value in changes.items():
            setattr(self, key, value)
        data = {k: getattr(self, k) for k in ("state", "restarts", "last_crash", "stub_reloads",
                                               "last_stub_death")}
        data["updated_at"] = time.time()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.path)


def crash_reason(log_text: str, exit_code: int | None) -> str:
    """A one-line reason for a tritonserver death: its ``Signal (N) received.`` line, else the
    signal name of a negative exit code, else the exit code."""
    for line in log_text.splitlines():
        if re.search(r"Signal \(\d+\) received", line):
            return line.strip()
    if exit_code is not None and exit_code < 0:
        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            pass
    return f"exited with code {exit_code}"

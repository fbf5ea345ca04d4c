"""The footprint of a served stack (issue 28 item 5): memory, load times, idle CPU, first serve.

Run (under the lock that every tritonserver on the shared machine takes)::

    flock /tmp/omni-server.lock .venv/bin/python -m clients.bench_footprint --models piper,csm \\
        --out footprint.json
    .venv/bin/python -m clients.bench_footprint --attach SERVE_PID --out footprint.json
    flock /tmp/omni-server.lock .venv/bin/python -m clients.bench_footprint --write-pss-mib  # all default pipelines

What it measures, each section of the JSON (docs/benchmarks.md "Footprint" lists the fields):

- ``stack``: ``omni-triton serve --models ...`` started on free ports with its own log folder
  (or a running one, ``--attach PID``), then, with no request in flight, the proportional set
  size (PSS, ``Pss:`` of ``/proc/PID/smaps_rollup`` through psutil) of every process of the
  stack: per Triton model (the sum over its stub processes and all their descendants, e.g. vLLM's
  EngineCore), per part (``serve``, ``tritonserver``, ``frontend``, ``other``) and in total.
- ``idle_cpu``: CPU seconds (utime + stime of ``/proc/PID/stat``, through psutil) each process
  of the stack used over ``--idle-s`` seconds (default 60) with no request, as a percentage of
  one core, per process, per model/part and in total.
- ``load``: for each pipeline, on a bare tritonserver (no ``serve`` supervisor, which would load
  again what the bench unloads), cold and one at a time: the time from the first repository-API
  load (with the admin key) to the last model of its closure READY, loading the closure
  (:func:`pipeline_closure`) dependencies first, one model after the other; then its PSS alone.
- ``first_request``: the latency of a first request through the frontend to a pipeline that is
  not loaded (on-demand loading, issue 28 item 2: ``serve --on-demand``); ``null`` with a
  reason while ``omni-triton serve`` has no ``--on-demand``.
- ``fresh_clone`` (opt-in, ``--fresh-clone``): ``git clone`` of this checkout into a temporary
  folder, ``bash scripts/serve.sh`` there with an empty ``OMNI_TRITON_CACHE`` (or
  ``--clone-cache DIR``), and the seconds to READY (the frontend's ``/health``) and to a first
  answer.

``--write-pss-mib`` writes each model's measured PSS (MiB, rounded up) into its ``config.pbtxt``
as the parameter ``pss_mib`` (the memory budget of on-demand loading reads it), with a comment
that says when and on what machine it was measured. Timings on a shared machine are indicative;
PSS is not affected by other processes' load (it is affected by what other processes map:
libraries shared with them are divided among them).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from clients.bench_common import git_commit, machine_info, package_versions
from omni_triton.cli import PIPELINES

ROOT = Path(__file__).resolve().parent.parent

#: the default stack: every pipeline a user can call (what serve offers: omni_triton.cli.PIPELINES)
DEFAULT_PIPELINES = PIPELINES
STUB = "triton_python_backend_stub"
#: the parts of a stack that are not a model's stubs
PARTS = ("serve", "tritonserver", "frontend", "other")
#: the comment line --write-pss-mib puts above the parameter (found again by the next write)
PSS_COMMENT = "# pss_mib: written by clients/bench_footprint.py"
_PSS_BLOCK = re.compile(r"(?m)^# pss_mib: .*\n(?:#.*\n)*parameters[^\n]*\"pss_mib\"[^\n]*\n?")

#: a small first request per pipeline, through the frontend: (path, JSON body)
FIRST_REQUESTS: dict[str, tuple[str, dict]] = {
    "piper": ("/v1/audio/speech", {"model": "piper_tts", "voice": "joe", "input": "Hello.",
                                   "response_format": "wav"}),
    "llm": ("/v1/chat/completions", {"model": "llm", "max_tokens": 4,
                                     "messages": [{"role": "user", "content": "Hi"}]}),
    "qwen_image": ("/v1/images/generations", {"model": "qwen_image", "prompt": "a fox",
                                              "size": "64x64", "num_inference_steps": 2}),
}


# ------------------------------------------------------------------------- processes and PSS


@dataclass
class Proc:
    """One process of the stack at one instant.

    Attributes:
        pid: process id; ``created``: its start time (psutil, seconds since the epoch), which
            with ``pid`` names it across samples (a reused pid is another process).
        group: ``model:<name>`` for a stub and its descendants, else one of :data:`PARTS`.
        name: the process name (``comm``).
        pss_kib: proportional set size in KiB (None when unreadable: gone, or not ours).
        cpu_s: user + system CPU seconds since it started (utime + stime).
    """

    pid: int
    created: float
    group: str
    name: str
    pss_kib: int | None
    cpu_s: float | None


def stub_model(cmdline: Sequence[str]) -> str | None:
    """The Triton model a Python-backend stub serves, from its argv
    (``stub <repo>/<model>/<version>/model.py <shm region> ...``); None for another process."""
    if len(cmdline) > 2 and cmdline[0].endswith(STUB):
        return Path(cmdline[1]).parent.parent.name
    return None


def _read(proc: psutil.Process) -> tuple[int | None, float | None]:
    try:
        pss: int | None = proc.memory_full_info().pss // 1024
    except (psutil.AccessDenied, psutil.ZombieProcess, psutil.NoSuchProcess, OSError):
        pss = None
    try:
        times = proc.cpu_times()
        cpu: float | None = times.user + times.system
    except (psutil.AccessDenied, psutil.ZombieProcess, psutil.NoSuchProcess, OSError):
        cpu = None
    return pss, cpu


def _describe(proc: psutil.Process, group: str) -> Proc | None:
    try:
        pid, created, name = proc.pid, proc.create_time(), proc.name()
    except psutil.Error:
        return None
    pss, cpu = _read(proc)
    return Proc(pid, created, group, name, pss, cpu)


def stack_processes(serve_pid: int) -> list[Proc]:
    """Every process of the stack rooted at ``serve_pid`` (``omni-triton serve``), classified.

    ``serve``: the root; ``tritonserver``: its tritonserver child; ``model:<m>``: each stub of
    tritonserver and all the stub's descendants; ``frontend``: the ``openai_frontend`` child and
    its descendants; ``other``: anything else under the root. Reads through psutil, so tests point
    ``psutil.PROCFS_PATH`` at a fake ``/proc``.

    Raises:
        psutil.NoSuchProcess: ``serve_pid`` does not exist.
    """
    root = psutil.Process(serve_pid)
    out: list[Proc] = []
    seen: set[int] = set()

    def add(proc: psutil.Process, group: str, with_descendants: bool) -> None:
        family = [proc]
        if with_descendants:
            try:
                family += proc.children(recursive=True)
            except psutil.Error:
                pass
        for p in family:
            if p.pid in seen:
                continue
            seen.add(p.pid)
            d = _describe(p, group)
            if d is not None:
                out.append(d)

    add(root, "serve", False)
    for child in root.children():
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if child.name() == "tritonserver" or (cmd and Path(cmd[0]).name == "tritonserver"):
            add(child, "tritonserver", False)
            for grand in child.children():
                try:
                    model = stub_model(grand.cmdline())
                except psutil.Error:
                    continue
                add(grand, f"model:{model}" if model else "other", True)
            add(child, "other", True)  # what is left under it (nothing but stubs, so far)
        elif "openai_frontend" in cmd:
            add(child, "frontend", True)
    add(root, "other", True)
    return out


def kib_to_mib(kib: float) -> int:
    """KiB -> MiB rounded up (a budget must not under-count)."""
    return math.ceil(kib / 1024)


def memory_table(procs: Iterable[Proc]) -> dict:
    """PSS of a stack: ``{"models": {model: {"pss_mib", "processes", "pids"}}, "parts":
    {part: {...}}, "total_pss_mib", "processes", "unreadable_pids"}`` (MiB rounded up from the
    KiB sums; a process whose PSS could not be read counts 0 and is listed)."""
    models: dict[str, dict] = {}
    parts: dict[str, dict] = {p: {"pss_kib": 0, "processes": 0, "pids": []} for p in PARTS}
    total, n, unreadable = 0, 0, []
    for p in procs:
        n += 1
        if p.group.startswith("model:"):
            entry = models.setdefault(p.group[len("model:"):], {"pss_kib": 0, "processes": 0, "pids": []})
        else:
            entry = parts[p.group]
        entry["processes"] += 1
        entry["pids"].append(p.pid)
        if p.pss_kib is None:
            unreadable.append(p.pid)
            continue
        entry["pss_kib"] += p.pss_kib
        total += p.pss_kib

    def fmt(entry: dict) -> dict:
        return {"pss_mib": kib_to_mib(entry["pss_kib"]), "processes": entry["processes"],
                "pids": entry["pids"]}

    return {"models": {m: fmt(e) for m, e in sorted(models.items())},
            "parts": {p: fmt(e) for p, e in parts.items()},
            "total_pss_mib": kib_to_mib(total), "processes": n, "unreadable_pids": unreadable}


def cpu_deltas(before: Iterable[Proc], after: Iterable[Proc], interval_s: float) -> dict:
    """Idle CPU between two samples of the same stack.

    Processes are matched by (pid, start time); one present in a single sample is listed under
    ``"started"`` or ``"ended"`` and not counted (its CPU over the interval is unknown).

    Returns:
        ``{"interval_s", "total_core_pct", "groups": {group: core_pct}, "processes": [{"pid",
        "name", "group", "cpu_s", "core_pct"}] (busiest first), "started": [pid], "ended": [pid]}``;
        ``core_pct`` = CPU seconds / ``interval_s`` * 100 (100 = one core busy all the time).

    Raises:
        ValueError: ``interval_s`` is not positive.
    """
    if interval_s <= 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s}")
    b = {(p.pid, p.created): p for p in before}
    a = {(p.pid, p.created): p for p in after}
    rows, groups, total = [], {}, 0.0
    for key, p in a.items():
        q = b.get(key)
        if q is None or p.cpu_s is None or q.cpu_s is None:
            continue
        used = max(0.0, p.cpu_s - q.cpu_s)
        total += used
        groups[p.group] = groups.get(p.group, 0.0) + used
        rows.append({"pid": p.pid, "name": p.name, "group": p.group, "cpu_s": round(used, 3),
                     "core_pct": round(100 * used / interval_s, 3)})
    rows.sort(key=lambda r: -r["cpu_s"])
    return {"interval_s": round(interval_s, 3), "total_core_pct": round(100 * total / interval_s, 3),
            "groups": {g: round(100 * s / interval_s, 3) for g, s in sorted(groups.items())},
            "processes": rows,
            "started": sorted(k[0] for k in a if k not in b), "ended": sorted(k[0] for k in b if k not in a)}


# ---------------------------------------------------------------------------- pss_mib writes


def set_pss_mib(config_text: str, mib: int, note: str) -> str:
    """``config_text`` (a ``config.pbtxt``) with its ``pss_mib`` parameter set to ``mib``, under
    comment lines: :data:`PSS_COMMENT` + the first line of ``note``, then its other lines. The
    block an earlier write left (:data:`PSS_COMMENT` line(s) + the parameter line) is replaced,
    else one is appended at the end.

    Raises:
        ValueError: ``mib`` is not a positive integer, or the text already names ``pss_mib``
            in a form this function did not write (it would be duplicated).
    """
    if not isinstance(mib, int) or mib < 1:
        raise ValueError(f"pss_mib must be a positive integer, got {mib!r}")
    first, *more = note.splitlines() or [""]
    block = (f"{PSS_COMMENT} {first}\n" + "".join(f"# {line}\n" for line in more)
             + "# (the PSS of all this model's stub processes and their children, MiB rounded up;\n"
             "#  the memory budget of on-demand loading reads it)\n"
             f'parameters: {{ key: "pss_mib" value: {{ string_value: "{mib}" }} }}\n')
    text, n = _PSS_BLOCK.subn(lambda _m: block, config_text, count=1)
    if n:
        return text
    if '"pss_mib"' in config_text:
        raise ValueError("config.pbtxt names pss_mib outside a block written by bench_footprint")
    return config_text.rstrip("\n") + "\n\n" + block


def model_pss_mib_of(config_text: str) -> int | None:
    """The ``pss_mib`` parameter of a ``config.pbtxt`` text, parsed as Triton parses it (protobuf
    text format); None when absent or not a positive decimal integer.

    Raises:
        google.protobuf.text_format.ParseError: the text is not a model config.
    """
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse(config_text, model_config_pb2.ModelConfig())
    value = config.parameters["pss_mib"].string_value if "pss_mib" in config.parameters else ""
    return int(value) if value.isdecimal() and int(value) > 0 else None


def write_pss_mib(models: dict[str, dict], paths: dict[str, Path], note: str) -> list[str]:
    """Write ``models[m]["pss_mib"]`` into the ``config.pbtxt`` of each model in ``paths``
    (:func:`set_pss_mib`); returns the models written. Models with no path are skipped."""
    written = []
    for model, entry in sorted(models.items()):
        if model not in paths or not entry.get("pss_mib"):
            continue
        config = paths[model] / "config.pbtxt"
        config.write_text(set_pss_mib(config.read_text(), int(entry["pss_mib"]), note))
        written.append(model)
    return written


def machine_note(info: dict | None = None) -> str:
    """``on <date UTC> on <cpu model>, <n> cores, <GiB> GiB RAM`` for the pss_mib comment."""
    info = info or machine_info()
    gib = round(psutil.virtual_memory().total / 2**30)
    return (f"on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d} on {info.get('cpu_model') or 'an unknown CPU'}, "
            f"{info.get('cpu_count')} cores, {gib} GiB RAM")


# ------------------------------------------------------------------------------ the stack


def pipeline_closure(pipeline: str, repositories: list[Path] | None = None) -> list[str]:
    """The models a pipeline loads as a unit, dependencies first: the pipeline, its frontend
    companions (:func:`omni_triton.serve.repository.frontend_models`) and all they need
    (:func:`omni_triton.serve.repository.resolve_models`).

    Raises:
        KeyError: an unknown pipeline or dependency.
    """
    from omni_triton.serve.repository import frontend_models, resolve_models, triton_name

    return resolve_models(frontend_models([triton_name(pipeline, repositories)], repositories), repositories)


def serve_supports(flag: str, python: str = sys.executable, cwd: Path = ROOT) -> bool:
    """Whether ``omni-triton serve --help`` of this checkout lists ``flag``."""
    out = subprocess.run([python, "-m", "omni_triton", "serve", "--help"], cwd=cwd,
                         capture_output=True, text=True, timeout=120)
    return flag in out.stdout


@dataclass
class Serve:
    """``omni-triton serve`` started by the bench (or a command that execs it: serve.sh)."""

    cmd: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = ROOT
    proc: subprocess.Popen | None = None
    url: str = ""

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd,
                                     stdin=subprocess.DEVNULL, env={**os.environ, **self.env},
                                     start_new_session=True)
        log.close()

    def wait_health(self, timeout_s: float) -> float:
        """Seconds until the frontend's /health answers 200.

        Raises:
            RuntimeError: serve exited or did not get healthy in time (with its log's tail).
        """
        assert self.proc is not None
        t0 = time.monotonic()
        # one client for all polls: a new httpx client per poll builds an SSL context each time
        # (~10% of a core at two polls a second, measured here), taken from the stack it waits for
        with httpx.Client(timeout=2, trust_env=False) as client:
            while time.monotonic() - t0 < timeout_s:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"serve exited ({self.proc.returncode}):\n{self.log_tail()}")
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return time.monotonic() - t0
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        raise RuntimeError(f"serve not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM serve (it stops its process groups), SIGKILL its session after 90 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def serve_args(models: str, ports: dict[str, int], extra: Sequence[str] = (),
               ready_timeout_s: float = 900) -> list[str]:
    """``omni-triton serve`` options: ``models`` on the given ports (keys frontend, http, grpc,
    metrics), Triton's READY within ``ready_timeout_s`` (serve's own default, 600 s, is too short
    for the whole default stack on a loaded 2-core machine), then ``extra``."""
    return ["--models", models, "--port", str(ports["frontend"]), "--triton-http-port", str(ports["http"]),
            "--triton-grpc-port", str(ports["grpc"]), "--triton-metrics-port", str(ports["metrics"]),
            "--ready-timeout", str(ready_timeout_s), *extra]


def serve_command(models: str, ports: dict[str, int], python: str = sys.executable,
                  extra: Sequence[str] = (), ready_timeout_s: float = 900) -> list[str]:
    """``python -m omni_triton serve --skip-prepare`` + :func:`serve_args` (the bench runs from a
    set-up checkout: scripts/setup.sh prepared the models)."""
    return [python, "-m", "omni_triton", "serve", "--skip-prepare", *serve_args(models, ports, extra, ready_timeout_s)]


def free_ports() -> dict[str, int]:
    """Four distinct free TCP ports: frontend, http, grpc, metrics."""
    from omni_triton.serve.process import free_port

    ports: dict[str, int] = {}
    while len(set(ports.values())) < 4:
        ports = {k: free_port() for k in ("frontend", "http", "grpc", "metrics")}
    return ports


def first_request(url: str, pipeline: str, timeout_s: float = 600) -> dict:
    """Time one request of :data:`FIRST_REQUESTS` to ``pipeline`` through the frontend at ``url``.

    Returns:
        ``{"pipeline", "latency_s", "status"}`` (``latency_s`` None and ``error`` set when it failed).
    """
    path, body = FIRST_REQUESTS[pipeline]
    t0 = time.monotonic()
    try:
        r = httpx.post(url + path, json=body, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return {"pipeline": pipeline, "latency_s": None, "status": None, "error": str(exc)}
    took = time.monotonic() - t0
    ok = r.status_code == 200
    return {"pipeline": pipeline, "latency_s": round(took, 3) if ok else None, "status": r.status_code,
            **({} if ok else {"error": r.text[:300]})}


# ------------------------------------------------------------------------------ load times


class BareTriton:
    """A tritonserver with no model and no supervisor, on free ports, for cold load timings."""

    def __init__(self, log_dir: Path):
        from omni_triton.serve.process import free_port
        from omni_triton.serve.server import TritonServer

        self.server = TritonServer([], http_port=free_port(), grpc_port=free_port(),
                                   metrics_port=free_port(), log_path=log_dir / "load-tritonserver.log")

    def __enter__(self) -> BareTriton:
        self.server.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()

    def _post(self, model: str, action: str) -> httpx.Response:
        return httpx.post(f"{self.server.http_url}/v2/repository/models/{model}/{action}",
                          timeout=900, headers=self.server.admin_headers)

    def load(self, models: Sequence[str]) -> dict:
        """Load ``models`` one after the other (each call returns when Triton has it READY or
        failed); ``{"seconds", "models": {m: s}, "error"}``."""
        per, error = {}, None
        t0 = time.monotonic()
        for m in models:
            t = time.monotonic()
            r = self._post(m, "load")
            per[m] = round(time.monotonic() - t, 3)
            if r.status_code != 200:
                error = f"{m}: {r.text[:500]}"
                break
        return {"seconds": round(time.monotonic() - t0, 3), "models": per, "error": error}

    def unload_all(self, models: Sequence[str], timeout_s: float = 120) -> None:
        """Unload ``models`` (dependents first) and wait until no stub process is left."""
        for m in reversed(list(models)):
            self._post(m, "unload")
        assert self.server.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                kids = psutil.Process(self.server.proc.pid).children(recursive=True)
            except psutil.Error:
                return
            if not kids:
                return
            time.sleep(0.5)

    def closure_pss(self) -> dict:
        """PSS of the models now loaded (:func:`memory_table` of tritonserver's stubs)."""
        assert self.server.proc is not None
        procs = []
        for stub in psutil.Process(self.server.proc.pid).children():
            try:
                model = stub_model(stub.cmdline())
                family = [stub, *stub.children(recursive=True)]
            except psutil.Error:
                continue
            for p in family:
                d = _describe(p, f"model:{model}" if model else "other")
                if d is not None:
                    procs.append(d)
        return memory_table(procs)


def load_times(pipelines: Sequence[str], log_dir: Path, ready_s: Callable[[], float] | None = None) -> dict:
    """Cold load time of each pipeline's closure, one pipeline at a time on a :class:`BareTriton`
    (nothing else loaded), and its PSS alone; ``{pipeline: {"models", "seconds", "per_model_s",
    "pss_alone_mib", "error"}}``."""
    out = {}
    with BareTriton(log_dir) as bare:
        for p in pipelines:
            closure = pipeline_closure(p)
            res = bare.load(closure)
            pss = bare.closure_pss() if res["error"] is None else None
            out[p] = {"models": closure, "seconds": res["seconds"] if res["error"] is None else None,
                      "per_model_s": res["models"], "error": res["error"],
                      "pss_alone_mib": pss["total_pss_mib"] if pss else None}
            print(f"footprint: {p} loads cold in {res['seconds']:.1f} s"
                  + (f" (FAILED: {res['error'][:200]})" if res["error"] else ""), flush=True)
            bare.unload_all(closure)
    return out


# ------------------------------------------------------------------------------ fresh clone


def fresh_clone(models: str, cache: Path | None, log_dir: Path, timeout_s: float) -> dict:
    """``git clone`` of this checkout (its HEAD) into a temporary folder, ``bash scripts/serve.sh``
    there with ``OMNI_TRITON_CACHE`` = ``cache`` (default an empty temporary folder), the
    seconds to READY (frontend /health) and to a first answer; everything temporary is removed."""
    tmp = Path(tempfile.mkdtemp(prefix="omni-footprint-clone-"))
    empty_cache = cache is None
    cache = cache or tmp / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    ports = free_ports()
    pick = next((p for p in models.split(",") if p in FIRST_REQUESTS), None)
    result: dict = {"cache": "empty" if empty_cache else str(cache), "models": models,
                    "ready_s": None, "first_answer_s": None, "first_answer": None, "error": None}
    from omni_triton import triton_admin

    t0 = time.monotonic()
    serve = None
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(tmp / "omni-triton")], check=True, timeout=300)
        result["clone_s"] = round(time.monotonic() - t0, 3)
        # serve.sh sets up and prepares
        cmd = ["bash", "scripts/serve.sh", *serve_args(models, ports, ready_timeout_s=timeout_s)]
        serve = Serve(cmd, log_dir / "fresh-clone-serve.log", cwd=tmp / "omni-triton",
                      env={"OMNI_TRITON_CACHE": str(cache), triton_admin.ENV: triton_admin.new_key()},
                      url=f"http://127.0.0.1:{ports['frontend']}")
        serve.start()
        serve.wait_health(timeout_s)
        result["ready_s"] = round(time.monotonic() - t0, 3)
        if pick:
            result["first_answer"] = first_request(serve.url, pick)
            if result["first_answer"]["latency_s"] is not None:
                result["first_answer_s"] = round(time.monotonic() - t0, 3)
    except (RuntimeError, subprocess.SubprocessError) as exc:
        result["error"] = str(exc)[-2000:]
    finally:
        if serve is not None:
            serve.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return result


# ------------------------------------------------------------------------------------ main


def attach_info(serve_pid: int) -> dict:
    """The frontend URL of a running ``omni-triton serve`` (from its frontend child's argv)."""
    for child in psutil.Process(serve_pid).children():
        cmd = child.cmdline()
        if "openai_frontend" in cmd and "--port" in cmd:
            return {"url": f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}"}
    return {"url": None}


def measure_stack(serve_pid: int, idle_s: float) -> tuple[dict, dict]:
    """(:func:`memory_table`, :func:`cpu_deltas` over ``idle_s``) of the running stack."""
    before = stack_processes(serve_pid)
    t0 = time.monotonic()
    time.sleep(idle_s)
    after = stack_processes(serve_pid)
    return memory_table(after), cpu_deltas(before, after, time.monotonic() - t0)


def report(args: argparse.Namespace, **sections) -> dict:
    """The JSON document: run metadata + the measured sections (each None when not measured)."""
    return {
        "bench": "footprint",
        "commit": git_commit(),
        "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": package_versions(["psutil", "tritonclient"]),
        "pipelines": args.models.split(","),
        "notes": "PSS from /proc/PID/smaps_rollup; CPU from utime+stime; timings indicative on a shared machine",
        **{k: sections.get(k) for k in ("stack", "idle_cpu", "load", "first_request", "fresh_clone",
                                        "pss_mib_written")},
    }


def on_demand_state(url: str, model_id: str) -> str | None:
    """The ``state`` (loaded, loading, unloaded, failed) the frontend's ``/v1/models`` gives
    ``model_id``; None when it lists no state for it (a frontend without on-demand loading)."""
    try:
        data = httpx.get(f"{url}/v1/models", timeout=10).json().get("data", [])
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return next((m.get("state") for m in data if isinstance(m, dict) and m.get("id") == model_id), None)


def first_requests(pipelines: Sequence[str], log_dir: Path, timeout_s: float) -> dict:
    """Latency of a first request to each pipeline while it is not loaded (serve ``--on-demand``,
    pinned: another small pipeline), or ``{"supported": False, "reason"}``."""
    if not serve_supports("--on-demand"):
        return {"supported": False, "reason": "omni-triton serve has no --on-demand yet "
                                              "(on-demand loading: issue 28 item 2)"}
    out: dict = {"supported": True, "pipelines": {}}
    for p in pipelines:
        if p not in FIRST_REQUESTS:
            out["pipelines"][p] = {"latency_s": None, "reason": "no first request defined in this bench"}
            continue
        pinned = "piper" if p != "piper" else "llm"
        ports = free_ports()
        serve = Serve(serve_command(pinned, ports, extra=["--on-demand", p, "--keep-alive", "-1"],
                                    ready_timeout_s=timeout_s),
                      log_dir / f"first-request-{p}-serve.log", url=f"http://127.0.0.1:{ports['frontend']}")
        try:
            serve.start()
            serve.wait_health(timeout_s)
            listed = on_demand_state(serve.url, FIRST_REQUESTS[p][1]["model"])
            if listed is None:
                out["pipelines"][p] = {"latency_s": None, "reason": "serve has --on-demand but the frontend's "
                                       "/v1/models gives no state for the pipeline: no on-demand loading yet"}
            else:
                out["pipelines"][p] = {**first_request(serve.url, p), "state_before": listed}
        except RuntimeError as exc:
            out["pipelines"][p] = {"latency_s": None, "error": str(exc)[-1000:]}
        finally:
            serve.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=DEFAULT_PIPELINES, help="pipelines to serve (comma separated)")
    ap.add_argument("--attach", type=int, default=None, metavar="SERVE_PID",
                    help="measure a running `omni-triton serve` (memory and idle CPU only)")
    ap.add_argument("--idle-s", type=float, default=60.0, help="idle CPU window (s)")
    ap.add_argument("--ready-timeout", type=float, default=1800.0,
                    help="seconds for a started serve to get READY (the whole default stack took over 600 s here)")
    ap.add_argument("--no-stack", action="store_true",
                    help="skip the served stack (memory, idle CPU): e.g. load times only, in a shorter locked run")
    ap.add_argument("--no-load-times", action="store_true", help="skip the cold load of each pipeline")
    ap.add_argument("--no-first-request", action="store_true")
    ap.add_argument("--fresh-clone", action="store_true",
                    help="also time a fresh clone's scripts/serve.sh to READY and a first answer")
    ap.add_argument("--clone-cache", type=Path, default=None,
                    help="OMNI_TRITON_CACHE of the fresh clone (default: an empty temporary folder)")
    ap.add_argument("--write-pss-mib", action="store_true",
                    help="write each model's PSS into its config.pbtxt (parameter pss_mib)")
    ap.add_argument("--log-dir", type=Path, default=None, help="default: a new folder in the cache's logs/")
    ap.add_argument("--out", type=Path, default=Path("bench_footprint.json"))
    args = ap.parse_args(argv)
    if args.write_pss_mib and args.no_stack:
        ap.error("--write-pss-mib writes what the stack measures: not with --no-stack")
    from omni_triton import triton_admin
    from omni_triton.paths import cache_dir
    from omni_triton.serve.repository import available_models

    log_dir = args.log_dir or cache_dir() / "logs" / f"footprint-{dt.datetime.now():%Y%m%d-%H%M%S}"
    log_dir.mkdir(parents=True, exist_ok=True)
    pipelines = [p.strip() for p in args.models.split(",") if p.strip()]
    sections: dict = {}
    if args.attach is not None:
        memory, idle = measure_stack(args.attach, args.idle_s)
        sections.update(stack={"attached": True, "serve_pid": args.attach, **memory}, idle_cpu=idle,
                        load={"skipped": "attach mode: the bench does not unload a running server's models"})
    elif not args.no_stack:
        ports = free_ports()
        serve = Serve(serve_command(args.models, ports, ready_timeout_s=args.ready_timeout), log_dir / "serve.log",
                      env={triton_admin.ENV: triton_admin.new_key()}, url=f"http://127.0.0.1:{ports['frontend']}")
        print(f"footprint: starting serve --models {args.models} (log: {serve.log_path})", flush=True)
        try:
            serve.start()
            ready_s = serve.wait_health(args.ready_timeout)
            assert serve.proc is not None
            print(f"footprint: READY in {ready_s:.1f} s; idle for {args.idle_s:.0f} s", flush=True)
            memory, idle = measure_stack(serve.proc.pid, args.idle_s)
            sections.update(stack={"attached": False, "ready_s": round(ready_s, 3), **memory}, idle_cpu=idle)
        finally:
            serve.stop()
    if args.attach is None and not args.no_load_times:
        sections["load"] = load_times(pipelines, log_dir)
    if not args.no_first_request:
        sections["first_request"] = first_requests(pipelines, log_dir, args.ready_timeout)
    if args.fresh_clone:
        sections["fresh_clone"] = fresh_clone(args.models, args.clone_cache, log_dir, args.ready_timeout)
    if args.write_pss_mib:
        note = f"{machine_note()},\nin the stack --models {args.models}"
        sections["pss_mib_written"] = write_pss_mib(sections["stack"]["models"], available_models(), note)
    doc = report(args, **sections)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out} (logs: {log_dir})")
    stack = doc["stack"]
    if stack is None:
        return 0
    print(f"{'model':28s} {'PSS MiB':>8s} {'procs':>5s}")
    for name, e in [*stack["models"].items(), *[(f"[{k}]", v) for k, v in stack["parts"].items()]]:
        print(f"{name:28s} {e['pss_mib']:8d} {e['processes']:5d}")
    print(f"{'total':28s} {stack['total_pss_mib']:8d} {stack['processes']:5d}")
    print(f"idle CPU: {doc['idle_cpu']['total_core_pct']:.2f}% of one core over {doc['idle_cpu']['interval_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

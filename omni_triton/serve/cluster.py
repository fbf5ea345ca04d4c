"""``omni-triton cluster``: the scale-out set-up on one machine (docs/scaling.md "Try it on one machine").

What it runs, each as a child process in its own process group:

- a PostgreSQL server of its own (:class:`~omni_triton.serve.postgres.LocalPostgres`; none with
  ``--database-url``): the frontends' video jobs, voices and consents;
- ``--replicas N`` Triton replicas, each an ``omni-triton serve --no-frontend`` (which restarts its
  tritonserver when it dies) with its own ports and model set, all with one admin key;
- ``--frontends M`` OpenAI frontends (``python -m openai_frontend``) on ports ``--port``,
  ``--port``+1, ..., each given every replica's gRPC URL (``--triton-url a,b``), the database URL
  and one shared media folder (``--media-url file://<cache>/cluster/media``).

:class:`Cluster` is what both the command and tests/e2e/test_scaleout.py use: start, stop and
``kill -9`` each piece on its own (:meth:`Cluster.kill_replica`, :meth:`Cluster.kill_frontend`,
...), so the test exercises the code path a user runs. :func:`plan` turns the command's arguments
into a :class:`ClusterPlan` (ports, models, flags) without starting anything.
"""
from __future__ import annotations

import argparse
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from omni_triton import triton_admin
from omni_triton.paths import cache_dir
from omni_triton.serve.postgres import LocalPostgres
from omni_triton.serve.process import (
    ServerStartError,
    check_ports_free,
    child_setup,
    kill_process_group,
    open_run_log,
    stop_on_signals,
    stop_process_group,
)
from omni_triton.serve.server import Frontend

#: Triton ports per replica: HTTP, gRPC, metrics (replica i uses base + 3 i, + 1, + 2: replica 0
#: on serve's defaults 8000-8002)
PORTS_PER_REPLICA = 3
#: the frontends' environment variable of the database URL (``openai_frontend.db``'s default for
#: ``--database-url``; not imported: serve does not import the frontend)
DATABASE_URL_ENV = "OMNI_TRITON_DATABASE_URL"
#: PostgreSQL's default port here: not 5432, which a system cluster may hold
POSTGRES_PORT = 55432


@dataclass
class ReplicaPlan:
    """One Triton replica: its models and ports (``omni-triton serve --no-frontend``)."""

    index: int
    models: list[str]
    http_port: int
    grpc_port: int
    metrics_port: int
    host: str = "127.0.0.1"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"


@dataclass
class ClusterPlan:
    """Everything :class:`Cluster` starts, decided before anything starts.

    Attributes:
        replicas: the Triton replicas.
        frontend_ports: one frontend per port.
        frontend_models: the models every frontend serves (union of the replicas' models and
            their frontend companions).
        run_dir: logs (``logs/``), per-frontend storage folders; the media folder is under it
            unless ``media_url`` says otherwise.
        media_url: the frontends' ``--media-url`` (None: none given, each frontend's own folders).
        database_url: ``--database-url`` given by the user, or None (a :class:`LocalPostgres`).
        postgres_dir, postgres_port: the local PostgreSQL's data folder and port.
        frontend_args: more ``python -m openai_frontend`` flags (every frontend).
        frontend_env: more environment variables for every frontend.
        skip_prepare: do not write the model folders first.
    """

    replicas: list[ReplicaPlan]
    frontend_ports: list[int]
    frontend_models: list[str]
    run_dir: Path
    media_url: str | None
    database_url: str | None = None
    postgres_dir: Path | None = None
    postgres_port: int = POSTGRES_PORT
    frontend_args: list[str] = field(default_factory=list)
    frontend_env: dict[str, str] = field(default_factory=dict)
    skip_prepare: bool = False
    frontend_host: str = "127.0.0.1"

    @property
    def triton_urls(self) -> str:
        """The frontends' ``--triton-url``: every replica's gRPC address, comma separated."""
        return ",".join(r.grpc_url for r in self.replicas)

    def ports(self) -> dict[str, int]:
        """Every port this plan listens on, by role (:func:`check_ports_free`'s argument)."""
        out = {}
        for r in self.replicas:
            out |= {f"replica {r.index} Triton HTTP": r.http_port, f"replica {r.index} Triton gRPC": r.grpc_port,
                    f"replica {r.index} Triton metrics": r.metrics_port}
        out |= {f"frontend {i}": port for i, port in enumerate(self.frontend_ports)}
        if self.database_url is None:
            out["PostgreSQL"] = self.postgres_port
        return out

    def frontend_command_args(self, index: int) -> list[str]:
        """The flags of frontend ``index`` besides ``--triton-url/--host/--port/--models`` (which
        :class:`~omni_triton.serve.server.Frontend` adds). The database URL is not among them: it
        holds a password, and argv shows in ``ps``; it travels in the frontend's environment
        (:data:`DATABASE_URL_ENV`)."""
        storage = self.run_dir / f"frontend-{index}"
        return ["--on-demand", "none", *(["--media-url", self.media_url] if self.media_url else []),
                "--video-storage-dir", str(storage / "videos"), "--voice-storage-dir", str(storage / "voices"),
                *self.frontend_args]


def default_postgres_dir() -> Path:
    """``<cache>/cluster/postgres``; as root ``~postgres/omni-triton-cluster`` (PostgreSQL runs as
    the ``postgres`` user then, which cannot enter root's home)."""
    if os.geteuid() == 0:
        return Path(pwd.getpwnam("postgres").pw_dir) / "omni-triton-cluster"
    return cache_dir() / "cluster" / "postgres"


def plan(args: argparse.Namespace) -> ClusterPlan:
    """The :class:`ClusterPlan` of ``omni-triton cluster``'s arguments.

    Raises:
        ValueError: ``--replica-models`` does not name one set per replica, fewer than one
            replica or frontend, or a model set is empty.
    """
    from omni_triton.serve.repository import frontend_models

    if args.replicas < 1 or args.frontends < 1:
        raise ValueError("--replicas and --frontends need at least 1")
    if args.replica_models:
        sets = [[m.strip() for m in part.split(",") if m.strip()] for part in args.replica_models.split(";")]
        if len(sets) != args.replicas:
            raise ValueError(f"--replica-models names {len(sets)} model sets for {args.replicas} replicas "
                             "(one per replica, separated by ';')")
    else:
        sets = [[m.strip() for m in args.models.split(",") if m.strip()] for _ in range(args.replicas)]
    if any(not s for s in sets):
        raise ValueError("every replica needs at least one model")
    replicas = [ReplicaPlan(i, models, args.triton_port + PORTS_PER_REPLICA * i,
                            args.triton_port + PORTS_PER_REPLICA * i + 1,
                            args.triton_port + PORTS_PER_REPLICA * i + 2) for i, models in enumerate(sets)]
    union = list(dict.fromkeys(m for s in sets for m in s))
    run_dir = Path(args.run_dir) if args.run_dir else cache_dir() / "cluster"
    return ClusterPlan(
        replicas=replicas,
        frontend_ports=[args.port + i for i in range(args.frontends)],
        frontend_models=frontend_models(union),
        run_dir=run_dir,
        media_url=args.media_url or f"file://{run_dir / 'media'}",
        database_url=args.database_url,
        postgres_dir=Path(args.postgres_dir) if args.postgres_dir else default_postgres_dir(),
        postgres_port=args.postgres_port,
        frontend_args=list(args.frontend_arg),
        skip_prepare=args.skip_prepare,
        frontend_host=args.host,
    )


class Replica:
    """One ``omni-triton serve --no-frontend`` child (its tritonserver is its own child)."""

    def __init__(self, spec: ReplicaPlan, log_path: Path, admin_key: str, ready_timeout: float = 600.0):
        self.spec, self.log_path, self.admin_key = spec, log_path, admin_key
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        s = self.spec
        return [sys.executable, "-m", "omni_triton", "serve", "--no-frontend", "--skip-prepare",
                "--models", ",".join(s.models), "--on-demand", "none", "--triton-host", s.host,
                "--triton-http-port", str(s.http_port), "--triton-grpc-port", str(s.grpc_port),
                "--triton-metrics-port", str(s.metrics_port), "--ready-timeout", str(self.ready_timeout)]

    def start(self) -> None:
        """Start it (output to :attr:`log_path`); the admin key travels in its environment."""
        with open_run_log(self.log_path, f"replica {self.spec.index}") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=child_setup,
                                         env={**os.environ, triton_admin.ENV: self.admin_key})

    def ready(self) -> bool:
        """Triton answers ready (every model it loaded is READY: Triton's strict readiness)."""
        try:
            return httpx.get(f"{self.spec.http_url}/v2/health/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until :meth:`ready`.

        Raises:
            ServerStartError: serve exited first, or ``timeout`` (default the ready timeout + 60 s)
                passed; the message has the end of its log.
        """
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + (timeout or self.ready_timeout + 60)
        while not self.ready():
            if self.proc.poll() is not None:
                raise ServerStartError(f"replica {self.spec.index} (omni-triton serve) exited with code "
                                       f"{self.proc.returncode}:\n{_tail(self.log_path)}")
            if time.monotonic() > deadline:
                raise ServerStartError(f"replica {self.spec.index} not ready:\n{_tail(self.log_path)}")
            time.sleep(0.5)

    def tritonserver_pid(self) -> int | None:
        """The pid of the tritonserver this replica's serve runs now, or None."""
        import psutil

        if self.proc is None:
            return None
        try:
            return next((p.pid for p in psutil.Process(self.proc.pid).children()
                         if p.name() == "tritonserver"), None)
        except psutil.NoSuchProcess:
            return None

    def kill_tritonserver(self) -> int:
        """``kill -9`` this replica's tritonserver and its process group (stubs included), as a
        crash would; its serve restarts it (after a 1 s backoff, then the models' load time).
        Returns the killed pid.

        Raises:
            RuntimeError: no tritonserver runs.
        """
        pid = self.tritonserver_pid()
        if pid is None:
            raise RuntimeError(f"replica {self.spec.index} runs no tritonserver")
        os.killpg(os.getpgid(pid), signal.SIGKILL)
        return pid

    def stop(self) -> None:
        """SIGTERM serve (it stops its tritonserver), SIGKILL the group after 60 s."""
        if self.proc is not None:
            stop_process_group(self.proc, timeout=60)


class Cluster:
    """The pieces of a :class:`ClusterPlan`, each startable, stoppable and killable on its own.

    Args:
        spec: the plan.
        admin_key: the Triton admin key of every replica and frontend (default env
            ``OMNI_TRITON_ADMIN_KEY``/``_FILE``, else a fresh one).
        ready_timeout: seconds a replica may take to load its models.
        say: where progress lines go (default: print to stdout).
    """

    def __init__(self, spec: ClusterPlan, admin_key: str | None = None, ready_timeout: float = 600.0,
                 say=None):
        self.spec = spec
        self.admin_key = admin_key or triton_admin.key_from_env() or triton_admin.new_key()
        self.say = say or (lambda line: print(f"omni-triton cluster: {line}", flush=True))
        logs = spec.run_dir / "logs"
        self.postgres = (None if spec.database_url is not None else
                         LocalPostgres(spec.postgres_dir or default_postgres_dir(), spec.postgres_port))
        self.replicas = [Replica(r, logs / f"replica-{r.index}.log", self.admin_key, ready_timeout)
                         for r in spec.replicas]
        self.frontends = [Frontend(spec.triton_urls, host=spec.frontend_host, port=port,
                                   models=spec.frontend_models, log_path=logs / f"frontend-{i}.log",
                                   env=dict(spec.frontend_env), admin_key=self.admin_key)
                          for i, port in enumerate(spec.frontend_ports)]
        self._reported: set[str] = set()  # dead() lines already given

    @property
    def database_url(self) -> str:
        return self.spec.database_url if self.postgres is None else self.postgres.url

    # -- pieces -----------------------------------------------------------------------------------

    def start_postgres(self) -> None:
        if self.postgres is not None:
            self.postgres.start()

    def start_replicas(self, indices: list[int] | None = None) -> None:
        """Start replicas (all by default) at once, then wait until each is ready."""
        chosen = [self.replicas[i] for i in (range(len(self.replicas)) if indices is None else indices)]
        for r in chosen:
            r.start()
        for r in chosen:
            r.wait_ready()

    def start_frontend(self, index: int, wait: bool = True) -> None:
        """Start frontend ``index`` (and wait until its ``/health`` answers 200).

        Raises:
            ServerStartError: it exited or did not become healthy (with the end of its log).
        """
        f = self.frontends[index]
        f.extra_args = self.spec.frontend_command_args(index)
        f.env[DATABASE_URL_ENV] = self.database_url
        f.start()
        if wait:
            self.wait_frontend(index)

    def wait_frontend(self, index: int, timeout: float = 120.0) -> None:
        """Block until frontend ``index`` is healthy.

        Raises:
            ServerStartError: it exited or ``timeout`` passed (with the end of its log).
        """
        f = self.frontends[index]
        try:
            f.wait_ready(timeout=timeout)
        except ServerStartError as exc:
            raise ServerStartError(f"frontend {index}: {exc}\n{_tail(f.log_path) if f.log_path else ''}") from exc

    def start_frontends(self) -> None:
        """Start every frontend at once, then wait for each."""
        for i in range(len(self.frontends)):
            self.start_frontend(i, wait=False)
        for i in range(len(self.frontends)):
            self.wait_frontend(i)

    def kill_frontend(self, index: int) -> int:
        """``kill -9`` frontend ``index`` (its whole process group); returns its pid."""
        f = self.frontends[index]
        assert f.proc is not None, "not started"
        kill_process_group(f.proc)
        f.proc.wait()
        return f.proc.pid

    def kill_replica(self, index: int) -> int:
        """``kill -9`` replica ``index``'s tritonserver (:meth:`Replica.kill_tritonserver`)."""
        return self.replicas[index].kill_tritonserver()

    def start(self) -> None:
        """Prepare the models (unless told not to), check every port, then start PostgreSQL, the
        replicas and the frontends, in that order, each waited for.

        Raises:
            ServerStartError: a port is in use or a piece did not start (the caller stops the rest
                with :meth:`stop`).
        """
        check_ports_free(self.spec.ports())
        if not self.spec.skip_prepare:
            from omni_triton.prepare import prepare

            prepare(list(dict.fromkeys(m for r in self.spec.replicas for m in r.models)))
        self.start_postgres()
        self.start_replicas()
        self.start_frontends()

    def stop(self) -> None:
        """Stop the frontends, then the replicas, then PostgreSQL (fast shutdown)."""
        _in_parallel([f.stop for f in self.frontends])
        _in_parallel([r.stop for r in self.replicas])  # each may wait for Triton's exit timeout
        if self.postgres is not None:
            self.postgres.stop()

    # -- reporting --------------------------------------------------------------------------------

    def describe(self) -> list[str]:
        """What runs where, one line per piece."""
        lines = []
        if self.postgres is not None:
            lines.append(f"PostgreSQL 127.0.0.1:{self.postgres.port} (data {self.postgres.data_dir}, "
                         f"log {self.postgres.log_path})")
        else:
            lines.append("PostgreSQL: --database-url (not started here)")
        for r in self.replicas:
            s = r.spec
            lines.append(f"replica {s.index}: Triton gRPC {s.grpc_url}, HTTP {s.http_url}, metrics "
                         f"{s.metrics_url}; models {','.join(s.models)} (log {r.log_path})")
        for i, f in enumerate(self.frontends):
            lines.append(f"frontend {i}: OpenAI API {f.url}/v1 -> Triton {self.spec.triton_urls} (log {f.log_path})")
        lines.append(f"media: {self.spec.media_url}")
        return lines

    def dead(self) -> list[str]:
        """Pieces that exited since the last call, one line each (each reported once)."""
        out = []
        pieces = [(f"replica {r.spec.index} (omni-triton serve, log {r.log_path})", r.proc) for r in self.replicas]
        pieces += [(f"frontend {i} (port {f.port}, log {f.log_path})", f.proc) for i, f in enumerate(self.frontends)]
        for name, proc in pieces:
            if proc is not None and proc.poll() is not None and f"{name}:{proc.pid}" not in self._reported:
                self._reported.add(f"{name}:{proc.pid}")
                out.append(f"{name} exited with code {proc.returncode}")
        if self.postgres is not None and "postgres" not in self._reported and not self.postgres.running():
            self._reported.add("postgres")
            out.append(f"PostgreSQL stopped (log {self.postgres.log_path})")
        return out


def _in_parallel(calls: list) -> None:
    """Run the calls in threads and wait for all (stops that each wait seconds for an exit)."""
    threads = [threading.Thread(target=call) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``omni-triton cluster``'s flags."""
    from omni_triton.cli import DEFAULT_MODELS

    p.add_argument("--replicas", type=int, default=2, help="Triton replicas (default 2)")
    p.add_argument("--frontends", type=int, default=2, help="OpenAI frontends (default 2)")
    p.add_argument("--models", default=DEFAULT_MODELS,
                   help=f"comma separated models every replica loads (default {DEFAULT_MODELS})")
    p.add_argument("--replica-models", default=None,
                   help="a model set per replica instead, ';' between replicas: 'piper;piper,wan_t2v'")
    p.add_argument("--port", type=int, default=9000, help="first frontend's port (the next ones follow)")
    p.add_argument("--host", default="127.0.0.1", help="frontends' bind address")
    p.add_argument("--triton-port", type=int, default=8000,
                   help="replica i's Triton HTTP/gRPC/metrics ports are this + 3i, +1, +2 (default 8000)")
    p.add_argument("--database-url", default=None,
                   help="an existing PostgreSQL (postgresql://...) instead of starting one")
    p.add_argument("--postgres-dir", default=None,
                   help="the local PostgreSQL's data folder (default <cache>/cluster/postgres; as root "
                        "~postgres/omni-triton-cluster)")
    p.add_argument("--postgres-port", type=int, default=POSTGRES_PORT, help=f"its port (default {POSTGRES_PORT})")
    p.add_argument("--media-url", default=None,
                   help="the frontends' shared media (fsspec URL; default file://<cache>/cluster/media)")
    p.add_argument("--run-dir", default=None, help="logs and frontend folders (default <cache>/cluster)")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds a replica may take to load")
    p.add_argument("--skip-prepare", action="store_true", help="do not run prepare first")
    p.add_argument("--frontend-arg", action="append", default=[],
                   help="extra argument for every python -m openai_frontend (repeatable)")


def run_cluster(args: argparse.Namespace) -> int:
    """``omni-triton cluster``: start everything, print what runs where, report a piece that
    dies, stop everything on SIGINT/SIGTERM.

    Returns:
        0 after a requested stop; 1 when a piece did not start or every frontend died; 2 for bad
        arguments or an unusable admin key.
    """
    try:
        spec = plan(args)
        admin_key = triton_admin.key_from_env()
    except (ValueError, triton_admin.AdminKeyError, OSError) as exc:
        print(f"omni-triton cluster: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    stop_on_signals(stop, "omni-triton cluster")
    cluster = Cluster(spec, admin_key=admin_key, ready_timeout=args.ready_timeout)
    cluster.say(f"starting {'PostgreSQL, ' if cluster.postgres is not None else ''}{len(cluster.replicas)} Triton "
                f"replicas, {len(cluster.frontends)} frontends (logs in {spec.run_dir / 'logs'})")
    try:
        cluster.start()
        cluster.say("serving; Ctrl-C to stop")
        for line in cluster.describe():
            cluster.say(line)
        cluster.say(f"try: curl http://127.0.0.1:{spec.frontend_ports[0]}/v1/models")
        while not stop.wait(0.5):
            for line in cluster.dead():
                print(f"omni-triton cluster: {line}", file=sys.stderr, flush=True)
            if all(f.proc is not None and f.proc.poll() is not None for f in cluster.frontends):
                print("omni-triton cluster: every frontend died, stopping", file=sys.stderr, flush=True)
                return 1
        return 0
    except ServerStartError as exc:
        print(f"omni-triton cluster: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        cluster.stop()
        cluster.say("stopped")

"""A PostgreSQL server of its own for one machine: ``omni-triton cluster`` and the scale-out e2e test.

:class:`LocalPostgres` runs Debian's (or any) PostgreSQL binaries on a data folder of its own:
``initdb`` once, ``pg_ctl start`` on ``127.0.0.1:<port>`` with its Unix socket in a fresh
temporary folder (never the system cluster's ``/var/run/postgresql``, never port 5432 unless asked),
a wait until it accepts connections, the database created, ``pg_ctl stop -m fast``. PostgreSQL
refuses to run as root: when this process is root, every binary runs as the ``postgres`` user
(``runuser -u postgres --``) on a data folder that user owns.

Authentication: TCP connections need the password of the ``postgres`` role (scram-sha-256, a
random one written at ``initdb`` to :attr:`LocalPostgres.password_path`, 0600, and kept for later
starts); the Unix socket trusts local connections of the server's own user. :attr:`LocalPostgres.url`
is the ``postgresql://`` URL a frontend's ``--database-url`` takes.
"""
from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from omni_triton.serve.process import ServerStartError, check_ports_free

#: the role and the system user the server runs as when this process is root (Debian's package)
SERVER_USER = "postgres"


def find_bindir() -> Path:
    """The folder holding ``initdb``, ``pg_ctl`` and ``pg_isready``.

    ``pg_config --bindir`` first (on Debian ``/usr/bin/pg_config`` answers the newest installed
    server's folder), else the newest ``/usr/lib/postgresql/<major>/bin`` that has ``initdb``.

    Raises:
        ServerStartError: no PostgreSQL server binaries found (``apt-get install postgresql``).
    """
    candidates = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True)
            candidates.append(Path(out.stdout.strip()))
        except (subprocess.SubprocessError, OSError):
            pass
    found = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += sorted((Path(p) for p in found), key=lambda p: _major(p.parent.name), reverse=True)
    for path in candidates:
        if (path / "initdb").is_file() and (path / "pg_ctl").is_file():
            return path
    raise ServerStartError("PostgreSQL server binaries (initdb, pg_ctl) not found: install them, e.g. "
                           "apt-get install postgresql (scripts/test.sh does it)")


def _major(name: str) -> int:
    return int(name) if name.isdigit() else -1


class LocalPostgres:
    """One PostgreSQL server on ``127.0.0.1:port`` over the data folder ``data_dir``.

    Args:
        data_dir: the cluster's data folder: created by :meth:`init` (``initdb``) when it holds
            no ``PG_VERSION``, kept otherwise (the data survives a stop and a start). When root,
            it is owned by the ``postgres`` user, which must be able to reach it (a folder under
            ``/root`` is not: pick one under ``/tmp``, ``/var/lib/postgresql``, ...).
        port: TCP port (loopback only).
        database: the database :meth:`start` creates if missing (the one in :attr:`url`).
        bindir: the PostgreSQL binaries (default :func:`find_bindir`).

    Raises:
        ServerStartError: from :meth:`start`: port in use, binaries missing, initdb or start
            failed (the message carries the end of the server log).
    """

    def __init__(self, data_dir: Path | str, port: int, database: str = "omni_triton",
                 bindir: Path | None = None):
        self.data_dir = Path(data_dir).absolute()
        self.port = port
        self.database = database
        self._bindir = bindir
        self.socket_dir: Path | None = None
        self.as_root = os.geteuid() == 0

    # -- paths and URLs -------------------------------------------------------------------------

    @property
    def bindir(self) -> Path:
        if self._bindir is None:
            self._bindir = find_bindir()
        return self._bindir

    @property
    def log_path(self) -> Path:
        """The server's log (``pg_ctl -l``), inside the data folder (the server user writes it)."""
        return self.data_dir / "server.log"

    @property
    def password_path(self) -> Path:
        """The ``postgres`` role's password (0600, owned by this process's user; PostgreSQL
        ignores files it does not know in its data folder)."""
        return self.data_dir / "omni-triton.password"

    @property
    def password(self) -> str:
        return self.password_path.read_text().strip()

    @property
    def url(self) -> str:
        """``postgresql://postgres:<password>@127.0.0.1:<port>/<database>`` (for ``--database-url``)."""
        return f"postgresql://{SERVER_USER}:{self.password}@127.0.0.1:{self.port}/{self.database}"

    # -- commands -------------------------------------------------------------------------------

    def _run(self, *cmd: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        """Run a PostgreSQL binary (as ``postgres`` when root); its output is captured.

        Raises:
            ServerStartError: it failed (``check``) or ran past ``timeout`` seconds.
        """
        argv = [str(self.bindir / cmd[0]), *cmd[1:]]
        if self.as_root:
            argv = ["runuser", "-u", SERVER_USER, "--", *argv]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, cwd="/")
        except subprocess.TimeoutExpired as exc:
            raise ServerStartError(f"{cmd[0]} ran past {timeout:.0f} s{self._log_tail()}") from exc
        if check and done.returncode != 0:
            raise ServerStartError(f"{cmd[0]} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}"
                                   f"{self._log_tail()}")
        return done

    def _log_tail(self, lines: int = 20) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\nend of the PostgreSQL log (" + str(self.log_path) + "):\n" + "\n".join(tail)

    def _give_to_server_user(self, path: Path) -> None:
        if self.as_root:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(path, user.pw_uid, user.pw_gid)

    @property
    def initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").is_file()

    def init(self) -> None:
        """``initdb`` the data folder unless it already holds a cluster (idempotent): UTF-8, C
        locale, scram-sha-256 over TCP with a fresh random password, trust on the local socket.

        Raises:
            ServerStartError: the ``postgres`` user cannot reach the folder, or initdb failed.
        """
        if self.initialized:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        self._give_to_server_user(self.data_dir)
        if self.as_root:
            probe = subprocess.run(["runuser", "-u", SERVER_USER, "--", "test", "-w", str(self.data_dir)],
                                   capture_output=True)
            if probe.returncode != 0:
                raise ServerStartError(f"the {SERVER_USER} user cannot write {self.data_dir} (a folder above it "
                                       "is closed to it, e.g. /root): pick a data folder it can reach")
        password = secrets.token_urlsafe(24)
        pw_dir = Path(tempfile.mkdtemp(prefix="omni-pg-init-"))
        try:
            pw_file = pw_dir / "pw"
            pw_file.write_text(password + "\n")
            os.chmod(pw_file, 0o600)
            self._give_to_server_user(pw_dir)
            self._give_to_server_user(pw_file)
            self._run("initdb", "-D", str(self.data_dir), "-U", SERVER_USER, "-E", "UTF8", "--locale=C",
                      "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pw_file}")
        finally:
            shutil.rmtree(pw_dir, ignore_errors=True)
        fd = os.open(self.password_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")

    def start(self, timeout: float = 60.0) -> None:
        """:meth:`init` if needed, start the server, wait until it accepts connections, create
        :attr:`database` if missing.

        Raises:
            ServerStartError: the port is in use, the server did not start within ``timeout``
                seconds, or creating the database failed.
        """
        check_ports_free({"PostgreSQL": self.port})
        self.init()
        self.socket_dir = Path(tempfile.mkdtemp(prefix="omni-pg-sock-"))
        self._give_to_server_user(self.socket_dir)
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.socket_dir}"
        self._run("pg_ctl", "start", "-D", str(self.data_dir), "-l", str(self.log_path), "-w",
                  "-t", str(int(timeout)), "-o", options, timeout=timeout + 10)
        deadline = time.monotonic() + timeout
        while self._run("pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port), check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise ServerStartError(f"PostgreSQL not accepting connections after {timeout:.0f} s"
                                       f"{self._log_tail()}")
            time.sleep(0.1)
        exists = self.psql(f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'", database="postgres")
        if exists != "1":
            self._run("createdb", "-h", str(self.socket_dir), "-p", str(self.port), "-U", SERVER_USER,
                      self.database)

    def psql(self, sql: str, database: str | None = None) -> str:
        """Run one SQL command over the local socket; returns its unaligned output, stripped.

        Raises:
            ServerStartError: psql failed (the message has its error).
        """
        assert self.socket_dir is not None, "start() first"
        return self._run("psql", "-h", str(self.socket_dir), "-p", str(self.port), "-U", SERVER_USER,
                         "-d", database or self.database, "-XtAc", sql).stdout.strip()

    def pid(self) -> int | None:
        """The postmaster's pid from ``postmaster.pid`` if that process runs, else None."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def running(self) -> bool:
        return self.pid() is not None

    def stop(self, timeout: float = 60.0) -> None:
        """Fast shutdown (``pg_ctl stop -m fast``: sessions disconnected, data flushed); no-op
        when it is not running. Removes the socket folder."""
        if self.running():
            self._run("pg_ctl", "stop", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", str(int(timeout)),
                      timeout=timeout + 10, check=False)
            if self.running():
                self.kill()
        self._remove_socket_dir()

    def kill(self, timeout: float = 30.0) -> None:
        """SIGKILL the postmaster and its backends now (a crash: the next :meth:`start` recovers
        from the WAL); returns once they are gone."""
        import psutil

        pid = self.pid()
        if pid is not None:
            try:
                procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                procs = []
            for p in procs:
                try:
                    p.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    pass
            # until reaped, not just dead: the next postmaster refuses a data folder whose
            # postmaster.pid names a process kill(pid, 0) still finds, a zombie included (pg_ctl's
            # postmaster is not our child: whoever adopted it reaps it, within a second here)
            deadline = time.monotonic() + timeout
            while any(psutil.pid_exists(p.pid) for p in procs) and time.monotonic() < deadline:
                time.sleep(0.05)
        self._remove_socket_dir()

    def _remove_socket_dir(self) -> None:
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            self.socket_dir = None

    def __enter__(self) -> LocalPostgres:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie that nobody reaped yet counts as gone: a postmaster started
    by pg_ctl is not our child)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

"""``omni_triton.serve.postgres.LocalPostgres`` on the machine's real PostgreSQL binaries (Debian's
``postgresql``; scripts/test.sh installs it): initdb once, start on a free port, the URL's password
works over TCP (and a wrong one does not), data survive a fast stop and a kill -9, stop leaves no
process. A few seconds; skipped where no PostgreSQL server binaries are installed."""
from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from pathlib import Path

import psutil
import pytest

from omni_triton.serve.postgres import LocalPostgres, find_bindir
from omni_triton.serve.process import ServerStartError, free_port

try:
    find_bindir()
except ServerStartError as exc:  # pragma: no cover - scripts/test.sh installs it
    pytest.skip(str(exc), allow_module_level=True)


@pytest.fixture
def reachable_dir():
    """A folder the ``postgres`` user can traverse when tests run as root (pytest's tmp_path sits
    under a 0700 folder of root's)."""
    path = Path(tempfile.mkdtemp(prefix="omni-pg-test-"))
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _tcp(pg: LocalPostgres, sql: str, url: str | None = None):
    """psql over TCP with the URL (password auth), not the trusted socket."""
    return pg._run("psql", url or pg.url, "-XtAc", sql, check=False)


def test_init_start_url_stop_restart_kill(reachable_dir):
    pg = LocalPostgres(reachable_dir / "data", free_port(), database="cluster_test")
    try:
        pg.start()
        assert pg.running() and pg.initialized
        assert pg.url.startswith(f"postgresql://postgres:{pg.password}@127.0.0.1:{pg.port}/cluster_test")
        assert oct(pg.password_path.stat().st_mode & 0o777) == "0o600"
        done = _tcp(pg, "CREATE TABLE t (v int); INSERT INTO t VALUES (42); SELECT current_database()")
        assert done.returncode == 0 and done.stdout.split()[-1] == "cluster_test", done.stderr
        wrong = _tcp(pg, "SELECT 1", url=pg.url.replace(pg.password, "wrong-password"))
        assert wrong.returncode != 0 and "password authentication failed" in wrong.stderr
        postmaster = pg.pid()
        owner = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        assert postmaster is not None and psutil.Process(postmaster).username() == owner

        pg.stop()  # fast shutdown: the data stay
        assert not pg.running()
        password = pg.password
        pg.start()  # no second initdb: same password, same rows
        assert pg.password == password
        assert _tcp(pg, "SELECT v FROM t").stdout.strip() == "42"

        pg.kill()  # a crash: the next start recovers from the WAL
        assert not pg.running()
        pg.start()
        assert _tcp(pg, "SELECT v FROM t").stdout.strip() == "42"
    finally:
        pg.stop()
    assert not pg.running() and pg.socket_dir is None


def test_port_in_use_is_refused_before_initdb(reachable_dir):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        pg = LocalPostgres(reachable_dir / "data", busy.getsockname()[1])
        with pytest.raises(ServerStartError, match="already in use: PostgreSQL port"):
            pg.start()
    assert not pg.initialized


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the data folder to the postgres user")
def test_a_folder_the_postgres_user_cannot_reach_is_a_clear_error(tmp_path):
    os.chmod(tmp_path, 0o700)
    pg = LocalPostgres(tmp_path / "data", free_port())
    with pytest.raises(ServerStartError, match="the postgres user cannot write"):
        pg.start()

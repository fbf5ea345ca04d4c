"""A real PostgreSQL for unit tests: one server per test session, a fresh database per test.

The server is ``omni_triton.serve.postgres.LocalPostgres`` (Debian's binaries, run as the
``postgres`` user when the tests run as root) on a free port, its data folder under ``/tmp`` (the
``postgres`` user cannot reach pytest's ``tmp_path`` under root's 0700 folder), stopped and
removed at the end of the session. Without PostgreSQL server binaries the tests that use it are
skipped with the reason (scripts/test.sh installs ``postgresql``).

Use: ``from tests.helpers.postgres_db import pg_url, postgres_server  # noqa: F401`` (fixtures).
"""
from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from omni_triton.serve.postgres import LocalPostgres, find_bindir
from omni_triton.serve.process import ServerStartError, free_port


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[LocalPostgres]:
    """A running PostgreSQL server for the whole session (skips when the binaries are missing)."""
    try:
        find_bindir()
    except ServerStartError as exc:
        pytest.skip(f"no PostgreSQL server: {exc}")
    base = Path(tempfile.mkdtemp(prefix="omni-test-pg-"))
    os.chmod(base, 0o711)  # the postgres user must traverse it to its data folder
    pg = LocalPostgres(base / "data", port=free_port())
    try:
        pg.start()
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


def database_url(pg: LocalPostgres, name: str) -> str:
    """The URL of database ``name`` on ``pg`` (password authentication over TCP)."""
    return f"postgresql://postgres:{pg.password}@127.0.0.1:{pg.port}/{name}"


@pytest.fixture
def pg_url(postgres_server: LocalPostgres) -> Iterator[str]:
    """The URL of a new, empty database (dropped after the test, its connections closed)."""
    name = "test_" + secrets.token_hex(6)
    postgres_server.psql(f"CREATE DATABASE {name}", database="postgres")
    try:
        yield database_url(postgres_server, name)
    finally:
        postgres_server.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", database="postgres")

"""Lint, types and import layers, so CI fails on a regression (issue 24 item 7).

The tools come from their own pinned venv (``requirements-lint.lock``, built by
``scripts/setup_lint.sh``, which ``scripts/test.sh`` runs; ``OMNI_TRITON_LINT_VENV`` or
``<cache>/lint-venv``); without it these tests skip. Their configuration is in ``pyproject.toml``:

* ``ruff check`` (rules E, F, I, B, UP, line length 120, RUF100 for stale ``noqa`` markers) over
  :data:`RUFF_PATHS` (every Python folder of the tree but ``omni_triton/``, which joins once it is
  clean);
* ``mypy`` strict over ``[tool.mypy] files`` (the frontend, ``omni_triton/contracts`` and
  ``omni_triton/runtime``), with this interpreter's packages (``--python-executable``). Modules
  not yet clean are listed with ``ignore_errors`` in ``pyproject.toml``: a module that is off that
  list must stay clean;
* ``lint-imports``: the import-linter contracts of ``[tool.importlinter]``, one per layer rule of
  ``docs/architecture.md``: the frontend never imports torch, vLLM or the Triton-side stages and
  adapters; ``contracts/`` is torch-free and imports nothing else of the project; ``runtime/``,
  ``checkpoints/`` and ``media/`` import no stages or adapters; ``stages/`` import no adapters and
  no ``triton_python_backend_utils``; the family adapters do not import each other (directly or
  through another module).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: What ``ruff check`` covers today; the goal is the whole tree (``.``).
RUFF_PATHS = ["."]  # the whole tree (pyproject.toml [tool.ruff] excludes what is not ours)


def lint_venv() -> Path:
    """The venv of ``scripts/setup_lint.sh`` (``OMNI_TRITON_LINT_VENV`` or ``<cache>/lint-venv``)."""
    if os.environ.get("OMNI_TRITON_LINT_VENV"):
        return Path(os.environ["OMNI_TRITON_LINT_VENV"])
    cache = Path(os.environ.get("OMNI_TRITON_CACHE", Path.home() / ".cache" / "omni-triton"))
    return cache / "lint-venv"


def _tool(name: str) -> Path:
    path = lint_venv() / "bin" / name
    if not path.exists():
        pytest.skip(f"no {name} in {lint_venv()}: run scripts/setup_lint.sh")
    return path


def _run(*argv: str | Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff_is_clean():
    r = _run(_tool("ruff"), "check", "--no-cache", "--output-format", "concise", *RUFF_PATHS)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_mypy_strict_set_is_clean():
    r = _run(_tool("mypy"), "--python-executable", sys.executable)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_import_contracts_hold():
    r = _run(_tool("lint-imports"), "--no-cache")
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]

"""Where Omni-Triton keeps prepared models, logs and the assembled Triton backend directory.

Everything lives under one cache directory: ``$OMNI_TRITON_CACHE`` or ``~/.cache/omni-triton``.
Triton stub processes inherit the variable from the launcher, so a ``model.py`` finds the same
folders as ``omni-triton prepare`` wrote.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """Root cache directory (``$OMNI_TRITON_CACHE``, default ``~/.cache/omni-triton``)."""
    return Path(os.environ.get("OMNI_TRITON_CACHE", Path.home() / ".cache" / "omni-triton"))


def model_dir(name: str) -> Path:
    """Folder of one prepared model, e.g. ``model_dir("csm-tiny")``."""
    return cache_dir() / "models" / name


def model_repositories() -> list[Path]:
    """The Triton model repositories of this checkout: stage models, then ensembles."""
    return [REPO_ROOT / "model_repository", REPO_ROOT / "ensembles"]


def server_run_dir(server_pid: int) -> Path:
    """Scratch folder of one running tritonserver (e.g. the talker's cancel flags); removed by
    the launcher when that server stops."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"omni-triton-run-{server_pid}"

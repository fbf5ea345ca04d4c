"""Finding a ``tritonserver`` and the environment its Python stubs need.

1. :func:`find_tritonserver` locates a server: ``$OMNI_TRITON_SERVER``, ``tritonserver`` on PATH,
   ``/opt/tritonserver`` (NGC container), or the binary inside the ``nvidia-pytriton`` wheel.
2. :func:`assemble_backend_dir` builds a ``backends/python`` folder for the *running* interpreter
   (``libtriton_python.so``, ``triton_python_backend_utils.py`` and the stub built for this Python
   version) when the server comes from the wheel.
3. :func:`server_env` makes the stubs use this virtualenv: ``VIRTUAL_ENV``/``PATH``, and
   ``LD_LIBRARY_PATH`` starting with the LIBDIR of the interpreter that made the venv (the 3.11
   stub embeds Debian's libpython while a pyenv venv's stdlib needs its own: ``ssl`` fails with
   ``undefined symbol: _PyModule_Add`` otherwise, docs/architecture.md "Environment facts"), then the wheel's libs.
"""
from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from omni_triton.paths import cache_dir


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

"""Find a model's Python-backend stub processes (for tests that kill one on purpose)."""
from __future__ import annotations

import psutil


def stub_processes(model: str, triton_pid: int) -> list[psutil.Process]:
    """The ``triton_python_backend_stub`` processes of ``model`` under the tritonserver ``triton_pid``
    (its model folder in argv[1], the server's pid in argv[5])."""
    return [p for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] and p.info["cmdline"][0].endswith("triton_python_backend_stub")
            and f"/{model}/" in p.info["cmdline"][1] and p.info["cmdline"][5] == str(triton_pid)]

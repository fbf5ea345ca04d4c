"""Runs vLLM-Omni's benchmark CLI several times in one process (its console script's ``main``,
unmodified, once per argument list), so the heavy import (vLLM + CUDA torch) is paid once.

Run with the benchmark venv's interpreter (scripts/setup_bench.sh)::

    ~/.cache/omni-triton/bench-venv/bin/python tests/e2e/vllm_omni_bench_driver.py runs.json \
        --metrics-url http://127.0.0.1:9000

``runs.json``: a list of argument lists for ``vllm-omni`` (each starting with ``bench serve
--omni``). A run that raises is reported in ``<runs.json>.errors.json`` and the others go on.
With ``--metrics-url`` the frontend's ``omni_frontend_*_total{model=...}`` counters are read
before and after each run; ``<runs.json>.metrics.json`` holds ``{run index: {"metric|model":
increase}}`` (what the server counted as sent during that run).
"""

from __future__ import annotations

import json
import re
import sys
import traceback
import urllib.request


def counters(url: str | None) -> dict[str, float]:
    """``"metric|model" -> value`` of the frontend's counters ({} without a URL)."""
    if not url:
        return {}
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r'(omni_frontend_\w+_total)\{model="([^"]+)"\} (\S+)$', line)
        if m:
            out[f"{m.group(1)}|{m.group(2)}"] = float(m.group(3))
    return out


def main() -> int:
    path = sys.argv[1]
    url = sys.argv[sys.argv.index("--metrics-url") + 1] if "--metrics-url" in sys.argv else None
    runs = json.load(open(path))
    from vllm_omni.entrypoints.cli.main import main as vllm_omni_main

    errors, deltas = {}, {}
    for i, argv in enumerate(runs):
        sys.argv = ["vllm-omni", *argv]
        before = counters(url)
        try:
            vllm_omni_main()
        except BaseException:
            errors[i] = traceback.format_exc()
            print(errors[i], file=sys.stderr, flush=True)
        after = counters(url)
        deltas[i] = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
    json.dump(errors, open(path + ".errors.json", "w"))
    json.dump(deltas, open(path + ".metrics.json", "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

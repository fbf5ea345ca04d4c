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

``<runs.json>.requests.json``: ``{run index: [{"e2el_ms", "success", "stage_gen_time_ms": {stage id:
ms}, "stage_durations": {...}}, ...]}``, the per-request figures the client itself parsed from
each response (its ``RequestFuncOutput`` objects, read as they reach its ``calculate_metrics``;
nothing of the client is changed), so a test can check each request's stage times against its
E2EL (docs/vllm_omni_compat.md "Stage metrics: what each number is").
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
    from vllm_omni.benchmarks.patch import patch as bench_patch
    from vllm_omni.entrypoints.cli.main import main as vllm_omni_main

    seen: list[dict] = []
    calculate = bench_patch.calculate_metrics

    def recording_calculate_metrics(*args, **kwargs):
        outputs = kwargs.get("outputs", args[1] if len(args) > 1 else [])
        for out in outputs:
            stages = getattr(out, "stage_metrics", None) or {}
            seen.append({"e2el_ms": float(getattr(out, "latency", 0.0) or 0.0) * 1000.0,
                         "success": bool(getattr(out, "success", False)),
                         "stage_gen_time_ms": {str(k): float((v or {}).get("stage_gen_time_ms") or 0.0)
                                               for k, v in stages.items() if isinstance(v, dict)},
                         "stage_durations": dict(getattr(out, "stage_durations", None) or {})})
        return calculate(*args, **kwargs)

    bench_patch.calculate_metrics = recording_calculate_metrics
    errors, deltas, requests = {}, {}, {}
    for i, argv in enumerate(runs):
        sys.argv = ["vllm-omni", *argv]
        seen.clear()
        before = counters(url)
        try:
            vllm_omni_main()
        except BaseException:
            errors[i] = traceback.format_exc()
            print(errors[i], file=sys.stderr, flush=True)
        after = counters(url)
        deltas[i] = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
        requests[i] = list(seen)
    json.dump(errors, open(path + ".errors.json", "w"))
    json.dump(requests, open(path + ".requests.json", "w"))
    json.dump(deltas, open(path + ".metrics.json", "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A bounded mixed soak (clients/soak.py) against the session's real stack: ordinary speech, chat,
completions and image traffic with client disconnects, hostile payloads, over-context prompts and
overload bursts (4x the loops) for ``OMNI_TRITON_SOAK_S`` seconds (60 in CI; the closing notes
give the longer runs). Every request must end (no hang) with 2xx, 4xx or 429/503; tritonserver
must not restart and no stub may die (serve's status file); /dev/shm must not grow. The report is
printed (RSS included) for the log.

Spoken chat and over-context chat through the ``llm_tts`` BLS are in the mix again: the stub heap
corruption and the hang they caused (issue 9) were python_backend 2.51's response-iterator
defects, now avoided (omni_triton/adapters/bls.py; reproduction: clients/repro_crash.py
--model probe_bls --probe-workers 8)."""
from __future__ import annotations

import json
import os
from urllib.parse import urlparse

import pytest

from clients.soak import soak
from omni_triton.paths import cache_dir

pytestmark = pytest.mark.e2e

SOAK_S = float(os.environ.get("OMNI_TRITON_SOAK_S", "60"))


def test_mixed_soak_has_no_crash_no_5xx_no_hang(stack):
    http_port = urlparse(stack.triton_http_url).port
    status = cache_dir() / "logs" / f"serve-status-{http_port}.json"
    report = soak(stack.frontend_url, SOAK_S, concurrency=4, triton_pid=stack.triton_pid,
                  serve_status=str(status), timeout_s=180.0, burst_every_s=20.0)
    print(json.dumps(report, indent=1))
    outcomes = report["outcomes"]
    assert report["crashes"] == 0 and not report["stub_deaths"], report
    assert not outcomes.get("5xx") and not outcomes.get("hang") and not outcomes.get("transport"), report
    assert outcomes.get("2xx", 0) > 20 and outcomes.get("4xx", 0) > 0, report
    grown_mb = report["dev_shm_mb"]["end"] - report["dev_shm_mb"]["start"]
    assert grown_mb < 64, f"/dev/shm grew by {grown_mb} MB"

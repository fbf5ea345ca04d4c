"""A bounded mixed soak (clients/soak.py) against the session's real stack: ordinary speech, chat,
completions and image traffic with client disconnects, hostile payloads, over-context prompts and
overload bursts (4x the loops) for ``OMNI_TRITON_SOAK_S`` seconds (60 in CI; the closing notes
give the longer runs). Every request must end (no hang) with 2xx, 4xx, 429 or at most
``MAX_503`` 503s, every 429/503 with the OpenAI error body and ``Retry-After``, and no 200 stream
may fail in-band (an SSE error event or error chunk; clients/soak.py counts these as
``stream_error``); tritonserver must not restart and no stub may die (serve's status file);
/dev/shm must not grow. The report is printed (RSS included) for the log.

503 is not success: the admission limit answers overload with 429, and Triton has no queue limit
here, so a 503 means a stage or Triton was unavailable, which nothing in this soak causes.

Spoken chat and over-context chat through the ``llm_tts`` BLS are in the mix again: the stub heap
corruption and the hang they caused (issue 9) were python_backend 2.51's response-iterator
defects, now avoided (omni_triton/adapters/bls.py; reproduction: clients/repro_crash.py
--model probe_bls --probe-workers 8)."""
from __future__ import annotations

import json
import os
from urllib.parse import urlparse

import pytest

from clients.soak import FAILURES, soak
from omni_triton.paths import cache_dir

pytestmark = pytest.mark.e2e

SOAK_S = float(os.environ.get("OMNI_TRITON_SOAK_S", "60"))
MAX_503 = 0  # see the module docstring


def test_mixed_soak_has_no_crash_no_5xx_no_hang(stack):
    http_port = urlparse(stack.triton_http_url).port
    status = cache_dir() / "logs" / f"serve-status-{http_port}.json"
    report = soak(stack.frontend_url, SOAK_S, concurrency=4, triton_pid=stack.triton_pid,
                  serve_status=str(status), timeout_s=180.0, burst_every_s=20.0)
    print(json.dumps(report, indent=1))
    outcomes = report["outcomes"]
    assert report["crashes"] == 0 and not report["stub_deaths"], report
    assert not any(outcomes.get(k) for k in FAILURES), report  # 5xx, hang, transport, bad refusal, in-band error
    assert outcomes.get("503", 0) <= MAX_503, report
    assert outcomes.get("2xx", 0) > 20 and outcomes.get("4xx", 0) > 0, report
    grown_mb = report["dev_shm_mb"]["end"] - report["dev_shm_mb"]["start"]
    assert grown_mb < 64, f"/dev/shm grew by {grown_mb} MB"

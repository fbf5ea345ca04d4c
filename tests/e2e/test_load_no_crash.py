"""The two crash reproductions of issue 9, bounded, against the session's real tritonserver:
8 clients sending a two-sentence text to ``piper`` back to back (one gRPC stream per request,
as the frontend does), and 5 concurrent over-context chats through the ``llm_tts`` BLS (every one
an INVALID_ARG answered from the BLS workers). Before the stub-call lock (omni_triton.adapters.triton_io)
tritonserver 2.51 died with SIGSEGV within 0.4-53 s of these loads (clients/repro_crash.py).
Passing means the same server process is still there and answered every request."""
from __future__ import annotations

import httpx
import pytest

from clients.repro_crash import drive

pytestmark = pytest.mark.e2e


def _same_server(stack) -> bool:
    try:
        return httpx.get(f"{stack.triton_http_url}/v2/health/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_piper_back_to_back_load_does_not_crash(stack):
    import psutil

    counts = drive(stack.triton_grpc_url, "piper", clients=8, seconds=15.0)
    assert psutil.pid_exists(stack.triton_pid), "tritonserver died under piper_tts load"
    assert counts.get("ok", 0) > 8 and not counts.get("error") and not counts.get("timeout"), counts
    assert _same_server(stack)


def test_over_context_chat_bursts_through_bls_do_not_crash(stack):
    import psutil

    counts = drive(stack.triton_grpc_url, "llm_tts", clients=5, seconds=8.0, over_context=True)
    assert psutil.pid_exists(stack.triton_pid), "tritonserver died under over-context llm_tts load"
    # Every request is rejected in-band (INVALID_ARG from the BLS): errors, never a hang.
    assert counts.get("error", 0) > 5 and not counts.get("ok") and not counts.get("timeout"), counts
    assert _same_server(stack)

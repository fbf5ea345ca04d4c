"""End-to-end: issue 23's auth and header probes against the served stack (``omni-triton serve``,
no API key, bound to 127.0.0.1): /health detail for a loopback client, the browser guard on a
real speech request and WebSocket, DNS rebinding, and a bounded ``X-Ignored-Fields``. The keyed
paths (URL keys refused and redacted from uvicorn's log, the WebSocket subprotocol key) run
against the real uvicorn in tests/unit/test_auth.py. A few requests: about a second."""
from __future__ import annotations

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

pytestmark = pytest.mark.e2e

SPEECH = {"model": "piper_tts", "input": "Hi.", "response_format": "pcm"}


def test_health_detail_for_loopback(stack):
    body = httpx.get(f"{stack.frontend_url}/health", timeout=30).json()
    assert body["status"] == "ok" and "piper" in body["models"]


def test_cross_origin_write_and_rebinding_refused(stack):
    url = stack.frontend_url
    r = httpx.post(f"{url}/v1/audio/speech", json=SPEECH, headers={"Origin": "http://evil.example"}, timeout=60)
    assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin_refused"
    r = httpx.get(f"{url}/v1/models", headers={"Host": "evil.example:9000"}, timeout=30)
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
    ws_url = url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url, origin="http://evil.example", open_timeout=30)
    assert refused.value.response.status_code == 403
    with connect(ws_url, origin=url, open_timeout=30):
        pass
    # the server's own origin (its /docs page) and non-browser clients still write
    assert httpx.post(f"{url}/v1/audio/speech", json=SPEECH, headers={"Origin": url}, timeout=60).status_code == 200


def test_ignored_fields_header_bounded_and_encoded(stack):
    r = httpx.post(f"{stack.frontend_url}/v1/audio/speech",
                   json={**SPEECH, "€": 1, **{f"f{i}": 1 for i in range(5000)}}, timeout=60)
    assert r.status_code == 200, r.text
    value = r.headers["x-ignored-fields"]
    assert value.startswith("%E2%82%AC, f0, ") and value.endswith("(+4985 more)") and len(value) <= 1024

"""Issue 23 items 5 and 7 against the in-process fake engine: one constant-time key check for
HTTP, WebSocket and ``/health``; keys never from URLs and never in log lines; ``/health`` detail
only for callers who may see it; the browser guard of a keyless server (cross-origin writes,
DNS rebinding); a bounded, header-safe ``X-Ignored-Fields``. docs/openai_frontend.md
"Authentication and browsers" has the rules these tests guard.
"""

from __future__ import annotations

import json
import logging
from urllib.parse import unquote

import httpx
import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse
from test_chat_frontend import assert_error
from test_frontend_bad_input import AllFake

from openai_frontend import auth
from openai_frontend.app import Settings, create_app
from openai_frontend.engine import ModelInfo
from tests.helpers.frontend import frontend_client, serve_in_thread

pytestmark = pytest.mark.anyio

KEY = "sk-test-key"
WS = "/v1/audio/speech/stream"
SPEECH = {"model": "piper_tts", "input": "Hello.", "response_format": "pcm"}


@pytest.fixture
def anyio_backend():
    return "asyncio"


def client(engine=None, *, peer=("127.0.0.1", 50000), base_url="http://test", **settings) -> httpx.AsyncClient:
    return frontend_client(engine or AllFake(), peer=peer, base_url=base_url, **settings)


def ws_session(ws) -> dict:
    """One empty utterance on an open speech WebSocket: proves the session was admitted."""
    ws.send_json({"type": "session.config", "model": "piper_tts"})
    ws.send_json({"type": "input.done"})
    return ws.receive_json()


@pytest.fixture
def compare_spy(monkeypatch):
    """Every key comparison, recorded: the check must go through ``hmac.compare_digest``."""
    calls = []
    real = auth.hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    return calls


# --------------------------------------------------------------------------- the key, in constant time
async def test_http_key_is_compared_in_constant_time(compare_spy):
    async with client(api_key=KEY) as c:
        assert (await c.post("/v1/audio/speech", json=SPEECH,
                             headers={"Authorization": f"Bearer {KEY}"})).status_code == 200
        assert_error(await c.post("/v1/audio/speech", json=SPEECH, headers={"Authorization": "Bearer sk-test-kez"}),
                     401, code="invalid_api_key")
    assert (b"sk-test-kez", KEY.encode()) in compare_spy and (KEY.encode(), KEY.encode()) in compare_spy


def test_websocket_key_is_compared_in_constant_time(compare_spy):
    with TestClient(create_app(AllFake(), Settings(api_key=KEY))) as tc:
        with pytest.raises(WebSocketDenialResponse):
            with tc.websocket_connect(WS, headers={"Authorization": "Bearer wrong"}):
                pass
        with tc.websocket_connect(WS, headers={"Authorization": f"Bearer {KEY}"}) as ws:
            assert ws_session(ws)["type"] == "session.done"
    assert (b"wrong", KEY.encode()) in compare_spy and (KEY.encode(), KEY.encode()) in compare_spy


async def test_health_detail_check_is_the_same_constant_time_check(compare_spy):
    async with client(api_key=KEY) as c:
        r = await c.get("/health", headers={"Authorization": "Bearer nope"})
    assert r.json() == {"status": "ok"} and (b"nope", KEY.encode()) in compare_spy


# --------------------------------------------------------------------------- WebSocket credentials
def test_websocket_refusals_are_openai_errors_and_the_subprotocol_key_works():
    with TestClient(create_app(AllFake(), Settings(api_key=KEY))) as tc:
        for kwargs, code in [({}, "invalid_api_key"),
                             ({"headers": {"Authorization": "Bearer wrong"}}, "invalid_api_key"),
                             ({"subprotocols": ["realtime", "openai-insecure-api-key.wrong"]}, "invalid_api_key")]:
            with pytest.raises(WebSocketDenialResponse) as denied:
                with tc.websocket_connect(WS, **kwargs):
                    pass
            assert denied.value.status_code == 401, kwargs
            assert denied.value.json()["error"]["code"] == code
        # the browser way (OpenAI Realtime's convention): the key rides as a subprotocol; the
        # server answers with the other offered subprotocol, never the one holding the key
        with tc.websocket_connect(WS, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]) as ws:
            assert ws.accepted_subprotocol == "realtime"
            assert ws_session(ws)["type"] == "session.done"


def test_websocket_subprotocol_answered_without_a_key_too():
    """A browser client written for a keyed server still connects to a keyless one."""
    with TestClient(create_app(AllFake(), Settings())) as tc:
        with tc.websocket_connect(WS, subprotocols=["openai-insecure-api-key.x", "speech"]) as ws:
            assert ws.accepted_subprotocol == "speech"


@pytest.mark.parametrize("query", [f"api_key={KEY}", f"api-key={KEY}", f"token={KEY}", f"key={KEY}"])
def test_key_in_the_url_is_refused_even_when_right(query):
    with TestClient(create_app(AllFake(), Settings(api_key=KEY))) as tc:
        with pytest.raises(WebSocketDenialResponse) as denied:
            with tc.websocket_connect(f"{WS}?{query}"):
                pass
        assert denied.value.status_code == 401 and denied.value.json()["error"]["code"] == "api_key_in_url"
        # also on HTTP, and even next to a right Authorization header: the URL is logged already
        r = tc.get(f"/v1/models?{query}", headers={"Authorization": f"Bearer {KEY}"})
        assert_error(r, 401, code="api_key_in_url")
        assert KEY not in r.text


# --------------------------------------------------------------------------- log redaction
@pytest.mark.parametrize("line, secret", [
    ('127.0.0.1:5 - "GET /v1/models?api_key=SECRET1&x=1 HTTP/1.1" 401', "SECRET1"),
    ('127.0.0.1:5 - "WebSocket /v1/audio/speech/stream?x=1&token=SECRET2" 403', "SECRET2"),
    ("/p?Api-Key=SECRET3", "SECRET3"), ("/p?access_token=SECRET4;b=2", "SECRET4"),
    ("subprotocols: realtime, openai-insecure-api-key.SECRET5", "SECRET5"),
    ("Authorization: Bearer SECRET6", "SECRET6"),
])
def test_redact(line, secret):
    out = auth.redact(line)
    assert secret not in out and auth.REDACTED in out


def test_redact_keeps_other_parameters():
    assert auth.redact("/v1/videos?limit=3&monkey=1&after=k") == "/v1/videos?limit=3&monkey=1&after=k"


def _serve(app):
    """uvicorn on a free loopback port, in a thread (tests/helpers/frontend.py)."""
    return serve_in_thread(app, log_level="info")


class _Lines(logging.Handler):
    """The formatted lines of the loggers it is attached to (uvicorn's do not propagate)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_uvicorn_logs_no_key_from_urls_and_a_real_client_gets_the_subprotocol():
    """The real uvicorn: its access line and WebSocket line with the filter ``main()`` installs,
    a real WebSocket client (which, like a browser, fails a handshake answered with a subprotocol
    it did not offer) and the JSON 401 over a real handshake."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    filt = auth.install_log_redaction()
    server, thread, port = _serve(create_app(AllFake(), Settings(api_key=KEY)))
    seen = _Lines()
    for name in ("uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).addHandler(seen)
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/v1/models?api_key=SECRET-A&limit=1", timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "api_key_in_url"
        with pytest.raises(InvalidStatus) as refused:
            connect(f"ws://127.0.0.1:{port}{WS}?token=SECRET-B", open_timeout=10)
        assert refused.value.response.status_code == 401
        assert json.loads(refused.value.response.body)["error"]["code"] == "api_key_in_url"
        with connect(f"ws://127.0.0.1:{port}{WS}?x=SECRET-C-ok",
                     subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"], open_timeout=10) as ws:
            assert ws.subprotocol == "realtime"
            ws.send(json.dumps({"type": "session.config", "model": "piper_tts"}))
            ws.send(json.dumps({"type": "input.done"}))
            assert json.loads(ws.recv(timeout=10))["type"] == "session.done"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        for name in auth.REDACTED_LOGGERS:
            logging.getLogger(name).removeFilter(filt)
            logging.getLogger(name).removeHandler(seen)
    lines = seen.lines
    assert any("api_key=REDACTED" in line for line in lines), lines
    assert any("token=REDACTED" in line for line in lines), lines
    assert any("x=SECRET-C-ok" in line for line in lines), lines  # other parameters stay readable
    assert not any("SECRET-A" in line or "SECRET-B" in line or KEY in line for line in lines), lines


def test_main_installs_the_redaction(monkeypatch, tmp_path):
    import uvicorn

    from openai_frontend import __main__ as main_mod

    def fake_run(self):
        self.started = True

    monkeypatch.setattr(uvicorn.Server, "run", fake_run)
    for name in auth.REDACTED_LOGGERS:
        for f in [f for f in logging.getLogger(name).filters if isinstance(f, auth.RedactSecrets)]:
            logging.getLogger(name).removeFilter(f)
    try:
        main_mod.main(["--port", "0", "--video-storage-dir", str(tmp_path / "videos"),
                       "--voice-storage-dir", str(tmp_path / "voices")])
        for name in ("uvicorn.access", "uvicorn.error"):
            assert any(isinstance(f, auth.RedactSecrets) for f in logging.getLogger(name).filters), name
    finally:
        for name in auth.REDACTED_LOGGERS:
            for f in [f for f in logging.getLogger(name).filters if isinstance(f, auth.RedactSecrets)]:
                logging.getLogger(name).removeFilter(f)


# --------------------------------------------------------------------------- /health detail
def _broken() -> AllFake:
    engine = AllFake()
    engine.models["piper_tts"] = ModelInfo(name="piper_tts", state="UNAVAILABLE",
                                           reason="load failed: secret detail")
    return engine


async def test_health_with_a_key_shows_detail_only_with_the_key():
    async with client(_broken(), api_key=KEY) as c:
        anonymous = await c.get("/health")
        assert anonymous.status_code == 503 and anonymous.json() == {"status": "unhealthy"}
        assert anonymous.headers["retry-after"] == "1" and "secret" not in anonymous.text
        keyed = await c.get("/health", headers={"Authorization": f"Bearer {KEY}"})
        assert keyed.status_code == 503 and keyed.json()["not_ready"] == ["piper_tts"]
        assert "secret detail" in keyed.json()["message"]
    async with client(api_key=KEY) as c:
        assert (await c.get("/health")).json() == {"status": "ok"}


async def test_health_without_a_key_shows_detail_to_loopback_clients_only():
    async with client(_broken(), peer=("203.0.113.9", 4000)) as c:
        remote = await c.get("/health")
    assert remote.status_code == 503 and remote.json() == {"status": "unhealthy"}
    for peer in [("127.0.0.1", 4000), ("::1", 4000), ("127.8.0.1", 1)]:
        async with client(_broken(), peer=peer) as c:
            local = await c.get("/health")
        assert local.status_code == 503 and local.json()["not_ready"] == ["piper_tts"], peer


async def test_health_status_only_fits_the_openapi_schema():
    async with client(api_key=KEY) as c:
        schema = (await c.get("/openapi.json", headers={"Authorization": f"Bearer {KEY}"})).json()
    health = schema["components"]["schemas"]["HealthStatus"]
    assert health["required"] == ["status"]


# --------------------------------------------------------------------------- browser guard (no key)
LOCAL = "http://127.0.0.1:9000"


async def test_cross_origin_browser_writes_are_refused_without_a_key():
    async with client(base_url=LOCAL) as c:
        for origin in ["http://evil.example", "http://127.0.0.1:9001", "http://localhost:9000", "null", "garbage"]:
            r = await c.post("/v1/audio/speech", json=SPEECH, headers={"Origin": origin})
            assert_error(r, 403, code="cross_origin_refused")
        assert_error(await c.delete("/v1/audio/voices/voice_x", headers={"Origin": "http://evil.example"}),
                     403, code="cross_origin_refused")
        assert_error(await c.post("/v1/audio/speech", json=SPEECH, headers={"Sec-Fetch-Site": "cross-site"}),
                     403, code="cross_origin_refused")
        # what passes: the server's own pages (Swagger /docs), non-browser clients, reads
        assert (await c.post("/v1/audio/speech", json=SPEECH, headers={"Origin": LOCAL})).status_code == 200
        assert (await c.post("/v1/audio/speech", json=SPEECH)).status_code == 200
        assert (await c.post("/v1/audio/speech", json=SPEECH,
                             headers={"Sec-Fetch-Site": "same-origin"})).status_code == 200
        assert (await c.get("/v1/models", headers={"Origin": "http://evil.example"})).status_code == 200


async def test_allowed_origins_and_the_off_switch():
    async with client(base_url=LOCAL, allowed_origins=("http://localhost:3000/",)) as c:
        assert (await c.post("/v1/audio/speech", json=SPEECH,
                             headers={"Origin": "http://localhost:3000"})).status_code == 200
        assert_error(await c.post("/v1/audio/speech", json=SPEECH, headers={"Origin": "http://localhost:3001"}),
                     403, code="cross_origin_refused")
    async with client(base_url=LOCAL, allowed_origins=("*",)) as c:
        assert (await c.post("/v1/audio/speech", json=SPEECH,
                             headers={"Origin": "http://evil.example", "Host": "evil.example"})).status_code == 200


async def test_with_a_key_the_guard_is_off():
    async with client(base_url=LOCAL, api_key=KEY) as c:
        r = await c.post("/v1/audio/speech", json=SPEECH,
                         headers={"Origin": "http://evil.example", "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200


def test_cross_origin_websocket_is_refused_without_a_key():
    with TestClient(create_app(AllFake(), Settings())) as tc:
        with pytest.raises(WebSocketDenialResponse) as denied:
            with tc.websocket_connect("ws://127.0.0.1:9000" + WS, headers={"Origin": "http://evil.example"}):
                pass
        assert denied.value.status_code == 403 and denied.value.json()["error"]["code"] == "cross_origin_refused"
        with tc.websocket_connect("ws://127.0.0.1:9000" + WS, headers={"Origin": LOCAL}) as ws:
            assert ws_session(ws)["type"] == "session.done"


async def test_dns_rebinding_host_is_refused_on_loopback():
    async with client(base_url=LOCAL) as c:
        # a page on http://evil.example:9000 rebound to 127.0.0.1: same-origin for the browser
        for method in ("GET", "POST"):
            for host in ["evil.example:9000", "evil.example@127.0.0.1:9000", "127.0.0.1:x", "[::1", ""]:
                r = await c.request(method, "/health", headers={"Host": host})
                assert_error(r, 403, code="host_not_allowed")
        for host in ["localhost:9000", "127.0.0.1:9000", "[::1]:9000", "app.localhost:9000"]:
            assert (await c.get("/health", headers={"Host": host})).status_code == 200, host
    async with client(base_url=LOCAL, allowed_origins=("https://api.example.com",)) as c:
        assert (await c.get("/health", headers={"Host": "api.example.com"})).status_code == 200
    async with client(base_url="http://10.0.0.5:9000") as c:  # arrived on another interface: no Host rule
        assert (await c.get("/health", headers={"Host": "frontend.internal:9000"})).status_code == 200


# --------------------------------------------------------------------------- X-Ignored-Fields
async def test_ignored_fields_header_is_bounded_in_count_and_bytes(caplog):
    many = {f"field_{i:05d}": 1 for i in range(20_000)}
    async with client() as c:
        r = await c.post("/v1/audio/speech", json={**SPEECH, **many})
        assert r.status_code == 200
        value = r.headers["x-ignored-fields"]
        assert len(value.encode()) <= 1024
        items = value.split(", ")
        assert items[:16] == [f"field_{i:05d}" for i in range(16)] and items[16] == "... (+19984 more)"
        r = await c.post("/v1/audio/speech", json={**SPEECH, "k" * 1_000_000: 1})
        assert r.status_code == 200 and r.headers["x-ignored-fields"] == "k" * 61 + "..."
    # the warning line is the same bounded text
    assert max(len(rec.getMessage()) for rec in caplog.records) < 2048


@pytest.mark.parametrize("name", ["€", "a\r\nX-Injected: 1", "naïve", "a,b%20", "\x00\x7f\"\\", "日本語" * 30])
async def test_ignored_field_names_are_percent_encoded(name):
    body = json.dumps({**SPEECH, name: 1}).encode()
    async with client() as c:
        r = await c.post("/v1/audio/speech", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200
    value = r.headers["x-ignored-fields"]
    assert value.isascii() and "\r" not in value and "\n" not in value and "x-injected" not in r.headers
    assert len(value) <= 64 and "," not in value
    if not value.endswith("..."):
        assert unquote(value, errors="surrogatepass") == name


def test_field_names_with_lone_surrogates_encode():
    """(The JSON routes refuse lone surrogates with a 400 before this; multipart names may not.)"""
    from openai_frontend.middleware import format_field_names

    assert format_field_names(["\ud800x"]) == "%ED%A0%80x"


def test_no_other_key_comparison_in_the_frontend():
    """Every key check goes through ``auth.ApiKeyCheck``: no other module reads the configured key
    or compares keys (``speech_stream`` compared it with ``==`` and read ``?api_key=``)."""
    import re
    from pathlib import Path

    import openai_frontend

    root = Path(openai_frontend.__file__).parent
    pattern = re.compile(r"settings\.api_key|\.api_key\b\s*[=!]=|compare_digest|get\(\s*[\"']api_key[\"']")
    allowed = {"auth.py", "app.py"}  # the check; the app builds it from the setting
    readers = [str(p.relative_to(root)) for p in root.rglob("*.py")
               if p.name not in allowed and pattern.search(p.read_text())]
    assert readers == []


def test_format_field_names_bounds_hold_for_any_names():
    """Seeded random names (CR/LF, commas, percent signs, NUL, surrogates, emoji; 0-40 names of
    0-200 characters): the value is ASCII, <= 1 KiB, <= 16 names of <= 64 characters, and the
    shown names plus the counted rest are all of them."""
    import random
    import re

    from openai_frontend.middleware import format_field_names

    rng = random.Random(23)
    alphabet = ["a", "€", "\r", "\n", ",", "%", " ", "日", "\x00", "\ud800", "\U0001F600", '"', "\\"]
    for _ in range(400):
        count = rng.choice([0, 1, 2, 15, 16, 17, 40])
        lengths = rng.choice([[0, 1, 5, 63, 64, 65, 200], [62, 63, 64, 65, 200]])  # mixed, or all long
        names = ["".join(rng.choice(alphabet) for _ in range(rng.choice(lengths))) for _ in range(count)]
        value = format_field_names(names)
        assert value.isascii() and "\r" not in value and "\n" not in value and len(value) <= 1024
        if not count:
            continue
        items = value.split(", ")
        rest = re.fullmatch(r"\.\.\. \(\+(\d+) more\)", items[-1])
        shown = items[:-1] if rest else items
        assert len(shown) <= 16 and all(len(item) <= 64 and "," not in item for item in shown)
        assert len(shown) + (int(rest[1]) if rest else 0) == count

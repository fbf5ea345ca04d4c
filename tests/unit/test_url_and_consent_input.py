"""Control characters in URLs and consent fields, through the app on both metadata stores
(SQLite files, and a REAL PostgreSQL from tests/helpers/postgres_db.py, which refuses NUL in
text: these requests were 500s there): a NUL (or any C0 control character / DEL) in a decoded
path or query string is a 400 ``invalid_characters`` before any route runs; NUL in a form or
JSON field is refused by the field check; consent ``name`` is 1-64 characters like a voice's,
``language`` a BCP 47 tag; ``?after=`` naming no consent is a 400 like ``/v1/videos``."""
from __future__ import annotations

import httpx
import pytest
from test_videos_frontend import FakeVideoEngine
from test_voices import wav_bytes

from openai_frontend.app import Settings, create_app
from openai_frontend.video_jobs import JobSettings
from openai_frontend.voice_store import VoiceSettings
from tests.helpers.postgres_db import pg_url, postgres_server  # noqa: F401  (fixtures)


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(params=["sqlite", "postgres"])
async def c(request, tmp_path):
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    app = create_app(FakeVideoEngine(), Settings(
        database_url=url, video=JobSettings(storage_dir=tmp_path / "videos", sweep_interval_s=3600),
        voices=VoiceSettings(storage_dir=tmp_path / "voices", min_seconds=1.0, max_seconds=5.0)))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        yield client


def _err(r: httpx.Response, status: int, code: str, param: str | None = None) -> None:
    assert r.status_code == status, (r.request.method, r.request.url, r.text)
    error = r.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error", error
    if param is not None:
        assert error["param"] == param, error


async def _consent(c, name="me", language="en-US") -> httpx.Response:
    return await c.post("/v1/audio/voice_consents", data={"name": name, "language": language},
                        files={"recording": ("c.wav", wav_bytes(1.5), "audio/wav")})


URLS = [
    ("DELETE", "/v1/audio/voices/%00", None),
    ("GET", "/v1/audio/voice_consents/%00", None),
    ("DELETE", "/v1/audio/voice_consents/%00", None),
    ("POST", "/v1/audio/voice_consents/%00", {"name": "x"}),
    ("GET", "/v1/audio/voice_consents?after=%00", None),
    ("GET", "/v1/videos?after=%00", None),
    ("GET", "/v1/videos/video_%00", None),
    ("GET", "/v1/audio/voice_consents?after=a%01b", None),
    ("GET", "/v1/audio/voice_consents/cons_%7F", None),
    ("GET", "/v1/videos?after=+%1F", None),
]


@pytest.mark.anyio
@pytest.mark.parametrize("method,url,body", URLS)
async def test_control_characters_in_the_url_are_a_400(c, method, url, body):
    r = await c.request(method, url, json=body)
    _err(r, 400, "invalid_characters")


@pytest.mark.anyio
async def test_nul_in_fields_is_a_400_and_stores_nothing(c):
    _err(await _consent(c, name="a\x00b"), 400, "invalid_characters", "name")
    _err(await _consent(c, language="en\x00"), 400, "invalid_characters", "language")
    cid = (await _consent(c)).json()["id"]
    _err(await c.post(f"/v1/audio/voice_consents/{cid}", json={"name": "a\x00"}), 400, "invalid_characters", "name")
    _err(await c.post("/v1/audio/voices", data={"name": "v\x00", "type": "prompt", "prompt": "calm"}),
         400, "invalid_characters", "name")
    _err(await c.post("/v1/audio/voices", data={"name": "v", "type": "prompt", "prompt": "calm\x00"}),
         400, "invalid_characters", "prompt")
    _err(await c.post("/v1/videos", data={"prompt": "a cat\x00"}), 400, "invalid_characters")
    assert [x["name"] for x in (await c.get("/v1/audio/voice_consents")).json()["data"]] == ["me"]


@pytest.mark.anyio
async def test_consent_name_and_language_are_bounded(c):
    _err(await _consent(c, name="n" * 65), 400, "invalid_value", "name")
    _err(await _consent(c, name="a\tb"), 400, "invalid_value", "name")
    for bad in ("english", "en_US", "e", "en-", "en-US; DROP", "x" * 300):
        _err(await _consent(c, language=bad), 400, "invalid_value", "language")
    for good in ("en", "yue", "en-US", "zh-Hans-CN"):
        assert (await _consent(c, name="n" * 64, language=good)).status_code == 200
    cid = (await _consent(c)).json()["id"]
    _err(await c.post(f"/v1/audio/voice_consents/{cid}", json={"name": "b" * 100_000}), 400, "invalid_value", "name")
    assert (await c.get(f"/v1/audio/voice_consents/{cid}")).json()["name"] == "me"
    assert (await c.post(f"/v1/audio/voice_consents/{cid}", json={"name": "b" * 64})).json()["name"] == "b" * 64


@pytest.mark.anyio
async def test_consent_cursor_naming_nothing_is_a_400_like_videos(c):
    ids = [(await _consent(c, name=f"c{i}")).json()["id"] for i in range(3)]
    page = (await c.get("/v1/audio/voice_consents", params={"after": ids[0], "limit": 1})).json()
    assert [x["id"] for x in page["data"]] == ids[1:2] and page["has_more"]
    _err(await c.get("/v1/audio/voice_consents", params={"after": "cons_nope"}), 400, "invalid_value", "after")
    _err(await c.get("/v1/videos", params={"after": "nope"}), 400, "invalid_value", "after")

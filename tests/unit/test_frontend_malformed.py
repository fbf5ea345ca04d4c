"""The malformed-payload suite (``clients/malformed_payloads.py``, >= 100 cases per endpoint)
through ASGI against a fake engine: every case is a 4xx with the OpenAI error body, the fake
engine never sees one of them, and a valid request of each endpoint succeeds afterwards.
The same cases run against the real server in ``tests/e2e/test_malformed.py``."""

from __future__ import annotations

import httpx
import pytest
from test_frontend_bad_input import AllFake

from clients import malformed_payloads as mp
from openai_frontend.app import Settings, create_app

pytestmark = pytest.mark.anyio

#: the fake's models under the names the cases use
MODELS = mp.Models(chat="llm", image="qwen_image", image_edit="qwen_image_edit", speech="piper_tts", video="wan_t2v")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.parametrize("endpoint", mp.ENDPOINTS)
def test_at_least_100_cases_per_endpoint(endpoint):
    assert len(mp.cases(endpoint, MODELS)) >= 100


@pytest.mark.parametrize("endpoint", mp.ENDPOINTS)
async def test_every_malformed_case_is_a_4xx_with_the_openai_error_body(endpoint):
    """With ``--strict-params`` (OpenAI's behaviour), so the unknown-field cases are 400s too."""
    engine = AllFake()
    app = create_app(engine, Settings(strict_params=True))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        await _assert_every_case_is_a_4xx(c, mp.cases(endpoint, MODELS, strict_params=True))
        # nothing reached the engine, and the server still serves
        assert engine.requests == [] and engine.images.jobs == [] and engine.speech_started == 0
        valid = mp.valid_request(endpoint, MODELS)
        if endpoint == "images_edits":
            r = await c.post(mp.PATHS[endpoint], data=valid, files=mp.valid_files())
        else:
            r = await c.post(mp.PATHS[endpoint], json=valid)
        assert r.status_code == 200, r.text
    assert app.state.admission.inflight == 0


@pytest.mark.parametrize("endpoint", mp.FORM_ENDPOINTS)
async def test_every_malformed_form_case_is_a_4xx_with_the_openai_error_body(endpoint, tmp_path):
    """Videos and voices read their own form or JSON body: the same catalogue against the real
    app with its stores (``fake_engine.fake_app``); nothing is stored, and a valid request
    succeeds afterwards."""
    from fake_engine import fake_app

    assert len(mp.cases(endpoint, MODELS)) >= 80
    app = fake_app(tmp_path)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            await _assert_every_case_is_a_4xx(c, mp.cases(endpoint, MODELS))
            listed = (await c.get("/v1/videos" if endpoint == "videos" else "/v1/audio/voices")).json()
            assert listed.get("data" if endpoint == "videos" else "uploaded_voices") == []
            r = await mp.send_valid(c, endpoint, MODELS)
            assert r.status_code == 200, r.text


# ------------------------------------------------------------------ overload
async def test_overload_4x_the_admission_limit():
    """4x ``max_inflight`` concurrent requests over all APIs: each ends with 200 or 429/503 with
    ``Retry-After``; no slot leaks; a request after the burst succeeds."""
    import asyncio

    engine = AllFake()
    limit = 4
    app = create_app(engine, Settings(max_inflight=limit))
    requests = [(mp.PATHS[e], mp.valid_request(e, MODELS)) for e in mp.ENDPOINTS if e != "images_edits"]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        rs = await asyncio.gather(*[c.post(*requests[i % len(requests)][:1], json=requests[i % len(requests)][1])
                                    for i in range(4 * limit)])
        statuses = [r.status_code for r in rs]
        assert set(statuses) <= {200, 429, 503}, statuses
        assert 200 in statuses and 429 in statuses, statuses  # the burst did overload it
        for r in rs:
            if r.status_code != 200:
                assert r.headers["retry-after"] and mp.check(r.status_code, r.content) is None
        assert (await c.post(requests[0][0], json=requests[0][1])).status_code == 200
    assert app.state.admission.inflight == 0


async def _assert_every_case_is_a_4xx(client, cases) -> None:
    """Post every catalogue case; fail listing each one whose answer is not a 4xx in the OpenAI
    error shape (``malformed_payloads.check``)."""
    failures = []
    for case in cases:
        r = await client.post(case.path, **case.request_kwargs())
        problem = mp.check(r.status_code, r.content)
        if problem:
            failures.append(f"{case.name}: {problem}")
    assert not failures, f"{len(failures)} of {len(cases)} cases: " + "\n".join(failures[:40])

"""Bad input measured as 5xx (issue 9) is a 4xx in the OpenAI error shape; unexpected errors are
JSON 500s that keep the connection; strict types; bounded fan-out; API key; body caps.

Runs the app through ASGI against the fakes of the other frontend unit tests.
"""

from __future__ import annotations

import asyncio
import io
import json

import httpx
import numpy as np
import pytest
from PIL import Image
from test_chat_frontend import USER, ChatFakeEngine, assert_error
from test_images_frontend import FakeImageEngine

from openai_frontend.app import Settings, create_app
from tests.helpers.frontend import frontend_client

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class AllFake(ChatFakeEngine):
    """Chat, completions, speech and image models in one fake (chat behaviour from
    ``ChatFakeEngine``, images from ``FakeImageEngine``, speech: one chunk of silence)."""

    def __init__(self):
        self.images = FakeImageEngine()
        super().__init__()
        self.models = {**self.images.models, **self.models}  # the chat fakes' piper_tts has voices
        self.speech_started = 0

    async def generate_images(self, model, job):
        return await self.images.generate_images(model, job)

    async def stage_statistics(self, models):
        return {**await self.images.stage_statistics(models), **await super().stage_statistics(models)}

    async def synthesize(self, model, text, voice=None, speed=None, paced=False):
        self.speech_started += 1
        await asyncio.sleep(0)
        yield np.zeros(2205, np.float32), self.models[model].sample_rate or 22050


def client(engine, **settings) -> httpx.AsyncClient:
    return frontend_client(engine, raise_app_exceptions=False, **settings)


def raw(payload) -> dict:
    """Request kwargs of a JSON body written by Python's encoder, which keeps lone surrogates as
    ``\\ud800`` escapes and writes ``NaN``/``Infinity`` (httpx's ``json=`` would refuse both)."""
    return {"content": json.dumps(payload, allow_nan=True).encode(),
            "headers": {"content-type": "application/json"}}


def png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 200, 30)).save(buf, "PNG")
    return buf.getvalue()


LONE = "\ud800"
CHAT = {"model": "llm", "messages": USER}
IMAGE = {"model": "qwen_image", "prompt": "a fox"}


# ------------------------------------------------------------------ lone surrogates
@pytest.mark.parametrize("path, payload, param", [
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": LONE}]}, "messages"),
    ("/v1/chat/completions",
     {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "a" + LONE}]}]}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "hi", "name": LONE}]}, "messages"),
    ("/v1/chat/completions", {**CHAT, "model": LONE}, "model"),
    ("/v1/chat/completions", {**CHAT, "stop": [LONE]}, "stop"),
    ("/v1/completions", {"model": "llm", "prompt": LONE}, "prompt"),
    ("/v1/completions", {"model": "llm", "prompt": ["ok", LONE]}, "prompt"),
    ("/v1/completions", {"model": LONE, "prompt": "x"}, "model"),
    ("/v1/images/generations", {**IMAGE, "prompt": LONE}, "prompt"),
    ("/v1/images/generations", {**IMAGE, "negative_prompt": LONE}, "negative_prompt"),
    ("/v1/images/generations", {**IMAGE, "model": LONE}, "model"),
    ("/v1/audio/speech", {"model": "piper_tts", "input": "x", "voice": LONE}, "voice"),
    ("/v1/audio/speech", {"model": "piper_tts", "input": LONE}, "input"),
])
async def test_lone_surrogate_is_400(path, payload, param):
    engine = AllFake()
    async with client(engine) as c:
        r = await c.post(path, **raw(payload))
    assert_error(r, 400, param=param, code="invalid_characters")
    assert engine.requests == [] and engine.images.jobs == []


async def test_nul_in_chat_content_is_400():
    async with client(AllFake()) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": "a\x00b"}]})
    assert_error(r, 400, param="messages", code="invalid_characters")


# ------------------------------------------------------------------ issue 23: the 500s of single requests
# Each probe of issue 23 against the real app with every store (``fake_engine.fake_app``: voices
# and video jobs in a temp folder) on one fake engine of every model kind.
@pytest.fixture
async def full(tmp_path):
    from fake_engine import fake_app

    app = fake_app(tmp_path)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            c.app = app
            yield c


SPEECH = {"model": "piper_tts", "input": "Hello."}


@pytest.mark.parametrize("name, header", [
    ("€", "%E2%82%AC"), ("naïve", "na%C3%AFve"), ("\ud800", None),
    ("a\r\nX-Evil: 1", "a%0D%0AX-Evil:%201"), ("100%", "100%25"),
])
async def test_unknown_field_of_any_name_is_ignored_and_named_in_a_latin1_header(full, name, header):
    """``X-Ignored-Fields`` carries only printable ASCII: other characters of a field name (and
    ``%``) are percent-encoded as UTF-8 (a lone surrogate as its 3 bytes), so the header always
    encodes (a non-Latin-1 name was a 500) and cannot be split (CR/LF). A name that is not
    Unicode text (a lone surrogate) is a 400."""
    for path, body in (("/v1/audio/speech", SPEECH), ("/v1/chat/completions", CHAT)):
        r = await full.post(path, **raw({**body, name: 1}))
        if header is None:
            assert_error(r, 400)
            continue
        assert r.status_code == 200, r.text
        assert r.headers["x-ignored-fields"] == header
        assert "x-evil" not in r.headers


async def test_unknown_non_latin1_field_with_strict_params_is_400():
    async with client(AllFake(), strict_params=True) as c:
        r = await c.post("/v1/audio/speech", **raw({**SPEECH, "€": 1}))
    err = assert_error(r, 400, code="unknown_parameter")
    assert "€" in err["message"]


#: every route that reads a form, with a valid text field
FORM_ROUTES = [("/v1/audio/speech", {"model": "piper_tts", "input": "Hello."}),
               ("/v1/videos", {"prompt": "a fox"}), ("/v1/videos/sync", {"prompt": "a fox"}),
               ("/v1/audio/voices", {"name": "v", "type": "prompt", "prompt": "calm"}),
               ("/v1/audio/voice_consents", {"name": "me", "language": "en"}),
               ("/v1/images/edits", {"model": "qwen_image_edit", "prompt": "blue"})]
BOGUS_CONTENT_TYPES = ["multipart/form-data", "multipart/form-data; boundary=", 'multipart/form-data; boundary=""',
                       "multipart/form-data; boundary=x", "multipart/form-data; boundary=\xe4\xff",
                       "multipart/form-data; boundary=x; charset=no-such-charset", "multipart/form-data;;;=;",
                       "multipart/mixed; boundary=x", "application/x-www-form-urlencoded; charset=no-such-charset"]


@pytest.mark.parametrize("ctype", BOGUS_CONTENT_TYPES)
@pytest.mark.parametrize("path", [p for p, _ in FORM_ROUTES])
async def test_bogus_multipart_content_type_is_400(full, path, ctype):
    body = b"--x\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\n\xff\r\n--y--\r\n"
    r = await full.post(path, content=body, headers={"content-type": ctype.encode("latin-1")})
    assert 400 <= r.status_code < 500, r.text
    assert_error(r, r.status_code)


@pytest.mark.parametrize("path, fields", FORM_ROUTES)
async def test_too_many_files_is_400(full, path, fields):
    files = [("ref_audio", ("a.wav", b"RIFF", "audio/wav"))] * 9
    r = await full.post(path, data=fields, files=files)
    assert_error(r, 400, code="invalid_multipart")


@pytest.mark.parametrize("path, fields", FORM_ROUTES)
async def test_text_part_over_its_cap_is_4xx(full, path, fields):
    key = next(iter(fields))
    r = await full.post(path, data={**fields, key: "x" * ((1 << 20) + 1)},
                        files=[("unused", ("a.bin", b"x", "application/octet-stream"))])
    err = assert_error(r, r.status_code)
    assert r.status_code in (400, 413), err


async def test_speech_with_three_files_is_400(full):
    files = [("ref_audio", ("a.wav", b"RIFF", "audio/wav"))] * 3
    r = await full.post("/v1/audio/speech", data={"model": "qwen3_tts", "input": "hi"}, files=files)
    assert_error(r, 400, code="invalid_multipart")


@pytest.mark.parametrize("size", ["²x²", "①⑥x16", "１６x１６", "16x16 ", " 16x16", "16x", "x16", "16x16x16",
                                  "9" * 5000 + "x16", "-16x16", "+16x16", "1_6x16"])
@pytest.mark.parametrize("path", ["/v1/videos", "/v1/videos/sync"])
async def test_video_size_is_ascii_digits_only(full, path, size):
    r = await full.post(path, data={"prompt": "a fox", "model": "wan_t2v", "size": size})
    assert_error(r, 400, param="size", code="invalid_size")


@pytest.mark.parametrize("field", ["width", "height", "num_frames", "fps", "seed", "num_inference_steps",
                                   "seconds", "guidance_scale"])
@pytest.mark.parametrize("value", ["²", "١٦", "１６", "1e400", "NaN"])
async def test_video_numbers_are_ascii_only(full, field, value):
    r = await full.post("/v1/videos", data={"prompt": "a fox", "model": "wan_t2v", field: value})
    assert_error(r, 400, param=field)


async def test_video_with_valid_ascii_size_still_works(full):
    r = await full.post("/v1/videos/sync", data={"prompt": "a fox", "model": "wan_t2v", "size": "16x32"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "video/mp4"


@pytest.mark.parametrize("video_id", ["%00", "**", "*", "[", "video_*", "video_%5B", ".video_x", "%2e%2e",
                                      "video_" + "0" * 23 + "g", "video_" + "A" * 24, "x" * 5000, "%ED%A0%80"])
async def test_malformed_video_id_is_404_and_touches_nothing(full, video_id):
    """Ids are checked against their exact format (``video_`` + 24 hex digits) before any store or
    file use: ``DELETE /v1/videos/*`` used to glob, and removed other jobs' temporary files."""
    r = await full.post("/v1/videos", data={"prompt": "a fox", "model": "wan_t2v"})
    assert r.status_code == 200, r.text
    job = r.json()["id"]
    videos = full.app.state.video_jobs.media.local_path("videos")
    videos.mkdir(parents=True, exist_ok=True)
    tmp = videos / f".{job}.mp4.abc123.tmp"  # another job's MP4 being written (write_atomic)
    tmp.write_bytes(b"partial")
    for method, path in (("DELETE", f"/v1/videos/{video_id}"), ("GET", f"/v1/videos/{video_id}"),
                         ("GET", f"/v1/videos/{video_id}/content")):
        r = await full.request(method, path)
        if video_id == "%00":  # a control character in the URL: refused before any route runs
            assert_error(r, 400, code="invalid_characters")
        else:
            assert_error(r, 404)
    assert tmp.exists()
    assert (await full.get(f"/v1/videos/{job}")).status_code == 200


async def test_deleting_a_job_removes_its_own_temporary_files_only(full):
    ids = [(await full.post("/v1/videos", data={"prompt": "a fox", "model": "wan_t2v"})).json()["id"]
           for _ in range(2)]
    videos = full.app.state.video_jobs.media.local_path("videos")
    videos.mkdir(parents=True, exist_ok=True)
    mine, other = videos / f".{ids[0]}.mp4.a.tmp", videos / f".{ids[1]}.mp4.b.tmp"
    mine.write_bytes(b"x")
    other.write_bytes(b"x")
    assert (await full.delete(f"/v1/videos/{ids[0]}")).status_code == 200
    assert not mine.exists() and other.exists()


@pytest.mark.parametrize("range_, status", [("bytes=²-", 400), ("bytes=5-1", 400), ("bytes=", 400), ("items=0-1", 400),
                                            ("bytes=a-b", 400), ("bytes=-0", 416), ("bytes=999999-", 416)])
async def test_bad_range_on_video_content_is_an_openai_error(full, range_, status):
    """Starlette's ``FileResponse`` answers a bad ``Range`` with plain text; the content route
    answers it in the OpenAI error shape (416 with ``Content-Range``); good ranges still work."""
    vid = (await full.post("/v1/videos", data={"prompt": "a fox", "model": "wan_t2v"})).json()["id"]
    for _ in range(100):
        if (await full.get(f"/v1/videos/{vid}")).json()["status"] == "completed":
            break
        await asyncio.sleep(0.05)
    r = await full.get(f"/v1/videos/{vid}/content", headers={"range": range_.encode()})
    assert_error(r, status, code="invalid_range" if status == 400 else "range_not_satisfiable")
    if status == 416:
        assert r.headers["content-range"].startswith("bytes */")
    r = await full.get(f"/v1/videos/{vid}/content", headers={"range": "bytes=0-3"})
    assert r.status_code == 206 and len(r.content) == 4


def jraw(payload) -> dict:
    """A JSON body with lone surrogates kept as ``\\udXXX`` escapes (``raw``)."""
    return raw(payload)


@pytest.mark.parametrize("path, payload, param", [
    ("/v1/audio/voices", {"name": LONE, "type": "prompt", "prompt": "calm"}, "name"),
    ("/v1/audio/voices", {"name": "v", "type": "prompt", "prompt": "a" + LONE}, "prompt"),
    ("/v1/audio/voices", {"name": "v", "type": LONE, "prompt": "calm"}, "type"),
    ("/v1/audio/voices", {"name": "v", "consent": LONE, "audio_sample": "x"}, "consent"),
    ("/v1/audio/voice_consents", {"name": LONE, "language": "en", "recording": "x"}, "name"),
    ("/v1/audio/voice_consents", {"name": "me", "language": LONE, "recording": "x"}, "language"),
    ("/v1/videos", {"prompt": "a fox", "model": LONE}, "model"),
    ("/v1/videos", {"prompt": "a fox", "negative_prompt": LONE}, "negative_prompt"),
    ("/v1/videos", {"prompt": "a fox", "model": "wan_t2v", "size": LONE}, "size"),
    ("/v1/videos/sync", {"prompt": LONE, "model": "wan_t2v"}, "prompt"),
    ("/v1/audio/speech", {**SPEECH, "model": "qwen3_tts", "voice": {"id": LONE}}, "voice"),
    ("/v1/audio/speech", {**SPEECH, "model": "qwen3_tts", "instructions": LONE}, "instructions"),
    ("/v1/audio/speech", {**SPEECH, "model": "qwen3_tts", "language": LONE}, "language"),
    ("/v1/audio/speech", {**SPEECH, "model": "qwen3_tts", "task_type": LONE}, "task_type"),
])
async def test_lone_surrogate_anywhere_is_400(full, path, payload, param):
    """A string that cannot be UTF-8 never reaches SQLite, a file name, a header or Triton."""
    r = await full.post(path, **jraw(payload))
    assert_error(r, 400, param=param)


@pytest.mark.parametrize("body", [b"[" * 50000 + b"]" * 50000, b'{"a":' * 50000 + b"1" + b"}" * 50000,
                                  b'{"prompt": "\xff"}', b"null", b'"x"', b"{"])
@pytest.mark.parametrize("path", ["/v1/videos", "/v1/videos/sync", "/v1/audio/voices", "/v1/audio/voice_consents"])
async def test_json_body_too_deep_or_not_an_object_is_400(full, path, body):
    """The routes that parse their own JSON body: a nesting deeper than the parser's recursion
    limit was a 500 (``RecursionError``)."""
    r = await full.post(path, content=body, headers={"content-type": "application/json"})
    assert_error(r, 400, code="invalid_json")


async def test_lone_surrogate_in_a_batch_item_fails_that_item_with_its_field(full):
    r = await full.post("/v1/audio/speech/batch", **jraw({"model": "piper_tts", "items": [
        {"input": "x", "voice": LONE}, {"input": "y"}]}))
    assert r.status_code == 200, r.text
    bad, good = r.json()["results"]
    assert (bad["status"], bad["param"], bad["code"], bad["status_code"]) == ("error", "voice", "invalid_characters",
                                                                              400), bad
    assert good["status"] == "success", good


async def test_lone_surrogate_in_a_consent_rename_is_400(full):
    from test_voices import wav_bytes

    r = await full.post("/v1/audio/voice_consents", data={"name": "me", "language": "en"},
                        files={"recording": ("r.wav", wav_bytes(1.0), "audio/wav")})
    assert r.status_code == 200, r.text
    r = await full.post(f"/v1/audio/voice_consents/{r.json()['id']}", **jraw({"name": LONE}))
    assert_error(r, 400, param="name")


@pytest.mark.parametrize("message", [
    {"type": "input.text", "text": "Hello " + LONE + ". "},
    {"type": "input.text", "text": ["not", "text"]},
    {"type": "session.config", "model": "piper_tts", "voice": LONE},
    {"type": "session.config", "model": LONE},
    {"type": LONE},
])
def test_websocket_message_with_a_lone_surrogate_is_an_error_event_and_the_session_goes_on(tmp_path, message):
    """A WebSocket text frame's JSON may hold ``\\ud800`` escapes: such text never reaches the
    engine or a JSON reply (both encode UTF-8); an ``error`` event says so and the session
    still speaks."""
    from fake_engine import fake_app
    from starlette.testclient import TestClient

    with TestClient(fake_app(tmp_path)) as tc, tc.websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_text(json.dumps({"type": "session.config", "model": "piper_tts", "response_format": "wav"}))
        ws.send_text(json.dumps(message))
        event = ws.receive_json()
        assert event["type"] == "error" and event["code"] in ("invalid_characters", "invalid_value", "invalid_message",
                                                              "model_not_found"), event
        ws.send_text(json.dumps({"type": "session.config", "model": "piper_tts", "response_format": "wav"}))
        ws.send_text(json.dumps({"type": "input.text", "text": "Still here. "}))
        ws.send_text(json.dumps({"type": "input.done"}))
        assert ws.receive_json()["type"] == "audio.start"
        assert ws.receive_bytes()[:4] == b"RIFF"
        assert ws.receive_json()["type"] == "audio.done"


@pytest.mark.parametrize("messages", [[{"role": "user", "content": None}], [{"role": "user"}],
                                      [{"role": "user", "content": [{"type": "input_audio"}]}]])
async def test_tokenize_messages_the_chat_template_cannot_render_are_400(full, messages):
    """Found by schemathesis: ``content: null`` made the chat template raise ``TypeError`` (a 500)."""
    from omni_triton.paths import model_dir

    if not (model_dir("smollm2") / "tokenizer.json").exists():
        pytest.skip("the prepared smollm2 folder (its tokenizer) is missing: run scripts/setup.sh")
    r = await full.post("/tokenize", json={"model": "llm", "messages": messages})
    assert_error(r, 400, param="messages")


async def test_model_name_the_engine_cannot_encode_is_404_not_500(full):
    """``model`` values reach Triton's gRPC API as UTF-8: a lone surrogate is an unknown model."""
    r = await full.post("/v1/videos", **jraw({"prompt": "a fox", "model": "wan" + LONE}))
    assert r.status_code in (400, 404), r.text
    assert_error(r, r.status_code, param="model")


# ------------------------------------------------------------------ sizes, sampling, guidance
@pytest.mark.parametrize("size", ["²³x64", "①⑥x16", "6４x64", "64x64 ", "9" * 5000 + "x64"])
async def test_size_with_non_ascii_digits_is_400(size):
    async with client(AllFake()) as c:
        r = await c.post("/v1/images/generations", json={**IMAGE, "size": size})
        assert_error(r, 400, param="size", code="invalid_size")
        r = await c.post("/v1/chat/completions", json={"model": "qwen_image", "messages": USER, "size": size})
        assert_error(r, 400, param="size", code="invalid_size")


@pytest.mark.parametrize("field", ["top_k", "min_tokens", "max_tokens", "max_completion_tokens", "n", "seed"])
async def test_huge_integer_sampling_fields_are_400(field):
    engine = AllFake()
    async with client(engine) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, field: 1180591620717411303424})
        assert_error(r, 400, param=field)
        if field != "max_completion_tokens":
            r = await c.post("/v1/completions", json={"model": "llm", "prompt": "x", field: 1180591620717411303424})
            assert_error(r, 400, param=field)
    assert engine.requests == []


@pytest.mark.parametrize("value", [1e308, float("inf"), float("-inf"), float("nan"), 101.0, -1.0])
@pytest.mark.parametrize("field", ["true_cfg_scale", "guidance_scale"])
async def test_guidance_scales_are_finite_and_bounded(field, value):
    engine = AllFake()
    async with client(engine) as c:
        r = await c.post("/v1/images/generations", **raw({**IMAGE, field: value}))
        assert_error(r, 400, param=field)
        r = await c.post("/v1/chat/completions", **raw({"model": "qwen_image", "messages": USER, field: value}))
        assert_error(r, 400, param=field)
        r = await c.post("/v1/images/edits", files={"image": ("a.png", png(64, 64), "image/png")},
                         data={"model": "qwen_image_edit", "prompt": "x", field: repr(value)})
        assert_error(r, 400, param=field)
    assert engine.images.jobs == []


@pytest.mark.parametrize("path, payload, param", [
    ("/v1/chat/completions", {**CHAT, "max_tokens": True}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "n": "2"}, "n"),
    ("/v1/chat/completions", {**CHAT, "temperature": "0.5"}, "temperature"),
    ("/v1/chat/completions", {**CHAT, "stream": "true"}, "stream"),
    ("/v1/chat/completions", {**CHAT, "seed": 1.0}, "seed"),
    ("/v1/completions", {"model": "llm", "prompt": "x", "n": "2"}, "n"),
    ("/v1/completions", {"model": "llm", "prompt": "x", "max_tokens": True}, "max_tokens"),
    ("/v1/images/generations", {**IMAGE, "n": "2"}, "n"),
    ("/v1/images/generations", {**IMAGE, "seed": "7"}, "seed"),
    ("/v1/images/generations", {**IMAGE, "output_format": ""}, "output_format"),
    ("/v1/chat/completions", {"model": "qwen_image", "messages": USER, "output_format": ""}, "output_format"),
    ("/v1/audio/speech", {"model": "piper_tts", "input": "x", "speed": "1.5"}, "speed"),
    ("/v1/audio/speech", {"model": "piper_tts", "input": "x", "stream": 1}, "stream"),
])
async def test_strict_types(path, payload, param):
    engine = AllFake()
    async with client(engine) as c:
        r = await c.post(path, json=payload)
    assert_error(r, 400, param=param)
    assert engine.requests == [] and engine.images.jobs == [] and engine.speech_started == 0


async def test_edit_form_fields_are_still_parsed_from_strings():
    engine = AllFake()
    async with client(engine) as c:
        r = await c.post("/v1/images/edits", files={"image": ("a.png", png(64, 64), "image/png")},
                         data={"model": "qwen_image_edit", "prompt": "x", "n": "2", "seed": "3",
                               "true_cfg_scale": "2.5"})
    assert r.status_code == 200, r.text
    job = engine.images.jobs[-1][1]
    assert (job.n, job.seed, job.true_cfg_scale) == (2, 3, 2.5)


# ------------------------------------------------------------------ edits: aspect ratio
@pytest.mark.parametrize("w, h", [(4096, 4), (2, 4096), (101, 1)])
async def test_edit_with_extreme_aspect_ratio_is_400(w, h):
    engine = AllFake()
    async with client(engine) as c:
        r = await c.post("/v1/images/edits", files={"image": ("a.png", png(w, h), "image/png")},
                         data={"model": "qwen_image_edit", "prompt": "x"})
        assert_error(r, 400, param="image", code="invalid_image")
        ok = await c.post("/v1/images/edits", files={"image": ("a.png", png(100, 1), "image/png")},
                          data={"model": "qwen_image_edit", "prompt": "x"})
    assert ok.status_code == 200, ok.text
    assert len(engine.images.jobs) == 1


# ------------------------------------------------------------------ completions fan-out
async def test_completions_fanout_is_bounded_and_counted():
    engine = AllFake()
    async with client(engine, max_fanout=16, max_inflight=32) as c:
        r = await c.post("/v1/completions", json={"model": "llm", "prompt": ["x"] * 64, "n": 16})
        assert_error(r, 400, param="prompt", code="too_many_generations")
        r = await c.post("/v1/completions", json={"model": "llm", "prompt": ["x"] * 17})
        assert_error(r, 400, param="prompt", code="too_many_generations")
        r = await c.post("/v1/chat/completions", json={**CHAT, "n": 5})
        assert r.status_code == 200
    async with client(engine, max_fanout=4) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "n": 5})
        assert_error(r, 400, param="n", code="too_many_generations")
    assert len(engine.requests) == 5


async def test_completions_fanout_counts_against_admission():
    """4 prompts x n=2 take 8 units: with 10 free, a second such request is a 429."""
    engine = AllFake()
    engine.block_at = 1
    app = create_app(engine, Settings(max_inflight=10))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        first = asyncio.create_task(c.post("/v1/completions",
                                           json={"model": "llm", "prompt": ["a", "b", "c", "d"], "n": 2}))
        await asyncio.wait_for(engine.reached_block.wait(), 5)
        assert app.state.admission.inflight == 8
        r = await c.post("/v1/completions", json={"model": "llm", "prompt": ["a", "b"], "n": 2})
        assert_error(r, 429, code="rate_limit_exceeded")
        assert r.headers["retry-after"]
        r = await c.post("/v1/audio/speech", json={"model": "piper_tts", "input": "x"})  # 1 unit fits
        assert r.status_code == 200, r.text
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
    await asyncio.sleep(0.05)
    assert app.state.admission.inflight == 0


# ------------------------------------------------------------------ unexpected errors
class Exploding(AllFake):
    async def list_models(self):
        raise RuntimeError("secret detail at /root/.cache/omni-triton/models/llm/weights.bin")


async def test_unexpected_error_is_a_json_500_that_keeps_the_connection():
    """No exception leaves the app (Starlette's ServerErrorMiddleware would answer, then re-raise,
    and uvicorn then drops the keep-alive connection without ``Connection: close``): with
    ``raise_app_exceptions`` on, the request would raise here."""
    app = create_app(Exploding(), Settings())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        r = await c.post("/v1/audio/speech", json={"input": "x"})
    err = assert_error(r, 500, code="internal_error")
    assert err["type"] == "server_error" and "RuntimeError" in err["message"]
    assert "/root" not in r.text and "secret" not in r.text and "Traceback" not in r.text
    assert r.headers.get("connection") != "close"


async def test_engine_error_messages_carry_no_paths():
    class PathyFailure(AllFake):
        async def generate_images(self, model, job):
            from openai_frontend.engine import InferenceError
            raise InferenceError(f"{model}: denoiser failed: [Errno 2] No such file: "
                                 "'/root/.cache/omni-triton/models/x/unet.bin' Traceback (most recent "
                                 "call last):\n  File \"/usr/lib/python3.11/a.py\", line 1")

    async with client(PathyFailure()) as c:
        r = await c.post("/v1/images/generations", json=IMAGE)
    err = assert_error(r, 500, code="inference_error")
    assert "/root" not in err["message"] and "Traceback" not in err["message"] and "<path>" in err["message"]


# ------------------------------------------------------------------ API key
@pytest.mark.parametrize("headers, status", [
    ({}, 401), ({"Authorization": "Bearer wrong"}, 401), ({"Authorization": "sk-test"}, 401),
    ({"Authorization": "Bearer sk-test"}, 200), ({"Authorization": "bearer sk-test"}, 200),
])
async def test_api_key(headers, status):
    async with client(AllFake(), api_key="sk-test") as c:
        r = await c.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert r.status_code == status, r.text
        if status == 401:
            assert_error(r, 401, code="invalid_api_key")
            assert r.headers["www-authenticate"] == "Bearer"
        assert (await c.get("/health")).status_code != 401
        assert (await c.get("/metrics")).status_code == 200
        assert (await c.get("/v1/models", headers=headers)).status_code == status


async def test_api_key_exempt_paths_are_configurable():
    async with client(AllFake(), api_key="k", auth_exempt_paths=("/metrics",)) as c:
        assert_error(await c.get("/health"), 401, code="invalid_api_key")
        assert (await c.get("/metrics")).status_code == 200
        assert (await c.get("/health", headers={"Authorization": "Bearer k"})).status_code == 200


async def test_sdk_sends_the_api_key():
    import openai

    app = create_app(AllFake(), Settings(api_key="sk-test"))
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    good = openai.AsyncOpenAI(base_url="http://test/v1", api_key="sk-test", http_client=http, max_retries=0)
    r = await good.chat.completions.create(model="llm", messages=USER)
    assert r.choices[0].message.content
    bad = openai.AsyncOpenAI(base_url="http://test/v1", api_key="nope", http_client=http, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await bad.chat.completions.create(model="llm", messages=USER)


def test_api_key_from_env_and_flag(monkeypatch):
    from openai_frontend.__main__ import parse_args

    monkeypatch.setenv("OMNI_TRITON_API_KEY", "from-env")
    assert parse_args([]).api_key == "from-env"
    assert parse_args(["--api-key", "flag"]).api_key == "flag"
    monkeypatch.delenv("OMNI_TRITON_API_KEY")
    assert parse_args([]).api_key is None


# ------------------------------------------------------------------ body and upload caps
async def chunks(data: bytes, size: int = 1000):
    for i in range(0, len(data), size):
        yield data[i:i + size]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/audio/speech",
                                  "/v1/images/generations"])
async def test_chunked_body_over_the_cap_is_413(path):
    body = json.dumps({"model": "llm", "prompt": "x" * 5000, "input": "y" * 5000}).encode()
    async with client(AllFake(), max_body_bytes=2000) as c:
        r = await c.post(path, content=chunks(body), headers={"content-type": "application/json"})
        assert_error(r, 413, code="payload_too_large")
        r = await c.post(path, content=body, headers={"content-type": "application/json"})
        assert_error(r, 413, code="payload_too_large")


async def test_chunked_multipart_over_the_cap_is_413():
    boundary = "b0undary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nx\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n"
            f"Content-Type: image/png\r\n\r\n").encode() + png(64,
                                                               64) + b"\0" * 6000 + f"\r\n--{boundary}--\r\n".encode()
    async with client(AllFake(), max_body_bytes=4000) as c:
        r = await c.post("/v1/images/edits", content=chunks(body),
                         headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert_error(r, 413, code="payload_too_large")


async def test_upload_over_the_cap_is_413():
    engine = AllFake()
    async with client(engine, max_upload_bytes=1000) as c:
        big = png(64, 64) + b"\0" * 2000
        r = await c.post("/v1/images/edits", files={"image": ("a.png", big, "image/png")},
                         data={"model": "qwen_image_edit", "prompt": "x"})
        assert_error(r, 413, param="image", code="payload_too_large")
        r = await c.post("/v1/images/edits", files=[("image", ("a.png", png(8, 8), "image/png"))] * 9,
                         data={"model": "qwen_image_edit", "prompt": "x"})
        assert_error(r, 400)
    assert engine.images.jobs == []


# ------------------------------------------------------------------ issue 23: the attack session's findings
def _multipart(fields: dict[str, bytes], boundary: str = "b") -> dict:
    body = b"".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n'.encode() + v + b"\r\n"
                    for k, v in fields.items()) + f"--{boundary}--\r\n".encode()
    return {"content": body, "headers": {"content-type": f"multipart/form-data; boundary={boundary}"}}


@pytest.mark.parametrize("path, fields", [
    ("/v1/videos", {"model": b"wan_t2v", "prompt": b"\xed\xa0\x80"}),  # an encoded lone surrogate
    ("/v1/audio/voices", {"name": b"\xed\xa0\x80\xff", "type": b"prompt", "prompt": b"calm"}),
    ("/v1/images/edits", {"model": b"qwen_image_edit", "prompt": b"\xff\xfe bad"}),
    ("/v1/audio/speech", {"model": b"piper_tts", "input": b"caf\xe9"}),  # Latin-1, not UTF-8
])
async def test_a_text_part_that_is_not_utf8_is_400_not_read_as_latin1(full, path, fields):
    """Starlette decodes a text part that is not valid UTF-8 as Latin-1: the bytes of a lone
    surrogate were stored as the prompt 'í\\xa0\\x80' (200). Now a 400 naming the part."""
    r = await full.post(path, **_multipart(fields))
    assert_error(r, 400, code="invalid_multipart")
    assert "not valid utf-8" in r.json()["error"]["message"]
    listed = (await full.get("/v1/videos")).json()["data"]
    assert listed == []  # nothing was queued


async def test_utf8_text_parts_still_pass(full):
    r = await full.post("/v1/videos", **_multipart({"model": b"wan_t2v", "prompt": "café ☕".encode()}))
    assert r.status_code == 200, r.text
    assert r.json()["prompt"] == "café ☕"


@pytest.mark.parametrize("name", ["Host", "Origin", "Authorization"])
async def test_a_second_host_origin_or_authorization_header_is_400(full, name):
    """Two ``Host`` headers passed the DNS-rebinding guard (it read the first); RFC 9112 wants 400."""
    first = {"Host": "127.0.0.1:9000", "Origin": "http://127.0.0.1:9000", "Authorization": "Bearer a"}[name]
    headers = [(name, first), (name, "evil.example")]
    r = await full.post("/v1/audio/speech", json=SPEECH, headers=httpx.Headers(headers))
    assert_error(r, 400, code="duplicate_header")
    assert (await full.post("/v1/audio/speech", json=SPEECH)).status_code == 200


@pytest.mark.parametrize("path", ["/v1/audio/speech", "/v1/chat/completions", "/v1/completions",
                                  "/v1/images/generations", "/tokenize", "/detokenize"])
@pytest.mark.parametrize("body", [b'{"a":' * 20000 + b"1" + b"}" * 20000, b'{"model": "\xff"}', b"{"])
async def test_a_json_body_that_does_not_parse_has_a_code(full, path, body):
    """FastAPI's own parse failure was a 400 with ``code: null``; now ``invalid_json`` as on the
    routes that read their body themselves."""
    r = await full.post(path, content=body, headers={"content-type": "application/json"})
    assert_error(r, 400, code="invalid_json")


async def test_an_unknown_after_is_not_echoed_whole(full):
    r = await full.get("/v1/videos", params={"after": "z" * 10000})
    assert_error(r, 400, param="after")
    assert len(r.content) < 1000

"""Chat media input without a model: content-part parsing (``omni_triton.contracts.chat``),
media decoding (``omni_triton.media.inputs``), the http(s) URL fetcher against a local HTTP
server (``omni_triton.media.fetch``: allow-list, public addresses on every hop, size and time
limits, each refusal its 4xx) and the frontend's checks (a text-only model names the part it
cannot take; omni gets the parts, fetched URLs as data URLs). No timing assertions: the slow
server only has to be slower than the fetch limit.
"""
from __future__ import annotations

import base64
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from omni_triton.contracts import chat
from omni_triton.media import inputs as mi
from omni_triton.media.fetch import UrlFetchError, UrlFetchPolicy, fetch_url

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def wav_bytes(seconds=0.5, rate=22050, channels=2, fmt="WAV") -> bytes:
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    x = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, np.stack([x] * channels, axis=1), rate, format=fmt)
    return buf.getvalue()


def mp3_bytes(seconds=0.5, rate=16000) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp3") as c:
        s = c.add_stream("libmp3lame", rate=rate, layout="mono")
        x = (0.3 * np.sin(2 * np.pi * 440 * np.arange(int(seconds * rate)) / rate)).astype(np.float32)
        frame = av.AudioFrame.from_ndarray(x[None], format="flt", layout="mono")
        frame.sample_rate = rate
        for p in s.encode(frame):
            c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


def png_bytes(w=40, h=30) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 10, 10)).save(buf, "PNG")
    return buf.getvalue()


b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731


# ----------------------------------------------------------------------------- parsing
def test_parse_media_parts_and_placeholders():
    msgs = json.dumps([{"role": "system", "content": "be brief"}, {"role": "user", "content": [
        {"type": "text", "text": "hear "}, {"type": "input_audio",
                                            "input_audio": {"data": "AAAA", "format": "wav", "x": 1}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}]}])
    parsed = chat.parse_messages(msgs, accept=("text", "audio", "image", "video"))
    assert parsed[0] == {"role": "system", "content": "be brief"}
    assert [p["type"] for p in chat.media_parts(parsed)] == ["input_audio", "image_url", "video_url"]
    assert parsed[1]["content"][1] == {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    assert chat.placeholder_messages(parsed)[1]["content"] == [
        {"type": "text", "text": "hear "}, {"type": "audio"}, {"type": "image"}, {"type": "video"}]
    # text parts only: joined into a string, as before
    two_texts = '[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]'
    assert chat.parse_messages(two_texts, accept=("text", "audio")) == [{"role": "user", "content": "ab"}]


@pytest.mark.parametrize("content, accept, match", [
    ([{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}], ("text",),
     "does not accept input_audio parts"),
    ([{"type": "image_url", "image_url": {"url": "data:,"}}], ("text", "audio"), "does not accept image_url parts"),
    ([{"type": "video_url", "video_url": {"url": "x"}}], ("text", "audio", "image"), "does not accept video_url parts"),
    ([{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "aiff"}}], ("text", "audio"), "format 'aiff'"),
    ([{"type": "input_audio", "input_audio": {"data": ""}}], ("text", "audio"), "non-empty base64"),
    ([{"type": "image_url", "image_url": "data:,"}], ("text", "image"), "needs an object"),
    ([{"type": "image_url", "image_url": {"url": 3}}], ("text", "image"), "url must be a non-empty string"),
    ([{"type": "file", "file": {}}], ("text", "image"), "unknown content part type 'file'"),
])
def test_parse_bad_media_parts(content, accept, match):
    with pytest.raises(chat.ChatInputError, match=match):
        chat.parse_messages(json.dumps([{"role": "user", "content": content}]), accept=accept)


def test_media_only_in_user_messages():
    part = {"type": "image_url", "image_url": {"url": "data:,"}}
    with pytest.raises(chat.ChatInputError, match="only accepted in user messages"):
        chat.parse_messages(json.dumps([{"role": "assistant", "content": [part]}]), accept=("text", "image"))


# ----------------------------------------------------------------------------- decoding
def test_decode_audio_wav_flac_mp3_to_mono_16k():
    for data in (wav_bytes(), wav_bytes(fmt="FLAC")):
        pcm = mi.decode_audio(data, "a", 16000, 60)
        assert pcm.dtype == np.float32 and pcm.ndim == 1 and abs(pcm.size - 8000) <= 2
        assert 0.2 < np.abs(pcm).max() < 0.35
    pcm = mi.decode_audio(mp3_bytes(), "a", 16000, 60)  # soundfile may not read it: PyAV does
    assert pcm.ndim == 1 and 7000 < pcm.size < 10000 and np.abs(pcm).max() > 0.1


def test_decode_audio_refusals():
    with pytest.raises(mi.MediaInputError, match="not (a decodable audio|an audio) file"):
        mi.decode_audio(png_bytes(), "a", 16000, 60)
    with pytest.raises(mi.MediaInputError, match="over the limit of 0.25 s"):
        mi.decode_audio(wav_bytes(0.5), "a", 16000, 0.25)
    with pytest.raises(mi.MediaInputError, match="invalid base64"):
        mi.b64decode("abc$", "a", 100)
    with pytest.raises(mi.MediaInputError, match="over the limit of 10 bytes"):
        mi.b64decode(b64(b"x" * 40), "a", 10)
    with pytest.raises(mi.MediaInputError, match="base64 data URL"):
        mi.parse_data_url("https://example.com/a.png", "i", 100)
    assert mi.parse_data_url("data:image/PNG;base64," + b64(b"abc"), "i", 100) == ("image/png", b"abc")


def test_decode_image_checks_pixels_before_decoding():
    img = mi.decode_image(png_bytes(40, 30), "i", 40 * 30)
    assert img.mode == "RGB" and img.size == (40, 30)
    with pytest.raises(mi.MediaInputError, match="1200 pixels is over the limit of 1199"):
        mi.decode_image(png_bytes(40, 30), "i", 40 * 30 - 1)
    with pytest.raises(mi.MediaInputError, match="not a decodable image"):
        mi.decode_image(wav_bytes(), "i", 1 << 20)
    truncated = png_bytes(64, 64)[:60]
    with pytest.raises(mi.MediaInputError, match="not a decodable image"):
        mi.decode_image(truncated, "i", 1 << 20)


def test_sample_video_frames():
    from omni_triton.media.video import encode_mp4

    px = np.random.default_rng(0).integers(0, 255, (12, 32, 48, 3)).astype(np.uint8)
    data = encode_mp4(px, 4)  # 3 s at 4 fps
    frames, fps = mi.sample_video_frames(data, "v", mi.MediaLimits(video_fps=2.0))
    assert fps == 2.0 and len(frames) == 6 and frames[0].shape == (32, 48, 3) and frames[0].dtype == np.uint8
    frames, _ = mi.sample_video_frames(data, "v", mi.MediaLimits(video_fps=2.0, max_video_frames=3))
    assert len(frames) == 3
    with pytest.raises(mi.MediaInputError, match="over the limit"):
        mi.sample_video_frames(data, "v", mi.MediaLimits(max_image_pixels=32 * 48 - 1))
    with pytest.raises(mi.MediaInputError, match="not a video file|not a decodable video"):
        mi.sample_video_frames(wav_bytes(), "v", mi.MediaLimits())


# ----------------------------------------------------------------------------- fetcher
BODY = png_bytes()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        port = self.server.server_address[1]
        routes = {
            "/redirect-ok": f"http://127.0.0.1:{port}/ok",
            "/redirect-private": f"http://127.0.0.2:{port}/ok",  # loopback, not a trusted network
            "/redirect-metadata": "http://169.254.169.254/latest/meta-data",  # link-local
            "/redirect-other-host": "http://not-allowed.example/x.png",
            "/redirect-loop": "/redirect-loop",
        }
        if self.path in routes:
            self.send_response(302)
            self.send_header("Location", routes[self.path])
            self.end_headers()
        elif self.path == "/ok":
            self.send_response(200)
            self.send_header("Content-Type", "image/png; charset=binary")
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)
        elif self.path == "/big":  # declares its size
            self.send_response(200)
            self.send_header("Content-Length", str(10_000))
            self.end_headers()
            self.wfile.write(b"x" * 10_000)
        elif self.path == "/big-undeclared":  # no Content-Length: counted while read
            self.send_response(200)
            self.end_headers()
            for _ in range(10):
                self.wfile.write(b"x" * 1000)
        elif self.path == "/slow":
            time.sleep(3)
            self.send_response(200)
            self.end_headers()
        else:
            self.send_response(404)
            self.end_headers()


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


#: the local server is on loopback: trusted explicitly (127.0.0.1 only) so the other limits can be seen
LOCAL = UrlFetchPolicy(allowed_hosts=frozenset({"127.0.0.1", "127.0.0.2", "169.254.169.254"}), max_bytes=5000,
                       timeout_s=1.0, trusted_networks=("127.0.0.1/32",))


async def _refused(url, policy=LOCAL) -> UrlFetchError:
    with pytest.raises(UrlFetchError) as info:
        await fetch_url(url, policy)
    return info.value


async def test_fetch_ok_and_redirect_followed(server):
    assert await fetch_url(f"{server}/ok", LOCAL) == ("image/png", BODY)
    assert await fetch_url(f"{server}/redirect-ok", LOCAL) == ("image/png", BODY)


@pytest.mark.parametrize("path, policy, status, code", [
    ("/ok", UrlFetchPolicy(), 400, "url_input_disabled"),
    ("/ok", UrlFetchPolicy(allowed_hosts=frozenset({"127.0.0.1"})), 403, "url_private_address"),  # loopback
    ("/redirect-private", LOCAL, 403, "url_private_address"),
    ("/redirect-metadata", LOCAL, 403, "url_private_address"),
    ("/redirect-other-host", LOCAL, 403, "url_host_not_allowed"),
    ("/redirect-loop", LOCAL, 400, "too_many_redirects"),
    ("/big", LOCAL, 413, "url_too_large"),
    ("/big-undeclared", LOCAL, 413, "url_too_large"),
    ("/slow", LOCAL, 408, "url_timeout"),
    ("/missing", LOCAL, 400, "url_fetch_failed"),
])
async def test_fetch_refusals(server, path, policy, status, code):
    err = await _refused(f"{server}{path}", policy)
    assert (err.status, err.code) == (status, code), err.message


async def test_fetch_refuses_hosts_and_schemes_before_connecting():
    for url, code in [("http://evil.example/a.png", "url_host_not_allowed"), ("ftp://127.0.0.1/a", "invalid_url"),
                      ("http://user:pw@127.0.0.1/a", "invalid_url"), ("http://10.0.0.1/a", "url_host_not_allowed")]:
        assert (await _refused(url)).code == code
    private = UrlFetchPolicy(allowed_hosts=frozenset({"10.0.0.1", "[::1]", "::1", "0.0.0.0"}))
    for url in ("http://10.0.0.1/a", "http://[::1]/a", "http://0.0.0.0/a"):
        assert (await _refused(url, private)).code == "url_private_address"
    assert UrlFetchPolicy(allowed_hosts=frozenset({"*.example.com"})).host_allowed("cdn.example.com")
    assert not UrlFetchPolicy(allowed_hosts=frozenset({"*.example.com"})).host_allowed("example.com.evil.org")
    assert UrlFetchPolicy().address_allowed("8.8.8.8") and not UrlFetchPolicy().address_allowed("::ffff:127.0.0.1")


# ----------------------------------------------------------------------------- frontend
def _omni_model():
    from test_chat_frontend import CHAT_INPUTS, TEXT_OUTPUTS

    from openai_frontend.engine import ModelInfo

    return ModelInfo(name="omni", inputs=CHAT_INPUTS | {"MODALITIES", "VOICE"},
                     outputs=TEXT_OUTPUTS | {"AUDIO", "SAMPLE_RATE"},
                     decoupled=True, modalities=("text", "audio"), voices=("Ethan",), default_voice="Ethan",
                     sample_rate=24000, max_model_len=1024, parameters={"input_modalities": "text,audio,image,video"})


def _engine(monkeypatch):
    import test_chat_frontend
    from test_chat_frontend import LLM, LLM_TTS, ChatFakeEngine

    monkeypatch.setattr(test_chat_frontend, "MAX_PROMPT_CHARS", 10 ** 6)  # base64 media are long
    return ChatFakeEngine(models=(LLM, LLM_TTS, _omni_model()))


AUDIO = {"type": "input_audio", "input_audio": {"data": b64(wav_bytes()), "format": "wav"}}


async def test_text_model_names_the_part_it_cannot_take(monkeypatch):
    import openai
    from test_chat_frontend import sdk

    engine = _engine(monkeypatch)
    client = sdk(engine)
    for model, part, name in [("llm", AUDIO, "input_audio"),
                              ("llm", {"type": "image_url", "image_url": {"url": "data:,"}}, "image_url"),
                              ("llm", {"type": "video_url", "video_url": {"url": "data:,"}}, "video_url")]:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model=model, messages=[{"role": "user", "content": [part]}])
        body = info.value.body
        assert f"The model '{model}' does not accept {name} parts" in body["message"], body
        assert body["code"] == "unsupported_content_part" and body["param"] == "messages.0.content.0"
    # audio output reroutes llm to llm_tts, which takes text only too
    with pytest.raises(openai.BadRequestError, match="does not accept input_audio parts"):
        await client.chat.completions.create(model="llm", modalities=["text", "audio"],
                                             messages=[{"role": "user", "content": [AUDIO]}])
    assert engine.requests == []


async def test_omni_gets_the_parts_and_fetched_urls_as_data(server, monkeypatch):
    from test_chat_frontend import chat as post

    engine = _engine(monkeypatch)
    content = [{"type": "text", "text": "look"}, AUDIO,
               {"type": "image_url", "image_url": {"url": f"{server}/ok", "detail": "low"}}]
    r = await post(engine,
                   {"model": "omni", "modalities": ["text"], "messages": [{"role": "user", "content": content}]},
                   media_urls=LOCAL)
    assert r.status_code == 200, r.text
    sent = engine.requests[-1][1].messages[0]["content"]
    assert sent[:2] == content[:2]
    assert sent[2] == {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(BODY)}}
    # every refusal of the fetcher is its 4xx with its code, and nothing reaches the model
    n = len(engine.requests)
    for path, status, code, settings in [("/ok", 400, "url_input_disabled", {}),
                                         ("/redirect-private", 403, "url_private_address", {"media_urls": LOCAL}),
                                         ("/big", 413, "url_too_large", {"media_urls": LOCAL}),
                                         ("/slow", 408, "url_timeout", {"media_urls": LOCAL})]:
        part = {"type": "image_url", "image_url": {"url": f"{server}{path}"}}
        r = await post(engine, {"model": "omni", "messages": [{"role": "user", "content": [part]}]}, **settings)
        assert r.status_code == status and r.json()["error"]["code"] == code, r.text
        assert r.json()["error"]["param"] == "messages.0.content.0.image_url.url"
    assert len(engine.requests) == n

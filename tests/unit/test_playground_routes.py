"""The playground's routes on the real app over the fake engine (no server): where the page is,
what protects it (CSP and friends), that it is public while the API behind it is not, that its
static mount is no way around the API key, and the ``endpoints`` each model card lists (what
the page fills its tabs from), checked against the routes themselves."""
from __future__ import annotations

import socket

import pytest
from fake_engine import FakeEngine

from openai_frontend.app import Settings
from openai_frontend.playground import CSP, static_dir
from tests.helpers.frontend import frontend_client, serve_in_thread

pytestmark = pytest.mark.anyio
KEY = "sk-playground-test"


@pytest.fixture
def anyio_backend():
    return "asyncio"


def client(**settings):
    return frontend_client(FakeEngine(), Settings(**settings), peer=("127.0.0.1", 50000))


async def test_root_and_playground_redirect_to_the_page():
    async with client() as c:
        for path in ("/", "/playground"):
            r = await c.get(path)
            assert r.status_code == 307 and r.headers["location"] == "/playground/", (path, r)
        page = await c.get("/playground/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert '<script type="module" src="js/main.js">' in page.text


async def test_every_file_of_the_page_carries_the_security_headers():
    files = [p.relative_to(static_dir()).as_posix() for p in static_dir().rglob("*") if p.is_file()]
    assert "js/main.js" in files and "index.html" in files
    async with client() as c:
        for name in ["", *files]:
            r = await c.get(f"/playground/{name}")
            assert r.status_code == 200, name
            assert r.headers["content-security-policy"] == CSP
            assert r.headers["x-frame-options"] == "DENY"
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["referrer-policy"] == "no-referrer"
            if name.endswith(".js"):  # module scripts need a JavaScript MIME type (nosniff)
                assert "javascript" in r.headers["content-type"], (name, r.headers["content-type"])
    assert "'unsafe-inline'" not in CSP and "'unsafe-eval'" not in CSP and "frame-ancestors 'none'" in CSP


async def test_the_page_is_public_and_the_api_behind_it_is_not():
    async with client(api_key=KEY) as c:
        assert (await c.get("/")).status_code == 307
        assert (await c.get("/playground/")).status_code == 200
        assert (await c.get("/playground/js/api.js")).status_code == 200
        assert (await c.get("/v1/models")).status_code == 401
        assert (await c.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})).status_code == 200
        # the exemption is the page's folder, not a prefix of other names
        assert (await c.get("/playgroundx")).status_code == 401
        assert (await c.post("/playground/", json={})).status_code in (401, 405)


def _raw_get(port: int, target: str) -> tuple[int, str]:
    """``GET target`` sent byte for byte (no client normalizes the ``..``): (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode("latin-1")


def test_the_static_mount_is_no_way_past_the_key_or_out_of_its_folder(tmp_path):
    """Real uvicorn, raw request lines: ``..`` and its encodings under /playground/ reach neither
    the API (without the key) nor a file outside the page's folder."""
    server, thread, port = serve_in_thread(frontend_client(FakeEngine(), Settings(api_key=KEY))._transport.app)
    try:
        assert _raw_get(port, "/playground/js/api.js")[0] == 200
        for target in ("/playground/../v1/models", "/playground/%2e%2e/v1/models", "/playground/..%2fv1/models",
                       "/playground/../../openai_frontend/app.py", "/playground/js/../../__init__.py",
                       "/playground/..%2f..%2fapp.py", "/playground//etc/passwd"):
            status, body = _raw_get(port, target)
            assert status in (401, 404), (target, status)
            assert '"object":"list"' not in body and "import" not in body and "root:" not in body, target
    finally:
        server.should_exit = True
        thread.join()


async def test_the_page_is_not_an_api_operation():
    async with client() as c:
        paths = (await c.get("/openapi.json")).json()["paths"]
        assert not [p for p in paths if p in ("/", "/playground") or p.startswith("/playground/")]


async def test_model_cards_list_the_routes_that_take_them():
    async with client() as c:
        cards = {m["id"]: m for m in (await c.get("/v1/models")).json()["data"]}
    assert cards["llm"]["endpoints"] == ["/v1/chat/completions", "/v1/completions"]
    assert cards["llm_tts"]["endpoints"][:2] == ["/v1/chat/completions", "/v1/realtime"]
    assert cards["piper_tts"]["endpoints"] == ["/v1/audio/speech"]
    assert cards["qwen_image"]["endpoints"] == ["/v1/images/generations"]
    assert cards["qwen_image_edit"]["endpoints"] == ["/v1/images/edits"]
    assert cards["qwen_image_edit"]["max_input_images"] == 1 and cards["qwen_image_edit"]["supports_mask"] is False
    assert "max_input_images" not in cards["qwen_image"]
    assert cards["wan_t2v"]["endpoints"] == ["/v1/videos", "/v1/videos/sync"]
    assert cards["whisper"]["endpoints"] == ["/v1/audio/transcriptions", "/v1/audio/translations"]
    assert cards["pocketsphinx"]["endpoints"] == ["/v1/audio/transcriptions"]
    assert "/v1/realtime" in cards["omni"]["endpoints"]
    assert "endpoints" not in cards["qwen3_tts_voice_prompt"]  # an internal stage


async def test_a_listed_image_endpoint_takes_the_model_and_the_other_refuses_it():
    """The cards say what the routes do: generations takes qwen_image, edits takes qwen_image_edit
    (and generations does not: the card must not list it)."""
    async with client() as c:
        ok = await c.post("/v1/images/generations", json={"model": "qwen_image", "prompt": "a fox", "size": "32x32"})
        assert ok.status_code == 200, ok.text
        wrong = await c.post("/v1/images/generations",
                             json={"model": "qwen_image_edit", "prompt": "a fox", "size": "32x32"})
        assert wrong.status_code == 400, wrong.text


class _CountingEngine(FakeEngine):
    """FakeEngine counting ``get_model`` calls (resolving an on-demand model waits for its load)."""

    def __init__(self):
        super().__init__()
        self.resolved = 0

    async def get_model(self, name):
        self.resolved += 1
        return await super().get_model(name)


@pytest.mark.parametrize("route", ["generations", "edits"])
async def test_a_malformed_image_request_is_refused_before_the_model_is_resolved(route):
    """The playground's trial: a junk size on an unloaded qwen_image waited out a 35 s load for its
    400. Size syntax and an empty prompt need no model: refused without resolving it."""
    engine = _CountingEngine()
    async with frontend_client(engine, Settings(), peer=("127.0.0.1", 50000)) as c:
        for fields in ({"size": "<b>99999x99999</b>", "prompt": "a fox"}, {"size": "32x32", "prompt": "  "}):
            if route == "generations":
                r = await c.post("/v1/images/generations", json={"model": "qwen_image", **fields})
            else:
                r = await c.post("/v1/images/edits", data={"model": "qwen_image_edit", **fields},
                                 files={"image": ("a.png", _png(), "image/png")})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] in ("invalid_size", "empty_prompt")
    assert engine.resolved == 0


def _png() -> bytes:
    import io

    from PIL import Image
    out = io.BytesIO()
    Image.new("RGB", (32, 32)).save(out, format="PNG")
    return out.getvalue()


def test_which_keys_a_browser_can_send_on_a_websocket():
    """A base64 key (``/``, ``=``) cannot travel in a WebSocket subprotocol: the frontend warns at
    start (openai_frontend.__main__) and the page says so instead of quoting the key."""
    from openai_frontend.auth import browser_ws_sendable
    assert browser_ws_sendable("sk-abc_DEF.123~x") and browser_ws_sendable("a+b")
    for key in ("my/secret+key==", "a b", "a,b", "a;b", 'a"b', "ключ", ""):
        assert not browser_ws_sendable(key), key

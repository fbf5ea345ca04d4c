"""End-to-end: tritonserver's administrative APIs need the key that ``omni-triton serve`` shares
with the frontend (``omni_triton.triton_admin``); inference, health, metadata and statistics stay
open on loopback, and the served stack works with the restriction on.

The stack fixture gives ``serve`` its key in ``OMNI_TRITON_ADMIN_KEY`` (``stack.admin_key``).
Each restricted API is tried over HTTP and gRPC without a key and with a wrong one (refused: HTTP
403, gRPC UNAVAILABLE "... is restricted ..."), then with the key (accepted). Load and unload with
the key are one test that unloads and reloads the model (Triton 2.51 reloads a loaded model on
``load``: it is never a no-op here).
"""
from __future__ import annotations

import os
import stat

import httpx
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from omni_triton import triton_admin
from omni_triton.paths import cache_dir

pytestmark = pytest.mark.e2e

MODEL = "piper"  # the Triton name
API_MODEL = "piper_tts"  # its OpenAI name (served_model_name)
WRONG = "not-the-key-0123456789"

#: (method, path, JSON body) of every restricted HTTP API family (none of them changes the stack
#: when refused; with the key only the reading ones are sent here)
HTTP_RESTRICTED = [
    ("POST", "/v2/repository/index", {}),
    ("POST", f"/v2/repository/models/{MODEL}/load", {}),
    ("POST", f"/v2/repository/models/{MODEL}/unload", {}),
    ("GET", f"/v2/models/{MODEL}/config", None),
    ("GET", "/v2/logging", None),
    ("POST", "/v2/logging", {"log_verbose_level": 1}),
    ("GET", "/v2/trace/setting", None),
    ("POST", "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]}),
    ("GET", "/v2/systemsharedmemory/status", None),
    ("POST", "/v2/systemsharedmemory/region/h4/register", {"key": "/h4", "offset": 0, "byte_size": 8}),
    ("GET", "/v2/cudasharedmemory/status", None),
]
HTTP_READS = [c for c in HTTP_RESTRICTED if c[0] == "GET" or c[1].endswith("/index")]


def _grpc_calls(client: grpcclient.InferenceServerClient) -> dict:
    return {
        "repository index": lambda **k: client.get_model_repository_index(**k),
        "model config": lambda **k: client.get_model_config(MODEL, **k),
        "log settings": lambda **k: client.get_log_settings(**k),
        "trace settings": lambda **k: client.get_trace_settings(**k),
        "system shared memory": lambda **k: client.get_system_shared_memory_status(**k),
        "cuda shared memory": lambda **k: client.get_cuda_shared_memory_status(**k),
    }


@pytest.fixture(scope="module")
def served(stack):
    ready = httpx.get(f"{stack.triton_http_url}/v2/models/{MODEL}/ready", timeout=10)
    if ready.status_code != 200:
        pytest.skip(f"needs {MODEL} served (OMNI_TRITON_E2E_MODELS)")
    return stack


def _http(stack, method: str, path: str, body, headers=None) -> httpx.Response:
    return httpx.request(method, f"{stack.triton_http_url}{path}", json=body, headers=headers, timeout=60)


@pytest.mark.parametrize("headers", [None, {triton_admin.HEADER: WRONG}], ids=["no key", "wrong key"])
@pytest.mark.parametrize("method,path,body", HTTP_RESTRICTED, ids=[f"{m} {p}" for m, p, _ in HTTP_RESTRICTED])
def test_http_admin_apis_refuse_without_the_key(served, method, path, body, headers):
    r = _http(served, method, path, body, headers)
    assert r.status_code == 403, (r.status_code, r.text)
    assert f"expecting header '{triton_admin.HEADER}'" in r.text
    assert httpx.get(f"{served.triton_http_url}/v2/models/{MODEL}/ready", timeout=10).status_code == 200


@pytest.mark.parametrize("method,path,body", HTTP_READS, ids=[f"{m} {p}" for m, p, _ in HTTP_READS])
def test_http_admin_apis_accept_the_key(served, method, path, body):
    r = _http(served, method, path, body, served.admin_headers)
    assert r.status_code == 200, (r.status_code, r.text)


def test_grpc_admin_apis_refuse_without_the_key_and_accept_it(served):
    with grpcclient.InferenceServerClient(served.triton_grpc_url) as client:
        for call in _grpc_calls(client).values():
            for headers in (None, triton_admin.headers(WRONG, grpc=True)):
                with pytest.raises(InferenceServerException, match="is restricted, expecting header"):
                    call(headers=headers)
            call(headers=served.grpc_admin_headers)  # accepted: no exception
        for headers in (None, triton_admin.headers(WRONG, grpc=True)):
            for change in (client.unload_model, client.load_model):
                with pytest.raises(InferenceServerException, match="is restricted"):
                    change(MODEL, headers=headers)
        assert client.is_model_ready(MODEL)


def _serve_settled(stack, since: int) -> bool:
    """serve has reported every exit of MODEL's stubs since byte ``since`` of its log: one for our
    unload, plus one death for each reload serve made itself (it may see the stubs missing mid-test)."""
    with open(stack.log_path, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    # serve logs an unload through Triton's API as one (issue 28: it watches the READY set, and a
    # model unloaded on purpose is no death): "exited as it unloaded", or "while it was LOADING" when
    # it looked after our load had started
    unloads = text.count(f"stubs of {MODEL} exited as it unloaded") + text.count(
        f"stub of {MODEL} exited while it was LOADING")
    deaths = text.count(f"the stub process of {MODEL} died")
    return unloads + deaths >= 1 + text.count(f"{MODEL} reloaded") and text.count(
        f"reloading {MODEL}") == text.count(f"{MODEL} reloaded")


@pytest.mark.kills_stub(MODEL)  # the model is unloaded and loaded again on purpose
def test_unload_and_load_accept_the_key(served):
    """With the key, HTTP unload and gRPC load work (and the frontend serves the model again)."""
    import time

    ready = f"{served.triton_http_url}/v2/models/{MODEL}/ready"
    since = os.path.getsize(served.log_path)
    r = httpx.post(f"{served.triton_http_url}/v2/repository/models/{MODEL}/unload",
                   headers=served.admin_headers, timeout=120)
    try:
        assert r.status_code == 200, r.text
        served.wait_until(lambda: httpx.get(ready, timeout=10).status_code != 200, f"{MODEL} never unloaded")
    finally:
        with grpcclient.InferenceServerClient(served.triton_grpc_url) as client:
            client.load_model(MODEL, headers=served.grpc_admin_headers)
    assert httpx.get(ready, timeout=10).status_code == 200
    # keep serve's reports of these stub deaths in this test (conftest: wait_for_stub_death_report)
    served.wait_until(lambda: _serve_settled(served, since), "serve never reported the unloaded stub", 120)
    time.sleep(2.5)  # two of serve's 1 s supervision ticks: a reload it starts now is seen below
    served.wait_until(lambda: _serve_settled(served, since), "serve's own reload never settled", 120)
    served.wait_until(lambda: httpx.get(f"{served.frontend_url}/health", timeout=30).status_code == 200,
                      "the frontend never saw the model ready again")


def test_inference_health_metadata_statistics_stay_open(served):
    """What the frontend and perf_analyzer use needs no key."""
    from clients.tts_grpc_stream import stream_tts

    base = served.triton_http_url
    for path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{MODEL}/ready", f"/v2/models/{MODEL}",
                 f"/v2/models/{MODEL}/stats", "/v2"):
        assert httpx.get(base + path, timeout=10).status_code == 200, path
    with grpcclient.InferenceServerClient(served.triton_grpc_url) as client:
        assert client.is_server_ready() and client.get_model_metadata(MODEL).name == MODEL
    assert stream_tts(served.triton_grpc_url, MODEL, "Open for inference.").chunks


def test_the_served_stack_works_with_the_restriction_on(served):
    """The frontend sends the key on its repository-index and model-config calls."""
    fe = served.frontend_url
    assert httpx.get(f"{fe}/health", timeout=30).status_code == 200
    models = httpx.get(f"{fe}/v1/models", timeout=30)
    assert models.status_code == 200 and API_MODEL in {m["id"] for m in models.json()["data"]}
    r = httpx.post(f"{fe}/v1/audio/speech", timeout=120,
                   json={"model": API_MODEL, "voice": "joe", "input": "Locked down and serving.",
                         "response_format": "wav"})
    assert r.status_code == 200 and r.content[:4] == b"RIFF"


def test_the_key_travels_outside_the_frontends_argv(served):
    """serve hands the key to the frontend in its environment and to local tools in a 0600 file;
    only tritonserver's own argv carries it (Triton reads it nowhere else: a documented limit)."""
    from urllib.parse import urlparse

    key_file = cache_dir() / "run" / f"triton-admin-key-{urlparse(served.triton_http_url).port}"
    assert key_file.read_text().strip() == served.admin_key
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    argvs = []
    for p in psutil.Process(served.serve_pid).children(recursive=True):
        try:
            argvs.append(" ".join(p.cmdline()))
        except psutil.Error:  # a stub or engine child that just exited (zombie)
            continue
    frontends = [a for a in argvs if "openai_frontend" in a]
    assert frontends and all(served.admin_key not in a for a in frontends)
    assert any(served.admin_key in a for a in argvs if "tritonserver" in a.split()[0])  # the known limit

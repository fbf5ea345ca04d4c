"""The key of Triton's restricted admin APIs: validation, sources, the flags the launcher passes,
how it reaches the frontend, and the frontend engine sending it (a fake gRPC Triton that
restricts the repository index and model config as tritonserver 2.51 does). The real server's
refusals are checked in tests/e2e/test_triton_lockdown.py."""
from __future__ import annotations

import os
import stat
import textwrap

import grpc
import pytest
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from omni_triton import triton_admin
from omni_triton.serve.process import free_port
from omni_triton.serve.server import Frontend, TritonServer
from openai_frontend.engine import TritonEngine, TritonUnavailableError
from tests.helpers.fake_triton import fake_triton

KEY = triton_admin.new_key()


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.parametrize("bad", ["short", "a" * 513, "x" * 20 + ":y", "x" * 20 + "=y", "x" * 20 + ",y",
                                 "x" * 20 + " y", "x" * 20 + "\ny", "x" * 20 + "é"])
def test_keys_that_the_flag_or_a_header_cannot_carry_are_refused(bad):
    with pytest.raises(triton_admin.AdminKeyError):
        triton_admin.check_key(bad)


def test_new_keys_are_random_and_valid():
    a, b = triton_admin.new_key(), triton_admin.new_key()
    assert a != b and triton_admin.check_key(a) == a and len(a) >= 40


def test_key_from_env_prefers_the_variable_then_the_file(tmp_path):
    f = tmp_path / "key"
    f.write_text(KEY + "\n")
    assert triton_admin.key_from_env({}) is None
    assert triton_admin.key_from_env({triton_admin.ENV: " ", triton_admin.ENV_FILE: ""}) is None
    assert triton_admin.key_from_env({triton_admin.ENV_FILE: str(f)}) == KEY
    other = triton_admin.new_key()
    assert triton_admin.key_from_env({triton_admin.ENV: other, triton_admin.ENV_FILE: str(f)}) == other
    f.write_text("bad:key\n")
    with pytest.raises(triton_admin.AdminKeyError):
        triton_admin.key_from_env({triton_admin.ENV_FILE: str(f)})


def test_the_key_file_is_private(tmp_path):
    path = triton_admin.write_key_file(tmp_path / "run" / "k", KEY)
    assert path.read_text().strip() == KEY
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    triton_admin.write_key_file(path, KEY)  # rewritten in place (a restarted server)


def test_headers_for_http_and_grpc():
    assert triton_admin.headers(None) == {} and triton_admin.headers("") == {}
    assert triton_admin.headers(KEY) == {"omni-triton-admin-key": KEY}
    # Triton 2.51's gRPC server expects the flag's header name with this prefix
    assert triton_admin.headers(KEY, grpc=True) == {"triton-grpc-protocol-omni-triton-admin-key": KEY}


def _repo(tmp_path):
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent("""\
        name: "m"
        backend: "python"
        max_batch_size: 0
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
        """))
    return tmp_path


def test_tritonserver_is_started_with_the_admin_apis_restricted_on_loopback(tmp_path):
    server = TritonServer(["m"], http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          repositories=[_repo(tmp_path)], admin_key=KEY)
    cmd = server.command()
    apis = "model-repository,model-config,shared-memory,trace,logging"
    assert f"--http-restricted-api={apis}:omni-triton-admin-key={KEY}" in cmd
    assert f"--grpc-restricted-protocol={apis}:omni-triton-admin-key={KEY}" in cmd
    for flag in ("--http-address", "--grpc-address", "--metrics-address"):
        assert f"{flag}=127.0.0.1" in cmd
    assert server.admin_headers == {"omni-triton-admin-key": KEY}
    random = TritonServer(["m"], repositories=[tmp_path])
    assert random.admin_key != KEY and any(a.startswith("--grpc-restricted-protocol=") for a in random.command())
    open_metrics = TritonServer(["m"], repositories=[tmp_path], host="0.0.0.0", metrics_host="127.0.0.1")
    assert "--grpc-address=0.0.0.0" in open_metrics.command()
    assert "--metrics-address=127.0.0.1" in open_metrics.command()


def test_the_frontend_gets_the_key_in_its_environment_not_its_argv():
    fe = Frontend("127.0.0.1:1", admin_key=KEY, env={"A": "b"})
    assert fe.env == {"A": "b", triton_admin.ENV: KEY}
    assert KEY not in " ".join(fe.command())


class RestrictedTriton(pbg.GRPCInferenceServiceServicer):
    """The repository index and model config need the key, as tritonserver 2.51 answers them."""

    async def _check(self, context):
        if dict(context.invocation_metadata()).get(triton_admin.GRPC_HEADER) != KEY:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "This protocol is restricted, expecting header "
                                f"'{triton_admin.GRPC_HEADER}'")

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def RepositoryIndex(self, request, context):
        await self._check(context)
        resp = pb.RepositoryIndexResponse()
        resp.models.add(name="m", version="1", state="READY")
        return resp

    async def ModelConfig(self, request, context):
        await self._check(context)
        return pb.ModelConfigResponse(config=mc.ModelConfig(name="m", backend="python"))


@pytest.fixture
async def restricted():
    async with fake_triton(RestrictedTriton()) as fake:
        yield fake.url


@pytest.mark.anyio
async def test_the_engine_sends_the_key_on_its_admin_calls(restricted):
    engine = TritonEngine(restricted, admin_key=KEY)
    try:
        assert [m.name for m in await engine.list_models()] == ["m"]
    finally:
        await engine.close()


@pytest.mark.anyio
@pytest.mark.parametrize("key", [None, triton_admin.new_key()], ids=["no key", "wrong key"])
async def test_an_engine_without_the_key_says_which_setting_is_missing(restricted, key):
    engine = TritonEngine(restricted, admin_key=key)
    try:
        with pytest.raises(TritonUnavailableError, match=triton_admin.ENV):
            await engine.list_models()
    finally:
        await engine.close()

"""On-demand models through the frontend: the real ``TritonEngine`` + app over a fake Triton gRPC
server with explicit model control (load / unload / index / statistics / streams). The policy
itself: tests/unit/test_on_demand.py; against a real tritonserver: tests/e2e/test_on_demand_served.py."""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from omni_triton.serve import on_demand as od
from omni_triton.serve.repository import available_models, read_config
from openai_frontend.__main__ import on_demand_engine_args, parse_args
from openai_frontend.app import Settings
from openai_frontend.engine import TritonEngine
from tests.helpers.fake_triton import StatefulTriton, fake_triton
from tests.helpers.frontend import running_frontend

pytestmark = pytest.mark.anyio

SPEECH_IO = """
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "AUDIO" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "SAMPLE_RATE" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}'


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """piper (pinned; OpenAI piper_tts), csm (OpenAI tts: talker + code2wav), broken (its load
    fails), big (2000 MiB); 100 MiB each otherwise."""
    models = {
        "piper": SPEECH_IO + _param("served_model_name", "piper_tts"),
        "csm_talker": "", "csm_code2wav": "",
        "csm": SPEECH_IO + _param("served_model_name", "tts") + _param("depends_on", "csm_talker,csm_code2wav"),
        "broken": SPEECH_IO,
        "big": SPEECH_IO + _param("pss_mib", "2000"),
    }
    for name, body in models.items():
        (tmp_path / name).mkdir()
        size = "" if "pss_mib" in body else _param("pss_mib", "100")
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{body}\n{size}\n')
    return tmp_path


def audio_response(final: bool) -> pb.ModelStreamInferResponse:
    r = pb.ModelStreamInferResponse()
    ir = r.infer_response
    ir.outputs.add(name="AUDIO", datatype="FP32", shape=[100])
    ir.outputs.add(name="SAMPLE_RATE", datatype="INT32", shape=[1])
    ir.raw_output_contents.append(np.zeros(100, "<f4").tobytes())
    ir.raw_output_contents.append(np.array([22050], dtype="<i4").tobytes())
    ir.parameters["triton_final_response"].bool_param = final
    return r


class ControlledTriton(StatefulTriton):
    """Triton with explicit model control over ``repo``: loads take ``load_s`` (or wait for
    ``gate``), ``fail`` names models whose load fails; streams send 3 chunks, or ``endless`` until
    the client cancels."""

    def __init__(self, repo: Path, ready: set[str]):
        self.paths = available_models([repo])
        self.states = {name: ("READY" if name in ready else "") for name in self.paths}
        self.loads: list[str] = []
        self.unloads: list[str] = []
        self.fail = {"broken"}
        self.gate: asyncio.Event | None = None
        self.load_s = 0.0
        self.endless = False
        self.last_ms: dict[str, int] = {}

    async def RepositoryIndex(self, request, context):
        resp = pb.RepositoryIndexResponse()
        for name, state in self.states.items():
            resp.models.add(name=name, version="1" if state else "", state=state,
                            reason="failed to load: boom" if state == "UNAVAILABLE" else "")
        return resp

    async def RepositoryModelLoad(self, request, context):
        name = request.model_name
        self.loads.append(name)
        self.states[name] = "LOADING"
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(self.load_s)
        if name in self.fail:
            self.states[name] = "UNAVAILABLE"
            await context.abort(grpc.StatusCode.INTERNAL, f"failed to load '{name}', boom: no such weights")
        self.states[name] = "READY"
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        self.unloads.append(request.model_name)
        self.states[request.model_name] = "UNAVAILABLE"
        return pb.RepositoryModelUnloadResponse()

    async def ModelConfig(self, request, context):
        if self.states.get(request.name) != "READY":
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"Request for unknown model: '{request.name}'")
        return pb.ModelConfigResponse(config=read_config(self.paths[request.name] / "config.pbtxt"))

    async def ModelStatistics(self, request, context):
        resp = pb.ModelStatisticsResponse()
        if request.name in self.last_ms:
            resp.model_stats.add(name=request.name, version="1", last_inference=self.last_ms[request.name])
        return resp

    async def ModelStreamInfer(self, request_iterator, context):
        async for req in request_iterator:
            if self.states.get(req.model_name) != "READY":
                yield pb.ModelStreamInferResponse(error_message=f"model '{req.model_name}' is not ready")
                continue
            i = 0
            while self.endless or i < 3:
                yield audio_response(final=not self.endless and i == 2)
                i += 1
                await asyncio.sleep(0.01)


def make_engine(triton: ControlledTriton, repo: Path, *flags: str) -> TritonEngine:
    args = parse_args(["--models", "piper", "--on-demand", "csm,broken,big", "--model-repository", str(repo),
                       *flags])
    return TritonEngine(triton.url, models=["piper"], **on_demand_engine_args(args, ["piper"]))


class Stack:
    def __init__(self, triton: ControlledTriton, engine: TritonEngine, client: httpx.AsyncClient):
        self.triton, self.engine, self.client = triton, engine, client

    async def speech(self, model: str) -> httpx.Response:
        body = {"model": model, "input": "hi", "response_format": "pcm"}
        return await self.client.post("/v1/audio/speech", json=body)

    async def states(self) -> dict[str, str]:
        return {m["id"]: m["state"] for m in (await self.client.get("/v1/models")).json()["data"]}

    async def metrics(self) -> str:
        return (await self.client.get("/metrics")).text


@contextlib.asynccontextmanager
async def stack(repo: Path, *flags: str) -> AsyncIterator[Stack]:
    """The fake Triton (piper READY) and a running frontend serving piper pinned and csm, broken,
    big on demand with ``flags``."""
    async with fake_triton(ControlledTriton(repo, ready={"piper"})) as triton:
        engine = make_engine(triton, repo, *flags)
        async with running_frontend(engine, Settings()) as client:
            yield Stack(triton, engine, client)


async def test_first_request_loads_the_pipeline_and_models_lists_every_state(repo):
    async with stack(repo) as s:
        assert await s.states() == {"piper_tts": "loaded", "tts": "unloaded", "broken": "unloaded",
                                    "big": "unloaded"}
        health = await s.client.get("/health")
        assert health.status_code == 200, health.text  # on-demand models do not make it unhealthy
        r = await s.speech("tts")
        assert r.status_code == 200, r.text
        assert s.triton.loads == ["csm_talker", "csm_code2wav", "csm"]  # dependencies first
        assert (await s.states())["tts"] == "loaded"
        assert (await s.client.get("/v1/models/tts")).json()["modality"] == "audio"
        m = await s.metrics()
        assert 'omni_frontend_model_loads_total{model="csm",outcome="ok"} 1.0' in m
        assert 'omni_frontend_model_state{model="csm",state="loaded"} 1.0' in m
        assert "omni_frontend_models_pss_mib 400.0" in m  # piper + csm's three models
        assert 'omni_frontend_model_load_seconds_count{model="csm"} 1.0' in m


async def test_concurrent_first_requests_trigger_one_load(repo):
    async with stack(repo) as s:
        s.triton.load_s = 0.1
        rs = await asyncio.gather(*(s.speech("tts") for _ in range(8)))
        assert [r.status_code for r in rs] == [200] * 8
        assert s.triton.loads.count("csm") == 1 and len(s.triton.loads) == 3
        assert 'omni_frontend_model_loads_total{model="csm",outcome="ok"} 1.0' in await s.metrics()


async def test_a_request_past_the_load_timeout_gets_503_model_loading_and_the_load_goes_on(repo):
    async with stack(repo, "--load-timeout", "0.2") as s:
        s.triton.gate = asyncio.Event()
        r = await asyncio.wait_for(s.speech("tts"), 10)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "model_loading"
        assert r.headers["Retry-After"] == str(od.RETRY_AFTER_S)
        assert (await s.states())["tts"] == "loading"
        s.triton.gate.set()
        for _ in range(100):
            if (await s.states())["tts"] == "loaded":
                break
            await asyncio.sleep(0.02)
        assert (await s.speech("tts")).status_code == 200
        assert s.triton.loads.count("csm") == 1


async def test_a_failed_load_gives_503_model_load_failed_and_leaves_the_others_serving(repo):
    async with stack(repo) as s:
        assert (await s.speech("tts")).status_code == 200
        r = await s.speech("broken")
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["code"] == "model_load_failed" and "no such weights" in error["message"]
        card = (await s.client.get("/v1/models/broken")).json()
        assert card["state"] == "failed" and "no such weights" in card["reason"]
        assert s.triton.unloads == ["broken"]  # what the failed load started; nothing else
        assert (await s.speech("tts")).status_code == 200
        assert (await s.speech("piper_tts")).status_code == 200
        again = await s.speech("broken")  # within the back-off: no new load
        assert again.json()["error"]["code"] == "model_load_failed"
        assert s.triton.loads.count("broken") == 1
        assert 'omni_frontend_model_loads_total{model="broken",outcome="failed"} 1.0' in await s.metrics()


async def test_a_pipeline_over_the_budget_gets_503_model_too_large(repo):
    async with stack(repo, "--memory-budget", "1000MiB") as s:
        r = await s.speech("big")
        assert r.status_code == 503 and "Retry-After" not in r.headers
        error = r.json()["error"]
        assert error["code"] == "model_too_large" and "2000 MiB" in error["message"] and "1000 MiB" in error["message"]
        assert "big" not in s.triton.loads


async def test_eviction_under_the_budget_unloads_the_lru_idle_pipeline(repo):
    # piper 100 (pinned) + csm 300 = 400; broken 100 more is over 450: csm must go first
    async with stack(repo, "--memory-budget", "450MiB", "--load-timeout", "2") as s:
        grace, od.REQUEST_GRACE_S = od.REQUEST_GRACE_S, 0.0
        try:
            s.triton.fail.clear()
            assert (await s.speech("tts")).status_code == 200
            assert (await s.speech("broken")).status_code == 200
            assert set(s.triton.unloads) == {"csm", "csm_talker", "csm_code2wav"}
            assert await s.states() == {"piper_tts": "loaded", "tts": "unloaded", "broken": "loaded",
                                        "big": "unloaded"}
            assert 'omni_frontend_model_unloads_total{model="csm",reason="evicted"} 1.0' in await s.metrics()
            assert "omni_frontend_models_pss_mib 200.0" in await s.metrics()
            assert (await s.speech("tts")).status_code == 200  # and back: broken goes
            assert s.triton.unloads[-1] == "broken"
        finally:
            od.REQUEST_GRACE_S = grace


async def test_keep_alive_unloads_an_idle_pipeline_but_not_while_a_stream_is_in_flight(repo):
    grace, od.REQUEST_GRACE_S = od.REQUEST_GRACE_S, 0.0
    try:
        async with stack(repo, "--keep-alive", "1") as s:
            s.triton.endless = True
            await s.engine.get_model("tts")
            stream = s.engine.synthesize("csm", "hi")
            await stream.__anext__()
            t0 = time.monotonic()
            while time.monotonic() - t0 < 2.5:  # a stream open 2.5 keep-alives long
                await stream.__anext__()
            assert "csm" not in s.triton.unloads and (await s.states())["tts"] == "loaded"
            await stream.aclose()
            for _ in range(500):  # the closure unloads one model after another (csm first)
                if {"csm", "csm_talker", "csm_code2wav"} <= set(s.triton.unloads):
                    break
                await asyncio.sleep(0.02)
            assert set(s.triton.unloads) == {"csm", "csm_talker", "csm_code2wav"}
            assert (await s.states())["tts"] == "unloaded"
            assert 'omni_frontend_model_unloads_total{model="csm",reason="keep_alive"} 1.0' in await s.metrics()
            s.triton.endless = False
            assert (await s.speech("tts")).status_code == 200  # loaded again at its next request
            assert s.triton.loads.count("csm") == 2
    finally:
        od.REQUEST_GRACE_S = grace


async def test_a_request_of_the_wrong_kind_is_refused_before_any_load(repo):
    """Review finding: /v1/audio/speech with an image model (or /v1/images with a speech one) loaded
    the pipeline, evicting another, only to answer 400 model_not_supported."""
    async with stack(repo) as s:
        r = await s.client.post("/v1/images/generations", json={"model": "tts", "prompt": "a fox"})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "model_not_supported"
        assert s.triton.loads == []  # nothing loaded for a request that cannot succeed
        assert (await s.states())["tts"] == "unloaded"

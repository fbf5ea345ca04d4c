"""The frontend over several Triton replicas (issue 25 item 1; ``openai_frontend/engine/replicas.py``).

Two layers:
* the policy alone (``ReplicaSet`` with fake clients and probes): least outstanding with round
  robin ties, model-aware routing and its fallback, draining and recovery, DNS re-resolution,
  the pin test hook, a lone replica left as before;
* the real ``TritonEngine`` against two in-process fake Tritons (``tests/helpers/fake_triton.py``)
  on two ports: per-request balancing, model-aware routing, a dead or unready replica drained, a
  unary call that could not connect retried once on the other replica (and an ``INVALID_ARG``
  never retried), a stream pinned to its replica and ended with the clear error when that replica
  dies, DNS re-resolution, the per-replica Prometheus metrics.
"""

from __future__ import annotations

import asyncio
import socket

import grpc
import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from openai_frontend.engine import InvalidRequestError, TritonEngine, TritonUnavailableError
from openai_frontend.engine.replicas import PIN_ENV, ReplicaSet, parse_target
from openai_frontend.metrics import FrontendMetrics
from tests.helpers.fake_triton import StatefulTriton, fake_triton

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


# --------------------------------------------------------------------------- the policy alone
class Client:
    def __init__(self, address: str):
        self.address = address
        self.closed = False


def _set(url: str, models: dict[str, set[str]] | None = None, fail: set[str] | None = None, **kw) -> ReplicaSet:
    """A ReplicaSet over fake clients whose probe lists ``models[address]`` (or raises for ``fail``)."""
    models = models if models is not None else {}
    fail = fail if fail is not None else set()

    async def probe(client: Client) -> frozenset[str]:
        if client.address in fail:
            raise ConnectionError(f"{client.address} refused")
        return frozenset(models.get(client.address, set()))

    async def close(client: Client) -> None:
        client.closed = True

    kw.setdefault("health_interval_s", 3600)
    return ReplicaSet(url, Client, probe, close, **kw)


def test_parse_target():
    assert parse_target("a:1,b:2") == (["a:1", "b:2"], None)
    assert parse_target("a:1") == (["a:1"], None)
    assert parse_target("dns:///svc.ns:8001") == ([], ("svc.ns", 8001))
    assert parse_target("dns:///svc") == ([], ("svc", 8001))
    with pytest.raises(ValueError):
        parse_target("a:1,,b:2")
    with pytest.raises(ValueError):
        parse_target("dns:///")


async def test_least_outstanding_then_round_robin_ties():
    s = _set("a:1,b:1,c:1", {"a:1": {"m"}, "b:1": {"m"}, "c:1": {"m"}})
    await s.start()
    a, b, c = s.replicas
    a.outstanding, b.outstanding, c.outstanding = 2, 0, 1
    assert {s.pick("m").address for _ in range(5)} == {"b:1"}  # the least busy, every time
    b.outstanding = 1  # b and c tie: alternate
    picks = [s.pick("m").address for _ in range(6)]
    assert sorted(set(picks)) == ["b:1", "c:1"] and picks.count("b:1") == 3
    assert all(picks[i] != picks[i + 1] for i in range(5))
    await s.close()


async def test_model_aware_routing_and_fallback():
    s = _set("a:1,b:1", {"a:1": {"piper"}, "b:1": {"csm"}})
    await s.start()
    assert {s.pick("piper").address for _ in range(6)} == {"a:1"}
    assert {s.pick("csm").address for _ in range(6)} == {"b:1"}
    # a model no replica lists: any healthy one (Triton's own error answers)
    assert {s.pick("ghost").address for _ in range(6)} == {"a:1", "b:1"}
    await s.close()


async def test_probe_failure_drains_until_a_probe_passes():
    fail = {"a:1"}
    s = _set("a:1,b:1", {"a:1": {"m"}, "b:1": {"m"}}, fail)
    await s.start()
    a, b = s.replicas
    assert not a.healthy and "refused" in a.last_error and b.healthy
    assert {s.pick("m").address for _ in range(4)} == {"b:1"}
    s.mark_down(b, "UNAVAILABLE")  # passive: a call could not connect
    with pytest.raises(TritonUnavailableError) as info:
        s.pick("m")
    assert "no healthy replica" in info.value.message and "a:1: ConnectionError" not in info.value.message
    assert "a:1 refused" in info.value.message and info.value.status_code == 503
    fail.clear()
    await s.check()
    assert a.healthy and b.healthy
    await s.close()


async def test_a_lone_replica_is_never_probed_nor_drained():
    probed = []

    async def probe(client):
        probed.append(client)
        return frozenset()

    async def close(client):
        pass

    s = ReplicaSet("a:1", Client, probe, close)
    await s.start()
    (a,) = s.replicas
    s.mark_down(a, "UNAVAILABLE")
    assert s.pick("m") is a and a.healthy and probed == [] and s._tasks == []
    await s.close()


async def test_dns_re_resolution_adds_and_retires_replicas():
    answers = {"svc": ["10.0.0.1:8001"]}
    asked = []

    async def resolver(host, port):
        asked.append((host, port))
        return list(answers[host])

    s = _set("dns:///svc:8001", resolver=resolver, resolve_interval_s=0.02)
    await s.start()
    assert [r.address for r in s.replicas] == ["10.0.0.1:8001"] and asked[0] == ("svc", 8001)
    answers["svc"] = ["10.0.0.1:8001", "10.0.0.2:8001"]
    await asyncio.sleep(0.1)
    assert [r.address for r in s.replicas] == ["10.0.0.1:8001", "10.0.0.2:8001"]
    old = s.replicas[0]
    client = old.client
    old.outstanding = 1  # a request still running on it
    answers["svc"] = ["10.0.0.2:8001"]
    await asyncio.sleep(0.1)
    assert [r.address for r in s.replicas] == ["10.0.0.2:8001"]
    assert {s.pick("m").address for _ in range(4)} == {"10.0.0.2:8001"}
    assert old in s.all_known() and not client.closed  # retired, closed after its last request
    old.outstanding = 0
    await asyncio.sleep(0.1)
    assert old not in s.all_known() and client.closed
    answers["svc"] = []  # a failed or empty answer: nothing to route to, said plainly
    await asyncio.sleep(0.1)
    with pytest.raises(TritonUnavailableError, match="svc resolved to no address"):
        s.pick("m")
    await s.close()


async def test_dns_failure_keeps_the_current_replicas():
    calls = 0

    async def resolver(host, port):
        nonlocal calls
        calls += 1
        if calls > 1:
            raise socket.gaierror("Temporary failure in name resolution")
        return ["10.0.0.1:8001"]

    s = _set("dns:///svc:8001", resolver=resolver, resolve_interval_s=0.02)
    await s.start()
    await asyncio.sleep(0.1)
    assert calls > 2 and [r.address for r in s.replicas] == ["10.0.0.1:8001"] and "Temporary" in s.resolve_error
    await s.close()


async def test_pin_test_hook_always_picks_that_replica():
    s = _set("a:1,b:1", {"a:1": {"m"}, "b:1": {"m"}}, pin=1)
    await s.start()
    assert {s.pick("m").address for _ in range(6)} == {"b:1"}
    s.mark_down(s.replicas[1], "gone")
    assert s.pick("m").address == "b:1"
    await s.close()


# --------------------------------------------------------------------------- the real engine
def _response(model: str, value: float, final: bool) -> pb.ModelStreamInferResponse:
    r = pb.ModelStreamInferResponse()
    ir = r.infer_response
    ir.model_name = model
    ir.outputs.add(name="AUDIO", datatype="FP32", shape=[4])
    ir.raw_output_contents.append(np.full(4, value, "<f4").tobytes())
    ir.parameters["triton_final_response"].bool_param = final
    return r


class Replica(StatefulTriton):
    """A fake Triton replica: ready, with ``states``; ``ModelInfer`` answers at once, or waits
    for ``release`` while ``hold``, or answers ``INVALID_ARG`` while ``invalid``; streams send
    responses every 10 ms until cancelled (``endless``) or 3 then a final one."""

    def __init__(self, states: dict[str, str]):
        self.states = states
        self.ready = True
        self.hold = False
        self.invalid = False
        self.endless = False
        self.release = asyncio.Event()
        self.infers: list[str] = []
        self.streams: list[str] = []
        self.configs: list[str] = []

    async def ModelConfig(self, request, context):
        if self.states.get(request.name) != "READY":
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"Request for unknown model: '{request.name}'")
        self.configs.append(request.name)
        return pb.ModelConfigResponse(config=mc.ModelConfig(name=request.name, backend="python"))

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.ready)

    async def RepositoryIndex(self, request, context):
        resp = pb.RepositoryIndexResponse()
        for name, state in self.states.items():
            resp.models.add(name=name, version="1", state=state)
        return resp

    async def ModelInfer(self, request, context):
        if self.states.get(request.model_name) != "READY":
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"Request for unknown model: '{request.model_name}'")
        self.infers.append(request.model_name)
        if self.invalid:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "invalid input: text too long")
        if self.hold:
            await self.release.wait()
        return pb.ModelInferResponse(model_name=request.model_name, id=request.id)

    async def ModelStreamInfer(self, request_iterator, context):
        async for req in request_iterator:
            self.streams.append(req.model_name)
            i = 0
            while self.endless or i < 3:
                yield _response(req.model_name, float(i), final=not self.endless and i == 2)
                i += 1
                await asyncio.sleep(0.01)


def _engine(*replicas: Replica, **kw) -> TritonEngine:
    kw.setdefault("health_interval_s", 3600)
    return TritonEngine(",".join(r.url for r in replicas), rpc_timeout_s=2, **kw)


def _of(engine: TritonEngine, fake: Replica):
    """The engine's replica of ``fake`` (the set lists its replicas in address order)."""
    return next(r for r in engine.replicas.all_known() if r.address == fake.url)


async def _infer(engine: TritonEngine, model: str = "piper"):
    return await engine._unary(model, [], "r")


async def _drain(agen) -> int:
    n = 0
    async for _ in agen:
        n += 1
    return n


async def test_unary_calls_are_balanced_per_request_least_outstanding_first():
    async with fake_triton(Replica({"piper": "READY"})) as a, fake_triton(Replica({"piper": "READY"})) as b:
        engine = _engine(a, b)
        a.hold = b.hold = True
        calls = [asyncio.ensure_future(_infer(engine)) for _ in range(6)]
        await asyncio.sleep(0.3)
        assert len(a.infers) == 3 and len(b.infers) == 3  # 6 in flight: 3 each
        b.release.set()  # b's three end; a's three stay in flight
        await asyncio.sleep(0.2)
        b.hold = False
        for _ in range(5):  # one at a time: b has 0 outstanding, a has 3
            await _infer(engine)
        assert len(a.infers) == 3 and len(b.infers) == 8
        a.release.set()
        await asyncio.gather(*calls)
        await engine.close()


async def test_sequential_requests_alternate_although_each_makes_a_metadata_pick():
    # every served request first checks its model (get_model: one pick for is_model_ready), then
    # infers (one pick): a round robin advanced by both picks sent every request to one replica
    async with fake_triton(Replica({"piper": "READY"})) as a, fake_triton(Replica({"piper": "READY"})) as b:
        engine = _engine(a, b)
        for _ in range(8):
            await engine.get_model("piper")
            await _infer(engine)
        assert (len(a.infers), len(b.infers)) == (4, 4)
        await engine.close()


async def test_model_aware_routing_over_two_replicas():
    async with fake_triton(Replica({"piper": "READY"})) as a, fake_triton(Replica({"csm": "READY"})) as b:
        engine = _engine(a, b)
        for _ in range(4):
            await _infer(engine, "piper")
            assert await _drain(engine._stream("csm", [], "s")) == 3
        assert a.infers == ["piper"] * 4 and b.infers == [] and b.streams == ["csm"] * 4 and a.streams == []
        assert {m.name: m.state for m in await engine.list_models()} == {"piper": "READY", "csm": "READY"}
        assert a.configs == ["piper"] and b.configs == ["csm"]  # each config from the replica that has it
        # a model no replica has: Triton's own error comes back, and no replica is drained for it
        with pytest.raises(TritonUnavailableError, match="unknown model"):
            await _infer(engine, "ghost")
        assert all(r.healthy for r in engine.replicas.replicas)
        await engine.close()


async def test_unready_replica_is_drained_and_comes_back():
    async with fake_triton(Replica({"piper": "READY"})) as a, fake_triton(Replica({"piper": "READY"})) as b:
        engine = _engine(a, b, health_interval_s=0.05)
        await engine.start()
        a.ready = False
        await asyncio.sleep(0.2)
        for _ in range(4):
            await _infer(engine)
        assert a.infers == [] and len(b.infers) == 4
        assert not _of(engine, a).healthy and _of(engine, b).healthy
        a.ready = True
        await asyncio.sleep(0.2)
        for _ in range(4):
            await _infer(engine)
        assert len(a.infers) == 2 and len(b.infers) == 6
        await engine.close()


async def test_dead_replica_is_drained_by_the_health_loop():
    async with fake_triton(Replica({"piper": "READY"})) as b:
        async with fake_triton(Replica({"piper": "READY"})) as a:
            engine = _engine(a, b, health_interval_s=0.05)
            await engine.start()
        await asyncio.sleep(0.3)  # a's server stopped
        assert not _of(engine, a).healthy and _of(engine, b).healthy
        for _ in range(4):
            await _infer(engine)
        assert len(b.infers) == 4
        assert _of(engine, a).errors == 0  # drained before any request went there
        await engine.close()


async def test_unary_connect_failure_is_retried_once_on_the_other_replica():
    async with fake_triton(Replica({"piper": "READY"})) as b:
        async with fake_triton(Replica({"piper": "READY"})) as a:
            engine = _engine(a, b)  # no probes in this test: only the call itself finds a dead
            await engine.start()
        for _ in range(4):  # a is dead and still taken for healthy: round robin sends it one
            await _infer(engine)
        dead, alive = _of(engine, a), _of(engine, b)
        assert len(b.infers) == 4 and dead.errors == 1 and not dead.healthy and alive.healthy
        assert "unavailable" in dead.last_error.lower()
        await engine.close()


async def test_unary_connect_failure_on_both_replicas_is_a_503_after_one_retry():
    async with fake_triton(Replica({"piper": "READY"})) as a, fake_triton(Replica({"piper": "READY"})) as b:
        engine = _engine(a, b)
        await engine.start()
    with pytest.raises(TritonUnavailableError):
        await _infer(engine)
    assert sum(r.requests for r in engine.replicas.replicas) == 2  # the first try and one retry
    await engine.close()


async def test_invalid_argument_is_never_retried():
    async with fake_triton(Replica({"piper": "READY"})) as a, fake_triton(Replica({"piper": "READY"})) as b:
        engine = _engine(a, b)
        a.invalid = b.invalid = True
        with pytest.raises(InvalidRequestError):
            await _infer(engine)
        assert len(a.infers) + len(b.infers) == 1
        assert all(r.healthy for r in engine.replicas.replicas)
        await engine.close()


async def test_stream_is_pinned_and_ends_with_the_clear_error_when_its_replica_dies():
    async with fake_triton(Replica({"piper": "READY"})) as b:
        async with fake_triton(Replica({"piper": "READY"})) as a:
            a.endless = b.endless = True
            engine = _engine(a, b)
            await engine.start()
            # b holds one stream already, so the least outstanding is a
            _of(engine, b).outstanding += 1
            stream = engine._stream("piper", [], "s")
            await stream.__anext__()
            _of(engine, b).outstanding -= 1
            assert a.streams == ["piper"] and b.streams == []
            for _ in range(5):
                await stream.__anext__()
        # a's server is gone
        with pytest.raises(TritonUnavailableError) as info:  # not moved to b (endless there: a timeout)
            await asyncio.wait_for(_drain(stream), 10)
        assert info.value.status_code == 503 and "Triton is unavailable (stream to piper)" in info.value.message
        assert b.streams == []  # never moved to b mid-stream
        dead = _of(engine, a)
        assert not dead.healthy and dead.errors == 1 and dead.outstanding == 0
        b.endless = False
        assert await _drain(engine._stream("piper", [], "new")) == 3  # new streams go to b
        assert b.streams == ["piper"]
        await engine.close()


async def test_stream_that_cannot_connect_starts_on_the_other_replica():
    async with fake_triton(Replica({"piper": "READY"})) as b:
        async with fake_triton(Replica({"piper": "READY"})) as a:
            engine = _engine(a, b)
            await engine.start()
        counts = [await _drain(engine._stream("piper", [], f"s{i}")) for i in range(4)]
        assert counts == [3] * 4 and b.streams == ["piper"] * 4
        assert not _of(engine, a).healthy and _of(engine, a).errors == 1
        await engine.close()


async def test_dns_target_follows_the_resolver():
    async with fake_triton(Replica({"piper": "READY"})) as a, fake_triton(Replica({"piper": "READY"})) as b:
        answers = [a.url]

        async def resolver(host, port):
            assert (host, port) == ("omni-triton-headless", 8001)
            return list(answers)

        engine = TritonEngine("dns:///omni-triton-headless:8001", resolver=resolver, resolve_interval_s=0.05,
                              health_interval_s=3600)
        for _ in range(4):
            await _infer(engine)
        assert len(a.infers) == 4 and b.infers == []
        answers.append(b.url)
        await asyncio.sleep(0.2)
        for _ in range(4):
            await _infer(engine)
        assert len(a.infers) == 6 and len(b.infers) == 2
        answers.remove(a.url)
        await asyncio.sleep(0.2)
        for _ in range(4):
            await _infer(engine)
        assert len(a.infers) == 6 and len(b.infers) == 6
        await engine.close()


async def test_pinned_engine_sends_everything_to_one_replica(monkeypatch):
    monkeypatch.setenv(PIN_ENV, "1")
    async with fake_triton(Replica({"piper": "READY"})) as a, fake_triton(Replica({"piper": "READY"})) as b:
        engine = _engine(a, b)
        for _ in range(6):
            await _infer(engine)
        pinned = engine.replicas.replicas[1].address  # index 1 in address order
        assert (a.infers, b.infers) == (([], ["piper"] * 6) if pinned == b.url else (["piper"] * 6, []))
        await engine.close()


async def test_metadata_is_merged_over_the_replicas():
    async with fake_triton(Replica({"piper": "READY", "csm": "UNAVAILABLE"})) as a, \
            fake_triton(Replica({"csm": "READY"})) as b:
        engine = _engine(a, b)
        index = await engine._index()
        assert index["piper"][0] == "READY" and index["csm"][0] == "READY"
        assert await engine.is_live()
        await engine.close()


async def test_single_url_starts_no_background_task():
    async with fake_triton(Replica({"piper": "READY"})) as a:
        engine = TritonEngine(a.url)
        await engine.start()
        await _infer(engine)
        assert not engine.replicas.checked and engine.replicas._tasks == []
        await engine.close()


def _samples(registry) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name.startswith("omni_frontend_triton_replica_"):
                out[(s.name, s.labels["replica"])] = s.value
    return out


async def test_per_replica_metrics():
    async with fake_triton(Replica({"piper": "READY"})) as b:
        async with fake_triton(Replica({"piper": "READY"})) as a:
            engine = _engine(a, b)
            metrics = FrontendMetrics()
            metrics.watch_replicas(engine.replicas.all_known)
            await engine.start()
            b.hold = True
            _of(engine, a).outstanding += 1  # so the held call goes to b
            held = asyncio.ensure_future(_infer(engine))
            await asyncio.sleep(0.2)
            _of(engine, a).outstanding -= 1
            assert len(b.infers) == 1
            await _infer(engine)  # a: b has one outstanding
            m = _samples(metrics.registry)
            assert m[("omni_frontend_triton_replica_in_flight", b.url)] == 1
            assert m[("omni_frontend_triton_replica_requests_total", a.url)] == 1
            assert m[("omni_frontend_triton_replica_up", a.url)] == 1
        b.hold = False
        await _infer(engine)  # a is gone: this one fails there, is retried on b
        b.release.set()
        await held
        m = _samples(metrics.registry)
        assert m[("omni_frontend_triton_replica_requests_total", a.url)] == 2
        assert m[("omni_frontend_triton_replica_errors_total", a.url)] == 1
        assert m[("omni_frontend_triton_replica_up", a.url)] == 0
        assert m[("omni_frontend_triton_replica_requests_total", b.url)] == 2
        assert m[("omni_frontend_triton_replica_in_flight", b.url)] == 0
        await engine.close()


def test_on_demand_with_several_replicas_is_refused(monkeypatch):
    from openai_frontend.__main__ import main

    monkeypatch.delenv("OMNI_TRITON_ADMIN_KEY", raising=False)
    monkeypatch.delenv("OMNI_TRITON_ADMIN_KEY_FILE", raising=False)
    with pytest.raises(SystemExit, match="--on-demand needs a single Triton"):
        main(["--triton-url", "a:8001,b:8001", "--on-demand", "qwen_image"])
    with pytest.raises(SystemExit, match="--on-demand needs a single Triton"):
        main(["--triton-url", "dns:///svc:8001", "--on-demand", "qwen_image"])
    with pytest.raises(ValueError, match="single Triton replica"):
        TritonEngine("a:1,b:1", on_demand=lambda control: None)  # type: ignore[arg-type,return-value]

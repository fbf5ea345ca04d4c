"""The on-demand policy (omni_triton/serve/on_demand.py) over a fake Triton: load on first request,
single flight, eviction under a budget, failed loads, keep-alive, shared models, load timeouts,
waiter cancellation. No server, no frontend (tests/unit/test_on_demand_frontend.py binds it)."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from omni_triton.serve import on_demand as od
from omni_triton.serve.on_demand import (
    LoadFailed,
    LoadTimeout,
    ModelLoadError,
    OnDemandModels,
    Pipeline,
    PipelineGraph,
    State,
    TooLarge,
)


class FakeControl:
    """Triton's explicit model control, in memory. ``gate`` (an Event) holds every load until set;
    ``fail`` names models whose load fails; ``last`` is Triton's last_inference (wall seconds)."""

    def __init__(self, ready: set[str] | None = None, fail: set[str] | None = None):
        self.ready = set(ready or ())
        self.fail = set(fail or ())
        self.loads: list[str] = []
        self.unloads: list[str] = []
        self.last: dict[str, float] = {}
        self.gate: asyncio.Event | None = None

    async def load(self, model: str) -> None:
        self.loads.append(model)
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(0)
        if model in self.fail:
            raise ModelLoadError(f"failed to load '{model}': boom")
        self.ready.add(model)

    async def unload(self, model: str) -> None:
        self.unloads.append(model)
        self.ready.discard(model)

    async def ready_models(self) -> set[str]:
        return set(self.ready)

    async def last_inference(self, models: list[str]) -> dict[str, float]:
        return {m: self.last[m] for m in models if m in self.last}


class Events:
    def __init__(self) -> None:
        self.loads: list[tuple[str, str]] = []
        self.unloads: list[tuple[str, str]] = []

    def loaded(self, pipeline: str, outcome: str, seconds: float) -> None:
        self.loads.append((pipeline, outcome))

    def unloaded(self, pipeline: str, reason: str) -> None:
        self.unloads.append((pipeline, reason))

    def state(self, pipeline: str, state: State) -> None:
        pass


def graph(**sizes: float) -> PipelineGraph:
    """llm (pinned), piper (pinned), llm_tts (llm, piper, llm_tts), csm (talker, code2wav, csm),
    wan_t2v / wan_i2v sharing text_encoder and vae_decoder, image (one model)."""
    p = [Pipeline("llm", ("llm",), True), Pipeline("piper", ("piper",), True),
         Pipeline("llm_tts", ("llm", "piper", "llm_tts"), False),
         Pipeline("csm", ("csm_talker", "csm_code2wav", "csm"), False, served_model_name="tts"),
         Pipeline("wan_t2v", ("te", "t2v_den", "vae", "wan_t2v"), False),
         Pipeline("wan_i2v", ("te", "vae_enc", "i2v_den", "vae", "wan_i2v"), False),
         Pipeline("image", ("image",), False)]
    pss = {m: 100.0 for x in p for m in x.models}
    pss.update(sizes)
    return PipelineGraph({x.name: x for x in p}, pss)


def manager(control: FakeControl, **kw) -> OnDemandModels:
    kw.setdefault("keep_alive_s", None)
    return OnDemandModels(graph(**kw.pop("sizes", {})), control, **kw)


PINNED = {"llm", "piper"}


def test_first_request_loads_the_closure_dependencies_first_skipping_ready_models():
    async def main():
        control = FakeControl(ready=set(PINNED))
        m = manager(control)
        assert m.state("tts") == (State.UNLOADED, "")
        await m.ensure_loaded("tts")  # the OpenAI name
        assert control.loads == ["csm_talker", "csm_code2wav", "csm"]
        assert m.state("csm")[0] == State.LOADED
        await m.ensure_loaded("llm_tts")  # llm, piper are READY: not loaded again
        assert control.loads[3:] == ["llm_tts"]
        await m.ensure_loaded("csm")  # loaded: Triton not asked
        assert len(control.loads) == 4
    asyncio.run(main())


def test_concurrent_first_requests_share_one_load():
    async def main():
        control = FakeControl(ready=set(PINNED))
        control.gate = asyncio.Event()
        events = Events()
        m = manager(control, events=events)
        waiters = [asyncio.ensure_future(m.ensure_loaded("csm")) for _ in range(20)]
        await asyncio.sleep(0.05)
        assert m.state("csm")[0] == State.LOADING
        control.gate.set()
        await asyncio.gather(*waiters)
        assert control.loads.count("csm") == 1
        assert events.loads == [("csm", "ok")]
    asyncio.run(main())


def test_eviction_under_the_budget_unloads_the_lru_idle_pipeline_never_a_busy_or_pinned_one():
    async def main():
        control = FakeControl(ready=set(PINNED))
        events = Events()
        # pinned 200 + csm 300 + image 100 + wan_t2v 400 = 1000; the budget holds 900
        m = manager(control, memory_budget_mib=900.0, events=events, load_timeout_s=0.3)
        await m.ensure_loaded("image")
        await m.ensure_loaded("csm")
        od_grace, od.REQUEST_GRACE_S = od.REQUEST_GRACE_S, 0.0
        try:
            with m.in_flight("image"):  # image is the LRU but busy: csm goes
                await m.ensure_loaded("wan_t2v")
                assert events.unloads == [("csm", "evicted")]
                assert m.state("image")[0] == State.LOADED
            assert set(control.unloads) == {"csm", "csm_talker", "csm_code2wav"}
            assert PINNED <= control.ready
            # now csm again: image (idle, LRU) goes before wan_t2v (used later)
            with m.in_flight("wan_t2v"):
                pass
            await m.ensure_loaded("csm")
            assert events.unloads[-1] == ("image", "evicted")
            # everything on demand busy: the request waits for room, then 503 model_loading
            with m.in_flight("csm"), m.in_flight("wan_t2v"):
                with pytest.raises(LoadTimeout):
                    await m.ensure_loaded("image")
                await asyncio.sleep(0.1)  # the load gives up at its own deadline
                assert m.state("image")[0] == State.UNLOADED
                assert "memory budget" in m.state("image")[1]
                assert control.loads.count("image") == 1
        finally:
            od.REQUEST_GRACE_S = od_grace
    asyncio.run(main())


def test_a_pipeline_over_the_whole_budget_is_too_large():
    async def main():
        m = manager(FakeControl(ready=set(PINNED)), memory_budget_mib=500.0, sizes={"wan_t2v": 1000.0})
        with pytest.raises(TooLarge, match="needs 1300 MiB beside the 200 MiB"):
            await m.ensure_loaded("wan_t2v")
        big = manager(FakeControl(ready=set(PINNED)), memory_budget_mib=300.0, sizes={"csm": 1000.0})
        with pytest.raises(TooLarge, match="The model 'tts' needs"):  # the name the client used
            await big.ensure_loaded("tts")
    asyncio.run(main())


def test_a_failed_load_unloads_what_it_started_leaves_loaded_pipelines_and_backs_off():
    async def main():
        control = FakeControl(ready=set(PINNED), fail={"csm"})
        events = Events()
        m = manager(control, events=events)
        await m.ensure_loaded("image")
        with pytest.raises(LoadFailed, match="boom"):
            await m.ensure_loaded("tts")
        assert m.state("csm") == (State.FAILED, "failed to load 'csm': boom")
        assert control.unloads == ["csm", "csm_code2wav", "csm_talker"]  # what it started, not image
        assert m.state("image")[0] == State.LOADED and {"image", *PINNED} <= control.ready
        assert events.loads[-1] == ("csm", "failed")
        with pytest.raises(LoadFailed):  # within the back-off: no new load
            await m.ensure_loaded("csm")
        assert control.loads.count("csm") == 1
        control.fail.clear()
        m._entries["csm"].failed_at -= od.FAILED_BACKOFF_S  # the back-off has passed
        await m.ensure_loaded("csm")
        assert m.state("csm")[0] == State.LOADED
    asyncio.run(main())


def test_a_shared_model_stays_while_another_loaded_pipeline_needs_it():
    async def main():
        control = FakeControl(ready=set(PINNED))
        m = manager(control)
        await m.ensure_loaded("wan_t2v")
        await m.ensure_loaded("wan_i2v")
        assert control.loads.count("te") == 1  # READY already: not loaded again
        await m._unload(m._entries["wan_t2v"], "keep_alive")
        assert control.unloads == ["wan_t2v", "t2v_den"]  # te, vae: wan_i2v needs them
        assert {"te", "vae"} <= control.ready
        await m._unload(m._entries["wan_i2v"], "keep_alive")
        assert {"te", "vae"}.isdisjoint(control.ready)
        # a pinned pipeline's models are never unloaded with an on-demand one
        await m.ensure_loaded("llm_tts")
        await m._unload(m._entries["llm_tts"], "keep_alive")
        assert control.unloads[-1] == "llm_tts" and PINNED <= control.ready
    asyncio.run(main())


def test_keep_alive_unloads_an_idle_pipeline_but_never_one_with_a_call_in_flight():
    async def main():
        control = FakeControl(ready=set(PINNED))
        events = Events()
        grace, od.REQUEST_GRACE_S = od.REQUEST_GRACE_S, 0.0
        m = manager(control, keep_alive_s=0.2, events=events)
        await m.start()
        try:
            await m.ensure_loaded("csm")
            await m.ensure_loaded("image")
            with m.in_flight("csm"):  # a stream open past the keep-alive
                await asyncio.sleep(0.6)
                assert m.state("csm")[0] == State.LOADED
                assert events.unloads == [("image", "keep_alive")]
            t0 = time.monotonic()
            while m.state("csm")[0] == State.LOADED and time.monotonic() - t0 < 2:
                await asyncio.sleep(0.02)
            # unloaded keep_alive after the call ended, not before
            assert events.unloads == [("image", "keep_alive"), ("csm", "keep_alive")]
            assert time.monotonic() - t0 >= 0.15
            assert PINNED <= control.ready
        finally:
            od.REQUEST_GRACE_S = grace
            await m.stop()
    asyncio.run(main())


def test_keep_alive_counts_tritons_last_inference_as_use():
    async def main():
        control = FakeControl(ready=set(PINNED))
        grace, od.REQUEST_GRACE_S = od.REQUEST_GRACE_S, 0.0
        m = manager(control, keep_alive_s=0.2)
        try:
            await m.ensure_loaded("image")
            await asyncio.sleep(0.25)
            control.last["image"] = time.time()  # a direct tritonclient call just now
            assert await m.expire_idle() == []
            await asyncio.sleep(0.25)
            assert await m.expire_idle() == ["image"]
        finally:
            od.REQUEST_GRACE_S = grace
    asyncio.run(main())


def test_waiting_past_the_load_timeout_gives_load_timeout_while_the_load_finishes():
    async def main():
        control = FakeControl(ready=set(PINNED))
        control.gate = asyncio.Event()
        m = manager(control, load_timeout_s=0.1)
        with pytest.raises(LoadTimeout, match="--load-timeout") as err:
            await m.ensure_loaded("csm")
        assert err.value.retry_after_s > 0
        assert m.state("csm")[0] == State.LOADING
        control.gate.set()
        for _ in range(50):
            await asyncio.sleep(0.01)
        assert m.state("csm")[0] == State.LOADED
        assert control.loads.count("csm") == 1
    asyncio.run(main())


def test_a_client_cancelling_while_waiting_does_not_cancel_the_load():
    async def main():
        control = FakeControl(ready=set(PINNED))
        control.gate = asyncio.Event()
        m = manager(control)
        waiter = asyncio.ensure_future(m.ensure_loaded("csm"))
        other = asyncio.ensure_future(m.ensure_loaded("csm"))
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        control.gate.set()
        await other  # the shared load went on
        assert m.state("csm")[0] == State.LOADED and "csm" in control.ready
    asyncio.run(main())


def test_start_takes_ready_on_demand_pipelines_as_loaded_and_lost_reloads():
    async def main():
        control = FakeControl(ready=set(PINNED) | {"image"})
        m = manager(control)
        await m.start()
        try:
            assert m.state("image")[0] == State.LOADED
            control.ready.discard("image")  # tritonserver restarted with the pinned models only
            m.lost("image")
            await m.ensure_loaded("image")
            assert control.loads == ["image"]
        finally:
            await m.stop()
    asyncio.run(main())


def _config(repo: Path, name: str, body: str) -> None:
    (repo / name).mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{body}\n')


def test_graph_from_repositories_reads_closures_companions_and_sizes(tmp_path, caplog):
    def param(k: str, v: str) -> str:
        return f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}'

    _config(tmp_path, "llm", param("pss_mib", "300"))
    _config(tmp_path, "talker", param("pss_mib", "50"))
    _config(tmp_path, "prompt", "")
    _config(tmp_path, "tts", "\n".join([param("depends_on", "talker,prompt"),
                                        param("frontend_companions", "prompt"),
                                        param("served_model_name", "speech"), param("pss_mib", "20")]))
    with caplog.at_level("INFO"):
        g = PipelineGraph.from_repositories(["llm"], ["speech"], [tmp_path])
    assert g.pipelines["tts"] == Pipeline("tts", ("talker", "prompt", "tts"), False, "speech")
    assert g.pipelines["prompt"].models == ("prompt",) and not g.pipelines["prompt"].pinned
    assert g.pipelines["llm"].pinned
    assert g.pss_mib == {"llm": 300.0, "talker": 50.0, "prompt": od.DEFAULT_PSS_MIB, "tts": 20.0}
    assert g.triton_name("speech") == "tts" and g.triton_name("nope") is None
    assert "no pss_mib parameter in prompt" in caplog.text


def test_triton_unreachable_during_a_load_fails_it_without_the_back_off():
    async def main():
        control = FakeControl(ready=set(PINNED))
        m = manager(control)

        async def down(model: str) -> None:
            raise ConnectionError("Triton is unavailable")

        control.load = down
        with pytest.raises(LoadFailed, match="unavailable"):
            await m.ensure_loaded("image")
        del control.load  # Triton is back: the next request loads at once
        await m.ensure_loaded("image")
        assert m.state("image")[0] == State.LOADED
    asyncio.run(main())


def test_a_load_right_after_another_pipelines_request_evicts_it_when_its_grace_ends():
    """Review finding: qwen3_tts answered, then a qwen_image request needing its room waited the
    whole load timeout (nothing woke the load when the 5 s request grace ended) and got a 503."""
    async def main():
        control = FakeControl(ready=set(PINNED))
        # pinned 200 + csm 300 + image 100 = 600 > 500: csm must go for image
        m = manager(control, memory_budget_mib=500.0, load_timeout_s=10.0)
        od_grace, od.REQUEST_GRACE_S = od.REQUEST_GRACE_S, 0.2
        try:
            await m.ensure_loaded("csm")
            with m.in_flight("csm"):
                pass
            t0 = time.monotonic()
            await m.ensure_loaded("image")  # LoadTimeout (after 10 s) when the grace is not awaited
            assert time.monotonic() - t0 < 2.0
            assert m.state("csm")[0] == State.UNLOADED and m.state("image")[0] == State.LOADED
        finally:
            od.REQUEST_GRACE_S = od_grace
    asyncio.run(main())


def test_queued_loads_that_fit_one_after_another_do_not_block_each_other():
    """Review finding: two first requests whose pipelines fit the budget one at a time, not
    together, both timed out: the lock holder counted the queued (not started) load as resident."""
    async def main():
        control = FakeControl(ready=set(PINNED))
        # pinned 200 + csm 300 = 500, pinned + image 300 = 500, all three 800 > 600
        m = manager(control, memory_budget_mib=600.0, load_timeout_s=3.0, sizes={"image": 300.0})
        od_grace, od.REQUEST_GRACE_S = od.REQUEST_GRACE_S, 0.2
        try:
            a = asyncio.ensure_future(m.ensure_loaded("csm"))
            b = asyncio.ensure_future(m.ensure_loaded("image"))
            done = await asyncio.gather(a, b, return_exceptions=True)
            # the first loaded; the second evicted it once its request grace ended: no timeout
            assert not [d for d in done if isinstance(d, BaseException)], done
            assert control.loads.count("csm") == 1 and control.loads.count("image") == 1
        finally:
            od.REQUEST_GRACE_S = od_grace
    asyncio.run(main())


def test_an_ensemble_without_pss_mib_costs_nothing(tmp_path):
    """Review finding: ensembles (no process) were charged DEFAULT_PSS_MIB (1 GiB) each."""
    def model(name: str, body: str) -> None:
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\n{body}\n')

    model("step", 'backend: "python"\nparameters { key: "pss_mib" value { string_value: "70" } }')
    model("dag", 'platform: "ensemble"\nensemble_scheduling { step [ { model_name: "step" '
                 'model_version: -1 input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } } ] }')
    g = PipelineGraph.from_repositories([], ["dag"], [tmp_path])
    assert g.pss_mib == {"step": 70.0, "dag": 0.0} and not g.unmeasured

"""TritonEngine.abort_inflight: a stage that died ends the in-flight calls on the models it takes
with it (StageRestartedError, a 503) instead of leaving them open forever (Triton 2.51 never
finishes the requests of a dead stub); the caller's own cancellation stays a CancelledError."""
from __future__ import annotations

import asyncio

import pytest
from engine_stub import EngineStub

from openai_frontend.engine.errors import StageRestartedError
from openai_frontend.engine.triton import TritonEngine


class HangingCall:
    """A grpc.aio stream call that never answers until cancelled (like a dead stub's stream)."""

    def __init__(self):
        self._never = asyncio.get_running_loop().create_future()
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        return await self._never

    def cancel(self):
        self.cancelled = True
        self._never.cancel()


class FakeStub:
    def __init__(self):
        self.calls = []

    def ModelStreamInfer(self, requests, metadata=()):
        call = HangingCall()
        self.calls.append(call)
        return call


class FakeClient:
    """The parts of ``tritonclient.grpc.aio.InferenceServerClient`` that ``_stream`` uses."""

    def __init__(self):
        self._client_stub = FakeStub()
        self.calls = self._client_stub.calls

    def _get_metadata(self, headers):
        return ()


def _engine():
    engine = TritonEngine("127.0.0.1:1")
    # the single replica's client (kept as _client_obj too, for the assertions)
    engine._client_obj = engine.replicas.replicas[0]._client = FakeClient()
    return engine


async def _consume(engine, model, request_id):
    async for _ in engine._stream(model, [], request_id):
        pass


def test_abort_ends_only_the_affected_streams_with_a_503():
    async def main():
        engine = _engine()
        hit = asyncio.create_task(_consume(engine, "llm_tts", "a"))
        other = asyncio.create_task(_consume(engine, "piper_tts", "b"))
        await asyncio.sleep(0.01)
        assert engine.abort_inflight(["llm", "llm_tts"], "llm") == 1
        with pytest.raises(StageRestartedError) as info:
            await hit
        assert info.value.status_code == 503 and "llm died" in info.value.message
        assert not other.done() and engine._inflight.keys() == {"b"}
        other.cancel()
        with pytest.raises(asyncio.CancelledError):
            await other
        assert engine._inflight == {} and engine._client_obj.calls[1].cancelled

    asyncio.run(main())


def test_a_task_cancellation_is_not_taken_for_a_dead_stage():
    async def main():
        engine = _engine()
        task = asyncio.create_task(_consume(engine, "llm", "c"))
        await asyncio.sleep(0.01)
        task.cancel()  # the HTTP client went away
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine._client_obj.calls[0].cancelled  # the Triton call was cancelled too

    asyncio.run(main())


class ReloadingEngine(EngineStub):
    """get_model fails ``not_ready`` times (the model reloading), then answers."""

    def __init__(self, not_ready: int):
        self.not_ready = not_ready

    async def get_model(self, name):
        from openai_frontend.engine.errors import ModelNotReadyError

        if self.not_ready:
            self.not_ready -= 1
            raise ModelNotReadyError("loading")
        return name


def test_side_effect_free_requests_are_retried_once_after_the_reload():
    from openai_frontend.serving.common import retry_after_stage_restart

    tries = []

    async def attempt():
        tries.append(1)
        if len(tries) == 1:
            raise StageRestartedError("piper_tts died")
        return "audio"

    engine = ReloadingEngine(not_ready=3)
    assert asyncio.run(retry_after_stage_restart(engine, "piper_tts", attempt, poll_s=0)) == "audio"
    assert len(tries) == 2 and engine.not_ready == 0


def test_a_second_stage_death_is_the_503():
    from openai_frontend.serving.common import retry_after_stage_restart

    async def attempt():
        raise StageRestartedError("died again")

    with pytest.raises(StageRestartedError):
        asyncio.run(retry_after_stage_restart(ReloadingEngine(0), "m", attempt, poll_s=0))
    with pytest.raises(StageRestartedError):  # never READY again within wait_s
        asyncio.run(retry_after_stage_restart(ReloadingEngine(10**6), "m", attempt, wait_s=0.05,
                                              poll_s=0.01))


def test_a_retry_that_finds_the_stage_still_down_waits_for_the_reload():
    """Triton lists a model READY for a moment after its stub died, so the retry can reach the
    dead stub ("not healthy": StageDownError, it never ran): it is tried again, not answered
    503 (the issue-26 trial: a killed pocketsphinx's transcription got the 503 every time).
    Red with StageDownError counted as a second death."""
    from openai_frontend.engine.errors import StageDownError
    from openai_frontend.serving.common import retry_after_stage_restart

    tries = []

    async def attempt():
        tries.append(1)
        if len(tries) == 1:
            raise StageRestartedError("died under the request")
        if len(tries) < 4:
            raise StageDownError("Stub process 'm_0_0' is not healthy.")
        return "text"

    assert asyncio.run(retry_after_stage_restart(ReloadingEngine(0), "m", attempt, poll_s=0)) == "text"
    assert len(tries) == 4

    async def down():
        raise StageDownError("still down")

    with pytest.raises(StageDownError):  # bounded by wait_s
        asyncio.run(retry_after_stage_restart(ReloadingEngine(0), "m", down, wait_s=0.05, poll_s=0.01))

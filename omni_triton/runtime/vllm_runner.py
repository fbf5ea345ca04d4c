"""vLLM ``AsyncLLM`` on its own asyncio loop thread, one coroutine per request streaming
:class:`GenerationDelta` objects; cancellation -> ``abort`` (the pattern of
triton-inference-server/vllm_backend ``src/model.py``).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omni_triton.runtime.reaper import ChildReaper
from omni_triton.runtime.vllm_request import GenerationJob, make_sampling_params

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

LOGGER = logging.getLogger("omni_triton.llm")


# --------------------------------------------------------------------------- engine


@dataclass
class GenerationDelta:
    """One streamed step of a request.

    Attributes:
        text: text generated since the previous delta (may be empty).
        new_tokens: tokens generated since the previous delta.
        prompt_tokens: prompt length in tokens.
        completion_tokens: tokens generated so far (cumulative).
        finish_reason: ``None`` until the last delta, then ``"stop"``, ``"length"`` or ``"abort"``.
    """

    text: str
    new_tokens: int
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None


class AsyncEngineRunner:
    """vLLM ``AsyncLLM`` on its own asyncio event-loop thread; one coroutine per request.

    The Triton thread calling ``execute`` only submits coroutines
    (``asyncio.run_coroutine_threadsafe``) and returns; deltas reach the caller through the
    ``on_delta`` callback, called on the loop thread. Pattern of Triton's vllm_backend
    (``src/model.py``: ``_event_thread``, ``_generate``, ``is_cancelled`` -> ``abort``).

    Args:
        engine_args: ``AsyncEngineArgs`` keyword arguments (see :func:`parse_engine_config`).
    """

    def __init__(self, engine_args: dict[str, Any]):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="vllm-engine-loop", daemon=True)
        self._thread.start()
        self._active = 0
        self.engine = asyncio.run_coroutine_threadsafe(self._create(engine_args), self.loop).result()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @staticmethod
    async def _create(engine_args: dict[str, Any]) -> AsyncLLM:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))

    @property
    def engine_dead(self) -> bool:
        """Whether vLLM's engine has failed for good (its EngineCore process died or raised):
        ``AsyncLLM.errored``, which vLLM's own process monitor sets; no request can succeed
        again until the engine is built anew."""
        return bool(getattr(self.engine, "errored", False))

    def watch_engine(self, on_dead: Callable[[], None], interval_s: float = 0.5) -> threading.Thread:
        """Poll :attr:`engine_dead` on a daemon thread; call ``on_dead`` once when it turns true.

        The ``llm`` stage exits its stub then (after the in-flight requests got their error
        responses), so ``omni-triton serve`` reloads the model with a new engine instead of every
        later request failing on a dead one while Triton reports the model READY."""

        def run() -> None:
            while not self.engine_dead:
                time.sleep(interval_s)
            on_dead()

        thread = threading.Thread(target=run, name="vllm-engine-watch", daemon=True)
        thread.start()
        return thread

    @property
    def active_requests(self) -> int:
        """Requests being generated now."""
        return self._active

    def submit(self, job: GenerationJob, on_delta: Callable[[GenerationDelta], None],
               is_cancelled: Callable[[], bool] = lambda: False) -> Future[None]:
        """Start generating ``job``; returns a future that completes when the stream ended.

        ``on_delta`` is called for every engine output; its last call has a ``finish_reason``.
        ``is_cancelled`` is polled every 0.1 s by a task of its own (also while the request waits);
        when it turns true the request is aborted in the engine, whose last output then has
        ``finish_reason == "abort"``. An exception inside the coroutine ends the future with it
        (the caller reports it; ``on_delta`` then never saw a final delta).
        """
        return asyncio.run_coroutine_threadsafe(self._generate(job, on_delta, is_cancelled), self.loop)

    async def _watch_cancel(self, request_id: str, is_cancelled: Callable[[], bool], poll_s: float) -> bool:
        while not is_cancelled():
            await asyncio.sleep(poll_s)
        await self.engine.abort(request_id)
        return True

    async def _generate(self, job: GenerationJob, on_delta: Callable[[GenerationDelta], None],
                        is_cancelled: Callable[[], bool], poll_s: float = 0.1) -> None:
        from vllm.inputs import TokensPrompt

        self._active += 1
        completion, final_sent = 0, False
        # Cancellation is watched by its own task, so a request still queued in the engine (no
        # output yet) is aborted too, not only between two outputs.
        watcher = asyncio.ensure_future(self._watch_cancel(job.request_id, is_cancelled, poll_s))
        try:
            # ignore: vLLM declares TokensPrompt's optional keys with typing.NotRequired (3.11+), which
            # mypy does not see when checking for Python 3.10, so it asks for every key
            prompt = TokensPrompt(prompt_token_ids=job.prompt_ids)  # type: ignore[typeddict-item]
            stream = self.engine.generate(prompt,
                                          make_sampling_params(job.sampling), request_id=job.request_id)
            async for output in stream:
                out = output.outputs[0]
                completion += len(out.token_ids)
                finish = (out.finish_reason or "stop") if output.finished else None
                on_delta(GenerationDelta(text=out.text, new_tokens=len(out.token_ids),
                                         prompt_tokens=len(job.prompt_ids),
                                         completion_tokens=completion, finish_reason=finish))
                final_sent = finish is not None
                if final_sent:
                    break
            if not final_sent:  # the engine stream ended without a finished output (aborted)
                on_delta(GenerationDelta(text="", new_tokens=0, prompt_tokens=len(job.prompt_ids),
                                         completion_tokens=completion, finish_reason="abort"))
        finally:
            self._active -= 1
            watcher.cancel()

    def shutdown(self, timeout: float = 1.0, reaper: ChildReaper | None = None) -> bool:
        """Shut the engine down (stops its EngineCore process) and stop the loop thread.

        vLLM's own shutdown gives its worker a 5 s grace period, while Triton's exit timeout is
        short (10 s in the launcher) and the stub still has to exit after ``finalize``. So this
        waits ``timeout`` seconds for a clean shutdown, then lets ``reaper`` kill the engine's
        processes (nothing of them is kept) and waits ``timeout`` more for vLLM to notice.

        Returns:
            whether vLLM's shutdown completed.
        """
        done = threading.Thread(target=self.engine.shutdown, name="vllm-shutdown", daemon=True)
        done.start()
        done.join(timeout)
        if done.is_alive() and reaper is not None:
            reaper.reap(timeout=0.5)
            done.join(timeout)

        async def cancel_tasks() -> None:  # the engine's output handler tasks, so the loop stops clean
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=1.0) if tasks else None

        try:
            asyncio.run_coroutine_threadsafe(cancel_tasks(), self.loop).result(timeout=2)
        except Exception:
            LOGGER.warning("engine loop tasks did not stop in time")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=2)
        return not done.is_alive()

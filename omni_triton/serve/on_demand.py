"""On-demand pipelines: load on first request, unload when idle, stay within a memory budget.

The policy of docs/running.md "On-demand models" (the shared design: issue 28), torch-free and
Triton-free: it talks to Triton through :class:`ModelControl` (the frontend binds it with
``tritonclient.grpc.aio``; unit tests with a fake) and runs on the caller's asyncio loop.

Words:
* pipeline: a model clients call (``csm``, ``llm_tts``, ``qwen_image``...). Its closure is
  :func:`omni_triton.serve.repository.resolve_models` of it (the pipeline and every model it
  needs, dependencies first) plus its ``frontend_companions``; it loads and unloads as a unit.
* pinned: loaded at start (``serve --models``), never unloaded here. on-demand: the others.
* a model is resident while a pinned, loaded or loading pipeline's closure holds it: it is
  unloaded only when none does (pipelines share models: ``llm_tts`` needs ``llm`` and ``piper``).

Behaviour:
* :meth:`OnDemandModels.ensure_loaded`: one load per pipeline at a time (single flight, every
  waiter shares it); models already READY are not loaded again; a waiter waits ``load_timeout_s``
  (:class:`LoadTimeout` after that, while the load goes on); a waiter's cancellation never cancels
  the load (``asyncio.wait``, not ``wait_for``, which on Python 3.11 can swallow a cancellation).
* :meth:`OnDemandModels.in_flight`: every Triton call holds its model for its whole duration; a
  pipeline whose closure has a call in flight is busy and never unloaded. Idle time counts from
  the end of the last call, or from Triton's ``last_inference`` statistics when later (clients
  that call Triton directly).
* keep-alive: a background task sleeps until the next idle deadline (no polling) and unloads each
  on-demand pipeline idle for ``keep_alive_s``.
* budget: each model's config parameter ``pss_mib`` (its measured PSS with all its instances, MiB;
  :data:`DEFAULT_PSS_MIB` when missing, logged once per model). Before a load, while the resident
  models plus the new ones exceed the budget, the least recently used idle on-demand pipeline is
  unloaded; if nothing is idle, the load waits (up to ``load_timeout_s``) for one to go idle.
  A pipeline that cannot fit even beside the pinned models alone: :class:`TooLarge`.
* failure: the models this load started are unloaded again, loaded pipelines are untouched; the
  pipeline is ``failed`` with Triton's reason for :data:`FAILED_BACKOFF_S`, then tried again (at
  once when the error was not the model's, :class:`ModelLoadError`, but Triton's: unreachable).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from omni_triton.serve.repository import (
    available_models,
    frontend_models,
    model_parameters,
    read_config,
    resolve_models,
)

logger = logging.getLogger(__name__)

#: MiB counted for a model whose config has no ``pss_mib`` parameter (clients/bench_footprint.py
#: writes it): 1 GiB, about the measured size of a tiny-checkpoint torch stage of the default
#: stack (issue 28: 265-311 MB per light instance, 1.55 GB for Piper's stub), so an unmeasured
#: model is neither free nor a budget's worth.
DEFAULT_PSS_MIB = 1024.0
#: Seconds a failed pipeline answers with its failure before the next request tries again.
FAILED_BACKOFF_S = 30.0
#: Seconds a pipeline that a request found loaded stays loaded, idle or not, so that the call
#: the request makes next finds it (``--keep-alive 0`` unloaded it in between otherwise).
REQUEST_GRACE_S = 5.0
#: ``Retry-After`` seconds suggested to a request that timed out waiting for a load.
RETRY_AFTER_S = 5


def byte_size(text: str) -> int:
    """``--memory-budget``'s value: a size (``6GiB``, ``6000MiB``, ``6G``: pydantic's ``ByteSize``,
    decimal and binary units) in bytes.

    Raises:
        argparse.ArgumentTypeError: not a size, or a size <= 0.
    """
    from pydantic import ByteSize, TypeAdapter, ValidationError

    try:
        size = int(TypeAdapter(ByteSize).validate_python(text))
    except ValidationError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 6GiB or 6000MiB") from None
    if size <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the budget must be positive")
    return size


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, on_demand_default: str,
                  on_demand_help: str) -> None:
    """Add the on-demand flags ``omni-triton serve`` and ``python -m openai_frontend`` share:
    ``--on-demand`` (its default and help differ: serve resolves ``all``), ``--keep-alive``
    (seconds), ``--memory-budget`` (bytes, :func:`byte_size`) and ``--load-timeout`` (seconds)."""
    parser.add_argument("--on-demand", default=on_demand_default, help=on_demand_help)
    parser.add_argument("--keep-alive", type=float, default=300.0,
                        help="seconds an on-demand pipeline stays loaded after its last request (default "
                             "300, Ollama's; 0: unload as soon as idle; -1: never)")
    parser.add_argument("--memory-budget", type=byte_size, default=None,
                        help="memory (PSS) the loaded models may take, e.g. 6GiB, 6000MiB, 6G: before a "
                             "load, idle on-demand pipelines are unloaded, least recently used first, to "
                             "make room (each model's size: its config's pss_mib); default unlimited")
    parser.add_argument("--load-timeout", type=float, default=120.0,
                        help="seconds a request waits for its pipeline to load; then 503 model_loading "
                             "with Retry-After (the load goes on)")


class State(str, enum.Enum):
    """A pipeline's state, as ``/v1/models`` reports it."""

    LOADED = "loaded"
    LOADING = "loading"
    UNLOADED = "unloaded"
    FAILED = "failed"


class ModelLoadError(Exception):
    """Raised by :meth:`ModelControl.load` when Triton refused or failed the load; ``str`` is
    Triton's reason."""


class OnDemandError(Exception):
    """Base of the errors :meth:`OnDemandModels.ensure_loaded` raises; ``pipeline`` is its name."""

    def __init__(self, pipeline: str, message: str):
        super().__init__(message)
        self.pipeline = pipeline
        self.message = message


class LoadFailed(OnDemandError):
    """The pipeline's last load failed less than :data:`FAILED_BACKOFF_S` ago (or just now);
    ``reason`` is Triton's."""

    def __init__(self, pipeline: str, reason: str, shown: str | None = None):
        super().__init__(pipeline, f"The model '{shown or pipeline}' failed to load: {reason}")
        self.reason = reason


class LoadTimeout(OnDemandError):
    """The pipeline did not load within ``load_timeout_s`` (still loading, or waiting for room
    under the budget); ``retry_after_s`` is a hint for the client."""

    def __init__(self, pipeline: str, message: str, retry_after_s: int = RETRY_AFTER_S):
        super().__init__(pipeline, message)
        self.retry_after_s = retry_after_s


class TooLarge(OnDemandError):
    """The pipeline does not fit in the memory budget even with every on-demand pipeline
    unloaded; ``size_mib`` (what it adds to the pinned models) and ``budget_mib`` say by how much."""

    def __init__(self, pipeline: str, size_mib: float, pinned_mib: float, budget_mib: float,
                 shown: str | None = None):
        super().__init__(pipeline, (
            f"The model '{shown or pipeline}' needs {size_mib:.0f} MiB beside the {pinned_mib:.0f} MiB of the "
            f"models kept loaded, over the memory budget of {budget_mib:.0f} MiB (--memory-budget)"))
        self.size_mib, self.pinned_mib, self.budget_mib = size_mib, pinned_mib, budget_mib


class ModelControl(Protocol):
    """What the policy needs from Triton (explicit model control). Every method may raise any
    exception when Triton is unreachable; :meth:`load` raises :class:`ModelLoadError` when the
    model itself failed."""

    async def load(self, model: str) -> None:
        """Load ``model`` (only it, not what it needs); return when it is READY."""

    async def unload(self, model: str) -> None:
        """Unload ``model`` (only it); return when its memory is released."""

    async def ready_models(self) -> set[str]:
        """The models Triton reports READY now."""

    async def last_inference(self, models: list[str]) -> dict[str, float]:
        """Model -> wall-clock time (``time.time()`` seconds) of its last inference, from
        Triton's statistics (``last_inference``, ms since the epoch); models never called or
        unknown are left out."""


class Events(Protocol):
    """Observer of loads and unloads (the frontend's Prometheus metrics)."""

    def loaded(self, pipeline: str, outcome: str, seconds: float) -> None:
        """A load ended: ``outcome`` ``ok`` or ``failed``, after ``seconds``."""

    def unloaded(self, pipeline: str, reason: str) -> None:
        """An unload: ``reason`` ``keep_alive`` or ``evicted``."""

    def state(self, pipeline: str, state: State) -> None:
        """The pipeline entered ``state``."""


@dataclass(frozen=True)
class Pipeline:
    """One pipeline of the graph.

    Attributes:
        name: its Triton model name.
        models: its closure, dependencies first, companions last.
        pinned: loaded at start and never unloaded by this policy.
        served_model_name: the OpenAI name (config parameter ``served_model_name``), or None.
    """

    name: str
    models: tuple[str, ...]
    pinned: bool
    served_model_name: str | None = None

    @property
    def shown(self) -> str:
        """The name error messages use: the OpenAI name clients call it by, else the Triton name
        (a client that asked for ``omni`` was told about ``qwen3_omni``: review finding)."""
        return self.served_model_name or self.name


@dataclass
class PipelineGraph:
    """The pipelines and each model's size, read once from the repositories' ``config.pbtxt``.

    Attributes:
        pipelines: name -> :class:`Pipeline`.
        pss_mib: model -> its ``pss_mib`` (:data:`DEFAULT_PSS_MIB` when the config has none).
        unmeasured: models counted with the default size.
    """

    pipelines: dict[str, Pipeline]
    pss_mib: dict[str, float]
    unmeasured: frozenset[str] = frozenset()

    @classmethod
    def from_repositories(cls, pinned: list[str], on_demand: list[str],
                          repositories: list[Path] | None = None) -> PipelineGraph:
        """The graph of ``pinned`` and ``on_demand`` pipelines (Triton or OpenAI names).

        Companions of an on-demand pipeline (``frontend_companions``) are on-demand pipelines
        too (the frontend calls them by name: ``qwen3_tts_voice_prompt``). Blocking file reads:
        call once at start, not on the event loop.

        Raises:
            KeyError: a name (or a model it needs) is in no repository.
            ValueError: a ``pss_mib`` parameter is not a non-negative number.
        """
        paths = available_models(repositories)
        pipelines: dict[str, Pipeline] = {}

        def add(name: str, is_pinned: bool) -> None:
            triton = resolve_models([name], repositories)[-1]
            if triton in pipelines:
                return
            closure = list(resolve_models([triton], repositories))
            for companion in frontend_models([triton], repositories)[1:]:
                closure += [m for m in resolve_models([companion], repositories) if m not in closure]
            served = model_parameters(paths[triton]).get("served_model_name") or None
            pipelines[triton] = Pipeline(triton, tuple(closure), is_pinned, served)

        for name in pinned:
            add(name, True)
        for name in on_demand:
            add(name, False)
            for companion in frontend_models([resolve_models([name], repositories)[-1]], repositories)[1:]:
                add(companion, False)
        sizes: dict[str, float] = {}
        unmeasured: set[str] = set()
        for p in pipelines.values():
            for m in p.models:
                if m in sizes:
                    continue
                raw = model_parameters(paths[m]).get("pss_mib", "").strip()
                if not raw and read_config(paths[m] / "config.pbtxt").platform == "ensemble":
                    sizes[m] = 0.0  # a DAG in the server, no process of its own: its steps count
                    continue
                if not raw:
                    sizes[m] = DEFAULT_PSS_MIB
                    unmeasured.add(m)
                    continue
                try:
                    sizes[m] = float(raw)
                except ValueError:
                    raise ValueError(f"model {m}: parameter pss_mib={raw!r} is not a number") from None
                if sizes[m] < 0 or sizes[m] != sizes[m]:
                    raise ValueError(f"model {m}: parameter pss_mib={raw!r} is negative")
        if unmeasured:
            logger.info("on-demand: no pss_mib parameter in %s: each counted as %.0f MiB against "
                        "--memory-budget (clients/bench_footprint.py measures them)",
                        ", ".join(sorted(unmeasured)), DEFAULT_PSS_MIB)
        return cls(pipelines, sizes, frozenset(unmeasured))

    def triton_name(self, name: str) -> str | None:
        """The pipeline called ``name`` (its Triton name or its ``served_model_name``), or None."""
        if name in self.pipelines:
            return name
        for p in self.pipelines.values():
            if p.served_model_name == name:
                return p.name
        return None


@dataclass
class _Entry:
    """Mutable state of one pipeline."""

    pipeline: Pipeline
    state: State
    reason: str = ""
    failed_at: float = 0.0
    last_used: float = 0.0  # monotonic: end of its last call
    requested_at: float = float("-inf")  # monotonic: its last ensure_loaded
    load: asyncio.Task[None] | None = None


@dataclass
class _NoEvents:
    def loaded(self, pipeline: str, outcome: str, seconds: float) -> None:
        pass

    def unloaded(self, pipeline: str, reason: str) -> None:
        pass

    def state(self, pipeline: str, state: State) -> None:
        pass


@dataclass
class OnDemandModels:
    """The policy over one Triton (see the module docstring).

    Args:
        graph: the pipelines (:meth:`PipelineGraph.from_repositories`).
        control: Triton's explicit model control (:class:`ModelControl`).
        keep_alive_s: seconds an idle on-demand pipeline stays loaded; 0 unloads as soon as idle;
            None (``--keep-alive -1``) never.
        memory_budget_mib: MiB the resident models may take (sum of ``pss_mib``); None: unlimited.
        load_timeout_s: seconds :meth:`ensure_loaded` waits before :class:`LoadTimeout`.
        events: observer of loads, unloads and states (metrics).
        clock: monotonic seconds (tests pass a fake); wall: ``time.time`` (for Triton's statistics).
    """

    graph: PipelineGraph
    control: ModelControl
    keep_alive_s: float | None = 300.0
    memory_budget_mib: float | None = None
    load_timeout_s: float = 120.0
    events: Events = field(default_factory=_NoEvents)
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        now = self.clock()
        self._entries = {name: _Entry(p, State.LOADED if p.pinned else State.UNLOADED, last_used=now)
                         for name, p in self.graph.pipelines.items()}
        self._inflight: dict[str, int] = {}
        #: serializes loads and unloads: the budget and the shared models' refcounts stay exact
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()  # for the keep-alive task: a call or a load ended
        self._room = asyncio.Event()  # for a load waiting for room: a call or a load ended
        pinned = self._pinned_models()
        #: per pipeline, the models of its closure no pinned pipeline holds: only calls on these
        #: keep it busy (a pinned model is never unloaded, and a busy pinned ``llm`` must not keep
        #: ``llm_tts`` loaded forever)
        self._own = {name: frozenset(p.models) - pinned for name, p in self.graph.pipelines.items()}
        self._keeper: asyncio.Task[None] | None = None
        for e in self._entries.values():
            self.events.state(e.pipeline.name, e.state)

    def attach(self, events: Events) -> None:
        """Report to ``events`` from now on, starting with every pipeline's current state."""
        self.events = events
        for e in self._entries.values():
            events.state(e.pipeline.name, e.state)

    # ------------------------------------------------------------------ queries
    def is_on_demand(self, name: str) -> bool:
        """Whether ``name`` (Triton or OpenAI name) is an on-demand pipeline."""
        triton = self.graph.triton_name(name)
        return triton is not None and not self.graph.pipelines[triton].pinned

    def state(self, name: str) -> tuple[State, str]:
        """``(state, reason)`` of pipeline ``name`` (reason empty unless failed).

        Raises:
            KeyError: ``name`` is not a pipeline of the graph.
        """
        e = self._entries[self._name(name)]
        return e.state, e.reason

    def resident_models(self) -> set[str]:
        """Models held by a pinned, loaded or loading pipeline."""
        return {m for e in self._entries.values()
                if e.pipeline.pinned or e.state in (State.LOADED, State.LOADING) for m in e.pipeline.models}

    def resident_pss_mib(self) -> float:
        """Sum of ``pss_mib`` over :meth:`resident_models`."""
        return sum(self.graph.pss_mib.get(m, DEFAULT_PSS_MIB) for m in self.resident_models())

    def busy(self, name: str) -> bool:
        """Whether a Triton call on any model of pipeline ``name``'s closure is in flight."""
        return any(self._inflight.get(m, 0) for m in self._own[self._name(name)])

    def _name(self, name: str) -> str:
        triton = self.graph.triton_name(name)
        if triton is None:
            raise KeyError(name)
        return triton

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Take on-demand pipelines Triton already has READY as loaded (a frontend restart) and
        start the keep-alive task. Triton unreachable: all stay unloaded (found at first request)."""
        try:
            ready = await self.control.ready_models()
        except Exception as exc:  # Triton down at start: learn at first request
            logger.warning("on-demand: Triton's model states unavailable at start (%s)", exc)
            ready = set()
        for e in self._entries.values():
            if not e.pipeline.pinned and set(e.pipeline.models) <= ready:
                self._set(e, State.LOADED)
                e.last_used = self.clock()
        if self._keeper is None:
            self._keeper = asyncio.ensure_future(self._keep_alive_loop())

    async def stop(self) -> None:
        """Stop the keep-alive task and every load in progress (models stay as they are)."""
        tasks = [t for t in [self._keeper, *(e.load for e in self._entries.values())] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._keeper = None

    def lost(self, name: str) -> None:
        """Pipeline ``name`` was found not READY although loaded (tritonserver restarted with the
        pinned models only): take it as unloaded, so the next :meth:`ensure_loaded` loads it."""
        e = self._entries[self._name(name)]
        if not e.pipeline.pinned and e.state == State.LOADED:
            logger.warning("on-demand: %s is no longer loaded in Triton; loading it again", e.pipeline.name)
            self._set(e, State.UNLOADED)

    # ------------------------------------------------------------------ requests
    @contextlib.contextmanager
    def in_flight(self, model: str) -> Iterator[None]:
        """Hold ``model`` busy for the duration of one Triton call (stream or unary). Every
        pipeline whose closure holds ``model`` counts the end of the call as its last use."""
        self._inflight[model] = self._inflight.get(model, 0) + 1
        try:
            yield
        finally:
            left = self._inflight[model] - 1
            if left:
                self._inflight[model] = left
            else:
                del self._inflight[model]
            now = self.clock()
            for e in self._entries.values():
                if model in self._own[e.pipeline.name]:
                    e.last_used = max(e.last_used, now)
            self._changed.set()
            self._room.set()

    async def ensure_loaded(self, name: str) -> None:
        """Return once pipeline ``name`` (Triton or OpenAI name) is loaded, loading it if needed.

        Pinned pipelines and loaded ones return at once (Triton is not asked). Otherwise one load
        runs per pipeline, shared by every caller; a caller waits at most ``load_timeout_s``.

        Raises:
            KeyError: ``name`` is not a pipeline of the graph.
            TooLarge: it cannot fit in the budget beside the pinned models.
            LoadFailed: its load failed (now, or less than :data:`FAILED_BACKOFF_S` ago).
            LoadTimeout: still loading (or waiting for room) after ``load_timeout_s``.
        """
        e = self._entries[self._name(name)]
        # a request that finds its pipeline loaded holds it for REQUEST_GRACE_S, until its call
        # (in_flight) has started: keep-alive 0 unloaded it in between otherwise
        e.requested_at = self.clock()
        if e.pipeline.pinned or e.state == State.LOADED:
            return
        if e.state == State.FAILED and self.clock() - e.failed_at < FAILED_BACKOFF_S:
            raise LoadFailed(e.pipeline.name, e.reason, e.pipeline.shown)
        self._check_fits(e.pipeline)
        if e.load is None:
            self._set(e, State.LOADING)
            e.load = asyncio.ensure_future(self._load(e))
        task = e.load
        # asyncio.wait neither cancels the load on a timeout nor when this caller is cancelled
        await asyncio.wait({task}, timeout=self.load_timeout_s)
        if not task.done() or e.state == State.LOADING:
            raise LoadTimeout(e.pipeline.name, (
                f"The model '{e.pipeline.shown}' is loading (on demand); it was not ready within "
                f"{self.load_timeout_s:g} s (--load-timeout). Retry shortly"))
        if e.state == State.FAILED:
            raise LoadFailed(e.pipeline.name, e.reason, e.pipeline.shown)
        if e.state != State.LOADED:  # the load gave up waiting for room
            raise LoadTimeout(e.pipeline.name, e.reason or (
                f"The model '{e.pipeline.shown}' could not be loaded yet; retry shortly"))

    # ------------------------------------------------------------------ internals
    def _set(self, e: _Entry, state: State, reason: str = "") -> None:
        e.state, e.reason = state, reason
        self.events.state(e.pipeline.name, state)

    def _pinned_models(self) -> set[str]:
        return {m for e in self._entries.values() if e.pipeline.pinned for m in e.pipeline.models}

    def _check_fits(self, p: Pipeline) -> None:
        if self.memory_budget_mib is None:
            return
        pinned = self._pinned_models()
        pinned_mib = sum(self.graph.pss_mib[m] for m in pinned)
        size = sum(self.graph.pss_mib[m] for m in p.models if m not in pinned)
        if pinned_mib + size > self.memory_budget_mib:
            raise TooLarge(p.name, size, pinned_mib, self.memory_budget_mib, p.shown)

    def _needed_by_others(self, e: _Entry) -> set[str]:
        return {m for o in self._entries.values() if o is not e
                and (o.pipeline.pinned or o.state in (State.LOADED, State.LOADING)) for m in o.pipeline.models}

    def _resident_besides(self, e: _Entry) -> set[str]:
        """Models that take memory now besides ``e``'s load: those of pinned and loaded pipelines.
        Not those of other *loading* pipelines: loads run one at a time (the lock ``e`` holds), so
        theirs have not started; counting them let two queued loads that fit one after the other
        block each other until both timed out (a review finding)."""
        return {m for o in self._entries.values() if o is not e
                and (o.pipeline.pinned or o.state == State.LOADED) for m in o.pipeline.models}

    def _idle_since(self, e: _Entry) -> float:
        """Monotonic time from which ``e`` counts as idle: its last use, or the end of the grace
        of its last request."""
        return max(e.last_used, e.requested_at + REQUEST_GRACE_S - (self.keep_alive_s or 0.0))

    async def _load(self, e: _Entry) -> None:
        """The shared load of ``e``'s closure (the task every waiter waits on); never raises."""
        started: list[str] = []
        t0 = self.clock()
        deadline = t0 + self.load_timeout_s
        try:
            async with self._lock:
                if not await self._make_room(e, deadline):
                    self._set(e, State.UNLOADED, (
                        f"The model '{e.pipeline.shown}' waits for room in the memory budget "
                        f"({self.memory_budget_mib:.0f} MiB): every other on-demand model is in use. "
                        "Retry shortly"))
                    return
                ready = await self.control.ready_models()
                for model in e.pipeline.models:
                    if model in ready:
                        continue
                    started.append(model)
                    await self.control.load(model)
            e.last_used = self.clock()
            self._set(e, State.LOADED)
            self.events.loaded(e.pipeline.name, "ok", self.clock() - t0)
            logger.info("on-demand: loaded %s in %.1f s", e.pipeline.name, self.clock() - t0)
        except asyncio.CancelledError:
            self._set(e, State.UNLOADED)
            raise
        except Exception as exc:  # any failure is the pipeline's state
            reason = str(exc) or type(exc).__name__
            logger.warning("on-demand: loading %s failed: %s", e.pipeline.name, reason)
            e.failed_at = self.clock()
            if not isinstance(exc, ModelLoadError):  # Triton unreachable, not the model: no back-off
                e.failed_at -= FAILED_BACKOFF_S
            self._set(e, State.FAILED, reason)
            self.events.loaded(e.pipeline.name, "failed", self.clock() - t0)
            await self._undo(e, started)
        finally:
            e.load = None
            e.requested_at = self.clock()
            self._changed.set()
            self._room.set()

    async def _undo(self, e: _Entry, started: list[str]) -> None:
        """Unload the models a failed load of ``e`` started (none another pipeline holds)."""
        keep = self._needed_by_others(e)
        async with self._lock:
            for model in reversed(started):
                if model in keep:
                    continue
                try:
                    await self.control.unload(model)
                except Exception as exc:  # logged; the next load tries again
                    logger.warning("on-demand: unloading %s after the failed load of %s: %s",
                                   model, e.pipeline.name, exc)

    async def _make_room(self, e: _Entry, deadline: float) -> bool:
        """Evict least recently used idle on-demand pipelines until ``e``'s closure fits the
        budget (lock held); wait for one to go idle when none is. False: no room by ``deadline``."""
        if self.memory_budget_mib is None:
            return True
        while True:
            resident = self._resident_besides(e)
            need = sum(self.graph.pss_mib[m] for m in resident | set(e.pipeline.models))
            if need <= self.memory_budget_mib:
                return True
            now = self.clock()
            idle = [o for o in self._entries.values()
                    if o is not e and not o.pipeline.pinned and o.state == State.LOADED
                    and not self.busy(o.pipeline.name)
                    and set(o.pipeline.models) - self._needed_by_others(o) - set(e.pipeline.models)]
            victims = sorted((o for o in idle if now - o.requested_at >= REQUEST_GRACE_S),
                             key=lambda o: o.last_used)
            if victims:
                await self._refresh_last_use(victims)
                victims.sort(key=lambda o: o.last_used)
                await self._unload(victims[0], "evicted", keep=set(e.pipeline.models))
                continue
            left = deadline - now
            if left <= 0:
                return False
            # Nothing to evict yet: wake when a call or a load ends (_room), or when the request
            # grace of an idle pipeline ends (no event marks that: without this timeout a load
            # right after another pipeline's request slept until its own deadline).
            graces = [o.requested_at + REQUEST_GRACE_S - now for o in idle]
            wait_s = min([left, *(g for g in graces if g > 0)])
            self._room.clear()
            waiter = asyncio.ensure_future(self._room.wait())
            try:
                await asyncio.wait({waiter}, timeout=wait_s)
            finally:
                waiter.cancel()

    async def _refresh_last_use(self, entries: list[_Entry]) -> None:
        """Fold Triton's ``last_inference`` of each entry's models into its ``last_used``."""
        models = sorted({m for e in entries for m in e.pipeline.models})
        try:
            last = await self.control.last_inference(models)
        except Exception as exc:  # statistics are a hint
            logger.debug("on-demand: Triton statistics unavailable: %s", exc)
            return
        now_wall, now = self.wall(), self.clock()
        for e in entries:
            seen = [last[m] for m in self._own[e.pipeline.name] if m in last]
            if seen:
                e.last_used = max(e.last_used, now - max(0.0, now_wall - max(seen)))

    async def _unload(self, e: _Entry, reason: str, keep: set[str] | None = None) -> None:
        """Unload ``e``'s models no other resident pipeline (nor ``keep``) holds (lock held)."""
        self._set(e, State.UNLOADED)  # before any await: a new request starts a fresh load
        self.events.unloaded(e.pipeline.name, reason)  # with the state, not after the stubs end
        held = self._needed_by_others(e) | (keep or set())
        logger.info("on-demand: unloading %s (%s)", e.pipeline.name, reason)
        for model in reversed(e.pipeline.models):
            if model in held:
                continue
            try:
                await self.control.unload(model)
            except Exception as exc:  # logged; Triton keeps it until next time
                logger.warning("on-demand: unloading %s (%s of %s): %s", model, reason, e.pipeline.name, exc)

    def _next_deadline(self) -> float | None:
        if self.keep_alive_s is None:
            return None
        times = [self._idle_since(e) + self.keep_alive_s for e in self._entries.values()
                 if not e.pipeline.pinned and e.state == State.LOADED and not self.busy(e.pipeline.name)]
        return min(times) if times else None

    async def _keep_alive_loop(self) -> None:
        """Sleep until the next idle deadline (or a change), unload what is idle past it."""
        while True:
            self._changed.clear()
            deadline = self._next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - self.clock())
            if timeout is None or timeout > 0:
                waiter = asyncio.ensure_future(self._changed.wait())
                try:
                    await asyncio.wait({waiter}, timeout=timeout)
                finally:
                    waiter.cancel()
                if self._changed.is_set():
                    continue
            try:
                await self.expire_idle()
            except Exception:  # never let the keeper die
                logger.exception("on-demand: keep-alive check failed")
                await asyncio.sleep(1.0)

    async def expire_idle(self) -> list[str]:
        """Unload every on-demand pipeline idle for ``keep_alive_s`` (Triton's ``last_inference``
        included) and not busy; returns their names. The keep-alive task calls it at deadlines."""
        if self.keep_alive_s is None:
            return []
        now = self.clock()
        due = [e for e in self._entries.values() if not e.pipeline.pinned and e.state == State.LOADED
               and not self.busy(e.pipeline.name) and now - self._idle_since(e) >= self.keep_alive_s]
        if not due:
            return []
        await self._refresh_last_use(due)
        done = []
        async with self._lock:
            now = self.clock()
            for e in due:  # re-checked under the lock: a call may have started meanwhile
                if (e.state == State.LOADED and not self.busy(e.pipeline.name)
                        and now - self._idle_since(e) >= self.keep_alive_s):
                    await self._unload(e, "keep_alive")
                    done.append(e.pipeline.name)
        return done

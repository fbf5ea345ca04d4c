"""Helpers every benchmark driver shares (``clients/bench_*.py``): statistics, the closed-loop
load generator, in-process stage instances sized like the served ones, and run metadata.

No benchmark imports another benchmark; they all import this module. Nothing here measures or
asserts a timing by itself.
"""
from __future__ import annotations

import contextlib
import os
import platform
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


# ------------------------------------------------------------------------------ statistics


def percentile(values: Sequence[float], q: float) -> float | None:
    """``q``-th percentile (0..100) by linear interpolation between closest ranks (numpy's
    default method); ``None`` for an empty sequence.

    Raises:
        ValueError: ``q`` outside [0, 100].
    """
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    xs = sorted(float(v) for v in values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def describe(values: Sequence[float]) -> dict:
    """``{mean, p50, p90, min, max}`` of ``values`` (all ``None`` when empty)."""
    if not values:
        return {"mean": None, "p50": None, "p90": None, "min": None, "max": None}
    return {
        "mean": sum(values) / len(values),
        "p50": percentile(values, 50), "p90": percentile(values, 90),
        "min": min(values), "max": max(values),
    }


def describe_ms(values_s: Sequence[float], ndigits: int = 2) -> dict:
    """:func:`describe` of seconds, reported in milliseconds rounded to ``ndigits``."""
    return {k: None if v is None else round(v * 1000.0, ndigits) for k, v in describe(list(values_s)).items()}


def ratio(a: float | None, b: float | None, ndigits: int = 3) -> float | None:
    """``a / b`` rounded, or ``None`` when either is missing or ``b`` is 0."""
    return round(a / b, ndigits) if a is not None and b else None


def serving_ratios(inproc: dict, front: dict) -> dict:
    """Served vs in-process ratios of one benchmark from its per-level summaries
    (``{concurrency: summarize(...)}`` of each path, string keys): ``serving_overhead_latency_p50``
    and ``_mean`` (served / in-process at C=1), ``batching_gain_throughput`` (served requests/s at
    the highest level / at C=1, with ``batching_gain_at_concurrency``) and
    ``throughput_vs_inprocess`` (served / in-process requests/s per level both measured)."""
    out: dict = {}
    levels = sorted(front, key=int)
    if "1" in inproc and "1" in front:
        out["serving_overhead_latency_p50"] = ratio(front["1"]["latency_ms"]["p50"], inproc["1"]["latency_ms"]["p50"])
        out["serving_overhead_latency_mean"] = ratio(front["1"]["latency_ms"]["mean"],
                                                     inproc["1"]["latency_ms"]["mean"])
    if "1" in front and levels:
        out["batching_gain_throughput"] = ratio(front[levels[-1]]["requests_per_s"], front["1"]["requests_per_s"])
        out["batching_gain_at_concurrency"] = int(levels[-1])
    if inproc:
        out["throughput_vs_inprocess"] = {c: ratio(front[c]["requests_per_s"], inproc[c]["requests_per_s"])
                                          for c in levels if c in inproc}
    return out


def format_level_table(results: dict, unit: str, path_width: int = 10) -> str:
    """``{path: {concurrency: summary}}`` as a text table: ok, ``unit`` per second, latency
    p50/p90/p99 (ms), SLO attainment and the denoiser's mean batch when measured."""
    rows = [f"{'path':<{path_width}} {'C':>3} {'ok':>4} {unit + '/s':>8} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} "
            f"{'SLO':>6} {'batch':>6}"]
    for path, levels in results.items():
        for c, s in sorted(levels.items(), key=lambda kv: int(kv[0])):
            lat = s["latency_ms"]
            rows.append(f"{path:<{path_width}} {c:>3} {s['ok']:>4} {s['requests_per_s'] or 0:>8.3f} "
                        f"{lat['p50'] or 0:>9.1f} {lat['p90'] or 0:>9.1f} {lat['p99'] or 0:>9.1f} "
                        f"{s['slo_attainment'] or 0:>6.2f} {s.get('denoiser_mean_batch') or '':>6}")
    return "\n".join(rows)


def parse_concurrency(text: str) -> list[int]:
    """``"1,4,8"`` -> ``[1, 4, 8]`` (positive, de-duplicated, in the given order).

    Raises:
        ValueError: a level below 1, or no level.
    """
    levels: list[int] = []
    for part in text.split(","):
        if part.strip():
            c = int(part)
            if c < 1:
                raise ValueError(f"concurrency must be >= 1, got {c}")
            if c not in levels:
                levels.append(c)
    if not levels:
        raise ValueError("no concurrency level given")
    return levels


# -------------------------------------------------------------------------- load generator


def closed_loop(run_one: Callable[[int], T], concurrency: int, n: int,
                on_error: Callable[[int, Exception], T] | None = None,
                stagger_s: float = 0.0) -> tuple[list[T], float]:
    """Send requests ``0 .. n-1`` from ``concurrency`` worker threads, each sending its next
    request as soon as its previous one ended.

    Args:
        run_one: ``run_one(index) -> result``.
        on_error: turns an exception of ``run_one`` into a result (one bad request must not end
            the run); ``None`` lets it propagate.
        stagger_s: worker ``k`` sends its first request ``k * stagger_s / concurrency`` seconds
            after the start (0: all at once, a burst). With ``stagger_s`` one request's duration,
            the clients are spread over it, as users who did not all click at the same instant.

    Returns:
        (results in index order, wall-clock seconds from the first send to the last end).
    """
    next_index = iter(range(n))
    lock = threading.Lock()
    results: dict[int, T] = {}
    failures: list[BaseException] = []

    def worker(k: int):
        if stagger_s > 0 and k:
            time.sleep(k * stagger_s / concurrency)
        while True:
            with lock:
                i = next(next_index, None)
            if i is None or failures:
                return
            try:
                r = run_one(i)
            except Exception as exc:
                if on_error is None:
                    failures.append(exc)
                    return
                r = on_error(i, exc)
            with lock:
                results[i] = r

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,), name=f"bench-worker-{k}") for k in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    if failures:
        raise failures[0]
    return [results[i] for i in sorted(results)], wall


# ------------------------------------------------------- per-request results of the generation benches
@dataclass
class Result:
    """One request: ``latency_s`` (None if failed), ``error``, denoiser seconds (frontend)."""

    index: int
    latency_s: float | None = None
    error: str | None = None
    denoise_s: float | None = None


def summarize(results: Sequence[Result], wall_s: float, slo_ms: float) -> dict:
    """Aggregate one level (see the module docstring); times in ms rounded to 0.01 ms."""
    ok = [r for r in results if r.error is None and r.latency_s is not None]
    lat = [r.latency_s * 1000 for r in ok]

    def rnd(x):
        return None if x is None else round(float(x), 2)

    latency = {"mean": rnd(sum(lat) / len(lat)) if lat else None,
               **{f"p{q}": rnd(percentile(lat, q)) for q in (50, 90, 99)},
               "min": rnd(min(lat)) if lat else None, "max": rnd(max(lat)) if lat else None}
    den = [r.denoise_s for r in ok if r.denoise_s is not None]
    return {
        "requests": len(results), "ok": len(ok), "errors": len(results) - len(ok),
        "error_messages": sorted({r.error for r in results if r.error})[:5],
        "latency_ms": latency,
        "requests_per_s": round(len(ok) / wall_s, 3) if wall_s > 0 and ok else None,
        "slo_ms": slo_ms,
        "slo_attainment": round(sum(1 for x in lat if x <= slo_ms) / len(results), 4) if results else None,
        "denoise_s_mean": round(sum(den) / len(den), 5) if den else None,
        "wall_s": round(wall_s, 3),
    }


def metric_total(metrics_text: str, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` (the sample's own name: ``x_total``, ``x_count``,
    ``x_bucket``) whose labels include ``labels``, in a Prometheus text exposition; 0.0 if none.

    Parsed by ``prometheus_client.parser`` (the one parser of this project's tests and clients).
    Raises ``ValueError`` on text that is not the Prometheus text format.
    """
    from prometheus_client.parser import text_string_to_metric_families

    # The parser names a counter's samples ``<family>_total`` (OpenMetrics) even where the text
    # wrote them without the suffix, as Triton does (``nv_inference_request_success 8``): such a
    # sample is found under the name the exposition wrote as well.
    def named(family, sample) -> bool:
        return sample.name == name or (family.type == "counter" and not name.endswith("_total")
                                       and sample.name == name + "_total" and family.name == name)

    return sum(sample.value for family in text_string_to_metric_families(metrics_text)
               for sample in family.samples
               if named(family, sample) and all(sample.labels.get(k) == v for k, v in labels.items()))


def metric_sum(metrics_text: str, name: str, model: str) -> float:
    """Sum of the samples of Prometheus metric ``name`` whose ``model`` label is ``model``."""
    return metric_total(metrics_text, name, model=model)



def measure_level(run_level: Callable[[Callable[[int], Result], int, int], tuple[list[Result], float]],
                  run_one: Callable[[int], Result], concurrency: int, requests: int, slo_ms: float,
                  batch_counts: Callable[[], tuple[float, float]] | None = None) -> tuple[int, dict]:
    """One concurrency level of a diffusion benchmark: ``max(requests, concurrency)`` requests
    through ``run_level`` (e.g. :func:`closed_loop`), summarised (:func:`summarize`).

    Args:
        batch_counts: ``() -> (requests succeeded, executions)`` of the served denoiser (Triton's
            ``nv_inference_request_success`` / ``nv_inference_exec_count``); when given, the
            summary gets ``denoiser_mean_batch`` = requests per execution over the level.

    Returns:
        ``(n, summary)``: the request count and the level's summary (with ``concurrency``).
    """
    n = max(requests, concurrency)
    before = batch_counts() if batch_counts is not None else None
    results, wall = run_level(run_one, concurrency, n)
    summary = summarize(results, wall, slo_ms)
    summary["concurrency"] = concurrency
    if before is not None:
        after = batch_counts()
        execs = after[1] - before[1]
        summary["denoiser_mean_batch"] = round((after[0] - before[0]) / execs, 3) if execs else None
    return n, summary


# ------------------------------------------------------------ in-process stage instances


class InstancePool(Generic[T]):
    """In-process copies of one stage, used like Triton's model instances: a request holds one
    copy for as long as it runs on it, and waits when all are busy.

    Baselines must get the parallelism the served stage has (e.g. 2 talker objects where
    ``csm_talker`` has ``instance_group count: 2``), or the served/in-process ratios are not
    comparable.

    Args:
        instances: the stage objects (one per served instance).
    """

    def __init__(self, instances: Sequence[T]):
        if not instances:
            raise ValueError("an InstancePool needs at least one instance")
        self.instances = list(instances)
        self._free: queue.Queue[T] = queue.Queue()
        for obj in self.instances:
            self._free.put(obj)

    def __len__(self) -> int:
        return len(self.instances)

    @contextlib.contextmanager
    def take(self) -> Iterator[T]:
        """Hold a free instance for the ``with`` block (blocks while all are busy)."""
        obj = self._free.get()
        try:
            yield obj
        finally:
            self._free.put(obj)


def instance_count(model: str) -> int:
    """Instances a model of this checkout's repositories runs (sum of its ``instance_group``
    counts in ``config.pbtxt``; 1 when it has none).

    Raises:
        KeyError: no such model.
    """
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from omni_triton.serve.repository import available_models

    config = text_format.Parse((available_models()[model] / "config.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())
    return sum(g.count or 1 for g in config.instance_group) or 1


def stop_all_on_sigterm() -> list:
    """A list for the processes a benchmark starts (anything with ``stop()``); on SIGTERM they are
    stopped, newest first, before the benchmark exits (in-flight requests then fail instead of
    blocking the exit). The caller still stops them in its own ``finally``."""
    import signal

    started: list = []

    def on_sigterm(signum, frame):
        for proc in reversed(started):
            proc.stop()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    return started


# ---------------------------------------------------------------------------- run metadata


def package_versions(packages: Sequence[str]) -> dict[str, str | None]:
    """``{"python": ..., package: installed version or None}``."""
    from importlib import metadata

    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in packages:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def machine_info() -> dict:
    """CPU count, affinity, model name, platform and load average of this machine."""
    cpu_model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"cpu_count": os.cpu_count(), "cpu_affinity": affinity, "cpu_model": cpu_model,
            "platform": platform.platform(), "loadavg_at_start": load}


def git_commit() -> str | None:
    """``HEAD`` of this checkout, or ``None`` outside git."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                              capture_output=True, text=True, timeout=5).stdout.strip() or None
    except Exception:
        return None


# ------------------------------------------------------------ in-process baselines in processes


def _process_worker_main(conn, factory: str, args: tuple) -> None:
    """Body of one :class:`ProcessWorkers` process: one torch thread (as a Triton stub), build the
    callable ``factory(*args)`` (``"module:function"``), say ``("ready", pid)``, then answer each
    ``args`` tuple received with ``("ok", result)`` or ``("error", message)`` until ``None``."""
    import importlib

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    try:
        module, _, name = factory.partition(":")
        fn = getattr(importlib.import_module(module), name)(*args)
    except Exception as exc:  # reported to the parent, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        try:
            conn.send(("ok", fn(*msg)))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"[:500]))


class ProcessWorkers:
    """``count`` processes (``spawn``), each holding its own copy of a stage or pipeline, used
    like Triton's model instances: a call holds one free process for as long as it runs and waits
    while all are busy. The in-process baselines run in these so that they get as many processes
    as the served path, each with one torch thread, instead of threads sharing one GIL.

    Args:
        count: processes (>= 1).
        factory: ``"module:function"``; ``function(*args)`` runs in each process and returns the
            callable that serves a call (its arguments and result must pickle).
        args: arguments of ``factory``.
        ready_timeout_s: seconds to wait for every process to have built its callable.

    Times measured inside a worker with ``time.perf_counter`` compare with the parent's: on Linux
    it reads ``CLOCK_MONOTONIC``, one clock for every process of the machine.

    Raises:
        RuntimeError: a process failed to build its callable (its message), or a call failed.
        TimeoutError: not every process was ready in ``ready_timeout_s``.
    """

    def __init__(self, count: int, factory: str, args: tuple = (), ready_timeout_s: float = 600.0):
        import multiprocessing as mp

        if count < 1:
            raise ValueError(f"ProcessWorkers needs at least one process, got {count}")
        ctx = mp.get_context("spawn")
        self._procs = []
        conns = []
        try:
            for k in range(count):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_process_worker_main, args=(child, factory, tuple(args)),
                                   name=f"bench-baseline-{k}", daemon=True)
                proc.start()
                child.close()
                self._procs.append(proc)
                conns.append(parent)
            self.pids = []
            for conn in conns:
                if not conn.poll(ready_timeout_s):
                    raise TimeoutError(f"a baseline process was not ready in {ready_timeout_s} s")
                kind, value = conn.recv()
                if kind != "ready":
                    raise RuntimeError(f"baseline process failed to start: {value}")
                self.pids.append(value)
        except BaseException:
            self._procs_and_conns_close(conns)
            raise
        self._pool = InstancePool(conns)

    def __len__(self) -> int:
        return len(self._procs)

    def call(self, *args):
        """Run the workers' callable with ``args`` in a free process and return its result."""
        with self._pool.take() as conn:
            conn.send(args)
            kind, value = conn.recv()
        if kind != "ok":
            raise RuntimeError(value)
        return value

    def _procs_and_conns_close(self, conns) -> None:
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.send(None)
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        """Stop every process (each ends after its current call)."""
        if self._procs:
            self._procs_and_conns_close(self._pool.instances)
            self._procs = []

    def __enter__(self) -> ProcessWorkers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------------------------ targets


def target(name: str, measured: float | None, limit: float, op: str = "<=", applies: bool = True,
           note: str = "") -> dict:
    """One target of a benchmark (issue 29 "Targets"): ``{"target", "measured", "limit", "op",
    "met", "note"}``. ``met`` is ``None`` when nothing was measured or the target does not apply
    (``applies`` false: e.g. continuity where the pipeline's capacity is below its listeners;
    ``note`` says why), else whether ``measured op limit`` holds.

    Raises:
        ValueError: ``op`` is not ``"<="`` or ``">="``.
    """
    if op not in ("<=", ">="):
        raise ValueError(f"op must be '<=' or '>=', got {op!r}")
    met = None
    if applies and measured is not None:
        met = measured <= limit if op == "<=" else measured >= limit
    return {"target": name, "measured": measured, "limit": limit, "op": op, "met": met, "note": note}


def format_targets(targets: Sequence[dict]) -> str:
    """Readable lines of :func:`target` dicts: ``met`` / ``MISSED`` / ``n/a``."""
    lines = ["Targets (issue 29; measured op limit)"]
    for t in targets:
        state = "n/a" if t["met"] is None else ("met" if t["met"] else "MISSED")
        measured = "-" if t["measured"] is None else f"{t['measured']:.3g}"
        lines.append(f"  {state:<6} {t['target']:<52} {measured:>7} {t['op']} {t['limit']:g}"
                     + (f"  ({t['note']})" if t.get("note") else ""))
    return "\n".join(lines)

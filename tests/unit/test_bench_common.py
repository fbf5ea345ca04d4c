"""clients.bench_common: statistics, the closed-loop generator, instance pools (no timing asserted)."""
from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from clients import bench_common as bc


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
@pytest.mark.parametrize("values", [[5.0], [3.0, 1.0], [1, 2, 3, 4, 10], list(range(17))])
def test_percentile_matches_numpy_linear(values, q):
    assert math.isclose(bc.percentile(values, q), float(np.percentile(values, q)), rel_tol=1e-12)


def test_percentile_edge_cases():
    assert bc.percentile([], 50) is None
    with pytest.raises(ValueError):
        bc.percentile([1.0], 101)
    d = bc.describe([])
    assert set(d) == {"mean", "p50", "p90", "min", "max"} and all(v is None for v in d.values())
    assert bc.describe_ms([0.1, 0.3])["mean"] == 200.0
    assert bc.ratio(3, 2) == 1.5 and bc.ratio(None, 2) is None and bc.ratio(1, 0) is None


def test_parse_concurrency():
    assert bc.parse_concurrency("1,4,8") == [1, 4, 8]
    assert bc.parse_concurrency("4, 4,1") == [4, 1]
    for bad in ("", "0", "a"):
        with pytest.raises(ValueError):
            bc.parse_concurrency(bad)


def test_closed_loop_sends_every_request_once_in_index_order():
    seen = []
    res, wall = bc.closed_loop(lambda i: seen.append(i) or i * 10, concurrency=3, n=7)
    assert res == [i * 10 for i in range(7)] and sorted(seen) == list(range(7)) and wall >= 0


def test_closed_loop_staggers_the_first_sends_over_stagger_s():
    """Worker k's first request starts k/C of stagger_s after the start (a burst without it).
    Red when the workers all start at once (the start offsets would be ~0)."""
    import time

    t0, starts = time.perf_counter(), {}
    def run_one(i):  # long enough that each worker sends exactly one
        starts[i] = time.perf_counter() - t0
        time.sleep(0.5)

    bc.closed_loop(run_one, concurrency=4, n=4, stagger_s=0.4)
    offsets = sorted(starts.values())
    assert offsets[-1] >= 0.3 - 0.01 and offsets[0] < 0.1  # 0, 0.1, 0.2, 0.3 s (lower bounds only)


def test_closed_loop_errors_recorded_or_raised():
    def run_one(i):
        if i == 2:
            raise RuntimeError("bad")
        return i

    res, _ = bc.closed_loop(run_one, 2, 4, on_error=lambda i, exc: f"{i}: {exc}")
    assert res == [0, 1, "2: bad", 3]
    with pytest.raises(RuntimeError, match="bad"):
        bc.closed_loop(run_one, 2, 4)


def test_instance_pool_runs_as_many_at_once_as_it_has_instances():
    """The in-process baselines' parallelism: two instances serve two requests at a time, a
    third waits for one of them (as a third request waits for a busy Triton instance)."""
    pool = bc.InstancePool(["a", "b"])
    running, peak, lock = [0], [0], threading.Lock()
    held: list[str] = []

    def run_one(i):
        with pool.take() as obj:
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
                held.append(obj)
            time.sleep(0.05)  # hold the instance while others try to take one (not a timing assert)
            with lock:
                running[0] -= 1
        return obj

    res, _ = bc.closed_loop(run_one, concurrency=6, n=12)
    assert peak[0] == 2 and set(res) == {"a", "b"} and len(pool) == 2
    with pytest.raises(ValueError):
        bc.InstancePool([])


def test_instance_count_reads_instance_groups():
    assert bc.instance_count("csm_talker") == 2
    assert bc.instance_count("qwen3_omni_talker") == 2
    assert bc.instance_count("piper") == 1
    with pytest.raises(KeyError):
        bc.instance_count("no-such-model")


def test_no_benchmark_imports_another():
    import ast
    from pathlib import Path

    clients = Path(bc.__file__).parent
    for path in clients.glob("bench_*.py"):
        if path.name == "bench_common.py":
            continue
        tree = ast.parse(path.read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        others = {m for m in imported if m.startswith("clients.bench_") and m != "clients.bench_common"}
        assert not others, f"{path.name} imports {others}"


def test_benchmarks_use_no_undefined_names():
    """A crude undefined-name check of every benchmark module (a helper moved to another module but
    still called by its old one fails only at run time, after minutes of measuring)."""
    import ast
    import builtins
    from pathlib import Path

    clients = Path(bc.__file__).parent
    for path in [*clients.glob("bench_*.py"), clients / "audio_bench_results.py"]:
        tree = ast.parse(path.read_text())
        defined = set(dir(builtins)) | {"__file__", "__name__"}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                defined |= {a.asname or a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                defined.add(node.name)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        assert not used - defined, f"{path.name}: undefined {sorted(used - defined)}"


def test_metric_total_parses_the_prometheus_text_format():
    """The one metrics-text reader of the clients and tests (prometheus_client's parser): label
    order, escaped quotes and braces in label values, HELP/TYPE lines and histogram samples."""
    from clients.bench_common import metric_total

    text = "\n".join([
        "# HELP omni_x_total requests",
        "# TYPE omni_x_total counter",
        'omni_x_total{reason="stop",model="piper_tts"} 2',
        'omni_x_total{model="piper_tts",reason="error: \\"bad} input\\""} 5',
        'omni_x_total{model="llm",reason="stop"} 7',
        "# TYPE omni_y_seconds histogram",
        'omni_y_seconds_bucket{model="llm",le="+Inf"} 3',
        'omni_y_seconds_count{model="llm"} 3',
        'omni_y_seconds_sum{model="llm"} 0.5',
        "",
    ])
    assert metric_total(text, "omni_x_total", model="piper_tts") == 7
    assert metric_total(text, "omni_x_total", model="piper_tts", reason='error: "bad} input"') == 5
    assert metric_total(text, "omni_x_total") == 14
    assert metric_total(text, "omni_y_seconds_count", model="llm") == 3
    assert metric_total(text, "omni_y_seconds", model="llm") == 0  # a family name is no sample
    assert metric_total(text, "omni_absent_total") == 0


def test_metric_total_finds_triton_counters_written_without_total():
    """Triton writes its counters without ``_total`` (``nv_inference_request_success 8``), which
    prometheus_client's parser renames ``..._total``: both names find them (a lookup by the
    written name returned 0 and test_images' batching check failed on it)."""
    from clients.bench_common import metric_total

    text = ('# HELP nv_inference_request_success Number of successful inference requests\n'
            '# TYPE nv_inference_request_success counter\n'
            'nv_inference_request_success{model="qwen_image_denoiser",version="1"} 8\n'
            'nv_inference_request_success{model="llm",version="1"} 2\n'
            '# TYPE nv_inference_exec_count counter\n'
            'nv_inference_exec_count{model="qwen_image_denoiser",version="1"} 3\n')
    assert metric_total(text, "nv_inference_request_success", model="qwen_image_denoiser") == 8
    assert metric_total(text, "nv_inference_request_success_total") == 10
    assert metric_total(text, "nv_inference_exec_count", model="qwen_image_denoiser") == 3
    assert metric_total(text, "nv_inference_request") == 0


def test_process_workers_run_calls_in_their_own_processes():
    """Each worker is a process of its own (spawn), not a thread of this one; calls rotate through
    the free ones; a failing call and a failing factory are raised here with their message."""
    import os

    with bc.ProcessWorkers(2, "functools:partial", (os.getpid,)) as workers:  # call() -> the worker's pid
        assert len(workers) == 2 and len(set(workers.pids)) == 2 and os.getpid() not in workers.pids
        assert {workers.call(), workers.call()} == set(workers.pids)
    with bc.ProcessWorkers(1, "functools:partial", (int,)) as workers:
        assert workers.call("7") == 7
        with pytest.raises(RuntimeError, match="ValueError"):
            workers.call("x")
    with pytest.raises(RuntimeError, match="ModuleNotFoundError"):
        bc.ProcessWorkers(1, "no_such_module_here:f")
    with pytest.raises(ValueError):
        bc.ProcessWorkers(0, "functools:partial", (int,))


def test_target_met_missed_and_not_applicable():
    assert bc.target("x", 1.1, 1.2)["met"] is True and bc.target("x", 1.2, 1.2)["met"] is True  # <= inclusive
    assert bc.target("x", 1.3, 1.2)["met"] is False
    assert bc.target("c", 0.96, 0.95, ">=")["met"] is True and bc.target("c", 0.9, 0.95, ">=")["met"] is False
    assert bc.target("x", None, 1.2)["met"] is None  # nothing measured
    na = bc.target("c", 0.1, 0.95, ">=", applies=False, note="capacity below listeners")
    assert na["met"] is None and na["measured"] == 0.1
    with pytest.raises(ValueError):
        bc.target("x", 1.0, 1.0, "<")
    text = bc.format_targets([bc.target("a", 1.1, 1.2), bc.target("b", 1.3, 1.2), na])
    assert "met    a" in text and "MISSED b" in text and "n/a    c" in text and "capacity below" in text

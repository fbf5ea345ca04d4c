"""clients/proc_pool.py: worker processes for the benchmarks' in-process baselines."""
import os
import threading
import time

import pytest

from clients import proc_pool


def echo_worker(tag):
    """A worker: answers (pid, tag, payload, its perf_counter), sleeping ``payload["sleep"]``."""
    def handle(payload):
        if payload.get("fail"):
            raise ValueError("bad payload")
        time.sleep(payload.get("sleep", 0.0))
        return os.getpid(), tag, payload["x"], time.perf_counter()
    return handle


def threads_worker():
    def handle(_):
        import torch

        return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    return handle


def broken_worker():
    raise OSError("no weights")


def test_pick_worker_takes_the_least_loaded_then_the_lowest_index():
    assert proc_pool.pick_worker([2, 0, 0]) == 1 and proc_pool.pick_worker([1, 1]) == 0
    with pytest.raises(ValueError):
        proc_pool.pick_worker([])


@pytest.mark.parametrize("concurrent", [False, True])
def test_requests_run_in_separate_processes_and_errors_come_back(concurrent):
    """Two requests that each sleep run in two different worker processes (not this one) and
    overlap; a worker's exception is raised in the caller; the clock is shared."""
    assert proc_pool.shared_clock()
    with proc_pool.ProcessPool(2, echo_worker, ("t",), concurrent=concurrent, ready_timeout_s=120) as pool:
        assert len(pool) == 2 and os.getpid() not in pool.pids
        out = {}

        def go(k):
            out[k] = pool.call({"x": k, "sleep": 0.5}, timeout_s=60)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=go, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert {out[k][0] for k in out} == set(pool.pids)  # one each: they ran side by side
        assert [out[k][1:3] for k in range(2)] == [("t", 0), ("t", 1)]
        assert all(t0 < out[k][3] < time.perf_counter() for k in out)  # worker times on the client's clock
        with pytest.raises(RuntimeError, match="ValueError: bad payload"):
            pool.call({"x": 9, "fail": True}, timeout_s=60)
        assert pool.call({"x": 5}, timeout_s=60)[2] == 5  # the worker survived it


def test_a_worker_that_cannot_start_is_reported():
    with pytest.raises(RuntimeError, match="OSError: no weights"):
        proc_pool.ProcessPool(1, broken_worker, ready_timeout_s=120)


def test_each_worker_computes_with_one_torch_thread():
    """As each Triton stub: one torch thread per process (and OMP_NUM_THREADS=1 for its pools)."""
    with proc_pool.ProcessPool(1, threads_worker, ready_timeout_s=120) as pool:
        assert pool.call(None, timeout_s=60) == (1, "1")

"""Scale-out benchmark (issue 25): 1 vs 2 Triton replicas behind one frontend, balance, failover.

Run (it starts tritonservers: hold the machine's server lock)::

    flock /tmp/omni-server.lock .venv/bin/python -m clients.bench_scaleout --out bench_scaleout.json
    .venv/bin/python -m clients.bench_scaleout --concurrency 8 --requests 64 --rounds 3
    .venv/bin/python -m clients.bench_scaleout --triton-urls h1:8001,h2:8001 \\
        --triton-metrics-urls http://h1:8002,http://h2:8002 --no-failover   # replicas already running

What it does, in one run, on one stack:

1. Starts two tritonservers (``omni-triton serve --no-frontend``'s server class,
   ``omni_triton.serve.server.TritonServer``; ``--models``, default ``piper``) on free ports, with
   one admin key, and two OpenAI frontends (``python -m openai_frontend``): ``F1`` with
   ``--triton-url`` = replica 0 only, ``F2`` with ``--triton-url`` = both replicas (the balancer,
   docs/scaling.md). Given ``--triton-urls`` it starts only the frontends (the admin key then comes
   from ``OMNI_TRITON_ADMIN_KEY``).
2. Throughput: ``--rounds`` times, alternately, ``--requests`` Piper speech requests
   (``POST /v1/audio/speech``, ``pcm``, the fixed ``--text``; whole clips: a streamed request is
   paced at playback speed, ``--stream``, and measures that instead of capacity) from a closed loop
   of ``--concurrency`` client threads through F1 (the 1-replica baseline: the same client
   parallelism, one replica) and through F2 (2 replicas). ``requests_per_s`` = successful requests
   / wall seconds of the level.
3. Balance: Triton's own ``nv_inference_request_success`` per replica and model, read from each
   replica's metrics endpoint before and after every level (deltas): how many requests each
   replica executed in the 2-replica levels (and that replica 1 got none in the 1-replica ones).
4. Failover (own replicas only): a closed loop through F2 for ``--failover-s`` seconds; at
   ``--kill-after-s`` replica 1's tritonserver gets SIGKILL (a crash: no drain, its stubs orphaned).
   Per request: start, end, HTTP status or exception; a client whose request failed waits
   ``--error-backoff-s`` before its next (a tight retry loop of fast 503s would eat the CPU the
   survivor needs). Reported: the requests in flight at the kill
   and how many of them failed; the requests sent after the kill that failed (statuses), the time
   from the kill to the end of the last such failure (``recovery_s``: after it every request
   succeeded) and to the first success; requests lost = every failed request.

Job takeover time (a frontend killed mid video job) is measured by ``tests/e2e/test_scaleout.py``
(it needs PostgreSQL and a video model), not here.

Timing caveat: on the 2-core dev machine two replicas share the same cores, and other work may
run at the same time; the figures are indicative (``config.notes`` in the JSON; machine in
``config.machine``).

Output: JSON (stdout, or ``--out``): ``config``, ``stack``, ``throughput`` (per round and mean,
``speedup_2_vs_1``, ``triton_cpu_s_per_request``: CPU seconds of both tritonserver process trees per
successful request, ``machine_busy_pct_mean``: share of all cores busy during the levels, any
process), ``balance``, ``failover``.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from clients.bench_common import (
    closed_loop,
    describe_ms,
    git_commit,
    machine_info,
    package_versions,
    ratio,
    stop_all_on_sigterm,
)

#: One short sentence (~2 s of Piper audio): many requests per level on a CPU machine.
TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank."
SUCCESS = "nv_inference_request_success"


@dataclass
class Request:
    """One speech request: start/end in seconds since its phase began, HTTP status (None: no
    response), error text (None: succeeded), PCM bytes received."""

    index: int
    start_s: float
    end_s: float | None = None
    status: int | None = None
    error: str | None = None
    pcm_bytes: int = 0
    sample_rate: int = 0  # Hz, from the X-Sample-Rate header


def successes(metrics_text: str) -> dict[str, float]:
    """``{model: nv_inference_request_success}`` of one Triton metrics page (Prometheus text)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name == SUCCESS:
            for sample in family.samples:
                if sample.name in (SUCCESS, SUCCESS + "_total"):
                    model = sample.labels.get("model", "")
                    out[model] = out.get(model, 0.0) + sample.value
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    """Per-model increase between two :func:`successes` readings (models that moved only)."""
    return {m: int(v - before.get(m, 0.0)) for m, v in sorted(after.items()) if v - before.get(m, 0.0) > 0}


class Replicas:
    """Per-replica success counters read from each replica's metrics URL (a dead replica reads
    as ``None``)."""

    def __init__(self, metrics_urls: list[str]):
        self.urls = metrics_urls
        self.http = httpx.Client(timeout=5.0)

    def read(self) -> list[dict[str, float] | None]:
        out: list[dict[str, float] | None] = []
        for url in self.urls:
            try:
                r = self.http.get(url.rstrip("/") + "/metrics")
                r.raise_for_status()
                out.append(successes(r.text))
            except httpx.HTTPError:
                out.append(None)
        return out


def speech(http: httpx.Client, base_url: str, model: str, voice: str, text: str, t0: float,
           stream: bool = False):
    """``run_one(i) -> Request``: one PCM speech request through the frontend at ``base_url``
    (``stream``: ``stream: true``, which the frontend sends to Piper as ``PACED``: synthesised at
    most ``max_lead_ms`` ahead of real-time playback, so its duration is bounded by the audio's,
    not by compute; default a whole clip, as fast as the replica computes it); failures (non-200,
    a broken stream, no audio) are recorded, never raised."""

    def run_one(index: int) -> Request:
        r = Request(index=index, start_s=time.perf_counter() - t0)
        body = {"model": model, "input": text, "voice": voice, "response_format": "pcm", "stream": stream}
        try:
            with http.stream("POST", f"{base_url}/v1/audio/speech", json=body) as resp:
                r.status = resp.status_code
                if resp.status_code != 200:
                    resp.read()
                    r.error = f"HTTP {resp.status_code}: {resp.text[:160]}"
                else:
                    r.sample_rate = int(resp.headers.get("x-sample-rate", 0))
                    for data in resp.iter_raw():
                        r.pcm_bytes += len(data)
                    if not r.pcm_bytes:
                        r.error = "no audio"
        except httpx.HTTPError as exc:
            r.error = f"{type(exc).__name__}: {exc}"[:200]
        r.end_s = time.perf_counter() - t0
        return r

    return run_one


def summarize(results: list[Request], wall_s: float) -> dict:
    """One level: counts, ``requests_per_s`` (successes / wall seconds), latency in ms."""
    ok = [r for r in results if r.error is None]
    return {"requests": len(results), "ok": len(ok), "errors": len(results) - len(ok),
            "error_messages": sorted({r.error for r in results if r.error})[:5],
            "wall_s": round(wall_s, 3),
            "requests_per_s": round(len(ok) / wall_s, 3) if wall_s > 0 else None,
            "latency_ms": describe_ms([r.end_s - r.start_s for r in ok if r.end_s is not None]),
            # 16-bit mono PCM: samples = bytes / 2
            "audio_s_mean": round(sum(r.pcm_bytes / 2 / r.sample_rate for r in ok if r.sample_rate) / len(ok), 3)
            if ok else None}


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and its live descendants (Triton's stubs);
    0.0 when it is gone. Children that already exited are not counted."""
    import psutil

    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def machine_busy() -> tuple[float, float]:
    """``(busy, total)`` CPU seconds of the whole machine so far, all cores (``psutil.cpu_times``;
    busy = total - idle - iowait)."""
    import psutil

    t = psutil.cpu_times()
    total = sum(t)
    return total - t.idle - getattr(t, "iowait", 0.0), total


def run_level(http: httpx.Client, url: str, args, replicas: Replicas, label: str, log,
              pids: dict[str, int] | None = None) -> dict:
    """``args.requests`` requests at ``args.concurrency`` through ``url``; per-replica deltas.
    With ``pids`` (name -> pid of a process started by this run): ``cpu_s`` of each process tree
    over the level, and ``machine_busy_pct``, the share of all cores busy (100 = every core, any
    process: other work on the machine included)."""
    pids = pids or {}
    before = replicas.read()
    cpu0 = {name: tree_cpu_s(pid) for name, pid in pids.items()}
    busy0, total0 = machine_busy()
    t0 = time.perf_counter()
    results, wall = closed_loop(speech(http, url, args.model, args.voice, args.text, t0, args.stream),
                                args.concurrency, max(args.requests, args.concurrency))
    busy1, total1 = machine_busy()
    cpu1 = {name: tree_cpu_s(pid) for name, pid in pids.items()}
    after = replicas.read()
    level = summarize(results, wall)
    level["per_replica"] = [delta(a, b) if a is not None and b is not None else None
                            for a, b in zip(after, before, strict=True)]
    level["cpu_s"] = {name: round(cpu1[name] - cpu0[name], 2) for name in pids}
    level["machine_busy_pct"] = round(100.0 * (busy1 - busy0) / (total1 - total0), 1) if total1 > total0 else None
    log(f"{label}: {level['ok']}/{level['requests']} ok, {level['requests_per_s']} req/s, "
        f"per replica {level['per_replica']}, cpu {level['cpu_s']}, machine busy {level['machine_busy_pct']} %")
    return level


def failover(http: httpx.Client, url: str, args, replicas: Replicas, kill, log) -> dict:
    """Closed loop through ``url`` for ``args.failover_s``; ``kill()`` at ``args.kill_after_s``."""
    t0 = time.perf_counter()
    run_one = speech(http, url, args.model, args.voice, args.text, t0, args.stream)
    results: list[Request] = []
    lock = threading.Lock()
    counter = iter(range(1 << 30))
    deadline = t0 + args.failover_s

    def worker() -> None:
        while time.perf_counter() < deadline:
            with lock:
                i = next(counter)
            r = run_one(i)
            with lock:
                results.append(r)
            if r.error:  # a client that retries at once would spin on fast 503s and eat the CPU
                time.sleep(args.error_backoff_s)

    before = replicas.read()
    threads = [threading.Thread(target=worker, name=f"failover-{k}") for k in range(args.concurrency)]
    for th in threads:
        th.start()
    time.sleep(max(0.0, t0 + args.kill_after_s - time.perf_counter()))
    kill_s = time.perf_counter() - t0
    kill()
    log(f"failover: replica 1 killed (SIGKILL) at {kill_s:.2f} s")
    for th in threads:
        th.join()
    after = replicas.read()
    report = analyse_failover(results, kill_s, args.failover_s)
    report["per_replica"] = [delta(a, b) if a is not None and b is not None else None
                             for a, b in zip(after, before, strict=True)]
    return report


def analyse_failover(results: list[Request], kill_s: float, duration_s: float) -> dict:
    """The failover figures of one phase: ``results`` (times in seconds since the phase began),
    the replica killed at ``kill_s``, the phase ``duration_s`` long.

    ``in_flight_at_kill``: started before the kill, ended after it. ``sent_after_kill_failed``:
    started at or after the kill and failed (``sent_after_kill_statuses``: HTTP status, ``200,
    stream broken`` or ``no response``). ``recovery_s``: from the kill to the end of the last
    failure of a request sent after it (0.0: none failed): after it every request succeeded.
    ``requests_lost``: every failed request of the phase."""
    results = sorted(results, key=lambda r: r.start_s)
    in_flight = [r for r in results if r.start_s < kill_s and r.end_s is not None and r.end_s > kill_s]
    new = [r for r in results if r.start_s >= kill_s]
    failed_new = [r for r in new if r.error]
    ok_new = [r for r in new if not r.error]
    statuses: dict[str, int] = {}
    for r in new:
        if r.status is None:
            key = "no response"
        elif r.status == 200 and r.error:
            key = "200, stream broken"
        else:
            key = str(r.status)
        statuses[key] = statuses.get(key, 0) + 1
    last_failure = max((r.end_s for r in failed_new if r.end_s is not None), default=None)
    first_ok = min((r.end_s for r in ok_new if r.end_s is not None), default=None)
    return {
        "duration_s": duration_s, "kill_at_s": round(kill_s, 3), "requests": len(results),
        "ok": sum(1 for r in results if not r.error),
        "in_flight_at_kill": len(in_flight), "in_flight_failed": sum(1 for r in in_flight if r.error),
        "sent_after_kill": len(new), "sent_after_kill_failed": len(failed_new),
        "sent_after_kill_statuses": statuses,
        "sent_after_kill_failed_5s_or_later": sum(1 for r in failed_new if r.start_s >= kill_s + 5.0),
        "requests_lost": sum(1 for r in results if r.error),
        "recovery_s": round(last_failure - kill_s, 3) if last_failure is not None else 0.0,
        "first_success_after_kill_s": round(first_ok - kill_s, 3) if first_ok is not None else None,
        "error_messages": sorted({r.error for r in results if r.error})[:6],
        "requests_per_s_after_kill": round(len(ok_new) / (duration_s - kill_s), 3)
        if duration_s > kill_s else None,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m clients.bench_scaleout", description=__doc__.split("\n")[0])
    p.add_argument("--models", default="piper", help="models each replica serves (omni-triton serve --models)")
    p.add_argument("--model", default="piper_tts", help="the speech model requested (OpenAI name)")
    p.add_argument("--voice", default="joe")
    p.add_argument("--text", default=TEXT)
    p.add_argument("--stream", action="store_true",
                   help="stream: true (paced at playback speed: measures pacing, not capacity); default whole clips")
    p.add_argument("--concurrency", type=int, default=4, help="client threads (closed loop)")
    p.add_argument("--requests", type=int, default=40, help="requests per throughput level")
    p.add_argument("--rounds", type=int, default=2, help="1-replica/2-replica level pairs, alternated")
    p.add_argument("--warmup", type=int, default=4, help="untimed requests through each frontend")
    p.add_argument("--failover-s", type=float, default=20.0, help="length of the failover phase")
    p.add_argument("--kill-after-s", type=float, default=5.0, help="SIGKILL replica 1 this far into it")
    p.add_argument("--error-backoff-s", type=float, default=0.1,
                   help="failover phase: a client waits this long after a failed request before its next")
    p.add_argument("--no-failover", action="store_true")
    p.add_argument("--triton-urls", default="", help="host:port,host:port of running replicas (reuse)")
    p.add_argument("--triton-metrics-urls", default="", help="their metrics base URLs, same order")
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    def log(msg: str) -> None:
        print(f"[bench_scaleout] {msg}", file=sys.stderr, flush=True)

    from omni_triton.paths import cache_dir
    from omni_triton.serve.process import free_port
    from omni_triton.serve.server import Frontend, TritonServer
    from omni_triton.triton_admin import new_key

    started = stop_all_on_sigterm()
    logs = cache_dir() / "logs"
    tag = f"bench-scaleout-{os.getpid()}"
    external = bool(args.triton_urls)
    out: dict = {"config": {
        "models": args.models, "model": args.model, "voice": args.voice, "text": args.text,
        "stream": args.stream, "concurrency": args.concurrency,
        "requests_per_level": max(args.requests, args.concurrency),
        "rounds": args.rounds, "failover_s": None if args.no_failover or external else args.failover_s,
        "kill_after_s": args.kill_after_s, "error_backoff_s": args.error_backoff_s,
        "external_replicas": external,
        "machine": machine_info(), "git_commit": git_commit(),
        "versions": package_versions(["tritonclient", "grpcio", "httpx"]),
        "notes": ["both replicas and both frontends share this machine's cores: 2 replicas cannot "
                  "double the throughput of a CPU-bound model on the same cores",
                  "other work may run on the machine meanwhile: timings are indicative"]}}
    servers: list[TritonServer] = []
    try:
        if external:
            grpc_urls = [u.strip() for u in args.triton_urls.split(",") if u.strip()]
            metrics_urls = [u.strip() for u in args.triton_metrics_urls.split(",") if u.strip()]
            if len(grpc_urls) != 2 or len(metrics_urls) != 2:
                raise SystemExit("--triton-urls and --triton-metrics-urls: two entries each, same order")
            admin_key = None  # the frontends inherit OMNI_TRITON_ADMIN_KEY
        else:
            admin_key = new_key()  # one key for both replicas: one frontend talks to both
            t = time.perf_counter()
            for k in range(2):
                server = TritonServer([m for m in args.models.split(",") if m], http_port=free_port(),
                                      grpc_port=free_port(), metrics_port=free_port(), admin_key=admin_key,
                                      log_path=logs / f"{tag}-triton{k}.log")
                started.append(server)
                servers.append(server)
                server.start()
            for server in servers:  # loading in parallel: both start at once
                server.wait_ready(timeout=args.ready_timeout)
            out["stack"] = {"triton_ready_s": round(time.perf_counter() - t, 2),
                            "triton_logs": [str(s.log_path) for s in servers]}
            grpc_urls = [s.grpc_url for s in servers]
            metrics_urls = [f"http://127.0.0.1:{s.metrics_port}" for s in servers]
        frontends = {}
        for name, url in (("replicas_1", grpc_urls[0]), ("replicas_2", ",".join(grpc_urls))):
            fe = Frontend(url, port=free_port(), models=[m for m in args.models.split(",") if m],
                          log_path=logs / f"{tag}-{name}-frontend.log", admin_key=admin_key)
            started.append(fe)
            fe.start()
            fe.wait_ready(timeout=120)
            frontends[name] = fe
        out.setdefault("stack", {}).update(
            triton_grpc_urls=grpc_urls, triton_metrics_urls=metrics_urls,
            frontends={k: {"url": fe.url, "triton_url": fe.triton_grpc_url, "log": str(fe.log_path)}
                       for k, fe in frontends.items()})
        log(f"stack ready: replicas {grpc_urls}; frontends {[fe.url for fe in frontends.values()]}")
        replicas = Replicas(metrics_urls)
        limit = args.concurrency + 4
        with httpx.Client(timeout=httpx.Timeout(args.timeout, connect=10.0),
                          limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit)) as http:
            for fe in frontends.values():
                warm = speech(http, fe.url, args.model, args.voice, args.text, time.perf_counter(), args.stream)
                closed_loop(warm, min(2, args.warmup) or 1, args.warmup)
            levels: dict[str, list[dict]] = {"replicas_1": [], "replicas_2": []}
            pids = {f"triton{k}": s.proc.pid for k, s in enumerate(servers) if s.proc is not None}
            pids.update({f"frontend_{name}": fe.proc.pid for name, fe in frontends.items() if fe.proc is not None})
            for rnd in range(args.rounds):
                for name, fe in frontends.items():
                    levels[name].append(run_level(http, fe.url, args, replicas, f"round {rnd + 1} {name}", log,
                                                  pids))
            rps = {}
            for name, runs in levels.items():
                values = [r["requests_per_s"] for r in runs if r["requests_per_s"] is not None]
                rps[name] = round(sum(values) / len(values), 3) if values else None
            two = [r["per_replica"] for r in levels["replicas_2"]]
            served = [sum(sum((lv[k] or {}).values()) for lv in two) for k in range(2)]
            # the requested model's own count (the entry point; ensembles count their steps too)
            top = [sum((lv[k] or {}).get(_entry(lv, k), 0) for lv in two) for k in range(2)]
            cpu_per_request = {}  # Triton CPU seconds (both replicas) per successful request
            for name, runs in levels.items():
                cpu = sum(v for r in runs for k, v in r["cpu_s"].items() if k.startswith("triton"))
                ok = sum(r["ok"] for r in runs)
                cpu_per_request[name] = round(cpu / ok, 4) if ok and cpu else None
            out["throughput"] = {"levels": levels, "requests_per_s_mean": rps,
                                 "speedup_2_vs_1": ratio(rps["replicas_2"], rps["replicas_1"]),
                                 "triton_cpu_s_per_request": cpu_per_request,
                                 "machine_busy_pct_mean": {
                                     name: round(sum(r["machine_busy_pct"] or 0 for r in runs) / len(runs), 1)
                                     for name, runs in levels.items() if runs}}
            out["balance"] = {
                "per_replica_requests": top,
                "per_replica_share": [ratio(x, sum(top)) for x in top],
                "per_replica_executions_all_models": served,
                "replica_1_in_1_replica_levels": sum(sum((lv["per_replica"][1] or {}).values())
                                                     for lv in levels["replicas_1"]),
                "source": "Triton's nv_inference_request_success per replica, deltas over the 2-replica levels"}
            if args.no_failover or external:
                out["failover"] = {"skipped": "--no-failover" if args.no_failover else
                                   "replicas not started by this run (cannot kill them)"}
            else:
                victim = servers[1]

                def kill() -> None:
                    assert victim.proc is not None
                    os.kill(victim.proc.pid, signal.SIGKILL)

                out["failover"] = failover(http, frontends["replicas_2"].url, args, replicas, kill, log)
        out["takeover"] = {"measured_by": "tests/e2e/test_scaleout.py (kill -9 a frontend mid video job)"}
    finally:
        for proc in reversed(started):
            proc.stop()
    text = json.dumps(out, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
        log(f"wrote {args.out}")
    else:
        print(text)
    return out


def _entry(per_replica: list[dict | None], k: int) -> str:
    """The model with the most successes on replica ``k`` of one level (the requested pipeline's
    entry model: every request passes it once)."""
    counts = per_replica[k] or {}
    return max(counts, key=lambda m: counts[m]) if counts else ""


if __name__ == "__main__":
    main()

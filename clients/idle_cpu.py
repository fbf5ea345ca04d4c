"""Idle CPU of a running ``omni-triton serve`` stack, per process and per thread.

Reads ``utime + stime`` of ``/proc/<pid>/stat`` (and ``/proc/<pid>/task/<tid>/stat``) of the
serve process and every descendant (tritonserver, each Python stub, the frontend, vLLM's engine
process, ...) at the start and end of a window with no request in flight, and reports the CPU
each used in that window, in percent of one core.

    python -m clients.idle_cpu --pid <serve pid> --seconds 60 [--json out.json] [--threads 5]

Output (JSON on stdout or ``--json``): ``{"seconds": window, "total_pct": sum, "processes":
[{"pid", "label", "cpu_s", "pct", "threads": [{"tid", "name", "cpu_s"}]}]}``, busiest first.
Labels: ``serve``, ``tritonserver``, ``stub:<model>``, ``frontend``, ``<name> (child of
stub:<model>)``. Processes that start or end inside the window count only their part in it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import psutil

#: clock ticks per second of /proc's utime/stime fields (``sysconf(_SC_CLK_TCK)``, 100 on Linux)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(stat_path: str) -> int | None:
    """``utime + stime`` (clock ticks) from a ``/proc/.../stat`` file; ``None`` if it is gone.

    The comm field (2) may hold spaces and parentheses: fields are counted after its last ')'.
    """
    try:
        text = Path(stat_path).read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()
    return int(rest[11]) + int(rest[12])  # fields 14 and 15 (utime, stime), 0-based after comm


def thread_ticks(pid: int) -> dict[int, tuple[str, int]]:
    """Thread id -> (thread name, utime + stime ticks) of every thread of ``pid``."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        ticks = cpu_ticks(f"/proc/{pid}/task/{tid}/stat")
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        if ticks is not None:
            out[int(tid)] = (name, ticks)
    return out


def label(proc: psutil.Process, stub_models: dict[int, str], root_pid: int) -> str:
    """What a process of the stack is (see the module docstring)."""
    if proc.pid == root_pid:
        return "serve"
    try:
        cmd = proc.cmdline()
        name = proc.name()
    except psutil.Error:
        return "?"
    if name == "tritonserver":
        return "tritonserver"
    if cmd and cmd[0].endswith("triton_python_backend_stub") and len(cmd) > 1:
        return f"stub:{Path(cmd[1]).parent.parent.name}"
    if "openai_frontend" in cmd:
        return "frontend"
    try:
        for parent in proc.parents():
            if parent.pid in stub_models:
                return f"{name} (child of stub:{stub_models[parent.pid]})"
    except psutil.Error:
        pass
    return name


def stack_processes(root_pid: int) -> list[psutil.Process]:
    """``root_pid`` and all its descendants."""
    root = psutil.Process(root_pid)
    return [root, *root.children(recursive=True)]


def measure(root_pid: int, seconds: float) -> dict:
    """Idle CPU of ``root_pid``'s process tree over ``seconds`` (see the module docstring)."""
    procs = stack_processes(root_pid)
    stubs = {}
    for p in procs:
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if cmd and cmd[0].endswith("triton_python_backend_stub") and len(cmd) > 1:
            stubs[p.pid] = Path(cmd[1]).parent.parent.name
    labels = {p.pid: label(p, stubs, root_pid) for p in procs}
    before = {p.pid: thread_ticks(p.pid) for p in procs}
    start = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - start
    after = {p.pid: thread_ticks(p.pid) for p in stack_processes(root_pid)}
    rows = []
    for pid in set(before) | set(after):
        b, a = before.get(pid, {}), after.get(pid, {})
        threads = []
        for tid, (name, ticks) in a.items():
            used = ticks - b.get(tid, (name, 0))[1]
            if used:
                threads.append({"tid": tid, "name": name, "cpu_s": used / CLK_TCK})
        threads.sort(key=lambda t: -t["cpu_s"])
        cpu_s = sum(t["cpu_s"] for t in threads)  # threads that ended inside the window: not seen
        rows.append({"pid": pid, "label": labels.get(pid, "(new) " + str(pid)), "cpu_s": round(cpu_s, 2),
                     "pct": round(100 * cpu_s / elapsed, 2), "threads": threads})
    rows.sort(key=lambda r: -r["cpu_s"])
    return {"seconds": round(elapsed, 1), "processes": len(rows),
            "total_pct": round(sum(r["pct"] for r in rows), 2), "per_process": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True, help="the omni-triton serve process")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=3, help="busiest threads shown per process")
    parser.add_argument("--json", type=Path, help="write the JSON here (default: stdout)")
    args = parser.parse_args(argv)
    result = measure(args.pid, args.seconds)
    for row in result["per_process"]:
        row["threads"] = [{**t, "cpu_s": round(t["cpu_s"], 2)} for t in row["threads"][:args.threads]]
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text)
    else:
        print(text)
    print(f"total {result['total_pct']}% of one core over {result['seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

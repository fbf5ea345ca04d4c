"""Reproduce (or rule out) the tritonserver 2.51 Python-backend crash under ordinary load.

Starts a tritonserver with only the named models (default ``piper``), then N client threads
send the same request back to back over gRPC streams for ``--seconds``; stops early when the
server dies. Prints one JSON line: requests completed, errors, whether the server crashed (its
exit code and the signal line of its log).

Usage::

    .venv/bin/python -m clients.repro_crash --seconds 60 --clients 8
    .venv/bin/python -m clients.repro_crash --runs 20 --seconds 30      # 20 fresh servers
    .venv/bin/python -m clients.repro_crash --model llm_tts --chat-over-context --clients 5
    .venv/bin/python -m clients.repro_crash --model probe_bls --clients 8 --runs 5 --seconds 30
    .venv/bin/python -m clients.repro_crash --model probe_bls --probe-workers 8 --seconds 60

``probe_bls`` (``clients/probe_repository/``) reads decoupled BLS streams the way ``llm_tts``
does. As shipped (one thread per stub, 2 instances) it must run clean; ``--probe-workers 8``
puts 8 threads into one stub (``OMNI_TRITON_BLS_THREADS=any``), which deadlocks the 2.51 stub
(requests end as "timeout"; the hang is reported as ``hung``); ``OMNI_TRITON_BLS_BARRIER=0``
also turns off the iterator release barrier (``omni_triton/adapters/bls.py``).

The request loop is bounded in time and count and talks only to 127.0.0.1.
Environment passed to the server, e.g. ``OMNI_TRITON_STUB_CALLS=unlocked`` (the old
discipline: only ``send`` serialised), applies to its stubs.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import re
import sys
import threading
import time
from functools import partial
from pathlib import Path

import tritonclient.grpc as grpcclient

from omni_triton.contracts import chat, probe, speech
from omni_triton.contracts.tensors import infer_input, scalar_array, wrap_inputs
from omni_triton.paths import model_repositories
from omni_triton.serve.process import free_port
from omni_triton.serve.server import TritonServer

#: Seconds after which a request that has not ended counts as a hang ("timeout").
REQUEST_TIMEOUT_S = 30.0

#: Log lines of a stub process that died (heap corruption aborts, the server noticing the death).
STUB_DEATH_MARKS = ("malloc(): ", "free(): ", "double free", "corrupted ", "Stub process", "unhealthy",
                    "Segmentation fault")

#: The diagnostic models' repository (probe_bls, probe_source).
PROBE_REPOSITORY = Path(__file__).resolve().parent / "probe_repository"


def _grpc_inputs(pairs) -> list:
    """``tritonclient.grpc.InferInput`` s from a contract builder's ``(name, array)`` pairs."""
    return wrap_inputs(pairs, partial(infer_input, grpcclient.InferInput))


def speech_inputs(text: str) -> list:
    """A speech model's inputs: TEXT only (``docs/speech_contracts.md``)."""
    return _grpc_inputs(speech.speech_inputs(text))


def chat_inputs(text: str, over_context: bool) -> list:
    """A chat model's inputs: one user message (3000 words with ``over_context``: over the
    context, so the stage rejects it), 16 greedy tokens, text and audio asked for."""
    messages = [{"role": "user", "content": ("word " * 3000 if over_context else text)}]
    return _grpc_inputs(chat.chat_inputs(messages=messages, sampling={"max_tokens": 16, "temperature": 0},
                                         modalities=["text", "audio"]))


def probe_inputs(streams: int = 4, responses: int = 8) -> list:
    """probe_bls's inputs: ``streams`` BLS streams of ``responses`` responses each per request."""
    return _grpc_inputs([(probe.COUNT, scalar_array(streams, "INT32")),
                         (probe.RESPONSES, scalar_array(responses, "INT32"))])


def client_loop(url: str, model: str, make_inputs, deadline: float, max_requests: int,
                counts: dict, lock: threading.Lock, alive) -> None:
    """Send one request at a time on a gRPC stream until ``deadline``; count outcomes."""
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        n = 0
        while time.monotonic() < deadline and n < max_requests and alive():
            n += 1
            client.async_stream_infer(model, make_inputs(), enable_empty_final_response=True)
            ok = True
            while True:
                try:
                    result, error = responses.get(timeout=REQUEST_TIMEOUT_S)
                except queue.Empty:
                    ok = None
                    break
                if error is not None:
                    ok = False
                    break
                params = result.get_response().parameters
                if params.get("triton_final_response") and params["triton_final_response"].bool_param:
                    break
            with lock:
                key = {True: "ok", False: "error", None: "timeout"}[ok]
                counts[key] = counts.get(key, 0) + 1
            if ok is None:
                break
    finally:
        try:
            client.stop_stream(cancel_requests=True)
        except Exception:
            pass
        client.close()


async def _aio_clients(url: str, model: str, make_inputs, deadline: float, clients: int,
                       max_requests: int, counts: dict, alive, half_close: str = "after-final") -> None:
    """The frontend's way: one ``ModelStreamInfer`` RPC per request (tritonclient.grpc.aio),
    ``clients`` concurrent loops."""
    import tritonclient.grpc.aio as aio

    from openai_frontend.engine.triton_private import open_stream

    client = aio.InferenceServerClient(url)

    async def loop():
        n = 0
        while time.monotonic() < deadline and n < max_requests and alive():
            n += 1
            inputs = make_inputs()  # tritonclient.grpc.aio uses the same InferInput

            async def requests(inputs=inputs):
                yield {"model_name": model, "inputs": inputs}

            async def one(inputs=inputs) -> str:
                key = "ok"
                if half_close == "immediately":  # the frontend's way before issue 9's last fix
                    async for _result, error in client.stream_infer(requests()):
                        if error is not None:
                            key = "error"
                    return key
                final = asyncio.Event()  # the frontend's way: half-close after the final response
                async for response in open_stream(client, model, inputs, "", final):
                    if response.error_message:
                        key = "error"
                        final.set()
                    param = response.infer_response.parameters.get("triton_final_response")
                    if param is not None and param.bool_param:
                        final.set()
                return key

            try:
                key = await asyncio.wait_for(one(), REQUEST_TIMEOUT_S)
            except asyncio.TimeoutError:
                key = "timeout"  # a hang: the request never ended
            except Exception:
                key = "error"
            counts[key] = counts.get(key, 0) + 1

    try:
        await asyncio.gather(*(loop() for _ in range(clients)))
    finally:
        await client.close()


def drive(grpc_url: str, model: str, clients: int = 8, seconds: float = 30.0,
          over_context: bool = False, text: str = "Hello there. How are you?",
          one_stream: bool = False, max_requests: int = 100_000,
          alive=lambda: True, half_close: str = "after-final") -> dict:
    """Drive ``model`` with ``clients`` concurrent request loops for ``seconds``.

    Args:
        grpc_url: Triton gRPC ``host:port`` (loopback).
        model: a speech model (``piper``, ``csm``: TEXT) or a chat model (``llm_tts``,
            ``qwen3_omni``: MESSAGES; ``over_context`` makes every prompt longer than the context, so
            every request is answered with INVALID_ARG).
        one_stream: each client keeps one gRPC stream for all its requests (default: one stream
            per request, as the OpenAI frontend does; that pattern reproduced the crash fastest).
        alive: stops the loops early when it returns False (the server died).
        half_close: one stream per request only: ``"after-final"`` (the frontend's way: the
            client half-closes once the final response is in) or ``"immediately"`` (right after
            sending the request, the pattern behind the 2.51 SIGSEGV in CI run 4 of issue 9).

    Returns:
        counts of request outcomes: ``{"ok": n, "error": n, "timeout": n}`` (keys present when > 0).
    """
    counts: dict = {}
    lock = threading.Lock()
    if model in ("llm_tts", "qwen3_omni", "llm"):
        make = lambda: chat_inputs(text, over_context)  # noqa: E731
    elif model == "probe_bls":
        make = probe_inputs
    else:
        make = lambda: speech_inputs(text)  # noqa: E731
    deadline = time.monotonic() + seconds
    if one_stream:
        threads = [threading.Thread(target=client_loop, daemon=True,
                                    args=(grpc_url, model, make, deadline, max_requests,
                                          counts, lock, alive))
                   for _ in range(clients)]
    else:
        threads = [threading.Thread(target=asyncio.run, daemon=True, args=(_aio_clients(
            grpc_url, model, make, deadline, clients, max_requests, counts, alive, half_close),))]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) and alive():
        time.sleep(0.2)
    return counts


def probe_repository(workers: int | None) -> Path:
    """The probe repository; with ``workers``, a temporary copy whose ``probe_bls`` runs that many
    threads in one stub with one instance (the one-thread rule lifted for its stub)."""
    if workers is None:
        return PROBE_REPOSITORY
    import shutil
    import tempfile

    copy = Path(tempfile.mkdtemp(prefix="probe-repo-")) / "probe_repository"
    shutil.copytree(PROBE_REPOSITORY, copy, ignore=shutil.ignore_patterns("__pycache__"))
    config = copy / "probe_bls" / "config.pbtxt"
    text = config.read_text().replace("count: 2 kind", "count: 1 kind")
    config.write_text(text.replace('"workers" value { string_value: "0" }',
                                   f'"workers" value {{ string_value: "{workers}" }}'))
    os.environ["OMNI_TRITON_BLS_THREADS"] = "any"  # inherited by the server and its stubs
    return copy


def one_run(args, run: int) -> dict:
    """Start a fresh tritonserver with ``args.model``, drive it, report whether it crashed."""
    ports = [free_port() for _ in range(3)]
    log = Path(args.log_dir) / f"repro-{os.getpid()}-{run}.log"
    repositories = model_repositories() + ([probe_repository(args.probe_workers)] if "probe_" in args.model else [])
    server = TritonServer(args.model.split(","), http_port=ports[0], grpc_port=ports[1],
                          metrics_port=ports[2], log_path=log, repositories=repositories)
    with server:
        target = args.model.split(",")[0]
        start = time.monotonic()
        alive = lambda: server.proc.poll() is None  # noqa: E731
        counts = drive(server.grpc_url, target, args.clients, args.seconds,
                       args.chat_over_context, args.text, args.one_stream, args.max_requests,
                       alive, args.half_close)
        elapsed = time.monotonic() - start
        code = server.proc.poll()
        text = server.log_text()
        signal_line = next((ln for ln in text.splitlines() if re.search(r"Signal \(\d+\)", ln)), "")
        crashed = code is not None or bool(signal_line)
        stub_death = next((ln for ln in text.splitlines() if any(m in ln for m in STUB_DEATH_MARKS)), "")
    hung = counts.get("timeout", 0) > 0
    bad = crashed or bool(stub_death) or hung
    return {"run": run, "model": target, "clients": args.clients, "seconds": round(elapsed, 1),
            "crashed": crashed, "stub_died": bool(stub_death), "hung": hung, "exit_code": code,
            "signal": signal_line.strip(), "stub_death": stub_death.strip()[:200],
            "log": str(log) if bad else "", **counts}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="piper", help="model(s) to load; the first is driven")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--max-requests", type=int, default=100_000, help="per client")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--text", default="Hello there. How are you?")
    p.add_argument("--chat-over-context", action="store_true",
                   help="chat prompts longer than the context (every request is an INVALID_ARG)")
    p.add_argument("--one-stream", action="store_true",
                   help="each client keeps one gRPC stream for all its requests (default: one "
                        "stream per request, as the OpenAI frontend does)")
    p.add_argument("--probe-workers", type=int, help="probe_bls only: run it on this many threads of "
                   "one stub (breaks the one-thread rule on purpose, to reproduce the deadlock)")
    p.add_argument("--half-close", choices=("after-final", "immediately"), default="after-final",
                   help="one stream per request: when the client half-closes its write side")
    p.add_argument("--log-dir", default="/tmp")
    p.add_argument("--out", help="write all runs as a JSON list here")
    args = p.parse_args(argv)
    results = []
    for run in range(args.runs):
        r = one_run(args, run)
        print(json.dumps(r), flush=True)
        results.append(r)
    crashes = sum(r["crashed"] for r in results)
    stub_deaths = sum(r["stub_died"] for r in results)
    hangs = sum(r["hung"] for r in results)
    summary = {"runs": len(results), "crashes": crashes, "stub_deaths": stub_deaths, "hangs": hangs,
               "ok": sum(r.get("ok", 0) for r in results),
               "errors": sum(r.get("error", 0) for r in results)}
    print(json.dumps({"summary": summary}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"runs": results, "summary": summary}, indent=1))
    return 1 if crashes or stub_deaths or hangs else 0


if __name__ == "__main__":
    sys.exit(main())

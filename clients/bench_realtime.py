"""Realtime API benchmark (``WS /v1/realtime``, docs/realtime.md) with the official SDK's GA client.

Run::

    python -m clients.bench_realtime --out bench_realtime.json                 # starts piper + qwen3_omni
    python -m clients.bench_realtime --url http://127.0.0.1:8000 --sessions 6 --concurrency 1,4

User speech is Piper's (``piper_tts`` on the same server, PCM16 24 kHz). Per session, at each
concurrency level ``C`` (``N = max(--sessions, C)`` sessions from ``C`` closed-loop workers):

``commit``
    no turn detection: the utterance appended at once, ``input_audio_buffer.commit`` +
    ``response.create``; ``commit_to_first_audio_ms``: the commit sent -> the first
    ``response.output_audio.delta`` received.
``vad``
    server VAD (``silence_duration_ms`` ``--silence-ms``): 0.5 s of silence, the utterance and 1 s
    of silence streamed in real time (100 ms appends); the server commits and answers by itself.
    ``speech_stop_to_first_audio_ms``: ``input_audio_buffer.speech_stopped`` received -> first
    audio delta; ``speech_end_to_first_audio_ms``: the last voiced sample sent -> first audio delta
    (includes the silence the VAD waits for).
``barge_in``
    from that answer's first audio delta on, a second utterance is streamed in real time (the rest
    of the trailing silence is not sent): ``barge_in_ms``: its first voiced sample sent -> the last
    audio delta of the interrupted response received; ``cancel_done_ms``: -> its
    ``response.done`` (status ``cancelled``); both only for answers still running when the VAD
    heard the user (``barge_in_cancelled`` counts them: an answer computed faster than the VAD
    needs, ~150 ms of speech, was sent whole and ends ``completed``/``incomplete``);
    ``late_audio_deltas``: audio deltas of the response after its ``response.done`` (must be 0).

Aggregates per level: mean / p50 / p90 / min / max (``clients.bench_common.describe``), errors.
The frontend's own histograms (``omni_frontend_realtime_*``, docs/metrics.md) measure the same
intervals server-side. JSON to ``--out`` with the machine and commit. Timings on a shared machine
are indicative only.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from clients.bench_common import describe, git_commit, machine_info, parse_concurrency

RATE = 24000
UTTERANCES = ("The capital of France is Paris.", "What is the weather like in Berlin today?")
#: a sample at or above this (of full scale) is voiced (Piper's silence is near 0)
VOICED = 0.02


def voiced_bounds_ms(pcm: bytes, threshold: float = VOICED) -> tuple[int, int] | None:
    """(first, last) voiced sample of PCM16 ``pcm`` at 24 kHz in ms; None when all of it is quiet."""
    import numpy as np

    samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0
    loud = np.flatnonzero(np.abs(samples) >= threshold)
    if not loud.size:
        return None
    return int(loud[0]) * 1000 // RATE, int(loud[-1]) * 1000 // RATE


def pieces(pcm: bytes, ms: int = 100) -> list[bytes]:
    """``pcm`` (PCM16 24 kHz) cut into ``ms`` pieces (the last one shorter)."""
    step = ms * RATE // 1000 * 2
    return [pcm[i:i + step] for i in range(0, len(pcm), step)]


def silence(ms: int) -> bytes:
    return bytes(ms * RATE // 1000 * 2)


@dataclass
class SessionResult:
    """One session's intervals in seconds (None: not measured) and what went wrong."""

    commit_to_first_audio: float | None = None
    speech_stop_to_first_audio: float | None = None
    speech_end_to_first_audio: float | None = None
    barge_in: float | None = None
    cancel_done: float | None = None
    late_audio_deltas: int = 0
    error: str | None = None
    statuses: list[str] = field(default_factory=list)


def summarize(results: Sequence[SessionResult], wall_s: float) -> dict:
    """The JSON of one level: each interval's ``describe`` in ms, the late deltas and errors."""
    def ms(name: str) -> dict:
        values = [getattr(r, name) * 1000 for r in results if getattr(r, name) is not None]
        return {k: None if v is None else round(v, 1) for k, v in describe(values).items()} | {"n": len(values)}

    return {"sessions": len(results), "wall_s": round(wall_s, 2),
            "commit_to_first_audio_ms": ms("commit_to_first_audio"),
            "speech_stop_to_first_audio_ms": ms("speech_stop_to_first_audio"),
            "speech_end_to_first_audio_ms": ms("speech_end_to_first_audio"),
            "barge_in_ms": ms("barge_in"), "cancel_done_ms": ms("cancel_done"),
            # barge-ins that found the answer still running (the others had been sent whole)
            "barge_in_cancelled": sum(r.barge_in is not None for r in results),
            "late_audio_deltas": sum(r.late_audio_deltas for r in results),
            "statuses": sorted({s for r in results for s in r.statuses}),
            "errors": [r.error for r in results if r.error]}


async def _next(conn, kind: str, timeout_s: float, on_event=None):
    async with asyncio.timeout(timeout_s):
        async for ev in conn:
            if on_event is not None:
                on_event(ev)
            if ev.type == kind:
                return ev
    raise RuntimeError(f"connection closed before {kind}")


async def _stream(conn, pcm: bytes, realtime: bool) -> None:
    for piece in pieces(pcm):
        await conn.input_audio_buffer.append(audio=base64.b64encode(piece).decode("ascii"))
        if realtime:
            await asyncio.sleep(len(piece) / 2 / RATE)


async def one_session(client, model: str, speech: Sequence[bytes], max_tokens: int, silence_ms: int,
                      timeout_s: float) -> SessionResult:
    """The three measurements of one session (module docstring), on a new connection each."""
    r = SessionResult()
    try:
        async with client.realtime.connect(model=model) as conn:  # commit
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            await _stream(conn, speech[0], realtime=False)
            await conn.input_audio_buffer.commit()
            t0 = time.perf_counter()
            await conn.response.create(response={"max_output_tokens": max_tokens})
            await _next(conn, "response.output_audio.delta", timeout_s)
            r.commit_to_first_audio = time.perf_counter() - t0
            r.statuses.append((await _next(conn, "response.done", timeout_s)).response.status)
        async with client.realtime.connect(model=model) as conn:  # server VAD, then barge-in
            await conn.session.update(session={"type": "realtime", "max_output_tokens": max_tokens, "audio": {
                "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": silence_ms}}}})
            first = voiced_bounds_ms(speech[0]) or (0, len(speech[0]) // 2 * 1000 // RATE)
            lead = 500
            seen: dict[str, float] = {}

            def mark(ev) -> None:  # the receive time of the first event of each type
                seen.setdefault(ev.type, time.perf_counter())

            t_start = time.perf_counter()
            talk = asyncio.create_task(_stream(conn, silence(lead) + speech[0] + silence(1000), realtime=True))
            delta = await _next(conn, "response.output_audio.delta", timeout_s, mark)
            talk.cancel()  # the user talks over the answer from its first audio delta on
            await asyncio.gather(talk, return_exceptions=True)
            t_audio = seen["response.output_audio.delta"]
            if "input_audio_buffer.speech_stopped" in seen:
                r.speech_stop_to_first_audio = t_audio - seen["input_audio_buffer.speech_stopped"]
            r.speech_end_to_first_audio = t_audio - (t_start + (lead + first[1]) / 1000)
            response_id = delta.response_id
            second = voiced_bounds_ms(speech[1]) or (0, 0)
            last_audio: list[float] = [t_audio]
            done: list = []
            late = [0]

            def watch(ev) -> None:
                if ev.type == "response.output_audio.delta" and ev.response_id == response_id:
                    if done:
                        late[0] += 1
                    else:
                        last_audio.append(time.perf_counter())
                elif ev.type == "response.done" and ev.response.id == response_id:
                    done.append((time.perf_counter(), ev.response.status))
                    r.statuses.append(ev.response.status)

            waiter = asyncio.create_task(_next(conn, "response.done", timeout_s, watch))
            t_interrupt = time.perf_counter()
            await _stream(conn, speech[1], realtime=True)
            await waiter
            t_voice = t_interrupt + second[0] / 1000
            if done[0][1] == "cancelled":  # else it was all sent before the user's voice started
                r.barge_in = max(0.0, last_audio[-1] - t_voice)
                r.cancel_done = done[0][0] - t_voice
            try:  # deltas of the response after its response.done
                await _next(conn, "never", 1.0, watch)
            except TimeoutError:
                pass
            r.late_audio_deltas = late[0]
    except Exception as exc:  # reported per session, the run goes on
        r.error = f"{type(exc).__name__}: {exc}"[:300]
    return r


async def run_level(url: str, model: str, speech: Sequence[bytes], concurrency: int, n: int, max_tokens: int,
                    silence_ms: int, timeout_s: float) -> tuple[list[SessionResult], float]:
    """``n`` sessions from ``concurrency`` workers; (results, wall seconds)."""
    import openai

    host = url.split("://", 1)[1]
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", websocket_base_url=f"ws://{host}/v1",
                                api_key=os.environ.get("OPENAI_API_KEY", "unused"), max_retries=0)
    todo = list(range(n))
    results: list[SessionResult] = []

    async def worker() -> None:
        while todo:
            todo.pop()
            results.append(await one_session(client, model, speech, max_tokens, silence_ms, timeout_s))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results, time.perf_counter() - t0


def speak(url: str, text: str) -> bytes:
    import httpx

    r = httpx.post(f"{url}/v1/audio/speech", timeout=120, json={"model": "piper_tts", "voice": "joe", "input": text,
                                                                "response_format": "pcm", "sample_rate": RATE})
    r.raise_for_status()
    return r.content


def _start_server(models: str) -> tuple[subprocess.Popen, str, object]:
    """``omni-triton serve --models models`` on free ports; (process, frontend URL, log file)."""
    import httpx

    from omni_triton.serve.process import free_port

    ports = [free_port() for _ in range(4)]
    log = tempfile.NamedTemporaryFile(prefix="bench_realtime_serve_", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "omni_triton", "serve", "--models", models, "--on-demand", "none",
                             "--port", str(ports[0]), "--triton-http-port", str(ports[1]),
                             "--triton-grpc-port", str(ports[2]), "--triton-metrics-port", str(ports[3])],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{ports[0]}"
    deadline = time.monotonic() + 600
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"omni-triton serve exited ({proc.returncode}); log: {log.name}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.terminate()
            raise SystemExit(f"omni-triton serve not healthy in 600 s; log: {log.name}")
        time.sleep(1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", help="a running frontend (default: start omni-triton serve --models piper,qwen3_omni)")
    p.add_argument("--model", default="omni")
    p.add_argument("--sessions", type=int, default=4, help="sessions per level (at least the concurrency)")
    p.add_argument("--concurrency", default="1,4", help="comma-separated levels")
    p.add_argument("--max-tokens", type=int, default=8, help="max_output_tokens of every response")
    p.add_argument("--silence-ms", type=int, default=500, help="server VAD silence_duration_ms")
    p.add_argument("--timeout-s", type=float, default=120.0, help="per awaited event")
    p.add_argument("--out", default="bench_realtime.json")
    args = p.parse_args(argv)
    proc = None
    url = args.url
    if url is None:
        proc, url, _log = _start_server("piper,qwen3_omni")
    try:
        speech = [speak(url, t) for t in UTTERANCES]
        report: dict = {"benchmark": "realtime", "url": url, "model": args.model, "max_tokens": args.max_tokens,
                        "silence_ms": args.silence_ms, "machine": machine_info(), "commit": git_commit(),
                        "levels": {}}
        for c in parse_concurrency(args.concurrency):
            results, wall = asyncio.run(run_level(url, args.model, speech, c, max(args.sessions, c), args.max_tokens,
                                                  args.silence_ms, args.timeout_s))
            report["levels"][str(c)] = summarize(results, wall)
            print(f"c={c}: {json.dumps(report['levels'][str(c)])}", flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

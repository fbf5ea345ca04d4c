"""A bounded mixed soak against a running Omni-Triton stack (OpenAI frontend + tritonserver).

For ``--seconds`` it keeps ``--concurrency`` client loops busy with a weighted mix of ordinary
traffic as users send it: streamed and whole speech (Piper and, if served, the codec pipeline),
streamed and whole chat (text, and with audio through ``llm_tts``), completions, small images,
client disconnects in the middle of a stream (cancellation), hostile payloads (over-context
prompts, lone surrogates, wrong types, truncated JSON) and overload bursts of 4x the concurrency.
It only talks to the addresses it is given (loopback in tests and CI).

It reports, as JSON: requests per kind and outcome class (``2xx``, ``4xx``, ``429``, ``503``,
``5xx``, ``transport`` errors, ``hang`` = no answer within the per-request timeout,
``bad_refusal`` = a 429/503 without the OpenAI error body or ``Retry-After``, ``stream_error`` = a
streamed answer that began with 200 and then failed in-band: an SSE ``error`` event or
``data: {"error": ...}`` chunk, or a chat stream that ended without ``[DONE]``), tritonserver crashes
(restarts counted from ``serve``'s status file, or a changed tritonserver pid), the resident
memory of tritonserver's process tree and the bytes in /dev/shm at start and end.

Usage::

    python -m clients.soak --url http://127.0.0.1:9000 --seconds 600 --out soak.json \
        --serve-status ~/.cache/omni-triton/logs/serve-status-8000.json

Exit code 1 when a crash, a 5xx, a hang, a bad refusal or an in-band stream error was seen.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx

#: kind -> weight in the mix (a kind whose model is not served is skipped). Models go by their
#: OpenAI names (``served_model_name``: piper_tts, tts), what /v1/models lists.
MIX = {
    "speech_stream": 4, "speech_wav": 3, "codec_speech": 1, "chat_stream": 3, "chat": 2,
    "chat_audio": 1, "completion": 1, "image": 1, "disconnect": 2, "hostile": 3,
    "over_context": 1, "speech_sse": 2,
}
HOSTILE_BODIES = [
    b'{"model": "piper_tts", "input": "\\ud800 lone surrogate", "voice": "joe"}',
    b'{"model": "llm", "messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"model": "llm", "messages": "not a list"}',
    b'{"model": "llm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}',
    b'{"model": "llm", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}',
    b'{"model": "piper_tts", "input": "truncated',
    b'{"model": "nope", "input": "x", "voice": "joe"}',
    b'{"model": "qwen_image", "prompt": "x", "size": "0x0"}',
    b"[1, 2, 3]",
    b"\x00\x01\x02",
]


#: outcome classes that fail a soak (a 503 is counted apart: its bound is the caller's)
FAILURES = ("5xx", "hang", "transport", "bad_refusal", "stream_error")


def _outcome(status: int) -> str:
    if status in (429, 503):
        return str(status)
    return f"{status // 100}xx"


def refusal_problem(status: int, headers, body: bytes) -> str | None:
    """What is wrong with a 429/503 refusal, or None: it must carry ``Retry-After`` and the
    OpenAI error body ``{"error": {"message": non-empty str, "type", "param", "code"}}``.

    Args:
        status: the HTTP status (429 or 503).
        headers: the response headers (case-insensitive mapping, e.g. ``httpx.Headers``).
        body: the response body.
    """
    if not headers.get("retry-after"):
        return f"{status} without Retry-After"
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return f"{status} without the OpenAI error body: {body[:200]!r}"
    if not isinstance(error, dict) or set(error) != {"message", "type", "param", "code"} \
            or not isinstance(error["message"], str) or not error["message"]:
        return f"{status} error body {error!r}"
    return None


def sse_stream_problem(lines: list[str], need_done: bool = False) -> str | None:
    """An in-band failure of a server-sent-event stream, or None.

    Args:
        lines: the stream's lines (``event: ...``, ``data: ...``).
        need_done: the stream must end with ``data: [DONE]`` (the chat and completions APIs).

    Returns:
        The first ``error`` event (``event: ...error``, e.g. ``speech.audio.error``) or ``data``
        chunk with an ``error`` member, or ``"no [DONE]"`` when ``need_done`` and it is missing.
    """
    for line in lines:
        if line.startswith("event:") and line.split(":", 1)[1].strip().endswith("error"):
            return line.strip()
        if line.startswith("data:"):
            data = line.split(":", 1)[1].strip()
            if data.startswith("{"):
                try:
                    chunk = json.loads(data)
                except ValueError:
                    return f"undecodable chunk: {data[:200]}"
                if isinstance(chunk, dict) and "error" in chunk:
                    return data[:300]
    if need_done and not any(ln.startswith("data:") and ln.split(":", 1)[1].strip() == "[DONE]" for ln in lines):
        return "no [DONE]"
    return None


class Soak:
    """The client loops and their tallies (one instance per run)."""

    def __init__(self, url: str, models: set[str], timeout_s: float, seed: int,
                 exclude: frozenset[str] = frozenset()):
        self.url = url.rstrip("/")
        self.models = models
        self.timeout_s = timeout_s
        self.rng = random.Random(seed)
        self.counts: dict[str, Counter] = defaultdict(Counter)
        self.samples: dict[str, list] = defaultdict(list)  # first few 5xx/hang bodies per kind
        kinds = {k: w for k, w in MIX.items() if self._served(k) and k not in exclude}
        self.kinds, self.weights = list(kinds), list(kinds.values())

    def _served(self, kind: str) -> bool:
        need = {"speech_stream": "piper_tts", "speech_sse": "piper_tts", "speech_wav": "piper_tts",
                "codec_speech": "tts",
                "chat_stream": "llm", "chat": "llm", "chat_audio": "llm_tts", "completion": "llm",
                "image": "qwen_image", "disconnect": "piper_tts", "hostile": "piper_tts",
                "over_context": "llm"}[kind]
        return need in self.models

    def _record(self, kind: str, outcome: str, detail: str = "") -> None:
        self.counts[kind][outcome] += 1
        if outcome in FAILURES + ("503",) and len(self.samples[kind]) < 3:
            self.samples[kind].append(detail[:300])

    async def _post(self, client: httpx.AsyncClient, kind: str, path: str, body,
                    stream: bool = False, disconnect_after: int | None = None) -> None:
        try:
            kwargs = {"content": body, "headers": {"Content-Type": "application/json"}} \
                if isinstance(body, bytes) else {"json": body}
            if stream:
                async with client.stream("POST", self.url + path, **kwargs) as r:
                    if r.status_code != 200 or disconnect_after is None:
                        body = await r.aread()
                        self._answer(kind, r, body, path)
                        return
                    got = 0
                    async for _ in r.aiter_bytes():
                        got += 1
                        if got >= disconnect_after:
                            break  # leaving the context closes the connection mid-stream
                    self._record(kind, _outcome(r.status_code), f"{r.status_code}")
            else:
                r = await client.post(self.url + path, **kwargs)
                self._answer(kind, r, r.content, path)
        except httpx.TimeoutException as exc:
            self._record(kind, "hang", repr(exc))
        except httpx.HTTPError as exc:
            self._record(kind, "transport", repr(exc))

    def _answer(self, kind: str, r: httpx.Response, body: bytes, path: str) -> None:
        """Record a whole answer: its status class, unless it is a malformed refusal or a 200
        event stream that failed in-band."""
        outcome, detail = _outcome(r.status_code), f"{r.status_code} {body[:300]!r}"
        if r.status_code in (429, 503):
            problem = refusal_problem(r.status_code, r.headers, body)
            if problem:
                outcome, detail = "bad_refusal", problem
        elif r.status_code == 200 and r.headers.get("content-type", "").startswith("text/event-stream"):
            lines = body.decode(errors="replace").splitlines()
            problem = sse_stream_problem(lines, need_done=path != "/v1/audio/speech")
            if problem:
                outcome, detail = "stream_error", problem
        self._record(kind, outcome, detail)

    async def one(self, client: httpx.AsyncClient, kind: str) -> None:
        """Send one request of ``kind``."""
        rng = self.rng
        words = ["One sentence here.", "The capital of France is Paris.", "Hello there. How are you?"]
        if kind == "speech_stream":
            await self._post(client, kind, "/v1/audio/speech", {
                "model": "piper_tts", "voice": "joe", "input": rng.choice(words),
                "response_format": "pcm", "stream": True}, stream=True)
        elif kind == "speech_sse":
            await self._post(client, kind, "/v1/audio/speech", {
                "model": "piper_tts", "voice": "joe", "input": rng.choice(words),
                "stream_format": "sse"}, stream=True)
        elif kind == "speech_wav":
            await self._post(client, kind, "/v1/audio/speech", {
                "model": "piper_tts", "voice": "joe", "input": rng.choice(words),
                "response_format": "wav"})
        elif kind == "codec_speech":
            await self._post(client, kind, "/v1/audio/speech", {
                "model": "tts", "input": "Hi there.", "response_format": "wav"})
        elif kind == "disconnect":
            await self._post(client, kind, "/v1/audio/speech", {
                "model": "piper_tts", "voice": "joe", "input": " ".join(words * 4),
                "response_format": "pcm", "stream": True}, stream=True, disconnect_after=1)
        elif kind in ("chat", "chat_stream"):
            await self._post(client, kind, "/v1/chat/completions", {
                "model": "llm", "messages": [{"role": "user", "content": rng.choice(
                    ["What is the capital of France?", "Say hello.", "Count to five."])}],
                "max_tokens": 16, "temperature": 0, "stream": kind == "chat_stream"},
                stream=kind == "chat_stream")
        elif kind == "chat_audio":
            await self._post(client, kind, "/v1/chat/completions", {
                "model": "llm", "modalities": ["text", "audio"],
                "audio": {"voice": "joe", "format": "wav"},
                "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 12,
                "temperature": 0})
        elif kind == "completion":
            await self._post(client, kind, "/v1/completions", {
                "model": "llm", "prompt": "The capital of France is", "max_tokens": 8,
                "temperature": 0})
        elif kind == "image":
            await self._post(client, kind, "/v1/images/generations", {
                "model": "qwen_image", "prompt": "a red fox", "size": "16x16", "seed": 1,
                "num_inference_steps": 2})
        elif kind == "over_context":
            await self._post(client, kind, "/v1/chat/completions", {
                "model": "llm_tts" if "llm_tts" in self.models else "llm",
                "messages": [{"role": "user", "content": "word " * 3000}],
                **({"modalities": ["text", "audio"], "audio": {"voice": "joe", "format": "wav"}}
                   if "llm_tts" in self.models else {})})
        elif kind == "hostile":
            path = rng.choice(["/v1/audio/speech", "/v1/chat/completions", "/v1/images/generations"])
            await self._post(client, kind, path, rng.choice(HOSTILE_BODIES))

    async def loop(self, client: httpx.AsyncClient, deadline: float) -> None:
        while time.monotonic() < deadline:
            await self.one(client, self.rng.choices(self.kinds, self.weights)[0])

    async def run(self, seconds: float, concurrency: int, burst_every_s: float) -> None:
        limits = httpx.Limits(max_connections=concurrency * 5)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits) as client:
            deadline = time.monotonic() + seconds
            loops = [asyncio.create_task(self.loop(client, deadline)) for _ in range(concurrency)]
            while time.monotonic() < deadline - burst_every_s:
                await asyncio.sleep(burst_every_s)
                # An overload burst: 4x the concurrency at once, every answer must be 200 or a
                # well-formed 429/503 (the caller bounds the 503s).
                await asyncio.gather(*(self.one(client, "speech_wav" if "piper_tts" in self.models
                                                else self.kinds[0]) for _ in range(concurrency * 4)))
            await asyncio.gather(*loops)


def triton_tree_rss(pid: int | None) -> int:
    """Resident bytes of process ``pid`` and its descendants (0 if gone or unknown)."""
    import psutil

    if not pid:
        return 0
    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    except psutil.Error:
        return 0


def shm_bytes() -> int:
    """Bytes of the files in /dev/shm."""
    total = 0
    for f in Path("/dev/shm").glob("*"):
        try:
            total += f.stat().st_size
        except OSError:
            pass
    return total


def _status(status_file: str | None) -> dict | None:
    if not status_file:
        return None
    try:
        return json.loads(Path(status_file).read_text())
    except (OSError, ValueError):
        return None


def _restarts(status_file: str | None) -> int | None:
    status = _status(status_file)
    return None if status is None else status.get("restarts", 0)


def _stub_reloads(status_file: str | None) -> dict[str, int]:
    """Per model, how often serve saw its stub die and reloaded it (serve's status file)."""
    status = _status(status_file) or {}
    return dict(status.get("stub_reloads") or {})


def served_models(url: str) -> set[str]:
    r = httpx.get(url.rstrip("/") + "/v1/models", timeout=30)
    r.raise_for_status()
    return {m["id"] for m in r.json()["data"]}


def soak(url: str, seconds: float, concurrency: int = 4, triton_pid: int | None = None,
         serve_status: str | None = None, timeout_s: float = 120.0, seed: int = 0,
         burst_every_s: float = 20.0, exclude: frozenset[str] = frozenset()) -> dict:
    """Run the soak; returns the report (see the module docstring). ``exclude``: kinds of
    :data:`MIX` left out."""
    models = served_models(url)
    start = {"rss": triton_tree_rss(triton_pid), "shm": shm_bytes(), "restarts": _restarts(serve_status),
             "stub_reloads": _stub_reloads(serve_status)}
    runner = Soak(url, models, timeout_s, seed, exclude)
    t0 = time.monotonic()
    asyncio.run(runner.run(seconds, concurrency, burst_every_s))
    elapsed = time.monotonic() - t0
    end = {"rss": triton_tree_rss(triton_pid), "shm": shm_bytes(), "restarts": _restarts(serve_status),
           "stub_reloads": _stub_reloads(serve_status)}
    stub_deaths = {m: n - start["stub_reloads"].get(m, 0) for m, n in end["stub_reloads"].items()
                   if n - start["stub_reloads"].get(m, 0) > 0}
    crashes = None
    if start["restarts"] is not None and end["restarts"] is not None:
        crashes = end["restarts"] - start["restarts"]
    elif triton_pid:
        import psutil

        crashes = 0 if psutil.pid_exists(triton_pid) else 1
    totals = Counter()
    for c in runner.counts.values():
        totals.update(c)
    return {
        "seconds": round(elapsed, 1), "concurrency": concurrency, "models": sorted(models),
        "requests": sum(totals.values()), "outcomes": dict(totals),
        "by_kind": {k: dict(v) for k, v in sorted(runner.counts.items())},
        "bad_samples": dict(runner.samples), "crashes": crashes, "stub_deaths": stub_deaths,
        "triton_rss_mb": {"start": round(start["rss"] / 2**20), "end": round(end["rss"] / 2**20)},
        "dev_shm_mb": {"start": round(start["shm"] / 2**20, 1), "end": round(end["shm"] / 2**20, 1)},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:9000", help="the OpenAI frontend")
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--triton-pid", type=int, help="tritonserver's pid (RSS, crash check)")
    p.add_argument("--serve-status", help="serve's status JSON (restarts = crashes)")
    p.add_argument("--timeout", type=float, default=120.0, help="per-request timeout (a hang)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exclude", default="", help="comma separated kinds to leave out of the mix")
    p.add_argument("--out", help="write the report JSON here")
    args = p.parse_args(argv)
    report = soak(args.url, args.seconds, args.concurrency, args.triton_pid, args.serve_status,
                  args.timeout, args.seed,
                  exclude=frozenset(k for k in args.exclude.split(",") if k))
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    bad = report["crashes"] or report["stub_deaths"] or any(report["outcomes"].get(k) for k in FAILURES)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

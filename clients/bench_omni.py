"""Omni pipeline benchmark: text TTFT, audio TTFP, end-to-end latency and RTF, Triton vs in-process.

Run::

    python -m clients.bench_omni --out bench_omni.json
    python -m clients.bench_omni --concurrency 1,2 --requests 6 --triton-grpc-url 127.0.0.1:8001

For each concurrency level ``C`` it sends ``N = max(--requests, C)`` chat requests (greedy,
``--max-tokens`` text tokens, text + audio) from a closed loop of ``C`` worker threads through two
paths, one after the other (they share the CPU cores):

``inprocess``
    ``omni_triton.stages.qwen3_omni.run_pipeline`` without Triton (thinker -> talker ->
    ChunkSchedule -> code2wav, the chunk and talker settings of the served configs) in as many
    worker processes as the served stages have instances (``qwen3_omni_thinker`` 1,
    ``qwen3_omni_talker`` 2, ``qwen3_omni_code2wav`` 1: 4; ``clients.bench_common.ProcessWorkers``,
    one torch thread each, not threads under one GIL), each a whole pipeline running one request
    at a time; waiting for a free process counts in the times. Also gives the per-stage cost
    (thinker, talker, code2wav seconds).
``transformers``
    the real peer (``--baselines``): transformers' ``Qwen3OmniMoeForConditionalGeneration.generate(...,
    return_audio=True)`` on the same checkpoint, in the same number of processes, greedy with the
    served talker's frame limits; the whole answer at once (TTFT = TTFP = E2E); levels only.
    ``ratios_triton_vs_transformers`` in the JSON.
``triton``
    Triton gRPC streaming to the BLS model ``qwen3_omni`` (``clients.omni_grpc_stream.stream_chat``).
``qwen2_5_omni``
    the same requests to the Qwen2.5-Omni BLS model ``qwen2_5_omni`` (voice Chelsie; token2wav
    decodes the whole utterance, so its TTFP is its E2E; ``docs/qwen2_5_omni.md``).

Unless ``--triton-grpc-url`` is given it starts its own tritonserver with ``qwen3_omni`` on free ports
after the in-process phase and always stops it. torch uses one thread here, as in the stubs.

TTFP vs answer length (issue 13 item 3), in the same run: for each ``--lengths`` value ``L``
(default 16, 64, 256 text tokens, forced with ``min_tokens = max_tokens = L``) and each talker
start, ``async_chunk`` on (the talker speaks while the thinker thinks) and off (it starts when the
thinker has finished), ``--length-requests`` requests one at a time through both paths (Triton:
the ``ASYNC_CHUNK`` input of ``qwen3_omni``). Reported under ``ttfp_vs_length[path][on|off][L]``:
the summary below plus ``audio_before_last_text`` (requests whose first audio chunk came before
the last text delta). ``--lengths ""`` skips it; ``--concurrency ""`` skips the levels.

Per request: ``ttft_ms`` (send -> first non-empty text delta), ``ttfp_ms`` (send -> first audio
chunk), ``e2e_ms`` (send -> end of stream), ``audio_s`` (samples / 24000), ``rtf``
(e2e / audio seconds). Aggregates: mean / p50 / p90 / min / max (``clients.bench_common.describe``),
``rtf_mean`` over the requests that returned audio, and ratios triton / inprocess of the means.
JSON to ``--out``, a table on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import time

from clients.bench_common import ProcessWorkers, closed_loop, describe, instance_count, parse_concurrency

QUESTIONS = ["What is the capital of France?", "Tell me a story about a cat.", "Hello, how are you today?",
             "What is the weather like?"]


def _ms(d: dict) -> dict:
    return {k: None if v is None else round(v * 1000, 1) for k, v in d.items()}


def run_level(run_one, concurrency: int, n: int) -> tuple[list[dict], float]:
    """``n`` requests from ``concurrency`` closed-loop workers; returns (results, wall seconds)."""
    return closed_loop(run_one, concurrency, n, on_error=lambda i, exc: {"error": str(exc)})  # reported, not fatal


def _omni_worker(path: str, settings: dict, bls: dict) -> object:
    """Factory of one in-process baseline process (``ProcessWorkers``): its own thinker, talker
    and code2wav (``omni_triton.stages.qwen3_omni``) with the served talker ``settings`` and the
    BLS chunk parameters ``bls``; the callable ``(i, max_tokens, min_tokens, async_chunk, t0)``
    runs ``run_pipeline`` for question ``i`` and returns its times in seconds from ``t0`` (the
    parent's ``time.perf_counter()`` at the send: the wait for a free process counts)."""
    from omni_triton.stages import qwen3_omni as qo

    thinker = qo.OmniThinker.from_pretrained(path)
    talker = qo.OmniTalker.from_pretrained(path)
    decoder = qo.OmniCode2Wav.from_pretrained(path)
    talker_settings = qo.TalkerSettings(**settings)

    def run(i: int, max_tokens: int, min_tokens: int, async_chunk: bool, t0: float) -> dict:
        ids = thinker.encode(messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
        start = time.perf_counter() - t0
        r = qo.run_pipeline(thinker, talker, decoder, ids,
                            qo.SamplingSettings(max_tokens=max_tokens, min_tokens=min_tokens),
                            "Ethan", talker_settings, first_chunk_frames=int(bls["first_chunk_frames"]),
                            chunk_frames=int(bls["chunk_frames"]), left_context_frames=int(bls["left_context_frames"]),
                            async_chunk=async_chunk)
        e2e = time.perf_counter() - t0
        kinds = [k for k, _ in r.events]

        def late(key):
            v = r.timings.get(key)
            return None if v is None else v + start

        return {"ttft_s": late("ttft_s"), "ttfp_s": late("ttfp_s"), "e2e_s": e2e,
                "audio_s": r.audio.size / decoder.sampling_rate, "thinker_s": r.timings["thinker_s"],
                "talker_s": r.timings.get("talker_s", 0.0), "code2wav_s": r.timings.get("code2wav_s", 0.0),
                "audio_before_last_text": "audio" in kinds and "text" in kinds
                and kinds.index("audio") < len(kinds) - 1 - kinds[::-1].index("text")}

    return run


def _omni_transformers_worker(path: str, settings: dict) -> object:
    """Factory of one process of the real peer: transformers'
    ``Qwen3OmniMoeForConditionalGeneration.generate(..., return_audio=True)`` on the same tiny
    checkpoint with the served talker's greedy settings and frame limits (the reference the stages
    reproduce: tests/unit/test_qwen3_omni.py). Whole answer at once: its TTFT and TTFP are its E2E.
    The callable ``(i, max_tokens, min_tokens, async_chunk, t0)`` ignores ``min_tokens`` and
    ``async_chunk`` (the levels only)."""
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from omni_triton.stages import qwen3_omni as qo

    thinker = qo.OmniThinker.from_pretrained(path)  # its chat template and EOS only
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path).eval()

    def run(i: int, max_tokens: int, min_tokens: int, async_chunk: bool, t0: float) -> dict:
        ids = thinker.encode(messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
        with torch.inference_mode():
            _, wav = model.generate(torch.tensor([ids]), speaker="Ethan", return_audio=True,
                                    thinker_max_new_tokens=max_tokens, thinker_eos_token_id=thinker.eos_token_id,
                                    talker_do_sample=settings["do_sample"],
                                    talker_max_new_tokens=settings["max_frames"],
                                    talker_min_new_tokens=settings["min_frames"])
        e2e = time.perf_counter() - t0
        samples = 0 if wav is None else int(wav.numel())
        return {"ttft_s": e2e, "ttfp_s": e2e if samples else None, "e2e_s": e2e, "audio_s": samples / 24000}

    return run


def baseline_processes(counts: dict[str, int]) -> int:
    """Processes of the in-process baseline: as many as the served stages have instances
    (``qwen3_omni_thinker`` + ``_talker`` + ``_code2wav``), each process a whole pipeline."""
    return sum(counts.values())


def summarize(results: list[dict], wall_s: float) -> dict:
    ok = [r for r in results if "error" not in r]
    out = {"requests": len(results), "ok": len(ok), "errors": sorted({r["error"] for r in results if "error" in r})[:3],
           "wall_s": round(wall_s, 3)}
    for key in ("ttft_s", "ttfp_s", "e2e_s"):
        out[key.replace("_s", "_ms")] = _ms(describe([r[key] for r in ok if r.get(key) is not None]))
    audio = [r["audio_s"] for r in ok]
    out["audio_s_mean"] = round(sum(audio) / len(audio), 3) if audio else None
    rtfs = [r["e2e_s"] / r["audio_s"] for r in ok if r["audio_s"]]  # requests that returned audio
    out["rtf_mean"] = round(sum(rtfs) / len(rtfs), 4) if rtfs else None
    out["with_audio"] = len(rtfs)
    for key in ("thinker_s", "talker_s", "code2wav_s"):
        vals = [r[key] for r in ok if key in r]
        if vals:
            out[key.replace("_s", "_ms_mean")] = round(1000 * sum(vals) / len(vals), 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench_omni.json")
    p.add_argument("--concurrency", default="1,2")
    p.add_argument("--requests", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--triton-grpc-url", help="use this running Triton (no own server)")
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument("--lengths", default="16,64,256", help="answer lengths (tokens) for TTFP vs length; '' skips")
    p.add_argument("--length-requests", type=int, default=3)
    p.add_argument("--baselines", default="inprocess,transformers",
                   help="inprocess (always) and transformers (Qwen3OmniMoeForConditionalGeneration.generate "
                        "with return_audio=True, the real peer; levels only)")
    args = p.parse_args(argv)
    args.baselines = [x.strip() for x in args.baselines.split(",") if x.strip()]
    levels = parse_concurrency(args.concurrency) if args.concurrency.strip() else []
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    import torch

    from clients.omni_grpc_stream import build_chat_inputs, stream_chat
    from omni_triton.checkpoints import qwen3_omni as ckpt
    from omni_triton.serve.repository import available_models, model_parameters

    torch.set_num_threads(1)
    models = available_models()
    bls, tp = model_parameters(models["qwen3_omni"]), model_parameters(models["qwen3_omni_talker"])
    path = ckpt.checkpoint_dir(bls.get("model_name", "qwen3-omni-tiny"))
    sampling = {"temperature": 0, "max_tokens": args.max_tokens}
    report: dict = {"config": {"max_tokens": args.max_tokens, "levels": levels, "requests": args.requests,
                               "lengths": lengths, "length_requests": args.length_requests,
                               "talker_max_frames": int(tp["default_max_frames"]),
                               "talker_min_frames": int(tp["default_min_frames"]),
                               "chunks": [int(bls[k]) for k in ("first_chunk_frames", "chunk_frames",
                                                                "left_context_frames")],
                               "cpus": os.cpu_count()}, "results": {}}

    # 1) in-process: as many worker processes as the served stages have instances (one torch
    #    thread each), each process a whole pipeline running one request at a time
    counts = {stage: instance_count(stage) for stage in ("qwen3_omni_thinker", "qwen3_omni_talker",
                                                         "qwen3_omni_code2wav")}
    report["config"]["instances"] = counts
    n_proc = baseline_processes(counts)
    report["config"]["baseline_processes"] = n_proc
    settings = {"max_frames": int(tp["default_max_frames"]), "min_frames": int(tp["default_min_frames"]),
                "do_sample": tp["do_sample"] == "true", "repetition_penalty": float(tp["repetition_penalty"])}
    default_async = bls.get("async_chunk", "false").lower() == "true"
    workers = ProcessWorkers(n_proc, "clients.bench_omni:_omni_worker", (str(path), settings, dict(bls)))

    def inprocess(i, max_tokens=args.max_tokens, min_tokens=0, async_chunk=default_async):
        return workers.call(i, max_tokens, min_tokens, async_chunk, time.perf_counter())

    def run_path(name, fn, warmup=args.warmup, lengths=lengths):
        for i in range(warmup):  # sequential calls rotate through the baseline's processes
            fn(i)
        for c in levels:
            results, wall = run_level(fn, c, max(args.requests, c))
            report["results"].setdefault(name, {})[str(c)] = summarize(results, wall)
            print(f"{name} c={c}: {json.dumps(report['results'][name][str(c)])}", flush=True)
        for n in lengths:  # TTFP vs answer length, async_chunk on and off side by side
            for mode in ("on", "off"):
                def at_length(i, n=n, mode=mode):
                    return fn(i, max_tokens=n, min_tokens=n, async_chunk=mode == "on")

                results, wall = run_level(at_length, 1,
                                          args.length_requests)
                row = summarize(results, wall)
                row["audio_before_last_text"] = sum(bool(r.get("audio_before_last_text")) for r in results)
                report.setdefault("ttfp_vs_length", {}).setdefault(name, {}).setdefault(mode, {})[str(n)] = row
                print(f"{name} async_chunk={mode} L={n}: ttfp_ms p50 {row['ttfp_ms']['p50']} "
                      f"ttft_ms p50 {row['ttft_ms']['p50']} e2e_ms p50 {row['e2e_ms']['p50']} "
                      f"audio_before_last_text {row['audio_before_last_text']}/{row['ok']}", flush=True)

    try:
        run_path("inprocess", inprocess, max(args.warmup, n_proc) if args.warmup else 0)
    finally:
        workers.close()  # the baseline's processes end before the next part
    if "transformers" in args.baselines:  # the real peer, the levels only (no streaming)
        workers = ProcessWorkers(n_proc, "clients.bench_omni:_omni_transformers_worker", (str(path), settings))
        try:
            run_path("transformers", inprocess, max(args.warmup, n_proc) if args.warmup else 0, lengths=[])
        finally:
            workers.close()

    # 2) Triton gRPC
    server = None
    try:
        url = args.triton_grpc_url
        if not url:
            from omni_triton.paths import cache_dir
            from omni_triton.serve.process import free_port
            from omni_triton.serve.server import TritonServer

            server = TritonServer(["qwen3_omni", "qwen2_5_omni"], http_port=free_port(), grpc_port=free_port(),
                                  metrics_port=free_port(),
                                  log_path=cache_dir() / "logs" / f"bench-omni-{os.getpid()}.log")
            server.start()
            server.wait_ready(timeout=args.ready_timeout)
            url = server.grpc_url

        def triton(i, max_tokens=args.max_tokens, min_tokens=0, async_chunk=None):
            import numpy as np
            import tritonclient.grpc as grpcclient

            from omni_triton.contracts.qwen3_omni import ASYNC_CHUNK

            inputs = build_chat_inputs([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], voice="Ethan",
                                       sampling={**sampling, "max_tokens": max_tokens,
                                                 **({"min_tokens": min_tokens} if min_tokens else {})})
            if async_chunk is not None:
                flag = grpcclient.InferInput(ASYNC_CHUNK, [1], "BOOL")
                flag.set_data_from_numpy(np.array([async_chunk], dtype=bool))
                inputs.append(flag)
            r = stream_chat(url, "qwen3_omni", inputs)
            return {"ttft_s": r.ttft_s, "ttfp_s": r.ttfp_s, "e2e_s": r.total_s,
                    "audio_s": r.audio.size / max(r.sample_rate, 1),
                    "audio_before_last_text": bool(r.audio_arrival_s and r.text_arrival_s
                                                   and r.audio_arrival_s[0] < r.text_arrival_s[-1])}

        run_path("triton", triton)

        def qwen25(i):
            inputs = build_chat_inputs([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], sampling=sampling,
                                       voice="Chelsie")
            r = stream_chat(url, "qwen2_5_omni", inputs)
            return {"ttft_s": r.ttft_s, "ttfp_s": r.ttfp_s, "e2e_s": r.total_s,
                    "audio_s": r.audio.size / max(r.sample_rate, 1)}

        run_path("qwen2_5_omni", qwen25)
    finally:
        if server is not None:
            server.stop()
    ratios = {}
    for c in map(str, levels):
        a, b = report["results"].get("triton", {}).get(c), report["results"]["inprocess"].get(c)
        if a and b:
            ratios[c] = {k: round(a[k]["mean"] / b[k]["mean"], 3) if a[k]["mean"] and b[k]["mean"] else None
                         for k in ("ttft_ms", "ttfp_ms", "e2e_ms")}
    report["ratios_triton_vs_inprocess"] = ratios
    peer = {}
    for c in map(str, levels):
        a, b = report["results"].get("triton", {}).get(c), report["results"].get("transformers", {}).get(c)
        if a and b:
            peer[c] = {k: round(a[k]["mean"] / b[k]["mean"], 3) if a[k]["mean"] and b[k]["mean"] else None
                       for k in ("ttfp_ms", "e2e_ms")}
    report["ratios_triton_vs_transformers"] = peer
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\n{'path':10} {'C':>3} {'TTFT ms':>9} {'TTFP ms':>9} {'E2E ms':>9} {'RTF':>7} {'audio s':>8}")
    for name, lv in report["results"].items():
        for c, s in lv.items():
            print(f"{name:10} {c:>3} {s['ttft_ms']['mean'] or 0:9.1f} {s['ttfp_ms']['mean'] or 0:9.1f} "
                  f"{s['e2e_ms']['mean'] or 0:9.1f} {s['rtf_mean'] or 0:7.3f} {s['audio_s_mean'] or 0:8.2f}")
    for path, modes in report.get("ttfp_vs_length", {}).items():
        for mode, rows in modes.items():
            print(f"TTFP p50 ms vs answer length, {path}, async_chunk={mode}: "
                  + ", ".join(f"L={n}: {r['ttfp_ms']['p50']}" for n, r in rows.items()))
    print(f"ratios triton/inprocess (means): {json.dumps(ratios)}")
    print(f"ratios triton/transformers generate (means; its TTFP is its E2E): {json.dumps(peer)}\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Qwen3-TTS benchmark (issue 11): TTFP, RTF and audio-s/s of the three forms at concurrency
1/4/8, served (Triton gRPC streaming to ``qwen3_tts``) vs in-process, side by side.

Run::

    python -m clients.bench_tts --qwen3-tts --out bench_qwen3_tts.json
    python -m clients.bench_qwen3_tts --concurrency 1,4,8 --requests 8 --max-frames 50
    python -m clients.bench_qwen3_tts --triton-grpc-url 127.0.0.1:8001   # a running server

``inprocess`` runs in the Qwen3-TTS environment (``.venv-qwen3-tts``, a subprocess of this
script with ``--inprocess-only``: qwen-tts needs transformers 4.57.3) with the served parallelism:
one :class:`~omni_triton.stages.qwen3_tts.scheduler.TalkerScheduler` (``max_num_seqs`` of the
talker config: requests share decode steps), one codec (the ``qwen3_tts_code2wav`` instance,
chunks decoded one at a time under a lock; served, concurrent chunks of equal length share a
pass), at most as many pipelines at once as ``qwen3_tts`` has instances (the others wait, as in
Triton's queue), the chunk schedule of the ``qwen3_tts`` config. ``triton``: the served pipeline
over gRPC (``clients.qwen3_tts_grpc``). Both send the same requests (forms ``custom_voice``,
``voice_design``, ``base`` with a precomputed clone prompt; fixed MAX_FRAMES so every path makes
the same frames: greedy decoding of the same weights), from a closed loop of C client threads.
Metrics and table: ``clients.bench_tts`` (``ttfp_ms``, ``e2e_ms``, ``rtf``, audio s/s, and a
real-time player per stream: underrun seconds, continuity); the report adds
``ttfp_p50_c8_over_c1`` per form and path and issue 13's scheduling summary
(``clients.audio_bench_results.scheduling_summary``). Served requests send ``PACED`` (the stream
is played as it comes, so the ``qwen3_tts`` BLS may cut low-water chunks) unless ``--unpaced``.
``--arrivals staggered`` spreads a level's first requests over one request's duration;
``--listen`` makes each client wait until its answer has played to the end before the next
request (C listeners instead of C clients that keep the server saturated; the capacity is then
measured by one more run of the highest level without it); ``--forms`` picks forms.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from clients.audio_bench_results import (
    RequestResult,
    add_load_args,
    all_ratios,
    format_scheduling,
    format_table,
    level_requests,
    listen_to_end,
    scheduling_summary,
    summarize,
)
from clients.bench_common import closed_loop, git_commit, machine_info, parse_concurrency

FORMS = ("custom_voice", "voice_design", "base")
LABEL = {"custom_voice": "q3-custom", "voice_design": "q3-design", "base": "q3-clone"}
TEXTS = ("Good morning, and welcome to the station.", "The next train to the city leaves at half past nine.",
         "Please stand clear of the doors and mind the gap.", "Streaming speech lowers the time to the first sound.")
SPEAKERS = ("vivian", "ryan", "serena")
DESIGNS = ("A deep calm voice.", "A bright young voice, speaking fast.")
REF_SR = 16000
REF = (np.sin(np.arange(REF_SR * 2) * 2 * np.pi * 220 / REF_SR) * 0.3).astype(np.float32)
REF_TEXT = "Some words here."


def request_kwargs(form: str, i: int, max_frames: int, prompt: bytes | None) -> dict:
    """Request ``i`` of a form: text, voice/description/prompt (cycled), MAX_FRAMES."""
    kw = dict(text=TEXTS[i % len(TEXTS)], task=form, max_frames=max_frames)
    if form == "custom_voice":
        kw["voice"] = SPEAKERS[i % len(SPEAKERS)]
    elif form == "voice_design":
        kw["instructions"] = DESIGNS[i % len(DESIGNS)]
    else:
        kw["voice_prompt"] = prompt
    return kw


def _levels(results_by_path: dict) -> dict:
    """TTFP p50 at the highest level over the lowest, per path."""
    out = {}
    for path, levels in results_by_path.items():
        cs = sorted(levels, key=int)
        lo, hi = levels[cs[0]]["ttfp_ms"]["p50"], levels[cs[-1]]["ttfp_ms"]["p50"]
        out[path] = {f"ttfp_p50_c{cs[-1]}_over_c{cs[0]}": round(hi / lo, 3) if lo and hi else None}
    return out


def _run_levels(run_one, levels, n_requests, warmup, log, arrivals: str = "burst", listen: bool = False,
                per_client: int = 0) -> dict:
    """Each level's closed loop (``clients.bench_common.closed_loop``). ``arrivals`` "staggered":
    the C clients' first requests are spread over one request's duration (the mean E2E of the
    first level run; with ``listen``, E2E + the wait to the end of playback), so new requests
    arrive while others stream, as users who did not all click at once; "burst": they are sent
    at once. A level runs :func:`clients.audio_bench_results.level_requests` requests
    (``n_requests``, at least ``per_client`` per client).

    ``listen``: ``run_one(i, listen=True)`` waits, after its stream ended, until a real-time
    player would have played it to the end, so C clients are C listeners (each asks for the next
    answer when the last one has been heard) rather than C clients that send the next request the
    moment a stream ends, which keeps a server faster than real time saturated. Their throughput
    is then bounded by playback, so the highest level is run once more without listening and its
    audio s/s recorded as the level's ``capacity_audio_s_per_s`` (what the target's "faster than
    real time at that load" is judged by)."""
    fail = lambda i, e: RequestResult(index=i, error=f"{type(e).__name__}: {e}"[:300])  # noqa: E731
    for w in range(warmup):
        run_one(10_000 + w)
    out = {}
    for c in levels:
        n = level_requests(n_requests, c, per_client)
        first = out[str(levels[0])] if out else None
        cycle = (first["e2e_ms"]["mean"] + (first.get("listen_wait_ms_mean") or 0.0)) / 1000.0 \
            if first and first["e2e_ms"]["mean"] else 0.0
        stagger = cycle if arrivals == "staggered" and c > 1 else 0.0
        waits: list[float] = []
        one = (lambda i, waits=waits: run_one(i, listen=True, waits=waits)) if listen else run_one
        results, wall = closed_loop(one, c, n, stagger_s=stagger, on_error=fail)
        out[str(c)] = summarize(results, wall)
        out[str(c)]["arrivals"], out[str(c)]["stagger_s"] = arrivals, round(stagger, 3)
        out[str(c)]["listen"] = listen
        if listen:
            out[str(c)]["listen_wait_ms_mean"] = round(sum(waits) / len(waits) * 1000.0, 1) if waits else 0.0
        log(f"    c={c}: TTFP p50 {out[str(c)]['ttfp_ms']['p50']} ms, RTF {out[str(c)]['rtf_mean']}, "
            f"{out[str(c)]['throughput_audio_s_per_s']} audio s/s")
    if listen and levels:
        c = levels[-1]
        results, wall = closed_loop(run_one, c, level_requests(n_requests, c, per_client), on_error=fail)
        out[str(c)]["capacity_audio_s_per_s"] = summarize(results, wall)["throughput_audio_s_per_s"]
        log(f"    c={c} without listening (capacity): {out[str(c)]['capacity_audio_s_per_s']} audio s/s")
    return out


def _load(args) -> tuple:
    """:func:`_run_levels`' load arguments ``(arrivals, listen, per_client)`` from the parsed
    options (``add_load_args``)."""
    return (getattr(args, "arrivals", "burst"), getattr(args, "listen", False),
            getattr(args, "requests_per_client", 0))


def _listen(r: RequestResult, t0: float, listen: bool, waits: list | None) -> None:
    """With ``listen``: :func:`clients.audio_bench_results.listen_to_end`."""
    if listen:
        listen_to_end(r, t0, waits)


# ------------------------------------------------------------------ in-process (Qwen3-TTS env)


def inprocess(args) -> dict:
    """The in-process path (needs qwen_tts): ``{form: {level: summary}}``."""
    import torch

    from omni_triton.paths import REPO_ROOT, model_dir
    from omni_triton.stages.chunking import ChunkedDecoder
    from omni_triton.stages.qwen3_tts.engine import Qwen3TtsCodec, Qwen3TtsForm
    from omni_triton.stages.qwen3_tts.request import Qwen3TtsRequest
    from omni_triton.stages.qwen3_tts.scheduler import TalkerScheduler
    from omni_triton.stages.qwen3_tts.streaming import ContextSchedule

    torch.set_num_threads(1)
    models = {m: REPO_ROOT / "model_repository" / m for m in ("qwen3_tts", "qwen3_tts_talker")}
    talker_p, bls_p = _parameters(models["qwen3_tts_talker"]), _parameters(models["qwen3_tts"])
    chunks = tuple(int(bls_p[k]) for k in ("first_chunk_frames", "chunk_frames", "left_context_frames"))
    root = model_dir("qwen3-tts-tiny")
    forms = {f: Qwen3TtsForm(root / f) for f in FORMS}
    codec, codec_lock = Qwen3TtsCodec(root / "base"), threading.Lock()
    sched = TalkerScheduler(forms, int(talker_p.get("max_num_seqs", "8")))
    pipelines = threading.Semaphore(_instances(models["qwen3_tts"]))
    prompt = forms["base"].voice_prompt(REF, REF_SR, REF_TEXT, False)

    def decode(c, left):
        with codec_lock:
            return codec.decode([c], [left])[0]

    def one(form):
        def run_one(i, listen=False, waits=None):
            kw = request_kwargs(form, i, args.max_frames, None)
            req = Qwen3TtsRequest(form, kw["text"], "Auto", kw.get("voice"), kw.get("instructions"),
                                  prompt if form == "base" else None, args.max_frames)
            r, t0 = RequestResult(index=i), time.perf_counter()
            with pipelines:
                import queue

                frames: queue.Queue = queue.Queue()
                sched.submit(req, frames.put, lambda: False, lambda reason, error=None: frames.put(None))
                ctx = prompt.ref_code if form == "base" else None
                dec = ChunkedDecoder(ContextSchedule(*chunks, context=0 if ctx is None else len(ctx)), decode)
                if ctx is not None:
                    dec.push(ctx)

                def account(pcms):
                    for pcm in pcms:
                        r.on_audio(time.perf_counter() - t0, pcm.size, codec.sample_rate)

                while (f := frames.get()) is not None:
                    account(dec.push(f[None]))
                account(dec.flush())
            r.sample_rate, r.e2e_s = codec.sample_rate, time.perf_counter() - t0
            _listen(r, t0, listen, waits)
            return r
        return run_one

    out = {}
    for form in getattr(args, "forms", FORMS):
        print(f"  in-process {form}", file=sys.stderr, flush=True)
        out[LABEL[form]] = _run_levels(one(form), args.levels, args.requests, args.warmup,
                                       lambda m: print(m, file=sys.stderr, flush=True),
                                       *_load(args))
    sched.close()
    return out


def _parameters(model_path: Path) -> dict:
    """config.pbtxt string parameters (read without protobuf: the Qwen3-TTS env has no tritonclient)."""
    import re

    text = (model_path / "config.pbtxt").read_text()
    return dict(re.findall(r'key:\s*"([^"]+)"\s*value\s*\{\s*string_value:\s*"([^"]*)"', text))


def _instances(model_path: Path) -> int:
    import re

    m = re.search(r"count:\s*(\d+)", (model_path / "config.pbtxt").read_text())
    return int(m.group(1)) if m else 1


# ------------------------------------------------------------------------------------ served


def served(args, grpc_url: str) -> dict:
    from clients.qwen3_tts_grpc import stream_qwen3_tts, voice_prompt
    from omni_triton.contracts.qwen3_tts import qwen3_tts_inputs

    prompt, _ = voice_prompt(grpc_url, REF, REF_SR, REF_TEXT)

    def one(form):
        def run_one(i, listen=False, waits=None):
            kw = request_kwargs(form, i, args.max_frames, prompt)
            t0 = time.perf_counter()
            res = stream_qwen3_tts(grpc_url, qwen3_tts_inputs(kw.pop("text"), **kw, paced=args.paced),
                                   timeout_s=args.timeout)
            r = RequestResult(index=i, e2e_s=time.perf_counter() - t0)
            for chunk, t in zip(res.chunks, res.arrival_s, strict=True):  # the real-time player, from the arrival times
                r.on_audio(t, chunk.size, res.sample_rate)
            r.sample_rate = res.sample_rate or r.sample_rate
            _listen(r, t0, listen, waits)
            return r
        return run_one

    out = {}
    for form in getattr(args, "forms", FORMS):
        print(f"  Triton gRPC {form}", file=sys.stderr, flush=True)
        out[LABEL[form]] = _run_levels(one(form), args.levels, args.requests, args.warmup,
                                       lambda m: print(m, file=sys.stderr, flush=True),
                                       *_load(args))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench_qwen3_tts.json")
    p.add_argument("--concurrency", default="1,4,8")
    p.add_argument("--requests", type=int, default=8, help="requests per level (at least the concurrency)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--max-frames", type=int, default=50, help="MAX_FRAMES of every request (12.5 frames/s)")
    p.add_argument("--paths", default="inprocess,triton")
    p.add_argument("--triton-grpc-url", help="use this running Triton (no own server)")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--unpaced", dest="paced", action="store_false",
                   help="served requests without PACED (default: PACED, as a client playing in real time)")
    p.add_argument("--forms", default=",".join(FORMS), help="forms to run (custom_voice,voice_design,base)")
    add_load_args(p)
    p.add_argument("--inprocess-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.levels = parse_concurrency(args.concurrency)
    args.forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    if not args.forms or any(f not in FORMS for f in args.forms):
        p.error(f"--forms must be a subset of {','.join(FORMS)}")
    if args.inprocess_only:  # the subprocess in the Qwen3-TTS environment
        Path(args.out).write_text(json.dumps(inprocess(args)))
        return 0
    paths = [x.strip() for x in args.paths.split(",") if x.strip()]
    results: dict = {}
    t_start = time.perf_counter()
    if "inprocess" in paths:  # first, never overlapping the served runs
        from omni_triton.paths import REPO_ROOT

        tmp = Path(args.out).with_suffix(".inprocess.json")
        cmd = [str(REPO_ROOT / ".venv-qwen3-tts/bin/python"), "-m", "clients.bench_qwen3_tts", "--inprocess-only",
               "--out", str(tmp), "--concurrency", args.concurrency, "--requests", str(args.requests),
               "--warmup", str(args.warmup), "--max-frames", str(args.max_frames), "--arrivals", args.arrivals,
               "--forms", ",".join(args.forms), "--requests-per-client", str(args.requests_per_client)] + \
            (["--listen"] if args.listen else [])
        subprocess.run(cmd, check=True, cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        for model, levels in json.loads(tmp.read_text()).items():
            results.setdefault(model, {})["inprocess"] = levels
        tmp.unlink()
    server = None
    try:
        if "triton" in paths:
            grpc_url = args.triton_grpc_url
            if not grpc_url:
                from omni_triton.serve.process import free_port
                from omni_triton.serve.server import TritonServer

                server = TritonServer(["qwen3_tts"], http_port=free_port(), grpc_port=free_port(),
                                      metrics_port=free_port())
                server.start()
                server.wait_ready(timeout=900)
                grpc_url = server.grpc_url
            for model, levels in served(args, grpc_url).items():
                results.setdefault(model, {})["triton"] = levels
    finally:
        if server is not None:
            server.stop()
    ratios = all_ratios(results)
    report = {"config": {"command": " ".join(["python", "-m", "clients.bench_qwen3_tts", *(argv or sys.argv[1:])]),
                         "levels": args.levels, "requests": args.requests,
                         "requests_per_level": {str(c): level_requests(args.requests, c, args.requests_per_client)
                                                for c in args.levels}, "max_frames": args.max_frames,
                         "arrivals": args.arrivals, "listen": args.listen,
                         "machine": machine_info(), "git_commit": git_commit(),
                         "notes": ["in-process and served share the CPU cores and run one after another",
                                   "tiny random weights: the figures are serving overhead and batching, not "
                                   "the real model's speed",
                                   "underrun/continuity: a real-time player per stream fed at the chunks' arrival "
                                   "times (omni_triton.runtime.playback.PlaybackClock)",
                                   "served requests send PACED (low-water chunks, as the frontend's streamed "
                                   "speech) unless --unpaced" if args.paced else "served requests without PACED"]},
              "results": results, "ratios": ratios,
              "ttfp_scaling": {m: _levels(paths_) for m, paths_ in results.items()},
              "scheduling": scheduling_summary(results),
              "wall_s": round(time.perf_counter() - t_start, 1)}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(format_table(results, ratios))
    print("\n" + format_scheduling(report["scheduling"]))
    print("\nTTFP p50 at the highest concurrency / at the lowest:")
    for m, paths_ in report["ttfp_scaling"].items():
        print(f"  {m:<10} " + "  ".join(f"{path}: {list(v.values())[0]}" for path, v in paths_.items()))
    print(f"\nwrote {args.out}; {report['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

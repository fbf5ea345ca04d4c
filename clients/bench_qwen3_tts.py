"""Qwen3-TTS benchmark (issues 11, 29): TTFP, RTF and audio-s/s of the three forms at concurrency
1/4/8, served (Triton gRPC streaming to ``qwen3_tts``) vs two in-process baselines, side by side.

Run::

    python -m clients.bench_qwen3_tts --out bench_qwen3_tts.json                 # full (see docs/benchmarks.md)
    python -m clients.bench_qwen3_tts --quick                                    # < 3 min
    python -m clients.bench_qwen3_tts --triton-grpc-url 127.0.0.1:8001 --paths triton   # a running server

Paths (one after the other, never overlapping; same requests, same concurrency levels):

``inprocess``
    the project's stage code without Triton (talker scheduler + chunked codec, the ``qwen3_tts``
    config's chunk schedule; :func:`project_worker`), in as many worker processes as the served
    pipeline computes in (the talker + code2wav instances, :func:`served_processes`; one torch
    thread each, ``clients.proc_pool``), requests spread over them (fewest open first).
``qwen_tts``
    the real peer: the ``qwen-tts`` package's own ``generate_custom_voice`` /
    ``generate_voice_design`` / ``generate_voice_clone`` (its generate loop and decode,
    :func:`package_worker`), same process count, one request at a time per process (the next
    waits, as in a server's queue). It does not stream: its TTFP is its E2E.
``triton``
    the served pipeline over gRPC (``clients.qwen3_tts_grpc``), **unpaced** by default (generated
    as fast as the pipeline can, the ratios come from unpaced runs); ``--paced`` sends ``PACED``
    (opt-in real-time pacing, low-water chunks).

The in-process paths run in the Qwen3-TTS environment (``.venv-qwen3-tts``: qwen-tts needs its
own transformers), in a subprocess of this script with ``--inprocess-only``. Requests: forms
``custom_voice``, ``voice_design``, ``base`` with a precomputed clone prompt; fixed MAX_FRAMES so
every path makes the same frames (greedy decoding of the same weights), from a closed loop of C
client threads (saturating: each sends its next request when the last one ended).

Metrics and table: ``clients.bench_tts`` (``ttfp_ms``, ``e2e_ms``, ``rtf``, audio s/s, and a
real-time player per stream: underrun seconds, continuity); the report adds
``ttfp_p50_c8_over_c1`` per form and path, ``targets`` (issue 29: the served TTFP p50 grows at
most 2x from c=1 to c=8 with saturating clients: target, measured, met), ratios served /
in-process and served / ``qwen_tts`` per level, and issue 13's scheduling summary
(``clients.audio_bench_results.scheduling_summary``). ``--arrivals staggered`` spreads a level's
first requests over one request's duration; ``--listen`` makes each client wait until its answer
has played to the end before the next request (C listeners; the capacity is then measured by one
more run of the highest level without it); ``--forms`` picks forms.
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
    TTFP_GROWTH_TARGET,
    RequestResult,
    add_load_args,
    all_ratios,
    compare,
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


def _stage_config() -> tuple[tuple[int, int, int], int, int]:
    """The served pipeline's chunk schedule ``(first_chunk_frames, chunk_frames,
    left_context_frames)``, the talker's ``max_num_seqs`` and the ``qwen3_tts`` instances, read
    from the model repository (the in-process path copies them)."""
    from omni_triton.paths import REPO_ROOT

    models = {m: REPO_ROOT / "model_repository" / m for m in ("qwen3_tts", "qwen3_tts_talker")}
    talker_p, bls_p = _parameters(models["qwen3_tts_talker"]), _parameters(models["qwen3_tts"])
    chunks = tuple(int(bls_p[k]) for k in ("first_chunk_frames", "chunk_frames", "left_context_frames"))
    return chunks, int(talker_p.get("max_num_seqs", "8")), _instances(models["qwen3_tts"])  # type: ignore[return-value]


def served_processes() -> int:
    """Processes that compute in the served pipeline: the instances of ``qwen3_tts_talker`` and
    ``qwen3_tts_code2wav`` (each a Triton Python stub with one torch thread; the ``qwen3_tts``
    BLS instances only forward tensors). The in-process baselines get as many processes."""
    from clients.bench_common import instance_count

    return sum(instance_count(m) for m in ("qwen3_tts_talker", "qwen3_tts_code2wav"))


def _load_forms():
    from omni_triton.paths import model_dir
    from omni_triton.stages.qwen3_tts.engine import Qwen3TtsForm

    root = model_dir("qwen3-tts-tiny")
    forms = {f: Qwen3TtsForm(root / f) for f in FORMS}
    return root, forms, forms["base"].voice_prompt(REF, REF_SR, REF_TEXT, False)


def _request(form: str, i: int, max_frames: int, prompt):
    from omni_triton.stages.qwen3_tts.request import Qwen3TtsRequest

    kw = request_kwargs(form, i, max_frames, None)
    return Qwen3TtsRequest(form, kw["text"], "Auto", kw.get("voice"), kw.get("instructions"),
                           prompt if form == "base" else None, max_frames)


def project_worker(max_frames: int):
    """Worker of path ``inprocess`` (one process of a :class:`clients.proc_pool.ProcessPool`, in the
    Qwen3-TTS environment): the served pipeline's own stage code without Triton: one
    :class:`~omni_triton.stages.qwen3_tts.scheduler.TalkerScheduler` (``max_num_seqs`` of the talker
    config: the process's requests share decode steps), one codec (chunks decoded one at a time),
    at most ``qwen3_tts``-instances pipelines at once, the chunk schedule of the ``qwen3_tts`` config.

    Returns ``handle((form, i)) -> {"audio": [(perf_counter s, samples)], "sample_rate": Hz,
    "end": perf_counter s}`` (one entry per decoded chunk, at the time it was decoded)."""
    import queue

    from omni_triton.stages.chunking import ChunkedDecoder
    from omni_triton.stages.qwen3_tts.engine import Qwen3TtsCodec
    from omni_triton.stages.qwen3_tts.scheduler import TalkerScheduler
    from omni_triton.stages.qwen3_tts.streaming import ContextSchedule

    chunks, max_num_seqs, instances = _stage_config()
    root, forms, prompt = _load_forms()
    codec, codec_lock = Qwen3TtsCodec(root / "base"), threading.Lock()
    sched = TalkerScheduler(forms, max_num_seqs)
    pipelines = threading.Semaphore(instances)

    def decode(c, left):
        with codec_lock:
            return codec.decode([c], [left])[0]

    def handle(payload):
        form, i = payload
        req, audio = _request(form, i, max_frames, prompt), []
        with pipelines:
            frames: queue.Queue = queue.Queue()
            sched.submit(req, frames.put, lambda: False, lambda reason, error=None: frames.put(None))
            ctx = prompt.ref_code if form == "base" else None
            dec = ChunkedDecoder(ContextSchedule(*chunks, context=0 if ctx is None else len(ctx)), decode)
            if ctx is not None:
                dec.push(ctx)
            while (f := frames.get()) is not None:
                audio += [(time.perf_counter(), pcm.size) for pcm in dec.push(f[None])]
            audio += [(time.perf_counter(), pcm.size) for pcm in dec.flush()]
        return {"audio": audio, "sample_rate": codec.sample_rate, "end": time.perf_counter()}

    return handle


def package_worker(max_frames: int):
    """Worker of path ``qwen_tts`` (the real peer, in the Qwen3-TTS environment): the ``qwen-tts``
    package's own ``generate_custom_voice`` / ``generate_voice_design`` / ``generate_voice_clone``
    (its generate loop and decode: :meth:`~omni_triton.stages.qwen3_tts.engine.Qwen3TtsForm.reference`),
    one request at a time per process, same request and ``max_new_tokens`` = MAX_FRAMES. The
    package does not stream, so its first audio is its whole clip (TTFP = E2E).

    Returns ``handle((form, i))`` as :func:`project_worker`'s (one entry: the whole clip)."""
    _, forms, prompt = _load_forms()

    def handle(payload):
        form, i = payload
        pcm = forms[form].reference(_request(form, i, max_frames, prompt))
        t = time.perf_counter()
        return {"audio": [(t, int(pcm.size))], "sample_rate": 24000, "end": t}

    return handle


def to_result(i: int, t0: float, answer: dict) -> RequestResult:
    """A worker's answer (:func:`project_worker`) as the client's :class:`RequestResult`:
    chunk times relative to ``t0`` (the client's ``perf_counter`` at the send; worker and client
    share the clock, :func:`clients.proc_pool.shared_clock`)."""
    r = RequestResult(index=i)
    for t, samples in answer["audio"]:
        r.on_audio(t - t0, samples, answer["sample_rate"])
    r.sample_rate, r.e2e_s = answer["sample_rate"], answer["end"] - t0
    return r


#: in-process paths: worker factory and whether one process serves several requests at once
INPROCESS_PATHS = {"inprocess": (project_worker, True), "qwen_tts": (package_worker, False)}


def inprocess(args) -> dict:
    """The in-process paths (needs qwen_tts), each in ``args.processes`` worker processes
    (:class:`clients.proc_pool.ProcessPool`, one torch thread each), one path after the other:
    ``{form label: {path: {level: summary}}}``."""
    from clients.proc_pool import ProcessPool, shared_clock

    if not shared_clock():
        raise RuntimeError("perf_counter is not the machine-wide monotonic clock: worker times are not comparable")
    out: dict = {}
    for path in [p for p in args.paths if p in INPROCESS_PATHS]:
        factory, concurrent = INPROCESS_PATHS[path]
        print(f"  {path}: {args.processes} processes", file=sys.stderr, flush=True)
        with ProcessPool(args.processes, factory, (args.max_frames,), concurrent=concurrent) as pool:
            for form in args.forms:
                def run_one(i, listen=False, waits=None, form=form):
                    t0 = time.perf_counter()
                    r = to_result(i, t0, pool.call((form, i), timeout_s=args.timeout))
                    _listen(r, t0, listen, waits)
                    return r

                print(f"  {path} {form}", file=sys.stderr, flush=True)
                out.setdefault(LABEL[form], {})[path] = _run_levels(
                    run_one, args.levels, args.requests, args.warmup,
                    lambda m: print(m, file=sys.stderr, flush=True), *_load(args))
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


def peer_ratios(results: dict) -> dict:
    """``{model: {level: {"triton_vs_qwen_tts": compare(triton, qwen_tts)}}}`` for the levels both
    ran (:func:`clients.audio_bench_results.compare`: served / peer; the peer's TTFP is its E2E)."""
    out: dict = {}
    for model, paths in results.items():
        served, peer = paths.get("triton", {}), paths.get("qwen_tts", {})
        for c in sorted(set(served) & set(peer), key=int):
            out.setdefault(model, {}).setdefault(c, {})["triton_vs_qwen_tts"] = compare(served[c], peer[c])
    return out


def targets(ttfp_scaling: dict, listen: bool) -> dict:
    """Issue 29's target for this benchmark: with saturating clients, the served path's TTFP p50
    grows at most :data:`~clients.audio_bench_results.TTFP_GROWTH_TARGET` times from the lowest
    concurrency level to the highest (c=1 -> c=8 with the default levels).

    Args:
        ttfp_scaling: ``{model: {path: {"ttfp_p50_c<hi>_over_c<lo>": ratio or None}}}`` (:func:`_levels`).
        listen: the clients were listeners (``--listen``); the target is about saturating
            clients, so ``met`` is then ``None``.

    Returns:
        ``{"ttfp_p50_growth:<model>": {"target": "<= 2.0", "measured": ratio, "levels": "c8<-c1",
        "clients": "saturating" | "listening", "met": bool or None, "same_machine": {path:
        ratio}}}`` (``met`` None as well when not measured). ``same_machine`` holds the in-process
        paths' growth in the same run: the bound this machine puts on the same work without
        Triton (``inprocess``: the same stage code; ``qwen_tts``: the package, one request per
        process), to read a missed target against.
    """
    out = {}
    for model, paths in ttfp_scaling.items():
        if "triton" not in paths:
            continue
        (name, measured), = paths["triton"].items()
        met = None if listen or measured is None else measured <= TTFP_GROWTH_TARGET
        out[f"ttfp_p50_growth:{model}"] = {"target": f"<= {TTFP_GROWTH_TARGET}", "measured": measured,
                                           "levels": name.removeprefix("ttfp_p50_").replace("_over_", "<-"),
                                           "clients": "listening" if listen else "saturating", "met": met,
                                           "same_machine": {path: next(iter(v.values()))
                                                            for path, v in paths.items() if path in INPROCESS_PATHS}}
    return out


ALL_PATHS = ("inprocess", "qwen_tts", "triton")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench_qwen3_tts.json")
    p.add_argument("--concurrency", default="1,4,8")
    p.add_argument("--requests", type=int, default=8, help="requests per level (at least the concurrency)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--max-frames", type=int, default=50, help="MAX_FRAMES of every request (12.5 frames/s)")
    p.add_argument("--paths", default=",".join(ALL_PATHS),
                   help="inprocess (the project's stage code), qwen_tts (the package's own generate), triton")
    p.add_argument("--processes", type=int, default=0,
                   help="worker processes of each in-process path (0: as many as the served pipeline "
                        "computes in: the talker + code2wav instances)")
    p.add_argument("--triton-grpc-url", help="use this running Triton (no own server)")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--paced", action="store_true",
                   help="served requests send PACED (real-time pacing, opt-in; default: unpaced, as fast "
                        "as the pipeline can: the ratios come from unpaced runs)")
    p.add_argument("--forms", default=",".join(FORMS), help="forms to run (custom_voice,voice_design,base)")
    p.add_argument("--quick", action="store_true",
                   help="short form (< 3 min): --concurrency 1,8 --requests 8 --max-frames 24 --forms custom_voice "
                        "--warmup 1")
    add_load_args(p)
    p.add_argument("--inprocess-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.concurrency, args.requests, args.max_frames, args.forms, args.warmup = "1,8", 8, 24, "custom_voice", 1
    args.levels = parse_concurrency(args.concurrency)
    args.forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    if not args.forms or any(f not in FORMS for f in args.forms):
        p.error(f"--forms must be a subset of {','.join(FORMS)}")
    args.paths = [x.strip() for x in args.paths.split(",") if x.strip()]
    if not args.paths or any(x not in ALL_PATHS for x in args.paths):
        p.error(f"--paths must be a subset of {','.join(ALL_PATHS)}")
    if args.inprocess_only:  # the subprocess in the Qwen3-TTS environment
        Path(args.out).write_text(json.dumps(inprocess(args)))
        return 0
    args.processes = args.processes or served_processes()
    results: dict = {}
    t_start = time.perf_counter()
    if set(args.paths) & set(INPROCESS_PATHS):  # first, never overlapping the served runs
        from omni_triton.paths import REPO_ROOT

        tmp = Path(args.out).with_suffix(".inprocess.json")
        cmd = [str(REPO_ROOT / ".venv-qwen3-tts/bin/python"), "-m", "clients.bench_qwen3_tts", "--inprocess-only",
               "--out", str(tmp), "--concurrency", args.concurrency, "--requests", str(args.requests),
               "--warmup", str(args.warmup), "--max-frames", str(args.max_frames), "--arrivals", args.arrivals,
               "--forms", ",".join(args.forms), "--requests-per-client", str(args.requests_per_client),
               "--paths", ",".join(x for x in args.paths if x in INPROCESS_PATHS),
               "--processes", str(args.processes), "--timeout", str(args.timeout)] + \
            (["--listen"] if args.listen else [])
        subprocess.run(cmd, check=True, cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        for model, by_path in json.loads(tmp.read_text()).items():
            results.setdefault(model, {}).update(by_path)
        tmp.unlink()
    server = None
    try:
        if "triton" in args.paths:
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
    for model, levels in peer_ratios(results).items():
        for c, pairs in levels.items():
            ratios.setdefault(model, {}).setdefault(c, {}).update(pairs)
    scaling = {m: _levels(paths_) for m, paths_ in results.items()}
    report = {"config": {"command": " ".join(["python", "-m", "clients.bench_qwen3_tts", *(argv or sys.argv[1:])]),
                         "levels": args.levels, "requests": args.requests,
                         "requests_per_level": {str(c): level_requests(args.requests, c, args.requests_per_client)
                                                for c in args.levels}, "max_frames": args.max_frames,
                         "arrivals": args.arrivals, "listen": args.listen, "paced": args.paced,
                         "inprocess_processes": args.processes,
                         "machine": machine_info(), "git_commit": git_commit(),
                         "notes": ["in-process and served share the CPU cores and run one after another",
                                   f"in-process paths: {args.processes} worker processes each (the served "
                                   "pipeline's talker + code2wav instances), one torch thread per process",
                                   "inprocess: the project's stage code (talker scheduler batching the "
                                   "process's requests, chunked codec); qwen_tts: the qwen-tts package's own "
                                   "generate_* (one request at a time per process, not streamed: TTFP = E2E)",
                                   "tiny random weights: the figures are serving overhead and batching, not "
                                   "the real model's speed",
                                   "underrun/continuity: a real-time player per stream fed at the chunks' arrival "
                                   "times (omni_triton.runtime.playback.PlaybackClock)",
                                   "served requests send PACED (opt-in real-time pacing)" if args.paced else
                                   "served requests unpaced (the default): generated as fast as possible"]},
              "results": results, "ratios": ratios,
              "ttfp_scaling": scaling,
              "targets": targets(scaling, args.listen),
              "scheduling": scheduling_summary(results),
              "wall_s": round(time.perf_counter() - t_start, 1)}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(format_table(results, ratios))
    print("\n" + format_scheduling(report["scheduling"]))
    print("\nTTFP p50 at the highest concurrency / at the lowest:")
    for m, paths_ in report["ttfp_scaling"].items():
        print(f"  {m:<10} " + "  ".join(f"{path}: {list(v.values())[0]}" for path, v in paths_.items()))
    print("\nTargets:")
    for name, t in report["targets"].items():
        print(f"  {name}: {t['measured']} ({t['levels']}, {t['clients']} clients; target {t['target']}): "
              f"{'met' if t['met'] else 'not met' if t['met'] is False else 'n/a'}; same machine without "
              f"Triton: {t['same_machine']}")
    print(f"\nwrote {args.out}; {report['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Transcription benchmark: RTF and throughput, served vs. in-process, and the WER of a Piper
round trip.

Run (it starts its own tritonserver and frontend: hold the machine's server lock)::

    flock /tmp/omni-server.lock python -m clients.bench_transcription --out bench_transcription.json
    python -m clients.bench_transcription --models pocketsphinx --concurrency 1,8 --requests 16
    python -m clients.bench_transcription --frontend-url http://127.0.0.1:9000 --paths served

The corpus: :data:`SENTENCES`, spoken once by Piper in this process (``PiperSpeaker``, the
voice the ``piper`` model uses by default) before anything is measured; clip ``i`` of a level is
``corpus[i % len]``. For each model (``pocketsphinx``: real CMU Sphinx weights; ``whisper``: the
tiny random checkpoint of ``omni-triton prepare``, whose text is noise) and each concurrency
level ``C`` it sends ``N = max(--requests, C)`` requests from a closed loop of ``C`` threads
(``bench_common.closed_loop``) through two paths, one after the other, never overlapping:

``inprocess``
    the same model without Triton or HTTP, in as many worker processes as the served model has
    instances (:func:`baseline_processes`; ``bench_common.ProcessWorkers``, spawned, one torch
    thread each), one request at a time per process, on the clip already at 16 kHz:
    ``pocketsphinx.Decoder`` (``process_raw`` of the whole utterance, as one segment) for
    ``pocketsphinx``; transformers ``WhisperForConditionalGeneration.generate`` (greedy, English,
    ``transcribe``) with its ``WhisperProcessor`` features for ``whisper``. Waiting for a free
    process counts in the latency.
``served``
    the user path: ``client.audio.transcriptions.create(model=..., file=<the Piper WAV at 22.05
    kHz>)`` with the official SDK (httpx), ``response_format="json"``: the upload, its decode,
    resampling and VAD segmentation in the frontend, the Triton model, the JSON answer.

Metrics (per request): ``latency_ms`` from just before the request is sent (in-process: the
call) to the answer; ``audio_s`` the clip's seconds; ``rtf`` = latency / audio seconds (< 1:
faster than real time). Per path, model and level (successful requests): ``latency_ms``
``{mean, p50, p90, min, max}``, ``rtf_mean`` / ``rtf_p50``, ``wall_s`` (first send to last
answer), ``throughput_audio_s_per_s`` = audio seconds transcribed / ``wall_s``,
``requests_per_s``, ``errors``, and ``wer``: the word error rate (``jiwer.wer``) of every
answer against its sentence, both normalised by :func:`normalize` (lower case, no punctuation,
single spaces): the Piper -> ASR round trip. Ratios ``ratios.<model>.<C>`` served / in-process
for ``latency_p50``, ``rtf_mean`` (> 1: the served path is slower) and ``throughput`` (< 1: it
transcribes less audio per second).

Fairness: this process and the baselines use one thread per library pool
(``OMP/MKL/OPENBLAS_NUM_THREADS=1``, torch one intra-op thread), as the Triton stubs do. The
served path pays its HTTP upload, decode and VAD: that is what it is measured for. No timing is
asserted anywhere: this is a benchmark, not a test.
"""
# ruff: noqa: E402 - the thread-count variables are set before any import that starts a pool
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import io
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from clients.bench_common import (
    ProcessWorkers,
    closed_loop,
    describe,
    git_commit,
    instance_count,
    machine_info,
    package_versions,
    parse_concurrency,
    percentile,
    ratio,
    stop_all_on_sigterm,
)

#: what Piper speaks: short English sentences of everyday words (in CMU Sphinx's dictionary)
SENTENCES = (
    "The capital of France is Paris.",
    "I would like a cup of coffee with milk.",
    "The weather is cold and windy today.",
    "Please open the door and turn on the light.",
    "We will meet at the station at nine.",
    "She reads a book every night before bed.",
    "The children played in the park after school.",
    "How much does this ticket cost?",
)
MODELS = ("pocketsphinx", "whisper")
PATHS = ("inprocess", "served")
SAMPLE_RATE = 16000
PACKAGES = ("pocketsphinx", "transformers", "torch", "openai", "jiwer", "piper-tts", "onnxruntime")


# ------------------------------------------------------------------------------ pure parts
def normalize(text: str) -> str:
    """What WER compares: lower case, punctuation removed, whitespace collapsed (jiwer's
    transforms), e.g. ``"The capital, Paris."`` -> ``"the capital paris"``."""
    import jiwer

    return str(jiwer.Compose([jiwer.ToLowerCase(), jiwer.RemovePunctuation(), jiwer.RemoveMultipleSpaces(),
                              jiwer.Strip()])(text))


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float | None:
    """Corpus WER (``jiwer.wer``: substitutions + deletions + insertions over reference words,
    all pairs together) after :func:`normalize`; ``None`` without pairs. An empty hypothesis
    counts every reference word as deleted.

    Raises:
        ValueError: the two sequences differ in length.
    """
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    if not references:
        return None
    import jiwer

    refs = [normalize(r) for r in references]
    hyps = [normalize(h) for h in hypotheses]
    return round(float(jiwer.wer(refs, hyps)), 4)


@dataclass
class TranscriptionResult:
    """One request: its clip's ``reference`` sentence and ``audio_s`` (seconds), the
    ``latency_s`` from send to answer and the answer ``text`` (None with ``error``)."""

    index: int
    reference: str
    audio_s: float
    latency_s: float | None = None
    text: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.latency_s is not None and self.text is not None

    @property
    def rtf(self) -> float | None:
        """Real-time factor: latency / audio seconds."""
        return self.latency_s / self.audio_s if self.ok and self.latency_s is not None and self.audio_s > 0 else None


def summarize(results: Sequence[TranscriptionResult], wall_s: float) -> dict:
    """One level's aggregates (module docstring), times in ms rounded to 0.01."""
    ok = [r for r in results if r.ok]
    lat = [r.latency_s * 1000 for r in ok if r.latency_s is not None]
    rtfs = [r.rtf for r in ok if r.rtf is not None]
    audio = sum(r.audio_s for r in ok)

    def rnd(x: float | None, nd: int = 2) -> float | None:
        return None if x is None else round(float(x), nd)

    return {
        "requests": len(results), "ok": len(ok), "errors": len(results) - len(ok),
        "error_messages": sorted({r.error for r in results if r.error})[:5],
        "latency_ms": {k: rnd(v) for k, v in describe(lat).items()},
        "rtf_mean": rnd(sum(rtfs) / len(rtfs), 4) if rtfs else None,
        "rtf_p50": rnd(percentile(rtfs, 50), 4),
        "audio_s_total": rnd(audio, 3),
        "wall_s": rnd(wall_s, 3),
        "throughput_audio_s_per_s": rnd(audio / wall_s, 3) if wall_s > 0 and ok else None,
        "requests_per_s": rnd(len(ok) / wall_s, 3) if wall_s > 0 and ok else None,
        "wer": word_error_rate([r.reference for r in ok], [r.text or "" for r in ok]),
    }


def compare(served: dict, base: dict) -> dict:
    """Served / in-process at one level: ``latency_p50`` and ``rtf_mean`` (> 1: served slower),
    ``throughput`` (< 1: served transcribes less audio per second)."""
    return {"latency_p50": ratio(served["latency_ms"]["p50"], base["latency_ms"]["p50"]),
            "rtf_mean": ratio(served["rtf_mean"], base["rtf_mean"]),
            "throughput": ratio(served["throughput_audio_s_per_s"], base["throughput_audio_s_per_s"])}


def all_ratios(results: dict) -> dict:
    """``{model: {C: compare(served, inprocess)}}`` wherever both paths ran the level."""
    out: dict = {}
    for model, paths in results.items():
        served, base = paths.get("served", {}), paths.get("inprocess", {})
        for c in sorted(set(served) & set(base), key=int):
            out.setdefault(model, {})[c] = compare(served[c], base[c])
    return out


def format_table(results: dict, ratios: dict) -> str:
    """The readable summary printed at the end."""
    lines = [f"{'model':<13} {'path':<10} {'C':>3} {'ok':>4} {'p50 ms':>9} {'RTF':>7} {'audio s/s':>10} {'WER':>6}"]
    for model, paths in results.items():
        for path, levels in paths.items():
            for c, s in sorted(levels.items(), key=lambda kv: int(kv[0])):
                f = lambda x, nd=3: "-" if x is None else f"{x:.{nd}f}"  # noqa: E731
                lines.append(f"{model:<13} {path:<10} {c:>3} {s['ok']:>4} {f(s['latency_ms']['p50'], 1):>9} "
                             f"{f(s['rtf_mean']):>7} {f(s['throughput_audio_s_per_s'], 2):>10} {f(s['wer']):>6}")
    for model, levels in ratios.items():
        for c, r in levels.items():
            lines.append(f"{model} c={c}: served/inprocess latency p50 x{r['latency_p50']}, RTF x{r['rtf_mean']}, "
                         f"throughput x{r['throughput']}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ the corpus
@dataclass
class Clip:
    """One spoken sentence: ``text``, the Piper ``wav`` file (its own rate), the same audio as
    16-bit PCM bytes at 16 kHz (``pcm16``, for the in-process paths) and its ``seconds``."""

    text: str
    wav: bytes
    pcm16: bytes
    seconds: float


def piper_corpus(sentences: Sequence[str], voice: str | None = None, noise: bool = True) -> list[Clip]:
    """Each sentence spoken by Piper in this process (the ``piper`` model's voices, one
    onnxruntime thread), as WAV and as 16 kHz PCM (``omni_triton.media.audio.resample``).

    ``noise``: VITS' sampling noise at the voice's own scales (the default, as served: every run
    differs a little, and a recogniser may hear one word differently from run to run); False sets
    both noise scales to 0, so the clip is the same on every run (what a test that asserts a
    transcript needs)."""
    import numpy as np
    import soundfile as sf

    from omni_triton.media.audio import float_to_pcm16, resample
    from omni_triton.paths import model_dir
    from omni_triton.stages.piper import PiperSpeaker, discover_voices

    quiet = {} if noise else {"noise_scale": 0.0, "noise_w_scale": 0.0}
    speaker = PiperSpeaker(discover_voices(model_dir("piper-voices")), intra_op_threads=1, **quiet)
    clips = []
    for text in sentences:
        parts = list(speaker.synthesize(text, voice=voice))
        audio = np.concatenate([p.audio for p in parts]).astype(np.float32)
        rate = parts[0].sample_rate
        buf = io.BytesIO()
        sf.write(buf, audio, rate, format="WAV", subtype="PCM_16")
        clips.append(Clip(text, buf.getvalue(), float_to_pcm16(resample(audio, rate, SAMPLE_RATE)),
                          len(audio) / rate))
    return clips


# ------------------------------------------------------------------------------ in-process baselines
def _pocketsphinx_worker() -> Callable[[bytes], str]:
    """Factory of a pocketsphinx baseline process: one ``pocketsphinx.Decoder`` (the wheel's US
    English model, 16 kHz); its callable decodes 16-bit PCM as one utterance -> the text."""
    from pocketsphinx import Decoder

    decoder = Decoder(samprate=SAMPLE_RATE, logfn=os.devnull)

    def run(pcm16: bytes) -> str:
        decoder.start_utt()
        decoder.process_raw(pcm16, full_utt=True)
        decoder.end_utt()
        hyp = decoder.hyp()
        return hyp.hypstr if hyp is not None else ""

    return run


def _whisper_worker(folder: str) -> Callable[[bytes], str]:
    """Factory of a whisper baseline process: transformers ``WhisperForConditionalGeneration`` and
    ``WhisperProcessor`` from the prepared ``folder``; its callable turns 16-bit PCM into
    log-mel features and runs ``generate`` (greedy, ``language="en"``, ``task="transcribe"``)."""
    import numpy as np
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    torch.set_num_threads(1)
    processor = WhisperProcessor.from_pretrained(folder)
    model = WhisperForConditionalGeneration.from_pretrained(folder).eval()

    def run(pcm16: bytes) -> str:
        audio = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32767.0
        features = processor(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
        with torch.inference_mode():
            ids = model.generate(features, language="en", task="transcribe", do_sample=False)
        return str(processor.batch_decode(ids, skip_special_tokens=True)[0])

    return run


def baseline_processes(model: str) -> int:
    """Processes of the in-process path: what runs the served model's requests at once, its
    instances times its ``workers`` parameter (pocketsphinx: 1 x 2 decoder threads); a BLS model:
    the summed instances of the stages it calls (``depends_on``; whisper: encoder + decoder)."""
    from omni_triton.serve.repository import available_models, model_parameters

    params = model_parameters(available_models()[model])
    depends = [d.strip() for d in params.get("depends_on", "").split(",") if d.strip()]
    if depends:
        return sum(instance_count(d) for d in depends)
    return instance_count(model) * max(1, int(params.get("workers") or 1))


def baseline_factory(model: str) -> tuple[str, tuple]:
    """``ProcessWorkers`` factory and arguments of ``model``'s in-process path."""
    if model == "pocketsphinx":
        return "clients.bench_transcription:_pocketsphinx_worker", ()
    from omni_triton.paths import model_dir
    from omni_triton.serve.repository import available_models, model_parameters

    params = model_parameters(available_models()[model])
    asset = (params.get("assets") or "").split(",")[0].strip()
    if not asset:
        for dep in (d.strip() for d in params.get("depends_on", "").split(",") if d.strip()):
            asset = (model_parameters(available_models()[dep]).get("assets") or "").split(",")[0].strip()
            if asset:
                break
    if not asset:
        raise RuntimeError(f"{model}: no prepared folder named in its config ('assets')")
    return "clients.bench_transcription:_whisper_worker", (str(model_dir(asset)),)


# ------------------------------------------------------------------------------ one request
RunOne = Callable[[int], TranscriptionResult]


def inprocess_run_one(workers: ProcessWorkers, clips: Sequence[Clip]) -> RunOne:
    """Request ``i``: clip ``i % len`` on a free baseline process."""
    def run(i: int) -> TranscriptionResult:
        clip = clips[i % len(clips)]
        r = TranscriptionResult(i, clip.text, clip.seconds)
        t0 = time.perf_counter()
        try:
            r.text = workers.call(clip.pcm16)
            r.latency_s = time.perf_counter() - t0
        except Exception as exc:
            r.error = f"{type(exc).__name__}: {exc}"[:300]
        return r
    return run


def served_run_one(client, model: str, clips: Sequence[Clip]) -> RunOne:
    """Request ``i``: clip ``i % len``'s WAV through ``client.audio.transcriptions.create``."""
    def run(i: int) -> TranscriptionResult:
        clip = clips[i % len(clips)]
        r = TranscriptionResult(i, clip.text, clip.seconds)
        t0 = time.perf_counter()
        try:
            answer = client.audio.transcriptions.create(model=model, file=(f"clip{i}.wav", clip.wav, "audio/wav"))
            r.text = answer.text
            r.latency_s = time.perf_counter() - t0
        except Exception as exc:
            r.error = f"{type(exc).__name__}: {exc}"[:300]
        return r
    return run


def run_levels(run_one: RunOne, levels: Sequence[int], requests: int, warmup: int, log: Callable[..., None],
               label: str) -> dict:
    """``warmup`` untimed requests, then each level (``max(requests, C)`` requests, closed loop)."""
    for i in range(warmup):
        run_one(i)
    out = {}
    for c in levels:
        n = max(requests, c)
        res, wall = closed_loop(run_one, c, n)
        s = summarize(res, wall)
        s["concurrency"] = c
        s["per_request"] = [asdict(r) for r in res]
        out[str(c)] = s
        log(f"  {label:<24} c={c:<2} n={n:<3} ok={s['ok']:<3} p50 {s['latency_ms']['p50']} ms  "
            f"RTF {s['rtf_mean']}  {s['throughput_audio_s_per_s']} audio s/s  WER {s['wer']}  ({wall:.1f} s)")
    return out


# ------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench_transcription.json", help="JSON output file")
    p.add_argument("--models", default=",".join(MODELS), help="comma separated: pocketsphinx,whisper")
    p.add_argument("--paths", default=",".join(PATHS), help="comma separated: inprocess,served")
    p.add_argument("--concurrency", default="1,8", help="comma separated levels")
    p.add_argument("--requests", type=int, default=16, help="requests per level (at least the concurrency)")
    p.add_argument("--warmup", type=int, default=2, help="untimed requests per path and model")
    p.add_argument("--voice", default=None, help="Piper voice of the corpus (default: the model's)")
    p.add_argument("--frontend-url", help="use this running frontend (no own stack)")
    p.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, s")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="server start-up timeout, s")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    for name, allowed in ((models, MODELS), (paths, PATHS)):
        for x in name:
            if x not in allowed:
                raise SystemExit(f"unknown {x!r}; choose from {', '.join(allowed)}")
    levels = parse_concurrency(args.concurrency)
    log = lambda *a: print(*a, flush=True)  # noqa: E731
    started = stop_all_on_sigterm()
    t_start = time.perf_counter()
    results: dict = {}
    errors: list[str] = []
    stack: dict = {}
    processes: dict[str, int] = {}

    log(f"corpus: {len(SENTENCES)} sentences spoken by Piper")
    clips = piper_corpus(SENTENCES, args.voice)
    corpus = [{"text": c.text, "seconds": round(c.seconds, 3)} for c in clips]
    try:
        if "inprocess" in paths:
            for model in models:
                processes[model] = baseline_processes(model)
                factory, fargs = baseline_factory(model)
                log(f"in-process {model}: {processes[model]} process(es)")
                with ProcessWorkers(processes[model], factory, fargs) as workers:
                    results.setdefault(model, {})["inprocess"] = run_levels(
                        inprocess_run_one(workers, clips), levels, args.requests, args.warmup, log,
                        f"{model} inprocess")
        if "served" in paths:
            import openai

            frontend_url = args.frontend_url
            if not frontend_url:
                from omni_triton.paths import cache_dir
                from omni_triton.prepare import prepare
                from omni_triton.serve.process import free_port
                from omni_triton.serve.server import Frontend, TritonServer

                prepare(models, log=lambda m: log(f"  prepare: {m}"))
                logs, tag = cache_dir() / "logs", f"bench-transcription-{os.getpid()}"
                t = time.perf_counter()
                server = TritonServer(models, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                                      log_path=logs / f"{tag}-tritonserver.log")
                started.append(server)
                log(f"starting tritonserver ({', '.join(server.models)})")
                server.start()
                server.wait_ready(timeout=args.ready_timeout)
                stack["triton_ready_s"] = round(time.perf_counter() - t, 2)
                frontend = Frontend(server.grpc_url, port=free_port(), models=server.models,
                                    log_path=logs / f"{tag}-frontend.log", admin_key=server.admin_key,
                                    extra_args=["--max-inflight", str(8 * max(levels))])
                started.append(frontend)
                frontend.start()
                frontend.wait_ready()
                frontend_url = frontend.url
                stack["triton_log"] = str(server.log_path)
            log(f"OpenAI frontend at {frontend_url}")
            client = openai.OpenAI(base_url=f"{frontend_url}/v1", api_key=os.environ.get("OPENAI_API_KEY", "unused"),
                                   timeout=args.timeout, max_retries=0)
            try:
                for model in models:
                    results.setdefault(model, {})["served"] = run_levels(
                        served_run_one(client, model, clips), levels, args.requests, args.warmup, log,
                        f"{model} served")
            finally:
                client.close()
    except Exception as exc:  # keep what was measured; report the failure
        errors.append(f"{type(exc).__name__}: {exc}"[:2000])
        print(f"error: {errors[-1]}", file=sys.stderr)
    finally:
        for proc in reversed(started):
            proc.stop()

    ratios = all_ratios(results)
    machine = machine_info()
    machine["loadavg_at_end"] = os.getloadavg()
    report = {
        "config": {
            "command": " ".join(["python", "-m", "clients.bench_transcription",
                                 *(argv if argv is not None else sys.argv[1:])]),
            "models": models, "paths": paths, "concurrency": levels,
            "requests_per_level": {str(c): max(args.requests, c) for c in levels},
            "warmup_requests": args.warmup, "corpus": corpus, "baseline_processes": processes,
            "load_pattern": "closed loop: C worker threads, each sends its next request when the previous one ended",
            "machine": machine, "versions": package_versions(PACKAGES), "commit": git_commit(),
            "notes": ["the paths run one after the other on the same cores, never together",
                      "whisper is a tiny random checkpoint: its WER measures nothing but the plumbing",
                      "timings on a shared machine are indicative only"],
        },
        "results": results, "ratios": ratios, "stack": stack,
        "wall_s": round(time.perf_counter() - t_start, 2), "errors": errors,
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    print()
    print(format_table(results, ratios))
    print(f"\nwrote {args.out}; total wall time {report['wall_s']:.1f} s")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

"""TTS serving benchmark: TTFP, latency, RTF and throughput, served vs. in-process.

Run::

    python -m clients.bench_tts --out bench_tts.json
    python -m clients.bench_tts --models piper --concurrency 1,4 --requests 8
    python -m clients.bench_tts --frontend-url http://127.0.0.1:9000 --triton-grpc-url 127.0.0.1:8001
    python -m clients.bench_tts --paths frontend --concurrency 1,8 --out ttfp.json   # issue 13 item 4
    python -m clients.bench_tts --models piper,csm --concurrency 1,8 --requests 4 --scheduling deadline \
        --paths inprocess,transformers,frontend,whole       # issue 29's targets, short (< 3 min)
    python -m clients.bench_tts --pacing realtime --listen --paths frontend   # paced listeners
    python -m clients.bench_tts --qwen3-tts   # the Qwen3-TTS forms (clients/bench_qwen3_tts.py)

In the spirit of vLLM-Omni's TTS serving benchmarks and CosyVoice's Triton client (which report
RTF). For each model (``piper``, ``csm``, ``qwen3_omni``: ``MODEL_PATHS``) and each concurrency level ``C`` it sends
``N = max(--requests, C)`` streaming requests from a closed loop of ``C`` worker threads (each
worker sends its next request as soon as its previous one finished) through up to five paths, one
after another, never overlapping (they share the same CPU cores):

``inprocess``
    the project's own pipeline without Triton, in as many worker processes as the served path
    has (``clients.bench_common.ProcessWorkers``, spawned, one torch thread each: not threads
    sharing one GIL), each process running one request at a time; waiting for a free process
    counts in TTFP and E2E. ``PiperSpeaker.synthesize`` (sentence streaming) for ``piper``, in
    ``workers`` x instances processes (2); for ``csm`` the streamed in-process variant of
    ``omni_triton.stages.csm`` (``CodecTalker.stream`` -> ``ChunkSchedule`` with the chunk
    parameters of the ``csm`` config -> ``CodecDecoder.decode`` per chunk, i.e. the streamed part of
    ``synthesize_reference`` without its extra one-shot full decode, which the served path does
    not do either) in ``csm_talker`` + ``csm_code2wav`` instances processes (3), each a whole
    talker + decoder (:func:`baseline_processes`). Chunk times are taken in the worker against
    the parent's send time (``time.perf_counter``: ``CLOCK_MONOTONIC``, one clock for all processes).
``transformers`` (``csm`` only)
    the real peer: transformers' ``CsmForConditionalGeneration.generate(output_audio=True)`` on
    the same tiny checkpoint, greedy, with the talker's frame cap for the text and its minimum
    frames (so every path makes the same frames), in the same number of processes; one clip per
    request, not streamed (its TTFP is its E2E).
``triton``
    Triton gRPC streaming straight to the model (``clients.tts_grpc_stream``: its
    ``build_inputs`` and the same stream handling as ``stream_tts``, plus the final response time).
``frontend``
    the user path: ``POST /v1/audio/speech`` on the OpenAI frontend with ``stream: true``,
    ``response_format: "pcm"`` (16-bit mono; samples = bytes / 2, rate from ``X-Sample-Rate``),
    read with httpx streaming. ``qwen3_omni``: ``POST /v1/chat/completions`` with ``modalities: ["text",
    "audio"]``, ``audio.format: "pcm16"``, streamed (SSE ``delta.audio.data``).
    Streams are sent unpaced (``stream_pacing: "none"``: as fast as the server makes them, the
    default of the API) unless ``--pacing realtime`` (``stream_pacing: "realtime"``; on the
    ``triton`` path ``PACED: true``): the ratios and targets are for unpaced runs; the paced form
    is for continuity and listener studies (with ``--listen``).
``whole``
    the same frontend request with ``stream: false`` (the whole clip in one response), at
    ``--whole-levels`` (default c=1): the non-streamed E2E the streamed one is compared with.

Scheduling (issue 13 item 4, docs/scheduling.md): with its own stack the served paths run once
per ``--scheduling`` mode, each on a fresh server: ``deadline`` (the configs as shipped: Piper and
the talkers step their open requests earliest playback deadline first) and ``fifo``
(``OMNI_TRITON_SCHEDULING=fifo`` in tritonserver's environment: each stage's plain dispatch (whole
requests in arrival order, PACED ignored; the rest of the configs as shipped: docs/scheduling.md
"The knobs")). Results are keyed
``<path>:<mode>`` (``frontend:fifo``); ``scheduling`` in the JSON compares them.

Targets (issue 29, ``targets`` in the JSON and the last table: each target, measured value, limit,
``met`` true / false / null when it does not apply; ``audio_bench_results.audio_targets``), all from
the one run, on ``frontend:deadline``: at c=1 streamed E2E p50 <= 1.2 x the ``whole`` E2E p50;
Piper's TTFP p50 <= 0.2 x its ``whole`` E2E p50; TTFP p50 growth c=1 -> c=8 <= 2 (saturating
clients, or listening ones with ``--listen``); continuity >= 0.95 at the highest level where the
pipeline's capacity (audio s/s, from the fifo run where there is one) covers its listeners.

Every path gets ``--warmup`` untimed requests per model before its first level.
Unless ``--frontend-url``/``--triton-grpc-url`` are given, the benchmark starts its own
tritonserver (``piper``, ``csm``) and frontend on free ports (``omni_triton.serve.server``) after
the in-process phase, and always stops them (``try``/``finally``).

Fairness: this process sets torch's intra-op threads to 1 (and ``OMP/MKL/OPENBLAS_NUM_THREADS=1``)
as the Triton stubs do, and Piper's onnxruntime sessions use one intra-op thread as in the
``piper`` model. Differences that remain are listed under ``config.notes`` in the JSON.

Metrics (per request):

- ``ttfp_ms``: time to first audio packet, milliseconds, from just before the request is sent
  (in-process: the call) to the arrival of the first non-empty audio chunk.
- ``e2e_ms``: end-to-end latency, milliseconds, from the same start to the end of the stream (last
  byte / final response / generator exhausted).
- ``audio_s``: seconds of audio received = samples / sample rate (Hz).
- ``rtf``: real-time factor = processing time / audio duration = ``e2e_ms / 1000 / audio_s``
  (dimensionless; < 1 is faster than real time).
- ``underrun_s`` / ``longest_stall_ms``: a real-time player per stream
  (``omni_triton.runtime.playback.PlaybackClock``, vLLM-Omni's audio metrics: playback starts at
  the first chunk, no jitter buffer): total seconds it stalled because a chunk arrived after the
  audio before it had finished playing, and the longest single stall.

Aggregates (per model, path, concurrency; over successful requests):

- ``ttfp_ms`` / ``e2e_ms``: ``mean``, ``p50``, ``p90`` (percentiles by linear interpolation
  between closest ranks, as ``numpy.percentile``'s default), ``min``, ``max``; milliseconds.
- ``rtf_mean``: mean of the per-request RTFs (dimensionless).
- ``audio_s_mean``: mean audio seconds per request; ``audio_s_total``: their sum.
- ``wall_s``: wall-clock seconds from the first request sent to the last one finished.
- ``throughput_audio_s_per_s``: ``audio_s_total / wall_s``, audio seconds generated per
  wall-clock second (dimensionless; "x real time" for the whole server).
- ``requests_per_s``: successful requests / ``wall_s``.
- ``errors``: failed requests (their messages are in ``error_messages``).
- ``underrun_s_total`` / ``underrun_s_max``: sum / max of the per-request underrun seconds;
  ``stalled_streams``: requests with any underrun; ``continuity_rate``: share of requests with no
  stall over 100 ms (``CONTINUITY_STALL_S``).

Scheduling summary (``scheduling.<model>.<path:mode>``): TTFP p50/p90 per level,
``ttfp_p50_growth`` (p50 at the highest level / at the lowest), underrun seconds and continuity
per level, ``faster_than_real_time`` (the audio seconds made per second, by the fifo run where
there is one, at least the highest level's listeners) and ``target_met``
(growth <= 2 and, when faster than real time, no underrun at the highest level).

Ratios (``ratios.<model>.<C>``), served path over baseline at the same concurrency:
``frontend_vs_inprocess``, ``triton_vs_inprocess``, ``frontend_vs_triton``, ``frontend_vs_whole``
(streamed / non-streamed), ``frontend_vs_transformers``, ``whole_vs_transformers``,
``inprocess_vs_transformers`` (``audio_bench_results.RATIO_PAIRS``), each with
``ttfp_mean``, ``ttfp_p50``, ``e2e_mean``, ``e2e_p50``, ``rtf_mean`` (> 1: the served path is
slower) and ``throughput`` (served / baseline audio-seconds per second; < 1: the served path
generates less audio per second).

No timing is asserted anywhere: this is a benchmark, not a test.
"""
# ruff: noqa: E402 - the thread-count variables are set before any import that starts a pool
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before torch/numpy start their pools; as the stubs get

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from clients.audio_bench_results import (  # noqa: F401 - re-exported for the tests and callers
    BASELINES,
    PATHS,
    RATIO_PAIRS,
    TTFP_GROWTH_TARGET,
    RequestResult,
    _fmt,  # number formats (progress lines, JSON)
    _round,
    add_load_args,
    all_ratios,
    audio_targets,
    compare,
    format_scheduling,
    format_table,
    level_requests,
    listen_to_end,
    path_label,
    scheduling_summary,
    split_label,
    summarize,
)
from clients.bench_common import (
    ProcessWorkers,
    closed_loop,
    format_targets,
    git_commit,
    instance_count,
    machine_info,
    package_versions,
    parse_concurrency,
    stop_all_on_sigterm,
)
from omni_triton.contracts import speech
from omni_triton.contracts.csm import FrameBudget
from omni_triton.runtime.playback import CONTINUITY_STALL_S
from omni_triton.runtime.scheduling import SCHEDULING_ENV

#: The served pipelines and the paths each can be measured on. To add a pipeline (e.g. a
#: Qwen3-TTS BLS): a row here, its texts (``TEXTS`` is shared) and voices in ``VOICES``, and for a
#: non-speech frontend API a ``frontend_run_one`` branch (``qwen3_omni`` uses chat completions).
MODEL_PATHS = {
    "piper": ("inprocess", "triton", "frontend", "whole"),
    "csm": ("inprocess", "transformers", "triton", "frontend", "whole"),
    "qwen3_omni": ("frontend", "whole"),  # POST /v1/chat/completions, text + pcm16 audio
}
MODELS = tuple(MODEL_PATHS)
#: ``--scheduling`` modes: ``deadline`` = the configs as shipped (``scheduling: "deadline"``),
#: ``fifo`` = ``OMNI_TRITON_SCHEDULING=fifo`` in tritonserver's environment: each stage's plain dispatch
#: (whole requests in arrival order, PACED ignored; the rest of the configs as shipped:
#: docs/scheduling.md "The knobs"; ``SCHEDULING_HELP``).
SCHEDULING_MODES = ("deadline", "fifo")
#: packages whose versions go into the report
TTS_PACKAGES = ("torch", "transformers", "onnxruntime", "piper-tts", "tritonclient", "httpx", "numpy",
                "nvidia-pytriton", "fastapi", "uvicorn")

#: Fixed English texts, several sentences each (~7-8 s of Piper audio). Request ``i`` uses
#: ``TEXTS[i % len(TEXTS)]``.
TEXTS = (
    "The quick brown fox jumps over the lazy dog. This is a test of the text to speech system. "
    "The weather is nice today, and the sky is a clear and brilliant blue.",
    "Good morning, and welcome to the station. The next train to the city leaves at half past "
    "nine. Please stand clear of the doors and mind the gap.",
    "She sells sea shells by the sea shore. Peter Piper picked a peck of pickled peppers. "
    "How many pickled peppers did Peter Piper pick?",
    "Streaming speech lowers the time to the first sound. Each sentence is sent as soon as it "
    "is ready. The listener hears the start while the rest is still being made.",
)

#: Voices cycled per request: ``VOICES[model][i % len]``.
VOICES = {"piper": ("joe",), "csm": ("0", "1", "2", "3"), "qwen3_omni": ("Ethan", "Chelsie", "Aiden")}
#: Text tokens the omni thinker may generate per request (its spoken answer follows them).
OMNI_MAX_TOKENS = 32
#: PCM rate of omni's streamed pcm16 chat audio (Hz; the model's ``sample_rate`` parameter).
OMNI_SAMPLE_RATE = 24000


# ------------------------------------------------------------------------------ results
# RequestResult, summaries, ratios and the table: clients/audio_bench_results.py (shared with
# clients/bench_qwen3_tts.py)


# ---------------------------------------------------------------------------- load generator

#: ``run_one(index, text, voice) -> RequestResult`` (fills ttfp/e2e relative to its own start).
RunOne = Callable[[int, str, str], RequestResult]


def run_level(run_one: RunOne, model: str, concurrency: int, n: int,
              stagger_s: float = 0.0) -> tuple[list[RequestResult], float]:
    """``n`` requests from ``concurrency`` closed-loop worker threads (first sends spread over
    ``stagger_s`` seconds, ``closed_loop``); returns results, wall s."""
    voices = VOICES[model]

    def one(i: int) -> RequestResult:
        return run_one(i, TEXTS[i % len(TEXTS)], voices[i % len(voices)])

    def failed(i: int, exc: Exception) -> RequestResult:  # recorded: one bad request must not end the run
        return RequestResult(index=i, error=f"{type(exc).__name__}: {exc}"[:300])

    return closed_loop(one, concurrency, n, on_error=failed, stagger_s=stagger_s)


def _set_torch_threads() -> dict:
    import torch

    torch.set_num_threads(1)
    return {"torch_num_threads": torch.get_num_threads(),
            "torch_num_interop_threads": torch.get_num_interop_threads()}


def _events_result(index: int, events: list[tuple[float, int, int]], e2e_s: float) -> RequestResult:
    """A :class:`RequestResult` from a worker's ``(t_s, samples, sample_rate)`` per chunk and its
    end ``e2e_s`` (seconds from the parent's start of the request)."""
    r = RequestResult(index=index)
    for t, n, sr in events:
        r.on_audio(t, n, sr)
    r.e2e_s = e2e_s
    return r


def _timed_events(t0: float, chunks: Iterable[tuple[int, int]]) -> tuple[list, float]:
    """``(events, e2e_s)`` of a chunk iterator, timed from ``t0`` (the parent's
    ``time.perf_counter()``: the same clock in every process, ``bench_common.ProcessWorkers``)."""
    events = [(time.perf_counter() - t0, n, sr) for n, sr in chunks]
    return events, time.perf_counter() - t0


def _piper_worker() -> Callable:
    """Factory of a Piper baseline process (``ProcessWorkers``): ``PiperSpeaker`` loaded as the
    ``piper`` model loads it (one intra-op thread); its callable ``(text, voice, t0) -> (events,
    e2e_s)`` synthesises sentence by sentence."""
    from omni_triton.paths import model_dir
    from omni_triton.stages.piper import PiperSpeaker, discover_voices

    speaker = PiperSpeaker(discover_voices(model_dir("piper-voices")), intra_op_threads=1)

    def run(text: str, voice: str, t0: float) -> tuple[list, float]:
        return _timed_events(t0, ((s.audio.size, s.sample_rate) for s in speaker.synthesize(text, voice=voice)))

    return run


def _codec_worker(codec: dict) -> Callable:
    """Factory of a ``csm`` baseline process: the streamed in-process pipeline (:class:`CodecStream`)
    with the chunk parameters and frame limits ``codec`` (:func:`codec_settings`) of the served
    models; callable ``(text, voice, t0) -> (events, e2e_s)``."""
    stream = CodecStream(codec)

    def run(text: str, voice: str, t0: float) -> tuple[list, float]:
        return _timed_events(t0, stream.stream(text, int(voice)))

    return run


def _transformers_csm_worker(codec: dict) -> Callable:
    """Factory of a process of the real peer of ``csm``: transformers'
    ``CsmForConditionalGeneration.generate(output_audio=True)`` on the same tiny checkpoint (greedy,
    ``max_new_tokens`` = the talker's frame cap for the text, the served talker's minimum frames,
    so every path makes the same frames), one clip per call, no streaming: its TTFP is its E2E.
    Loaded as ``CodecTalker.from_pretrained`` loads it (transformers 5.19 drops the depth
    decoder's generation config on load; ``_restore_depth_decoder_generation_config``)."""
    from transformers import LogitsProcessorList

    from omni_triton.contracts.csm import FrameBudget
    from omni_triton.paths import model_dir
    from omni_triton.stages.csm import CodecTalker
    from omni_triton.stages.csm.talker import _MinFramesLogitsProcessor

    talker = CodecTalker.from_pretrained(model_dir("csm-tiny"))
    model = talker.model
    rate = int(model.config.codec_config.sampling_rate)
    budget = FrameBudget(codec["max_frames_per_char"], codec["min_max_frames"])

    def run(text: str, voice: str, t0: float) -> tuple[list, float]:
        import torch

        with torch.inference_mode():
            audio = model.generate(**talker.prompt_ids(text, int(voice)), max_new_tokens=budget.for_text(text),
                                   do_sample=False, output_audio=True,
                                   logits_processor=LogitsProcessorList(
                                       [_MinFramesLogitsProcessor(codec["min_frames"], talker.codebook_eos_id)]))
        t = time.perf_counter() - t0
        return [(t, int(sum(a.numel() for a in audio)), rate)], time.perf_counter() - t0

    return run


class CodecStream:
    """The ``csm`` pipeline in one process: talker stream -> ChunkedDecoder (the BLS model's chunk
    loop) -> Mimi decode per chunk, with the chunk parameters and frame limits the served models
    use (``codec``: :func:`codec_settings`; ``FrameBudget``: the talker's cap for a text)."""

    def __init__(self, codec: dict):
        from omni_triton.paths import model_dir
        from omni_triton.stages.csm import CodecDecoder, CodecTalker

        path = model_dir("csm-tiny")
        self.talker = CodecTalker.from_pretrained(path)
        self.decoder = CodecDecoder.from_pretrained(path)
        self.sampling_rate = self.decoder.sampling_rate
        self.first_chunk, self.chunk = codec["first_chunk_frames"], codec["chunk_frames"]
        self.left_context = codec["left_context_frames"]
        self.low_water_s = codec["low_water_ms"] / 1000.0  # the tts config's low_water_ms
        self.min_frames = codec["min_frames"]
        self.budget = FrameBudget(codec["max_frames_per_char"], codec["min_max_frames"])

    def stream(self, text: str, speaker: int) -> Iterator[tuple[int, int]]:
        """``(samples, sample_rate)`` per decoded chunk, exactly the BLS model's schedule."""
        from omni_triton.stages.chunking import ChunkedDecoder, ChunkSchedule

        def decode(codes, left):
            return self.decoder.decode([codes], [left])[0]

        chunked = ChunkedDecoder(ChunkSchedule(self.first_chunk, self.chunk, self.left_context,
                                               low_water_s=self.low_water_s), decode)
        sr = self.sampling_rate
        for new in self.talker.stream(text, speaker, self.min_frames, self.budget.for_text(text)):
            for pcm in chunked.push(new):
                yield pcm.size, sr
        if chunked.total:
            for pcm in chunked.flush():
                yield pcm.size, sr


class Baseline:
    """An in-process baseline in ``processes`` worker processes (``ProcessWorkers``, one torch
    thread each): a request holds one process for its whole run, and waiting for a free process
    counts in its TTFP and E2E, as queueing in Triton does. ``factory``: ``_piper_worker``,
    ``_codec_worker`` or ``_transformers_csm_worker`` (``"clients.bench_tts:<name>"``)."""

    def __init__(self, processes: int, factory: str, args: tuple = ()):
        self.workers = ProcessWorkers(processes, factory, args)

    def run_one(self, index: int, text: str, voice: str) -> RequestResult:
        events, e2e = self.workers.call(text, voice, time.perf_counter())
        return _events_result(index, events, e2e)

    def close(self) -> None:
        self.workers.close()


def baseline_processes(model: str) -> int:
    """Processes of a model's in-process baselines: as many as the served path runs for it.
    ``piper``: its ``workers`` x instances (each process one synthesis at a time, as each served
    worker thread); ``csm``: the ``csm_talker`` plus ``csm_code2wav`` instances (each process a
    whole talker + decoder: the baseline's requests never wait for a shared decoder)."""
    if model == "piper":
        return piper_parallelism()
    return instance_count("csm_talker") + instance_count("csm_code2wav")


# --------------------------------------------------------------------------------- served


def _stream_tts_timed(url: str, model: str, text: str, voice: str, timeout_s: float,
                      paced: bool = False) -> RequestResult:
    """Like ``clients.tts_grpc_stream.stream_tts`` (same inputs and stream handling) but also
    records the final response's arrival, which ``stream_tts`` does not expose. ``paced``: send
    ``PACED: true`` (``--pacing realtime``: computed just ahead of a real-time listener)."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    from clients.tts_grpc_stream import build_inputs

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    r = RequestResult(index=0)
    finished = False
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        t0 = time.perf_counter()
        inputs = build_inputs(text, voice)
        if paced:
            flag = grpcclient.InferInput(speech.PACED, [1], "BOOL")
            flag.set_data_from_numpy(np.array([True], dtype=bool))
            inputs.append(flag)
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            try:
                res, err = responses.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(f"no response from {model} for {timeout_s} s") from None
            if err is not None:
                raise err
            audio = res.as_numpy(speech.AUDIO)
            if audio is not None and audio.size:
                r.on_audio(time.perf_counter() - t0, int(audio.size),
                           int(res.as_numpy(speech.SAMPLE_RATE).reshape(-1)[0]))
            final = res.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
        r.e2e_s = time.perf_counter() - t0
        finished = True
    finally:
        # After a timeout or an error the server may never end the stream: cancel it, or
        # stop_stream() would wait for it forever.
        client.stop_stream(cancel_requests=not finished)
        client.close()
    return r


def grpc_run_one(url: str, model: str, timeout_s: float, pacing: str = "none") -> RunOne:
    def run_one(index: int, text: str, voice: str) -> RequestResult:
        r = _stream_tts_timed(url, model, text, voice, timeout_s, paced=pacing == "realtime")
        r.index = index
        return r

    return run_one


def speech_body(model: str, text: str, voice: str, stream: bool = True, pacing: str = "none") -> dict:
    """The ``/v1/audio/speech`` body of one request: pcm; ``stream_pacing`` (``"none"``: as fast
    as the server makes it, ``"realtime"``: paced to a listener) with ``stream: true`` only."""
    body = {"model": model, "input": text, "voice": voice, "response_format": "pcm", "stream": stream}
    if stream:
        body["stream_pacing"] = pacing
    return body


def frontend_run_one(client, base_url: str, model: str, stream: bool = True, pacing: str = "none") -> RunOne:
    """The user path of ``model``: ``/v1/audio/speech`` (pcm; ``stream``: streamed, else the
    whole clip in one response, the ``whole`` path) or, for ``qwen3_omni``, :func:`chat_run_one`.
    Each HTTP read feeds the stream's real-time player (a non-streamed body is read as it
    arrives too: its first audio comes once the whole clip is made)."""
    if model == "qwen3_omni":
        return chat_run_one(client, base_url, model, stream, pacing)

    def run_one(index: int, text: str, voice: str) -> RequestResult:
        body = speech_body(model, text, voice, stream, pacing)
        r = RequestResult(index=index)
        t0 = time.perf_counter()
        with client.stream("POST", f"{base_url}/v1/audio/speech", json=body) as resp:
            if resp.status_code != 200:
                resp.read()
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
            rate = int(resp.headers["x-sample-rate"])
            r.sample_rate = rate
            nbytes = 0
            for data in resp.iter_raw():
                if data:  # s16le mono; a read may end inside a sample: count whole ones
                    before, nbytes = nbytes // 2, nbytes + len(data)
                    r.on_audio(time.perf_counter() - t0, nbytes // 2 - before, rate)  # HTTP reads, not model chunks
        r.e2e_s = time.perf_counter() - t0
        return r

    return run_one


def chat_body(model: str, text: str, voice: str, stream: bool = True, pacing: str = "none") -> dict:
    """The ``/v1/chat/completions`` body of one spoken answer (``pcm16``, ``OMNI_MAX_TOKENS``);
    ``stream_pacing`` with ``stream: true`` only."""
    body = {"model": model, "messages": [{"role": "user", "content": text}],
            "modalities": ["text", "audio"], "audio": {"format": "pcm16", "voice": voice},
            "max_tokens": OMNI_MAX_TOKENS, "stream": stream}
    if stream:
        body["stream_pacing"] = pacing
    return body


def chat_run_one(client, base_url: str, model: str, stream: bool = True, pacing: str = "none") -> RunOne:
    """``POST /v1/chat/completions`` with ``modalities: ["text", "audio"]``, ``audio.format:
    pcm16``; streamed, every SSE chunk's ``delta.audio.data`` (base64 s16le at
    ``OMNI_SAMPLE_RATE``) feeds the player; not streamed, ``message.audio.data`` is the whole
    clip (its TTFP is its E2E). The request's text is the user message."""
    import base64

    def run_one(index: int, text: str, voice: str) -> RequestResult:
        body = chat_body(model, text, voice, stream, pacing)
        r = RequestResult(index=index, sample_rate=OMNI_SAMPLE_RATE)
        t0 = time.perf_counter()
        if not stream:
            resp = client.post(f"{base_url}/v1/chat/completions", json=body)
            if resp.status_code != 200:
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
            t = time.perf_counter() - t0
            for choice in resp.json().get("choices", []):
                data = ((choice.get("message") or {}).get("audio") or {}).get("data")
                if data:
                    r.on_audio(t, len(base64.b64decode(data)) // 2, OMNI_SAMPLE_RATE)
            r.e2e_s = time.perf_counter() - t0
            return r
        with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                resp.read()
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
            carry = b""
            for line in resp.iter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                for choice in json.loads(line[5:]).get("choices", []):
                    data = ((choice.get("delta") or {}).get("audio") or {}).get("data")
                    if data:
                        pcm = carry + base64.b64decode(data)
                        whole = len(pcm) // 2 * 2
                        carry = pcm[whole:]
                        r.on_audio(time.perf_counter() - t0, whole // 2, OMNI_SAMPLE_RATE)
        r.e2e_s = time.perf_counter() - t0
        return r

    return run_one


# ------------------------------------------------------------------------------- config


def model_parameters(name: str, grpc_url: str | None, admin_key: str | None = None) -> dict[str, str]:
    """A model's config ``parameters``: from the running Triton when reachable, else from this
    checkout's ``config.pbtxt``. Triton's model-config API is restricted: ``admin_key`` is its key
    (default: env ``OMNI_TRITON_ADMIN_KEY`` / ``OMNI_TRITON_ADMIN_KEY_FILE``)."""
    if grpc_url:
        try:
            import tritonclient.grpc as grpcclient

            from omni_triton import triton_admin

            key = admin_key or triton_admin.key_from_env()
            with grpcclient.InferenceServerClient(grpc_url) as c:
                cfg = c.get_model_config(name, headers=triton_admin.headers(key, grpc=True),
                                         as_json=True)["config"]
            return {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
        except Exception:
            pass
    from omni_triton.serve.repository import available_models
    from omni_triton.serve.repository import model_parameters as local_params

    return local_params(available_models()[name])


def piper_parallelism() -> int:
    """Syntheses ``piper`` runs at once: its ``workers`` threads times its instances."""
    return int(model_parameters("piper", None).get("workers", 2)) * instance_count("piper")


def codec_settings(grpc_url: str | None, admin_key: str | None = None) -> dict:
    tts = model_parameters("csm", grpc_url, admin_key)
    talker = model_parameters("csm_talker", grpc_url, admin_key)
    return {
        "first_chunk_frames": int(tts.get("first_chunk_frames", 5)),
        "chunk_frames": int(tts.get("chunk_frames", 25)),
        "left_context_frames": int(tts.get("left_context_frames", 25)),
        "low_water_ms": float(tts.get("low_water_ms", 0)),
        "min_frames": int(talker.get("default_min_frames", 8)),
        # the talker's cap tts sets when the client sends no MAX_FRAMES (follows the text length)
        "max_frames_per_char": float(tts.get("max_frames_per_char", 2.5)),
        "min_max_frames": int(tts.get("min_max_frames", 100)),
        "talker_workers": int(talker.get("workers", 4)),
        "tts_workers": int(tts.get("workers", 8)),
    }


# ---------------------------------------------------------------------------------- driver


class Bench:
    def __init__(self, args):
        self.args = args
        self.levels = parse_concurrency(args.concurrency)
        self.results: dict = {m: {} for m in args.models}
        self.log = (lambda *a: print(*a, flush=True)) if not args.quiet else (lambda *a: None)

    def n_requests(self, c: int) -> int:
        return level_requests(self.args.requests, c, getattr(self.args, "requests_per_client", 0))

    def stagger_s(self, model: str, path: str, c: int) -> float:
        """``--arrivals staggered``: spread the C clients' first requests over one request's
        duration, the mean E2E (s; with ``--listen`` plus the wait to the end of playback) of
        the lowest level already measured on this path (0 for that level itself and for
        ``burst``)."""
        done = self.results[model].get(path, {})
        if self.args.arrivals != "staggered" or c <= 1 or not done:
            return 0.0
        low = done[min(done, key=int)]
        e2e = low["e2e_ms"]["mean"]
        return (e2e + (low.get("listen_wait_ms_mean") or 0.0)) / 1000.0 if e2e else 0.0

    def run_path(self, model: str, path: str, run_one: RunOne, levels: list[int] | None = None,
                 listen: bool | None = None, warmup: int | None = None) -> None:
        """Warm-up, then each level (``levels``, default ``--concurrency``); with ``--listen``
        (``listen``, default the option) each client waits until its answer has played to the
        end (``listen_to_end``) and the highest level runs once more without it, for the level's
        ``capacity_audio_s_per_s`` (the target's "faster than real time")."""
        levels = self.levels if levels is None else levels
        for i in range(self.args.warmup if warmup is None else warmup):
            try:
                run_one(-1 - i, TEXTS[i % len(TEXTS)], VOICES[model][0])
            except Exception as exc:
                self.log(f"  warm-up failed: {exc}")
        listen = getattr(self.args, "listen", False) if listen is None else listen
        for c in levels:
            n = self.n_requests(c)
            stagger = self.stagger_s(model, path, c)
            waits: list[float] = []

            def listening(index, text, voice, _waits=waits):
                t0 = time.perf_counter()
                r = run_one(index, text, voice)
                listen_to_end(r, t0, _waits)
                return r

            res, wall = run_level(listening if listen else run_one, model, c, n, stagger)
            s = summarize(res, wall)
            s["concurrency"] = c
            s["arrivals"], s["stagger_s"] = self.args.arrivals, _round(stagger, 3)
            s["listen"] = listen
            if listen:
                s["listen_wait_ms_mean"] = _round(sum(waits) / len(waits) * 1000.0, 1) if waits else 0.0
                if c == max(levels):
                    res_cap, wall_cap = run_level(run_one, model, c, n, 0.0)
                    s["capacity_audio_s_per_s"] = summarize(res_cap, wall_cap)["throughput_audio_s_per_s"]
                    self.log(f"  {model:<10} {path:<10} c={c:<2} without listening (capacity): "
                             f"{_fmt(s['capacity_audio_s_per_s'], 2)} audio s/s  ({wall_cap:.1f} s)")
            s["per_request"] = [r.to_json() for r in res]
            self.results[model].setdefault(path, {})[str(c)] = s
            self.log(f"  {model:<10} {path:<10} c={c:<2} n={n:<3} ok={s['ok']:<3} "
                     f"TTFP mean {_fmt(s['ttfp_ms']['mean'])} ms  E2E mean "
                     f"{_fmt(s['e2e_ms']['mean'])} ms  RTF {_fmt(s['rtf_mean'], 3)}  "
                     f"{_fmt(s['throughput_audio_s_per_s'], 2)} audio s/s  ({wall:.1f} s)")


def run_served(bench: Bench, args, served: list[str], mode: str | None, started: list,
               external: bool) -> tuple[dict, dict | None]:
    """Run the served ``paths`` of every model under one scheduling ``mode`` (``deadline``: the
    configs as shipped; ``fifo``: ``OMNI_TRITON_SCHEDULING=fifo`` in tritonserver's environment;
    ``None``: as is). Starts and stops its own stack unless ``external``. Results go to
    ``bench.results[model][path_label(path, mode)]``. Returns (stack info, codec settings the
    server runs or ``None``); a failure is recorded in the info's ``error``, never raised."""
    log = bench.log
    info: dict = {"scheduling": mode}
    codec = None
    server = frontend = None
    saved = os.environ.get(SCHEDULING_ENV)
    try:
        frontend_url, grpc_url = args.frontend_url, args.triton_grpc_url
        if not external:
            from omni_triton.paths import cache_dir
            from omni_triton.serve.process import free_port
            from omni_triton.serve.server import Frontend, TritonServer

            if mode == "fifo":
                os.environ[SCHEDULING_ENV] = "fifo"  # tritonserver's stubs inherit it
            elif mode == "deadline":
                os.environ.pop(SCHEDULING_ENV, None)
            logs = cache_dir() / "logs"
            tag = f"bench-{os.getpid()}-{mode or 'served'}"
            t = time.perf_counter()
            server = TritonServer(list(args.models), http_port=free_port(),
                                  grpc_port=free_port(), metrics_port=free_port(),
                                  log_path=logs / f"{tag}-tritonserver.log")
            log(f"starting tritonserver ({', '.join(server.models)}) on gRPC {server.grpc_url}"
                f" (scheduling: {mode or 'as configured'})")
            started.append(server)
            server.start()
            server.wait_ready(timeout=args.ready_timeout)
            info["triton_ready_s"] = round(time.perf_counter() - t, 2)
            grpc_url = server.grpc_url
            if "frontend" in served or "whole" in served:
                frontend = Frontend(grpc_url, port=free_port(), models=list(args.models),
                                    log_path=logs / f"{tag}-frontend.log", admin_key=server.admin_key)
                started.append(frontend)
                frontend.start()
                frontend.wait_ready()
                frontend_url = frontend.url
            info.update(stack_ready_s=round(time.perf_counter() - t, 2), triton_log=str(server.log_path),
                        frontend_log=str(frontend.log_path) if frontend else None)
            log(f"stack ready in {info['stack_ready_s']} s (frontend {frontend_url})")
        if "csm" in args.models:
            codec = codec_settings(grpc_url, server.admin_key if server else None)  # what the server runs
        info.update(frontend_url=frontend_url, triton_grpc_url=grpc_url)
        if grpc_url:
            try:
                import tritonclient.grpc as grpcclient

                with grpcclient.InferenceServerClient(grpc_url) as c:
                    info["tritonserver_version"] = c.get_server_metadata(as_json=True).get("version")
            except Exception:
                pass
        import httpx

        limit = max(bench.levels) + 2
        with httpx.Client(timeout=httpx.Timeout(args.timeout, connect=10.0),
                          limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit)) as http:
            for model in args.models:
                if "triton" in served and grpc_url and "triton" in MODEL_PATHS[model]:
                    log(f"Triton gRPC streaming ({mode or 'as served'}; pacing {args.pacing})")
                    bench.run_path(model, path_label("triton", mode),
                                   grpc_run_one(grpc_url, model, args.timeout, args.pacing))
                if "frontend" in served and frontend_url and "frontend" in MODEL_PATHS[model]:
                    log(f"OpenAI frontend (httpx streaming, pcm; {mode or 'as served'}; pacing {args.pacing})")
                    bench.run_path(model, path_label("frontend", mode),
                                   frontend_run_one(http, frontend_url, model, pacing=args.pacing))
                whole_levels = [c for c in bench.levels if c in args.whole_levels]
                if "whole" in served and frontend_url and "whole" in MODEL_PATHS[model] and whole_levels:
                    log(f"OpenAI frontend, stream: false ({mode or 'as served'})")
                    bench.run_path(model, path_label("whole", mode),
                                   frontend_run_one(http, frontend_url, model, stream=False),
                                   levels=whole_levels, listen=False)
    except Exception as exc:  # keep what was measured; report the failure
        info["error"] = f"{type(exc).__name__}: {exc}"
        print(f"error: {info['error']}", file=sys.stderr)
    finally:
        for proc in (frontend, server):
            if proc is not None:
                proc.stop()
                started.remove(proc)
        if saved is None:
            os.environ.pop(SCHEDULING_ENV, None)
        else:
            os.environ[SCHEDULING_ENV] = saved
    return info, codec


#: ``--pacing`` values, sent as the request field ``stream_pacing`` (frontend) or ``PACED`` (gRPC)
PACINGS = ("none", "realtime")
#: the help of ``--scheduling`` (docs/scheduling.md "The knobs")
SCHEDULING_HELP = ("comma separated scheduling modes, one own stack each: deadline (the configs as shipped: "
                   "each stage's `scheduling` parameter), fifo (OMNI_TRITON_SCHEDULING=fifo: every stage "
                   "configured `scheduling: deadline` uses its plain dispatch, whole requests in arrival "
                   "order, PACED ignored; instance counts, emit_frames, chunk schedules and "
                   "qwen3_tts_talker's batching stay as configured, so it is not an earlier release); "
                   "default deadline,fifo with an own stack, the server as it runs with --*-url")


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """The command line of :func:`main`: ``(args, paths to run)``; ``args.models``,
    ``args.scheduling`` and ``args.whole_levels`` come back as lists. With ``--frontend-url`` /
    ``--triton-grpc-url`` only the baselines and the paths whose endpoint was given remain.

    Raises:
        SystemExit: an unknown model, path, scheduling mode or pacing (argparse's error, code 2).
    """
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench_tts.json", help="JSON output file")
    p.add_argument("--models", default=",".join(MODELS), help="comma separated: " + ",".join(MODELS))
    p.add_argument("--paths", default=",".join(PATHS), help="comma separated: " + ",".join(PATHS)
                   + " (whole: the frontend with stream: false, at --whole-levels)")
    p.add_argument("--concurrency", default="1,4,8", help="comma separated levels")
    p.add_argument("--requests", type=int, default=8,
                   help="requests per level (at least the concurrency)")
    p.add_argument("--whole-levels", default="1",
                   help="levels (of --concurrency) the non-streamed whole path runs at (the c=1 target)")
    p.add_argument("--warmup", type=int, default=1, help="untimed requests per model and path")
    p.add_argument("--frontend-url", help="use this running frontend (no own stack)")
    p.add_argument("--triton-grpc-url", help="use this running Triton gRPC host:port (no own stack)")
    p.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, s")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="own stack start-up timeout, s")
    p.add_argument("--quiet", action="store_true", help="only the final table")
    add_load_args(p)
    p.add_argument("--pacing", default="none", choices=PACINGS,
                   help="none (default): streams sent unpaced, as fast as the server makes them (the "
                        "overhead ratios and targets); realtime: stream_pacing realtime / PACED, each "
                        "stream computed just ahead of a real-time listener (continuity and listener "
                        "studies, with --listen)")
    p.add_argument("--scheduling", default=None, help=SCHEDULING_HELP)
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    paths = [x.strip() for x in args.paths.split(",") if x.strip()]
    for m in args.models:
        if m not in MODELS:
            p.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    for x in paths:
        if x not in PATHS:
            p.error(f"unknown path {x!r}; choose from {', '.join(PATHS)}")
    try:
        args.whole_levels = parse_concurrency(args.whole_levels)
    except ValueError as exc:
        p.error(f"--whole-levels: {exc}")
    external = bool(args.frontend_url or args.triton_grpc_url)
    if args.scheduling is None:
        args.scheduling = [] if external else list(SCHEDULING_MODES)
    else:
        args.scheduling = [m.strip() for m in args.scheduling.split(",") if m.strip()]
    for m in args.scheduling:
        if m not in SCHEDULING_MODES:
            p.error(f"unknown scheduling mode {m!r}; choose from {', '.join(SCHEDULING_MODES)}")
    if external and len(args.scheduling) > 1:
        p.error("one running server has one scheduling mode: give at most one with --*-url")
    if external:  # only the paths whose endpoints were given
        paths = [x for x in paths if x in BASELINES or (x == "triton" and args.triton_grpc_url)
                 or (x in ("frontend", "whole") and args.frontend_url)]
    return args, paths


def main(argv: list[str] | None = None) -> int:
    if "--qwen3-tts" in (sys.argv[1:] if argv is None else argv):  # the Qwen3-TTS forms: clients/bench_qwen3_tts.py
        import subprocess  # its own process: benchmarks do not import each other (test_bench_common)

        rest = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--qwen3-tts"]
        return subprocess.call([sys.executable, "-m", "clients.bench_qwen3_tts", *rest])
    args, paths = parse_args(argv)
    external = bool(args.frontend_url or args.triton_grpc_url)

    started = stop_all_on_sigterm()  # what this run starts, stopped in `finally` and on SIGTERM

    t_start = time.perf_counter()
    bench = Bench(args)
    log = bench.log
    threads = _set_torch_threads()
    machine = machine_info()
    codec = codec_settings(args.triton_grpc_url) if "csm" in args.models else None
    stack_info: dict = {"own_stack": not external}
    stack_error = None

    # 1) baselines, before any server runs (never overlapping the served runs), each in as many
    #    processes as the served path has (Baseline / ProcessWorkers, one torch thread each)
    baseline_info: dict = {}
    for path in [x for x in BASELINES if x in paths]:
        log(f"baseline {path} (no Triton; worker processes)")
        for model in [m for m in args.models if path in MODEL_PATHS[m]]:
            t = time.perf_counter()
            n_proc = baseline_processes(model)
            factory = {("inprocess", "piper"): ("_piper_worker", ()),
                       ("inprocess", "csm"): ("_codec_worker", (codec,)),
                       ("transformers", "csm"): ("_transformers_csm_worker", (codec,))}[(path, model)]
            engine = Baseline(n_proc, f"clients.bench_tts:{factory[0]}", factory[1])
            try:
                baseline_info.setdefault(model, {})[path] = {"processes": n_proc, "pids": engine.workers.pids,
                                                             "load_s": round(time.perf_counter() - t, 2)}
                log(f"  {model}: {n_proc} processes loaded in {time.perf_counter() - t:.1f} s")
                # every process warmed up (calls rotate through the free processes)
                bench.run_path(model, path, engine.run_one, warmup=max(args.warmup, n_proc) if args.warmup else 0)
            finally:
                engine.close()

    # 2) served paths, once per scheduling mode (own stack: one server per mode, one after another)
    served = [x for x in paths if x not in BASELINES]
    modes = args.scheduling or [None]
    stack_info["per_mode"] = {}
    if served:
        for mode in modes:
            info, codec_served = run_served(bench, args, served, mode, started, external)
            stack_info["per_mode"][mode or "as_served"] = info
            codec = codec_served or codec
            if info.get("error"):
                stack_error = info["error"]
                break

    ratios = all_ratios(bench.results)
    sched = scheduling_summary(bench.results)
    targets = audio_targets(bench.results, sched, args.pacing, getattr(args, "listen", False))
    machine["loadavg_at_end"] = os.getloadavg()
    config = {
        "command": " ".join([Path(sys.executable).name, "-m", "clients.bench_tts", *(argv or sys.argv[1:])]),
        "models": args.models,
        "paths": paths,
        "concurrency": bench.levels,
        "requests_per_level": {str(c): bench.n_requests(c) for c in bench.levels},
        "warmup_requests": args.warmup,
        "texts": list(TEXTS),
        "voices": {m: list(VOICES[m]) for m in args.models},
        "request_text_voice": "request i: TEXTS[i % len(TEXTS)], voice VOICES[model][i % len]",
        "load_pattern": "closed loop: C worker threads, each sends its next request when the "
                        + ("previous one has played to the end (--listen; capacity from a run of the top "
                           "level without it)" if getattr(args, "listen", False) else "previous one ended"),
        "arrivals": args.arrivals + (": the C first requests of a level sent at once" if args.arrivals == "burst"
                                     else ": worker k's first request k/C of the lowest level's mean E2E later"),
        "tts_codec": codec,
        "scheduling_modes": args.scheduling or ["as served"],
        "pacing": args.pacing + (": streams sent without stream_pacing/PACED pacing, as fast as the server "
                                 "makes them" if args.pacing == "none" else
                                 ": stream_pacing realtime (frontend) / PACED true (gRPC)"),
        "whole_levels": args.whole_levels,
        "baselines": baseline_info,
        "playback_model": "per stream a real-time player with no jitter buffer "
                          "(omni_triton.runtime.playback.PlaybackClock): playback starts at the first "
                          "chunk; a chunk arriving after the audio before it finished playing stalls it; "
                          f"continuity = no stall over {CONTINUITY_STALL_S * 1000:.0f} ms",
        "threads": {**threads,
                    **{v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                      "OPENBLAS_NUM_THREADS")},
                    "onnxruntime_intra_op_threads": 1,
                    "note": "benchmark process: torch.set_num_threads(1) as the Triton stubs do"},
        "machine": machine,
        "versions": package_versions(TTS_PACKAGES),
        "git_commit": git_commit(),
        "stack": stack_info,
        "notes": [
            "in-process and served runs use the same CPU cores and run one after another",
            "tts: frame counts are the talker defaults (MAX_FRAMES is not sent: the OpenAI "
            "frontend cannot send it), so every path generates the same frames",
            "baselines run in worker processes, one torch thread each, as many as the served path has: "
            "csm: csm_talker + csm_code2wav instances, each process a whole talker + decoder running "
            "one request at a time; piper: workers x instances processes, one synthesis each",
            "transformers (csm only): the real peer, CsmForConditionalGeneration.generate(output_audio=True) "
            "on the same checkpoint, greedy, the same frame cap and minimum frames; whole clip, TTFP = E2E",
            "whole: the frontend with stream: false (the non-streamed request of the c=1 target)",
            "tts served: code2wav chunks of concurrent streams are dynamically batched; "
            "in-process decodes each chunk alone (the batching is what serving adds)",
            "frontend chunks count HTTP reads, not model chunks",
            "with scheduling deadline the served talkers interleave their open requests frame by "
            "frame (earliest playback deadline first); each baseline process generates one request "
            "at a time",
            f"omni: chat completions, {OMNI_MAX_TOKENS} text tokens, streamed pcm16 at "
            f"{OMNI_SAMPLE_RATE} Hz; the request text is the user message",
        ],
    }
    report = {"config": config, "results": bench.results, "ratios": ratios, "scheduling": sched,
              "targets": targets,
              "wall_s": round(time.perf_counter() - t_start, 2), "error": stack_error}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print()
    print(format_table(bench.results, ratios))
    if sched:
        print()
        print(format_scheduling(sched))
    if targets:
        print()
        print(format_targets(targets))
    print(f"\nwrote {args.out}; total wall time {report['wall_s']:.1f} s")
    return 1 if stack_error else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Streamed-audio benchmark results shared by ``clients/bench_tts.py`` and
``clients/bench_qwen3_tts.py`` (benchmarks do not import each other: ``tests/unit/test_bench_common.py``):
one timed request (:class:`RequestResult`, with its simulated real-time player), per-level
summaries (TTFP, E2E, RTF, audio s/s, underrun seconds, continuity), the served-vs-baseline
ratios, the scheduling comparison and the stdout table. Times are seconds in results, ms in
summaries. The definitions of each figure are in ``clients/bench_tts.py``'s module docstring.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from clients.bench_common import describe, ratio, target
from omni_triton.runtime.playback import CONTINUITY_STALL_S, PlaybackClock

#: the paths a pipeline can be measured on, in table order: the baselines (``inprocess``: the
#: project's own stage code in processes; ``transformers``: the real peer, transformers'
#: ``generate`` on the same checkpoint), the served paths, and ``whole`` (the frontend with
#: ``stream: false``: the non-streamed request the streamed one is compared with)
PATHS = ("inprocess", "transformers", "triton", "frontend", "whole")
#: paths that do not run under a server scheduling mode (their result key has no ``:mode``) and are
#: no served stream: the project's stage code and the real peers (``qwen_tts``: the qwen-tts
#: package's own generate loop, ``clients/bench_qwen3_tts.py``)
BASELINES = ("inprocess", "transformers", "qwen_tts")
#: paths left out of the scheduling summary: baselines and the non-streamed requests
NOT_STREAMED_SERVED = (*BASELINES, "whole")
#: served pipeline name of each benchmark model key (issue 29's names; others are their own)
PIPELINE_NAMES = {"piper": "piper_tts", "csm": "tts", "qwen3_omni": "omni"}


@dataclass
class RequestResult:
    """One timed request. Times in seconds from the request start; see the module docstring.
    ``player`` is the real-time player of this stream (``PlaybackClock`` from 0 = the send):
    fed by :meth:`on_audio` as chunks arrive; absent, no underrun is known (0)."""

    index: int
    ttfp_s: float | None = None
    e2e_s: float | None = None
    samples: int = 0
    sample_rate: int = 0
    chunks: int = 0
    error: str | None = None
    player: PlaybackClock | None = None

    def on_audio(self, t_s: float, samples: int, sample_rate: int) -> None:
        """``samples`` samples at ``sample_rate`` Hz arrived ``t_s`` seconds after the send."""
        if samples <= 0:
            return
        if self.ttfp_s is None:
            self.ttfp_s = t_s
        if self.player is None:
            self.player = PlaybackClock(start=0.0)
        self.player.add(t_s, samples, sample_rate)
        self.samples += samples
        self.sample_rate = sample_rate
        self.chunks += 1

    @property
    def underrun_s(self) -> float:
        """Seconds a real-time player of this stream stalled after its first chunk."""
        return self.player.underrun_s if self.player is not None else 0.0

    @property
    def longest_stall_s(self) -> float:
        return self.player.longest_stall_s if self.player is not None else 0.0

    @property
    def continuous(self) -> bool:
        """No stall longer than ``CONTINUITY_STALL_S`` (100 ms; vLLM-Omni's continuity)."""
        return self.longest_stall_s <= CONTINUITY_STALL_S

    @property
    def ok(self) -> bool:
        return self.error is None and self.e2e_s is not None and self.samples > 0

    @property
    def audio_s(self) -> float:
        return self.samples / self.sample_rate if self.sample_rate else 0.0

    @property
    def rtf(self) -> float | None:
        return self.e2e_s / self.audio_s if self.ok and self.audio_s > 0 else None

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "ttfp_ms": _ms(self.ttfp_s), "e2e_ms": _ms(self.e2e_s),
            "audio_s": round(self.audio_s, 4), "rtf": _round(self.rtf, 4),
            "samples": self.samples, "sample_rate": self.sample_rate, "chunks": self.chunks,
            "underrun_s": round(self.underrun_s, 4), "longest_stall_ms": _ms(self.longest_stall_s),
            "error": self.error,
        }


def _round(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(float(x), nd)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)


def summarize(results: Sequence[RequestResult], wall_s: float) -> dict:
    """Aggregate one level (see the module docstring); times in ms, rounded to 0.01 ms."""
    ok = [r for r in results if r.ok]
    ttfp = {k: _round(v * 1000 if v is not None else None) for k, v in
            describe([r.ttfp_s for r in ok if r.ttfp_s is not None]).items()}
    e2e = {k: _round(v * 1000 if v is not None else None) for k, v in
           describe([r.e2e_s for r in ok]).items()}
    audio_total = sum(r.audio_s for r in ok)
    rtfs = [r.rtf for r in ok if r.rtf is not None]
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "error_messages": sorted({r.error for r in results if r.error})[:5],
        "ttfp_ms": ttfp,
        "e2e_ms": e2e,
        "rtf_mean": _round(sum(rtfs) / len(rtfs), 4) if rtfs else None,
        "audio_s_mean": _round(audio_total / len(ok), 3) if ok else None,
        "audio_s_total": _round(audio_total, 3),
        "wall_s": _round(wall_s, 3),
        "throughput_audio_s_per_s": _round(audio_total / wall_s, 3) if wall_s > 0 and ok else None,
        "requests_per_s": _round(len(ok) / wall_s, 3) if wall_s > 0 and ok else None,
        "underrun_s_total": _round(sum(r.underrun_s for r in ok), 3),
        "underrun_s_max": _round(max((r.underrun_s for r in ok), default=None), 3),
        "stalled_streams": sum(1 for r in ok if r.underrun_s > 0),
        "continuity_rate": _round(sum(1 for r in ok if r.continuous) / len(ok), 3) if ok else None,
    }


def compare(served: dict, base: dict) -> dict:
    """Ratios served / baseline of two :func:`summarize` results (see the module docstring)."""
    return {
        "ttfp_mean": ratio(served["ttfp_ms"]["mean"], base["ttfp_ms"]["mean"]),
        "ttfp_p50": ratio(served["ttfp_ms"]["p50"], base["ttfp_ms"]["p50"]),
        "e2e_mean": ratio(served["e2e_ms"]["mean"], base["e2e_ms"]["mean"]),
        "e2e_p50": ratio(served["e2e_ms"]["p50"], base["e2e_ms"]["p50"]),
        "rtf_mean": ratio(served["rtf_mean"], base["rtf_mean"]),
        "throughput": ratio(served["throughput_audio_s_per_s"], base["throughput_audio_s_per_s"]),
    }


RATIO_PAIRS = (("frontend_vs_inprocess", "frontend", "inprocess"),
               ("triton_vs_inprocess", "triton", "inprocess"),
               ("frontend_vs_triton", "frontend", "triton"),
               ("frontend_vs_whole", "frontend", "whole"),  # streamed / non-streamed, same server
               ("frontend_vs_transformers", "frontend", "transformers"),
               ("whole_vs_transformers", "whole", "transformers"),
               ("inprocess_vs_transformers", "inprocess", "transformers"))


def path_label(path: str, mode: str | None) -> str:
    """Result key of a path run under a scheduling mode: ``frontend:fifo``; ``path`` alone for
    the baselines (``BASELINES``) and runs without a mode."""
    return path if mode is None or path in BASELINES else f"{path}:{mode}"


def split_label(label: str) -> tuple[str, str | None]:
    """Inverse of :func:`path_label`: ``(path, mode or None)``."""
    path, _, mode = label.partition(":")
    return path, mode or None


def all_ratios(results: dict) -> dict:
    """``{model: {concurrency: {pair: compare(...)}}}`` for every pair whose both paths ran; with
    scheduling modes the pair name gets the mode (``frontend_vs_inprocess:fifo``)."""
    out: dict = {}
    for model, paths in results.items():
        levels = sorted({c for p in paths.values() for c in p}, key=int)
        modes = sorted({split_label(lb)[1] for lb in paths if split_label(lb)[0] not in BASELINES},
                       key=lambda m: m or "") or [None]
        for c in levels:
            for mode in modes:
                for name, served, base in RATIO_PAIRS:
                    s_lb, b_lb = path_label(served, mode), path_label(base, mode)
                    plain = mode is None or (served in BASELINES and base in BASELINES)
                    if c in paths.get(s_lb, {}) and c in paths.get(b_lb, {}):
                        out.setdefault(model, {}).setdefault(c, {})[
                            name if plain else f"{name}:{mode}"] = compare(paths[s_lb][c], paths[b_lb][c])
    return out


#: Issue 13's target: TTFP p50 at the highest concurrency at most this many times the lowest's.
TTFP_GROWTH_TARGET = 2.0


def add_load_args(parser) -> None:
    """The audio benchmarks' load options: ``--arrivals`` (burst | staggered), ``--listen`` and
    ``--requests-per-client`` (:func:`level_requests`)."""
    parser.add_argument("--arrivals", default="burst", choices=("burst", "staggered"),
                        help="burst: the C clients of a level send their first requests at once; staggered: "
                             "spread over one request's duration (the lowest level's mean E2E, with --listen "
                             "plus the wait to the end of playback)")
    parser.add_argument("--listen", action="store_true",
                        help="each client waits until its answer has played to the end before its next "
                             "request (C listeners); the highest level also runs without it for the capacity")
    parser.add_argument("--requests-per-client", type=int, default=0, metavar="K",
                        help="at least K requests per client at each level (C x K at concurrency C), so all C "
                             "clients of a staggered level overlap for about half of it instead of only at its "
                             "end; 0: --requests alone")


def level_requests(requests: int, concurrency: int, per_client: int = 0) -> int:
    """Requests a level of ``concurrency`` clients runs: ``requests``, at least one per client,
    and at least ``per_client`` per client (``--requests-per-client``). Why: with as many
    requests as clients each client makes one, and when their first requests are staggered the
    level ramps up to C streams only at its end."""
    return max(int(requests), int(concurrency), int(per_client) * int(concurrency))


def listen_to_end(r: RequestResult, t0: float, waits: list | None = None) -> None:
    """Sleep until ``r``'s real-time player has played it to the end (``t0``: the request's
    ``time.perf_counter()`` at its send); the wait (s) is appended to ``waits``. A benchmark's
    ``--listen`` client: it asks for its next answer once it has heard this one, so C clients
    are C listeners instead of C clients that keep a faster-than-real-time server saturated."""

    if r.player is None or r.player.play_end is None:
        return
    wait = max(0.0, r.player.play_end - (time.perf_counter() - t0))
    if waits is not None:
        waits.append(wait)
    time.sleep(wait)


def scheduling_summary(results: dict) -> dict:
    """Per model and served path label (``frontend:deadline`` ...): TTFP p50/p90 per concurrency,
    ``ttfp_p50_growth`` = p50 at the highest level / p50 at the lowest, underrun seconds and the
    continuity rate per level, ``faster_than_real_time`` and ``target_met``: growth <=
    ``TTFP_GROWTH_TARGET`` and, when faster than real time, zero underrun seconds at the highest
    level (issue 13 item 4).

    ``faster_than_real_time`` is the pipeline's capacity at the highest level ``C``: the audio
    seconds it generated per wall second (``throughput_audio_s_per_s``) are at least ``C``, i.e.
    it keeps up with ``C`` listeners each playing one second per second, read from the same
    path's ``fifo`` run when the results have one (work-conserving: every stream is computed as
    fast as the cores allow), else from the run itself. Not the mean RTF < 1: under fifo a stream
    waits whole (its wait is in its TTFP) and then has the cores to itself, so RTF < 1 even when
    ``C`` streams together would need more than the pipeline makes (omni at C=8 here: fifo mean
    RTF 0.71, 6.9 audio-s/s for 8 listeners). A paced run (the frontend's streamed speech under
    ``deadline``, docs/scheduling.md "Pacing") computes each stream just ahead of its listener,
    so its own throughput is bounded by playback and says nothing about capacity;
    ``capacity_audio_s_per_s`` is the figure used, ``rtf_mean`` is reported as measured. A level
    whose own summary has ``capacity_audio_s_per_s`` (its clients paused to listen, so its
    throughput is bounded by playback too) is judged by that figure instead (the ``fifo`` run's
    where there is one: a paced run's own figure is bounded by playback as well)."""
    out: dict = {}
    for model, paths in results.items():
        for label, levels in paths.items():
            path, mode = split_label(label)
            if path in NOT_STREAMED_SERVED or not levels:
                continue
            cs = sorted(levels, key=int)
            lo, hi = levels[cs[0]], levels[cs[-1]]
            growth = ratio(hi["ttfp_ms"]["p50"], lo["ttfp_ms"]["p50"]) if len(cs) > 1 else None
            capacity = paths.get(path_label(path, "fifo"), {}).get(cs[-1], hi) if mode else hi
            # a level whose clients listened (--listen) measured its capacity in a run without it
            made = capacity.get("capacity_audio_s_per_s", capacity.get("throughput_audio_s_per_s"))
            fast = made is not None and made >= int(cs[-1])
            out.setdefault(model, {})[label] = {
                "ttfp_p50_ms": {c: levels[c]["ttfp_ms"]["p50"] for c in cs},
                "ttfp_p90_ms": {c: levels[c]["ttfp_ms"]["p90"] for c in cs},
                "ttfp_p50_growth": growth,
                "underrun_s_total": {c: levels[c]["underrun_s_total"] for c in cs},
                "continuity_rate": {c: levels[c]["continuity_rate"] for c in cs},
                "rtf_mean": {c: levels[c]["rtf_mean"] for c in cs},
                "capacity_audio_s_per_s": made,
                "faster_than_real_time": fast,
                "target_met": (growth is not None and growth <= TTFP_GROWTH_TARGET
                               and (not fast or hi["underrun_s_total"] == 0)),
            }
    return out


def format_scheduling(summary: dict) -> str:
    """Readable table of :func:`scheduling_summary`."""
    head = (f"{'model':<10} {'path':<18} | {'TTFP p50 by conc (ms)':<26} {'p90 at max':>10} | "
            f"{'growth':>6} | {'underrun s':>10} {'contin.':>7} | {'capacity':>8} | target")
    lines = ["Scheduling (TTFP p50 growth = highest / lowest concurrency; underrun and continuity "
             "at the highest; capacity: audio s/s made at the highest, fifo run's where there is one; "
             "the underrun counts when capacity >= listeners)", head, "-" * len(head)]
    for model, labels in summary.items():
        for label, x in sorted(labels.items()):
            cs = list(x["ttfp_p50_ms"])
            p50s = " / ".join(f"{_fmt(x['ttfp_p50_ms'][c], 0)}" for c in cs)
            lines.append(f"{model:<10} {label:<18} | {p50s:<26} {_fmt(x['ttfp_p90_ms'][cs[-1]], 0):>10} | "
                         f"{_fmt(x['ttfp_p50_growth'], 2):>6} | {_fmt(x['underrun_s_total'][cs[-1]], 2):>10} "
                         f"{_fmt(x['continuity_rate'][cs[-1]], 2):>7} | "
                         f"{_fmt(x.get('capacity_audio_s_per_s'), 2):>8} | "
                         f"{'met' if x['target_met'] else 'missed'}")
    return "\n".join(lines)


def _fmt(x, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def format_table(results: dict, ratios: dict) -> str:
    """Readable stdout table of :func:`summarize` results and :func:`all_ratios`."""
    head = (f"{'model':<10} {'path':<18} {'conc':>4} {'ok/n':>6} | {'TTFP mean':>9} {'p50':>8} "
            f"{'p90':>8} | {'E2E mean':>9} {'p50':>8} {'p90':>8} | {'audio s':>7} {'RTF':>6} "
            f"{'audio s/s':>9} {'req/s':>6} | {'underrun s':>10} {'contin.':>7}")
    lines = ["Latency in ms; RTF = E2E / audio duration; audio s/s = audio seconds per wall second",
             head, "-" * len(head)]
    order = {p: i for i, p in enumerate(PATHS)}
    for model, paths in results.items():
        for path in sorted(paths, key=lambda lb: (order.get(split_label(lb)[0], 99), lb)):
            for c, s in sorted(paths[path].items(), key=lambda kv: int(kv[0])):
                lines.append(
                    f"{model:<10} {path:<18} {c:>4} {s['ok']:>3}/{s['requests']:<2} | "
                    f"{_fmt(s['ttfp_ms']['mean']):>9} {_fmt(s['ttfp_ms']['p50']):>8} "
                    f"{_fmt(s['ttfp_ms']['p90']):>8} | {_fmt(s['e2e_ms']['mean']):>9} "
                    f"{_fmt(s['e2e_ms']['p50']):>8} {_fmt(s['e2e_ms']['p90']):>8} | "
                    f"{_fmt(s['audio_s_mean'], 2):>7} {_fmt(s['rtf_mean'], 3):>6} "
                    f"{_fmt(s['throughput_audio_s_per_s'], 2):>9} {_fmt(s['requests_per_s'], 2):>6} | "
                    f"{_fmt(s.get('underrun_s_total'), 2):>10} {_fmt(s.get('continuity_rate'), 2):>7}")
    if ratios:
        rhead = (f"{'model':<10} {'conc':>4} {'ratio':<34} | {'TTFP mean':>9} {'TTFP p50':>8} | "
                 f"{'E2E mean':>8} {'E2E p50':>8} | {'RTF':>6} | {'thrpt':>6}")
        lines += ["", "Serving overhead (served / baseline; thrpt < 1: less audio per second)",
                  rhead, "-" * len(rhead)]
        for model, levels in ratios.items():
            for c, pairs in sorted(levels.items(), key=lambda kv: int(kv[0])):
                for name, r in pairs.items():
                    lines.append(
                        f"{model:<10} {c:>4} {name:<34} | {_fmt(r['ttfp_mean'], 2):>9} "
                        f"{_fmt(r['ttfp_p50'], 2):>8} | {_fmt(r['e2e_mean'], 2):>8} "
                        f"{_fmt(r['e2e_p50'], 2):>8} | {_fmt(r['rtf_mean'], 2):>6} | "
                        f"{_fmt(r['throughput'], 2):>6}")
    return "\n".join(lines)


#: Issue 29's targets (benchmarks on this machine): streamed E2E at c=1 at most this many times the
#: non-streamed E2E; Piper's TTFP at most this share of its non-streamed E2E; continuity at least
#: this where the pipeline's capacity covers its listeners (TTFP growth: ``TTFP_GROWTH_TARGET``).
STREAM_E2E_TARGET = 1.2
PIPER_TTFP_TARGET = 0.2
CONTINUITY_TARGET = 0.95


def primary_label(paths: dict, path: str = "frontend") -> str | None:
    """The result key the targets are read from: ``path`` under ``deadline`` (the configs as
    shipped), else ``path`` run without a mode (a running server), else any mode of it."""
    for label in (path_label(path, "deadline"), path):
        if paths.get(label):
            return label
    return next((lb for lb in sorted(paths) if split_label(lb)[0] == path and paths[lb]), None)


def audio_targets(results: dict, sched: dict, pacing: str = "none", listen: bool = False) -> list[dict]:
    """Issue 29's targets of the streamed-audio pipelines, each a :func:`clients.bench_common.target`
    dict with ``pipeline`` added, all read from one run's ``results`` (``{model: {label: {C:
    summary}}}``) and its :func:`scheduling_summary` ``sched``, on the frontend path under
    ``deadline`` (:func:`primary_label`; the Triton path where there is no frontend run):

    - ``c=1 streamed E2E p50 / non-streamed``: the streamed request's E2E p50 at the lowest level
      over the ``whole`` (``stream: false``) request's at the same level and mode, <=
      ``STREAM_E2E_TARGET`` (1.2);
    - Piper only, ``c=1 TTFP p50 / non-streamed E2E p50`` <= ``PIPER_TTFP_TARGET`` (0.2);
    - ``TTFP p50 growth c=lo->c=hi`` <= ``TTFP_GROWTH_TARGET`` (2); it applies when the levels are
      1 and at least 8 (saturating clients unless ``listen``);
    - ``continuity at c=hi`` >= ``CONTINUITY_TARGET`` (0.95); it applies only when the capacity
      (``sched``'s ``capacity_audio_s_per_s``, from the fifo run where there is one) covers the
      ``hi`` listeners.

    ``pacing`` other than ``"none"``: the served streams were paced to real time, so every target
    gets a note that the issue's figures are unpaced ones. Missing figures give ``measured:
    None`` (``met: None``) rather than no entry, so a partial run still lists every target.
    """
    out: list[dict] = []
    paced_note = "" if pacing == "none" else f"stream_pacing {pacing}: the issue's targets are for unpaced runs"
    clients = "listening" if listen else "saturating"

    def add(pipeline: str, t: dict) -> None:
        if paced_note:
            t["note"] = "; ".join(x for x in (t["note"], paced_note) if x)
        out.append({"pipeline": pipeline, **t})

    for model, paths in results.items():
        name = PIPELINE_NAMES.get(model, model)
        label = primary_label(paths) or primary_label(paths, "triton")
        if label is None:
            continue
        levels = paths[label]
        cs = sorted(levels, key=int)
        lo, hi = cs[0], cs[-1]
        whole = paths.get(path_label("whole", split_label(label)[1]), {}).get(lo)
        e2e_s, ttfp_s = levels[lo]["e2e_ms"]["p50"], levels[lo]["ttfp_ms"]["p50"]
        e2e_w = whole["e2e_ms"]["p50"] if whole else None
        note = f"{label} vs whole at c={lo}" + ("" if whole else "; no non-streamed run (--paths whole)")
        add(name, target(f"{name}: c={lo} streamed E2E p50 / non-streamed", ratio(e2e_s, e2e_w),
                         STREAM_E2E_TARGET, "<=", applies=lo == "1", note=note))
        if model == "piper":
            add(name, target(f"{name}: c={lo} TTFP p50 / non-streamed E2E p50", ratio(ttfp_s, e2e_w),
                             PIPER_TTFP_TARGET, "<=", applies=lo == "1", note=note))
        s = sched.get(model, {}).get(label, {})
        add(name, target(f"{name}: TTFP p50 growth c={lo}->{hi} ({clients})", s.get("ttfp_p50_growth"),
                         TTFP_GROWTH_TARGET, "<=", applies=lo == "1" and int(hi) >= 8,
                         note=label + ("" if lo == "1" and int(hi) >= 8 else "; needs levels 1 and >= 8")))
        capacity = s.get("capacity_audio_s_per_s")
        covers = capacity is not None and capacity >= int(hi)
        add(name, target(f"{name}: continuity at c={hi} ({clients})", levels[hi].get("continuity_rate"),
                         CONTINUITY_TARGET, ">=", applies=covers,
                         note=f"{label}; capacity {_fmt(capacity, 2)} audio s/s for {hi} listeners"
                              + ("" if covers else ": below them, the target does not apply")))
    return out

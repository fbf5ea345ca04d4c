"""vLLM-Omni's own benchmark client (``vllm-omni bench serve --omni`` from the PyPI package
``vllm-omni`` 0.30.0, unmodified, in its own venv: scripts/setup_bench.sh) against the session
server: text chat (``llm``), omni chat with audio (``qwen3_omni``, modalities left to the server),
``/v1/audio/speech`` with the random dataset and a local one (``piper_tts``), and images
(``qwen_image``); a few requests each at concurrency 1 and 2.

Each run must complete every request, and the client's figures must agree with what the server
sent: its output token total with the frontend's ``omni_frontend_completion_tokens`` counter, its
audio seconds with ``omni_frontend_audio_seconds`` (speech asks ``sample_rate: 24000``, the rate
the client assumes), TTFT within each request's latency, RTF = audio time / audio seconds.
No timing is asserted. Skipped when the benchmark venv is not built (OMNI_TRITON_SKIP_BENCH_ENV=1).

All runs go through one process (``vllm_omni_bench_driver.py``: the client's console-script
``main`` once per run), so its heavy import (vLLM + CUDA torch, ~50 s here) is paid once; the
driver reads the frontend's counters before and after each run.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import E2E_MODELS

from omni_triton.paths import cache_dir, model_dir
from omni_triton.serve.repository import resolve_models

BENCH = cache_dir() / "bench-venv" / "bin" / "vllm-omni"
SERVED = set(resolve_models([m.strip() for m in E2E_MODELS.split(",") if m.strip()]))

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not BENCH.exists(), reason="benchmark venv not built: run bash scripts/setup_bench.sh "
                                                          "(scripts/test.sh does)")]

BENCH_PY = cache_dir() / "bench-venv" / "bin" / "python"
DRIVER = Path(__file__).with_name("vllm_omni_bench_driver.py")
CONCURRENCY = [(1, 2), (2, 4)]  # (max concurrency, requests)


def _workloads(url: str, tmp) -> dict[str, list[str]]:
    """name -> client arguments (after ``bench serve --omni``) of each workload."""
    m = model_dir
    (tmp / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in [
        "The capital of France is Paris.", "One. Two. Three.", "Hello from Triton.",
        "Speech streams out sentence by sentence."]))
    speech = ["--backend", "openai-audio-speech", "--endpoint", "/v1/audio/speech", "--model", "piper_tts",
              "--tokenizer", str(m("smollm2")), "--extra-body", json.dumps({"voice": "joe", "sample_rate": 24000}),
              "--percentile-metrics", "e2el,audio_ttfp,audio_rtf"]
    w = {
        "llm": ["--backend", "openai-chat-omni", "--endpoint", "/v1/chat/completions", "--model", "llm",
                "--tokenizer", str(m("smollm2")), "--dataset-name", "random", "--random-input-len", "16",
                "--random-output-len", "8", "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el"],
        "omni": ["--backend", "openai-chat-omni", "--endpoint", "/v1/chat/completions", "--model", "omni",
                 "--tokenizer", str(m("qwen3-omni-tiny")), "--dataset-name", "random", "--random-input-len", "8",
                 "--random-output-len", "6", "--ignore-eos", "--print-stage",  # per-stage timing, int() stage ids
                 "--percentile-metrics", "ttft,tpot,itl,e2el,audio_ttfp,audio_rtf"],
        "speech_random": [*speech, "--dataset-name", "random", "--random-input-len", "12", "--random-output-len", "1"],
        "speech_local": [*speech, "--dataset-name", "custom", "--dataset-path", str(tmp / "prompts.jsonl"),
                         "--skip-chat-template", "--custom-output-len", "1"],
        "images": ["--endpoint", "/v1/images/generations", "--model", "qwen_image", "--tokenizer", str(m("smollm2")),
                   "--dataset-name", "random", "--random-input-len", "8", "--random-output-len", "1",
                   "--extra-body", json.dumps({"size": "64x64", "num_inference_steps": 2})],
    }
    model_of = {"llm": "llm", "omni": "qwen3_omni", "speech_random": "piper", "speech_local": "piper",
                "images": "qwen_image"}
    return {k: v for k, v in w.items() if model_of[k] in SERVED}


@pytest.fixture(scope="module")
def bench_runs(stack, tmp_path_factory):
    """Every workload at concurrency 1 and 2, run in sequence by the client; returns
    ``{(workload, concurrency): (result JSON, {(metric, model): counter delta over that run})}``."""
    tmp = tmp_path_factory.mktemp("vllm_omni_bench")
    runs, keys = [], []
    for name, args in _workloads(stack.frontend_url, tmp).items():
        for concurrency, prompts in CONCURRENCY:
            keys.append((name, concurrency))
            runs.append(["bench", "serve", "--omni", "--base-url", stack.frontend_url, "--num-prompts", str(prompts),
                         "--max-concurrency", str(concurrency), "--seed", "0", "--save-result", "--save-detailed",
                         "--result-dir", str(tmp), "--result-filename", f"{name}-{concurrency}.json",
                         "--disable-tqdm", *args])
    (tmp / "runs.json").write_text(json.dumps(runs))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OPENAI_API_KEY": "unused",
           "VLLM_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.run([str(BENCH_PY), str(DRIVER), str(tmp / "runs.json"), "--metrics-url", stack.frontend_url],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    errors = json.loads((tmp / "runs.json.errors.json").read_text())
    deltas = json.loads((tmp / "runs.json.metrics.json").read_text())
    requests = json.loads((tmp / "runs.json.requests.json").read_text())
    assert not errors, errors
    out = {}
    for i, key in enumerate(keys):
        delta = {tuple(k.split("|")): v for k, v in deltas[str(i)].items()}
        result = json.loads((tmp / f"{key[0]}-{key[1]}.json").read_text())
        result["_requests"] = requests[str(i)]  # the client's own per-request figures (the driver)
        out[key] = (result, delta)
    return out


def assert_stage_times_within_e2el(result: dict, stage_names: set[str]) -> None:
    """Per request, as vLLM-Omni's client parsed it: every stage reported (ids only, so its
    ``--print-stage`` can sort them) and the stage times add up to no more than that request's
    E2EL; so do the means the client reports (``stage_durations_mean``, every key in ms) against
    the mean E2EL (its own ``mean_e2el_ms`` where the run selected e2el, else the mean of the
    requests' latencies it parsed)."""
    assert result["_requests"] and all(r["success"] for r in result["_requests"])
    for r in result["_requests"]:
        print(f"client: E2EL {r['e2el_ms']:.1f} ms, stage times {r['stage_gen_time_ms']} "
              f"(sum {sum(r['stage_gen_time_ms'].values()):.1f} ms)")
        assert r["stage_gen_time_ms"] and all(k.isdigit() for k in r["stage_gen_time_ms"])
        assert sum(r["stage_gen_time_ms"].values()) <= r["e2el_ms"], r
    means = result["stage_durations_mean"]
    assert all(k.endswith("_ms") for k in means) and {f"{n}_ms" for n in stage_names} <= set(means)
    requests = result["_requests"]
    mean_e2el = result.get("mean_e2el_ms", sum(r["e2el_ms"] for r in requests) / len(requests))
    assert sum(means[f"{n}_ms"] for n in stage_names) <= mean_e2el


def _run(bench_runs, name, concurrency, prompts):
    if (name, concurrency) not in bench_runs:
        pytest.skip(f"{name}: its model is not served")
    result, delta = bench_runs[(name, concurrency)]
    assert result["completed"] == prompts and result.get("failed", 0) == 0, result.get("errors")
    assert not any(result["errors"]), result["errors"]
    return result, delta


@pytest.mark.parametrize("concurrency, prompts", CONCURRENCY)
def test_text_chat(bench_runs, concurrency, prompts):
    r, sent = _run(bench_runs, "llm", concurrency, prompts)
    assert r["total_output_tokens"] == sent[("omni_frontend_completion_tokens_total", "llm")] == 8 * prompts
    assert r["output_lens"] == [8] * prompts  # ignore_eos: every answer is 8 tokens
    assert all(0 < t for t in r["ttfts"]) and r["mean_ttft_ms"] > 0  # was: no valid chunk for TTFT
    assert r["mean_ttft_ms"] <= r["mean_e2el_ms"]
    assert r["mean_tpot_ms"] > 0 and r["num_itl_samples"] > 0


@pytest.mark.parametrize("concurrency, prompts", CONCURRENCY)
def test_omni_chat_with_audio(bench_runs, concurrency, prompts):
    r, sent = _run(bench_runs, "omni", concurrency, prompts)
    assert r["total_output_tokens"] == sent[("omni_frontend_completion_tokens_total", "omni")] == 6 * prompts
    audio = sent.get(("omni_frontend_audio_seconds_total", "omni"), 0.0)
    assert audio > 0  # modalities omitted: the omni model speaks (vLLM-Omni's default)
    assert r["total_audio_duration_s"] == pytest.approx(audio, abs=1e-3)  # every WAV chunk counted
    assert 0 < r["mean_ttft_ms"] <= r["mean_audio_ttfp_ms"] <= r["mean_e2el_ms"]  # text, then speech
    assert r["mean_audio_rtf"] > 0
    # return_stage_metrics (the client asks for tpot/itl): per request, within its E2EL
    assert_stage_times_within_e2el(r, {"qwen3_omni", "qwen3_omni_thinker", "qwen3_omni_talker", "qwen3_omni_code2wav"})


@pytest.mark.parametrize("name", ["speech_random", "speech_local"])
@pytest.mark.parametrize("concurrency, prompts", CONCURRENCY)
def test_speech(bench_runs, name, concurrency, prompts):
    """vLLM's random dataset (random token text; the client sends ignore_eos with it) and its
    ``custom`` dataset (a local JSONL), with ``sample_rate`` 24000 (the client's PCM rate)."""
    r, sent = _run(bench_runs, name, concurrency, prompts)
    audio = sent.get(("omni_frontend_audio_seconds_total", "piper_tts"), 0.0)
    assert audio > 0 and r["total_audio_duration_s"] == pytest.approx(audio, rel=1e-3)
    assert 0 < r["mean_audio_ttfp_ms"] <= r["mean_e2el_ms"] and r["mean_audio_rtf"] > 0


@pytest.mark.parametrize("concurrency, prompts", CONCURRENCY)
def test_images(bench_runs, concurrency, prompts):
    r, sent = _run(bench_runs, "images", concurrency, prompts)
    assert r["total_images"] == prompts == sent[("omni_frontend_images_total", "qwen_image")]
    assert r["average_pixels_per_image"] == 64 * 64
    assert r["mean_denoise_step_latency_ms"] > 0  # from return_stage_metrics (the client always asks)
    assert_stage_times_within_e2el(r, {"qwen_image_text_encoder", "qwen_image_denoiser", "qwen_image_vae_decoder"})

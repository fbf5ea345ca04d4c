"""End-to-end: every metric of docs/metrics.md is on its endpoint after the requests that feed
it, with the values those requests imply (real tritonserver + frontend)."""
from __future__ import annotations

import time

import httpx
import pytest

from clients.bench_common import metric_total
from omni_triton.adapters.telemetry import METRICS

pytestmark = pytest.mark.e2e


def _speech(stack, model, text, stream):
    body = {"model": model, "input": text, "response_format": "pcm" if stream else "wav", "stream": stream}
    r = httpx.post(f"{stack.frontend_url}/v1/audio/speech", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


def _eventually(check, timeout_s=15.0):
    """Stages update their metrics right after the FINAL response: poll briefly."""
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.1)
    return check()


def _series(stack, name):
    return name + ("_count" if METRICS[name].kind == "histogram" else "")


def test_stage_audio_and_bls_metrics_after_requests(stack):
    streams = stack.metric("omni_audio_streams_total", model="piper")
    finished = stack.metric("omni_stage_requests_finished_total", model="piper", reason="stop")
    calls = stack.metric("omni_bls_calls_total", model="csm", target="csm_talker")
    batches = stack.metric("omni_stage_batch_size_count", model="csm_code2wav")
    _speech(stack, "piper_tts", "One sentence here. And a second one.", stream=True)
    _speech(stack, "tts", "Hi there.", stream=False)
    served = {m["id"] for m in httpx.get(f"{stack.frontend_url}/v1/models", timeout=30).json()["data"]}
    expected = set(METRICS)
    if "qwen_image" in served:
        steps = stack.metric("omni_diffusion_steps_total", model="qwen_image_denoiser")
        r = httpx.post(f"{stack.frontend_url}/v1/images/generations", timeout=300, json={
            "model": "qwen_image", "prompt": "a red fox", "size": "16x16", "num_inference_steps": 3, "seed": 1})
        assert r.status_code == 200, r.text
        assert _eventually(lambda: stack.metric("omni_diffusion_steps_total", model="qwen_image_denoiser") == steps + 3)
        assert stack.metric("omni_diffusion_step_seconds_count", model="qwen_image_denoiser") >= 1
    else:
        expected -= {"omni_diffusion_steps_total", "omni_diffusion_step_seconds"}
    assert _eventually(lambda: stack.metric("omni_audio_streams_total", model="piper") == streams + 1)
    assert _eventually(lambda: stack.metric("omni_stage_requests_finished_total", model="csm", reason="stop") >= 1)
    assert stack.metric("omni_stage_requests_finished_total", model="piper", reason="stop") == finished + 1
    for name in ("omni_audio_ttfp_seconds", "omni_audio_rtf", "omni_audio_duration_seconds",
                 "omni_stage_request_duration_seconds"):
        assert stack.metric(_series(stack, name), model="piper") >= 1, name
        assert stack.metric(_series(stack, name), model="csm") >= 1, name
    text = httpx.get(stack.metrics_url, timeout=10).text
    missing = [n for n in sorted(expected) if f"{_series(stack, n)}{{" not in text]
    assert not missing, f"not on Triton's metrics endpoint: {missing}"
    rtf_sum = stack.metric("omni_audio_rtf_sum", model="piper")
    assert rtf_sum > 0
    # the tts BLS: one talker stream and its code2wav calls, bytes both ways, time waited
    assert stack.metric("omni_bls_calls_total", model="csm", target="csm_talker") == calls + 1
    assert stack.metric("omni_bls_calls_total", model="csm", target="csm_code2wav") >= 1
    assert stack.metric("omni_bls_transfer_bytes_total", model="csm", target="csm_code2wav", direction="received") > 0
    assert stack.metric("omni_bls_transfer_bytes_total", model="csm", target="csm_talker", direction="sent") > 0
    assert stack.metric("omni_bls_transfer_seconds_total", model="csm", target="csm_talker") > 0
    assert stack.metric("omni_stage_batch_size_count", model="csm_code2wav") > batches
    assert _eventually(lambda: stack.metric("omni_stage_requests_running", model="piper") == 0)


def test_frontend_itl_and_tpot_after_a_chat(stack):
    def count(name):
        return metric_total(httpx.get(f"{stack.frontend_url}/metrics", timeout=10).text, f"{name}_count", model="llm")

    itl, tpot = count("omni_frontend_inter_token_latency_seconds"), count("omni_frontend_time_per_output_token_seconds")
    with httpx.stream("POST", f"{stack.frontend_url}/v1/chat/completions", timeout=120, json={
            "model": "llm", "messages": [{"role": "user", "content": "Count to five."}],
            "max_tokens": 8, "temperature": 0, "stream": True}) as r:
        assert r.status_code == 200
        chunks = sum(1 for line in r.iter_lines() if line.startswith("data: {"))
    assert chunks >= 3
    assert count("omni_frontend_inter_token_latency_seconds") > itl
    assert count("omni_frontend_time_per_output_token_seconds") == tpot + 1

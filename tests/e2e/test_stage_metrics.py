"""End-to-end: ``return_stage_metrics`` gives each request its own per-stage times, measured inside
the pipeline (docs/metrics.md "Per-request stage metrics"), also when requests of clearly
different sizes run at once: the bigger one reports more compute where it did more work, and each
request's stage times add up to no more than its own wall time, which is within the client's E2E.
The former before/after delta of Triton's global statistics gave both requests the same means.

Models: ``qwen3_omni`` (chat with audio: the BLS, the talker streaming the thinker, code2wav) and
``qwen_image`` (the ensemble); each part is skipped when its model is not served
(``OMNI_TRITON_E2E_MODELS=qwen3_omni,qwen_image``). No timing target is asserted.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from conftest import E2E_MODELS

from omni_triton.serve.repository import resolve_models

pytestmark = pytest.mark.e2e

SERVED = set(resolve_models([m.strip() for m in E2E_MODELS.split(",") if m.strip()]))


def _concurrently(stack, path: str, bodies: list[dict]) -> list[tuple[dict, float]]:
    """POST every body at once; (response JSON, client E2E ms) each."""
    def one(body):
        start = time.monotonic()
        r = httpx.post(f"{stack.frontend_url}{path}", json=body, timeout=600)
        e2e_ms = (time.monotonic() - start) * 1000.0
        assert r.status_code == 200, r.text
        return r.json(), e2e_ms

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, bodies))


def _check_sums(metrics: dict, e2e_ms: float) -> dict[str, dict]:
    stages = metrics["stage_metrics"]
    print(f"e2e {e2e_ms:.1f} ms, request_wall {metrics['request_wall_ms']} ms, "
          f"stage_total {metrics['stage_total_ms']} ms:",
          {e["stage_name"]: (e["stage_gen_time_ms"], e["compute_ms"], e["calls"]) for e in stages.values()})
    assert sorted(stages, key=int) == [str(i) for i in range(len(stages))]  # stage ids only
    total = sum(e["stage_gen_time_ms"] for e in stages.values())
    assert metrics["stage_total_ms"] == pytest.approx(total, abs=0.01)
    assert total <= metrics["request_wall_ms"] + 0.01 <= e2e_ms + 0.01  # per request: parts <= whole
    assert metrics["stage_durations"] == {**{f"stage_{i}_gen_ms": e["stage_gen_time_ms"] for i, e in stages.items()},
                                          **{f"{e['stage_name']}_ms": e["stage_gen_time_ms"] for e in stages.values()}}
    return {e["stage_name"]: e for e in stages.values()}


@pytest.mark.skipif("qwen3_omni" not in SERVED, reason="qwen3_omni not in OMNI_TRITON_E2E_MODELS")
def test_omni_chats_of_different_sizes_get_their_own_stage_times(stack):
    def body(tokens):
        return {"model": "omni", "messages": [{"role": "user", "content": "Say something about Paris."}],
                "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "return_stage_metrics": True}

    (small, small_e2e), (large, large_e2e) = _concurrently(stack, "/v1/chat/completions", [body(2), body(24)])
    assert small["usage"]["completion_tokens"] == 2 and large["usage"]["completion_tokens"] == 24
    s, big = _check_sums(small["metrics"], small_e2e), _check_sums(large["metrics"], large_e2e)
    for stages in (s, big):
        assert list(stages)[:1] == ["qwen3_omni"] and {"qwen3_omni_thinker", "qwen3_omni_talker",
                                                       "qwen3_omni_code2wav"} <= set(stages)
        assert stages["qwen3_omni_talker"]["calls"] == 1 and stages["qwen3_omni_code2wav"]["calls"] >= 1
        for name in ("qwen3_omni", "qwen3_omni_thinker", "qwen3_omni_talker", "qwen3_omni_code2wav"):
            assert stages[name]["compute_ms"] is not None and stages[name]["compute_ms"] > 0, (name, stages[name])
        assert stages["qwen3_omni"]["wall_ms"] == pytest.approx(stages["qwen3_omni"]["wall_ms"])
    # 24 tokens vs 2: the thinker's own compute for each request, not a shared mean
    assert big["qwen3_omni_thinker"]["compute_ms"] > s["qwen3_omni_thinker"]["compute_ms"]
    assert small["metrics"]["num_tokens_out"] == 2 and large["metrics"]["num_tokens_out"] == 24


@pytest.mark.skipif("qwen_image" not in SERVED, reason="qwen_image not in OMNI_TRITON_E2E_MODELS")
def test_images_of_different_step_counts_get_their_own_stage_times(stack):
    def body(steps):
        return {"model": "qwen_image", "prompt": "a red fox", "size": "64x64", "num_inference_steps": steps,
                "seed": 1, "return_stage_metrics": True}

    (small, small_e2e), (large, large_e2e) = _concurrently(stack, "/v1/images/generations", [body(2), body(10)])
    s, big = _check_sums(small["metrics"], small_e2e), _check_sums(large["metrics"], large_e2e)
    for stages in (s, big):
        assert list(stages) == ["qwen_image_text_encoder", "qwen_image_denoiser", "qwen_image_vae_decoder"]
        assert all(e["compute_ms"] is not None and e["compute_ms"] > 0 and e["wall_ms"] is None
                   for e in stages.values())
    # 10 denoising steps vs 2: its own pipeline call's time, not the batch's mean
    assert big["qwen_image_denoiser"]["compute_ms"] > 2 * s["qwen_image_denoiser"]["compute_ms"]
    assert small["metrics"]["num_inference_steps"] == 2 and large["metrics"]["num_inference_steps"] == 10

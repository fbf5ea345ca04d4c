"""clients.bench_chat: pure helpers only (stream parsing, per-request metrics, aggregation,
ratios, vLLM command line). No timing asserts."""
from __future__ import annotations

import json

import pytest

from clients import bench_chat as b


def _sse(chunks, done=True):
    lines = []
    for c in chunks:
        lines += [f"data: {json.dumps(c)}", ""]
    if done:
        lines += ["data: [DONE]", ""]
    return lines


def _delta(content=None, audio=None):
    d = {}
    if content is not None:
        d["content"] = content
    if audio is not None:
        d["audio"] = audio
    return {"choices": [{"index": 0, "delta": d, "finish_reason": None}]}


def test_consume_chat_stream_times_content_audio_and_usage():
    chunks = [_delta(""), {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
              _delta("Par"), _delta(audio={"id": "a", "data": "AAAA"}), _delta("is"),
              _delta(audio={"id": "a", "transcript": "Paris"}),
              {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}]
    ticks = iter([0.1, 0.2, 0.3, 0.45, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1])
    r = b.ChatResult(index=0)
    b.consume_chat_stream([": ping", ""] + _sse(chunks), lambda: next(ticks), r)
    assert r.content_times == [0.3, 0.6] and r.audio_times == [0.45]
    assert r.text == "Paris" and r.output_tokens == 3
    assert r.ttft_s == 0.3 and r.ttfp_s == 0.45
    assert r.itl_s == pytest.approx([0.3])
    assert r.e2e_s == 0.9  # read after [DONE]
    assert r.tpot_s == pytest.approx((0.9 - 0.3) / 2)


def test_consume_chat_stream_raises_on_error_event():
    with pytest.raises(RuntimeError, match="boom"):
        b.consume_chat_stream(_sse([{"error": {"message": "boom"}}]), lambda: 0.0, b.ChatResult(index=0))


def test_tpot_needs_two_tokens_and_success():
    r = b.ChatResult(index=0, content_times=[0.1], e2e_s=0.2, output_tokens=1)
    assert r.ok and r.tpot_s is None
    r = b.ChatResult(index=0, error="x", content_times=[0.1], e2e_s=0.5, output_tokens=4)
    assert not r.ok and r.tpot_s is None


def _r(i, times, e2e, tokens, error=None):
    return b.ChatResult(index=i, content_times=times, e2e_s=e2e, output_tokens=tokens, error=error)


def test_summarize_and_ratios():
    results = [_r(0, [0.1, 0.2, 0.3], 0.3, 3), _r(1, [0.3, 0.5, 0.7], 0.7, 3), _r(2, [], None, None, "HTTP 500")]
    s = b.summarize(results, wall_s=1.0)
    assert (s["requests"], s["ok"], s["errors"]) == (3, 2, 1) and s["error_messages"] == ["HTTP 500"]
    assert s["ttft_ms"]["mean"] == 200.0 and s["ttft_ms"]["p50"] == 200.0
    assert s["itl_ms"]["mean"] == pytest.approx(150.0)  # gaps 100, 100, 200, 200
    assert s["tpot_ms"]["mean"] == pytest.approx(150.0)  # (0.2/2 + 0.4/2) / 2
    assert s["output_tokens_total"] == 6 and s["output_tokens_per_s"] == 6.0
    assert s["requests_per_s"] == 2.0
    slow = b.summarize([_r(0, [0.2, 0.4, 0.6], 0.6, 3)], wall_s=2.0)
    fast = b.summarize([_r(0, [0.1, 0.2, 0.3], 0.3, 3)], wall_s=1.0)
    ratios = b.all_ratios({"triton": {"1": slow}, "vllm": {"1": fast, "8": fast}})
    assert list(ratios) == ["1"]
    r = ratios["1"]["triton_vs_vllm"]
    assert r["ttft_mean"] == 2.0 and r["itl_mean"] == 2.0 and r["tpot_mean"] == 2.0 and r["e2e_mean"] == 2.0
    assert r["output_tokens_per_s"] == 0.5
    table = b.format_table({"triton": {"1": slow}, "vllm": {"1": fast}}, ratios, {"skipped": "no omni"})
    assert "triton" in table and "vllm" in table and "omni: skipped (no omni)" in table


def test_engine_args_to_cli():
    args = b.engine_args_to_cli({"model": "/m/smollm2", "dtype": "bfloat16", "enforce_eager": True,
                                 "max_model_len": 2048, "trust_remote_code": False})
    assert args == ["--model", "/m/smollm2", "--dtype", "bfloat16", "--enforce-eager",
                    "--max-model-len", "2048", "--no-trust-remote-code"]


def test_chat_payload_fixed_length_text_and_omni_audio():
    p = b.chat_payload(5, "llm", 64)
    assert p["max_tokens"] == 64 and p["ignore_eos"] is True and p["temperature"] == 0
    assert p["messages"][0]["content"] == b.PROMPTS[5 % len(b.PROMPTS)]
    assert p["stream_options"] == {"include_usage": True}
    o = b.chat_payload(0, "omni", 8, audio=True)
    assert o["modalities"] == ["text", "audio"] and o["audio"]["format"] == "pcm16" and "ignore_eos" not in o


def test_itl_p90_ratio_and_the_llm_target():
    """ITL gaps 0.1 and 0.3 s on Triton (p90 0.28 s, p50 0.2 s) vs 0.05 s on vLLM: ITL p90 ratio
    5.6, p50 4.0; at c=8 the target (ITL p90 <= 1.2 x vLLM) is missed; equal servers meet it;
    without c=8 it does not apply."""
    slow = b.summarize([_r(0, [0.1, 0.2, 0.5], 0.5, 3)], wall_s=1.0)
    fast = b.summarize([_r(0, [0.05, 0.1, 0.15], 0.15, 3)], wall_s=1.0)
    ratios = b.all_ratios({"triton": {"1": slow, "8": slow}, "vllm": {"1": fast, "8": fast}})
    r = ratios["8"]["triton_vs_vllm"]
    assert r["itl_p90"] == pytest.approx(5.6) and r["itl_p50"] == pytest.approx(4.0)
    (t,) = b.chat_targets(ratios)
    assert t["target"] == "llm: ITL p90 at c=8 / vLLM server" and t["measured"] == pytest.approx(5.6)
    assert t["met"] is False
    (same,) = b.chat_targets(b.all_ratios({"triton": {"8": fast}, "vllm": {"8": fast}}))
    assert same["measured"] == 1.0 and same["met"] is True
    (only1,) = b.chat_targets(b.all_ratios({"triton": {"1": fast}, "vllm": {"1": fast}}))
    assert only1["met"] is None and "c=1" in only1["note"]
    assert b.chat_targets({})[0]["measured"] is None
    assert "ITL p90" in b.format_table({"triton": {"8": slow}, "vllm": {"8": fast}}, ratios, None)

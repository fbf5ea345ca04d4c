"""End-to-end: the Qwen2.5-Omni pipeline (qwen2_5_omni_thinker -> qwen2_5_omni_talker ->
qwen2_5_omni_token2wav, BLS ``qwen2_5_omni``) on the real tritonserver, through the OpenAI frontend
with the official ``openai`` SDK (chat completions with ``modalities: ["text", "audio"]``).

Parity reference: ``Qwen2_5OmniForConditionalGeneration.generate(..., return_audio=True)`` on the
same prepared checkpoint in this test process, greedy thinker and talker with the talker settings
of ``model_repository/qwen2_5_omni_talker/config.pbtxt``, ``torch.manual_seed(seed)`` just before
``generate`` (the request sends the same ``seed``; it seeds the DiT's noise). Text must be equal
and the audio equal sample for sample after the frontend's int16 conversion (bit-exact in float:
tests/unit/test_qwen2_5_omni.py).
"""
from __future__ import annotations

import base64
import io
import threading

import httpx
import openai
import pytest
import soundfile as sf
from conftest import E2E_MODELS

from omni_triton.media.audio import float_to_pcm16
from omni_triton.serve.repository import available_models, model_parameters, resolve_models

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    "qwen2_5_omni" not in set(resolve_models([m.strip() for m in E2E_MODELS.split(",") if m.strip()])),
    reason="qwen25_omni not in OMNI_TRITON_E2E_MODELS")]

MODEL = "qwen2_5_omni"  # the Triton name; the OpenAI name (served_model_name) is qwen25_omni
QUESTION = "What is the capital of France?"


def _msgs(text):
    return [{"role": "user", "content": text}]


def _sdk(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.frontend_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def reference():
    """(text, int16 PCM bytes) of the reference generate for a question, voice, seed, max_tokens."""
    import torch

    from omni_triton.checkpoints.common import read_manifest
    from omni_triton.paths import model_dir
    from omni_triton.stages.qwen2_5_omni import chat_tokenizer, load_model

    torch.set_num_threads(1)
    path = model_dir("qwen2.5-omni-tiny")
    model, tok = load_model(path), chat_tokenizer(path).tokenizer
    man = read_manifest(path)
    talker = model_parameters(available_models()["qwen2_5_omni_talker"])
    lock = threading.Lock()

    def run(question: str, voice: str, seed: int, max_tokens: int = 16):
        ids = tok.apply_chat_template(_msgs(question), tokenize=True, add_generation_prompt=True)
        x = torch.tensor([list(ids["input_ids"] if hasattr(ids, "keys") else ids)])
        with lock, torch.inference_mode():
            torch.manual_seed(seed)
            seq, wav = model.generate(
                x, attention_mask=torch.ones_like(x), speaker=voice, thinker_max_new_tokens=max_tokens,
                thinker_eos_token_id=man["thinker_eos_token_id"], thinker_do_sample=False,
                talker_do_sample=talker["do_sample"] == "true",
                talker_repetition_penalty=float(talker["repetition_penalty"]),
                talker_max_new_tokens=int(talker["default_max_frames"]),
                talker_min_new_tokens=int(talker["default_min_frames"]),
                talker_eos_token_id=man["talker_eos_token_id"])
        return tok.decode(seq[0, x.shape[1]:], skip_special_tokens=True), float_to_pcm16(wav.numpy())

    return run


def test_listed_with_text_and_audio(stack):
    cards = {m["id"]: m for m in httpx.get(f"{stack.frontend_url}/v1/models", timeout=30).json()["data"]}
    assert cards["qwen25_omni"]["modalities"] == ["text", "audio"]


def test_sdk_chat_text_and_wav_equal_reference(stack, reference):
    ref_text, ref_pcm = reference(QUESTION, "Chelsie", seed=7)
    resp = _sdk(stack).chat.completions.create(
        model=MODEL, messages=_msgs(QUESTION), temperature=0, max_tokens=16, seed=7,
        modalities=["text", "audio"], audio={"format": "wav", "voice": "Chelsie"})
    message = resp.choices[0].message
    assert message.content == ref_text and message.audio.transcript == ref_text
    samples, rate = sf.read(io.BytesIO(base64.b64decode(message.audio.data)), dtype="int16")
    assert rate == 24000 and samples.tobytes() == ref_pcm


def test_sdk_chat_stream_text_then_audio_equal_reference(stack, reference):
    question = "Tell me a story."
    ref_text, ref_pcm = reference(question, "Ethan", seed=123)
    stream = _sdk(stack).chat.completions.create(
        model=MODEL, messages=_msgs(question), temperature=0, max_tokens=16, seed=123,
        modalities=["text", "audio"], audio={"format": "pcm16", "voice": "Ethan"}, stream=True)
    text, pcm, order = "", b"", []
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                text += choice.delta.content
                order.append("text")
            audio = getattr(choice.delta, "audio", None)
            if audio is not None:
                audio = audio if isinstance(audio, dict) else audio.model_dump()
                if audio.get("data"):
                    pcm += base64.b64decode(audio["data"])
                    order.append("audio")
    assert text == ref_text and pcm == ref_pcm
    assert order[0] == "text" and order[-1] == "audio"


@pytest.mark.parametrize("payload, param", [
    ({"audio": {"format": "wav", "voice": "no-such-voice"}, "modalities": ["text", "audio"]}, None),
    ({"messages": []}, "messages"),
    ({"temperature": 7}, "temperature"),
])
def test_bad_input_is_400_and_still_serving(stack, payload, param):
    body = {"model": MODEL, "messages": _msgs(QUESTION), "max_tokens": 4, **payload}
    r = httpx.post(f"{stack.frontend_url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param:
        assert err["param"] == param
    ok = _sdk(stack).chat.completions.create(model=MODEL, messages=_msgs("Hi"), temperature=0, max_tokens=4)
    assert ok.choices[0].message.content is not None


def test_cancel_mid_stream_stops_the_thinker(stack):
    metric = "qwen25_omni_thinker_cancelled_total"
    before = stack.metric(metric)
    payload = {"model": MODEL, "messages": _msgs("Tell me a very long story."), "max_tokens": 900,
               "ignore_eos": True, "stream": True, "modalities": ["text", "audio"],
               "audio": {"format": "pcm16", "voice": "Chelsie"}}
    with httpx.Client(timeout=120) as http:
        with http.stream("POST", f"{stack.frontend_url}/v1/chat/completions", json=payload) as r:
            assert r.status_code == 200
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data:")
                if seen >= 5:
                    break  # leaving the block closes the connection mid-text
    stack.wait_until(lambda: stack.metric(metric) > before,
                     "qwen2_5_omni_thinker did not stop after the client went away", timeout_s=60)
    ok = _sdk(stack).chat.completions.create(model=MODEL, messages=_msgs("Hi"), temperature=0, max_tokens=4)
    assert ok.choices[0].message.content is not None

"""vLLM-Omni's client conventions (issue 14: a drop-in for its benchmark client) against the
in-process fakes: SSE framing, extension fields, ``modality`` on chat chunks, one complete WAV per
streamed audio chunk, default output modalities, image chat streams, stage metrics, /tokenize and
the speech ``sample_rate``. docs/vllm_omni_compat.md has the table these tests guard.
"""

from __future__ import annotations

import base64
import io
import json
import wave

import httpx
import numpy as np
import pytest
import soundfile as sf
from test_chat_frontend import ANSWER, SR, USER, assert_error
from test_frontend_bad_input import AllFake

from clients.bench_common import metric_total
from tests.helpers.frontend import frontend_client

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def engine():
    return AllFake()


client = frontend_client


async def post(engine, path, payload, **settings) -> httpx.Response:
    async with client(engine, **settings) as c:
        return await c.post(path, json=payload)


def vllm_messages(body: bytes) -> list[str]:
    """The SSE messages as vLLM's benchmark parser sees them (``StreamedResponseHandler``:
    split on ``\\n\\n``, each message stripped), without ``data: `` prefixes."""
    messages = [m.strip() for m in body.decode("utf-8").split("\n\n") if m.strip()]
    out = []
    for m in messages:
        assert m.startswith("data: ") or m.startswith("event: ") or m.startswith(":"), m
        out.append(m)
    return out


def data_payloads(body: bytes) -> list[str]:
    """``data:`` payloads (one line each: every event here is one line of JSON)."""
    out = []
    for m in vllm_messages(body):
        lines = [ln for ln in m.split("\n") if ln.startswith("data: ")]
        assert len(lines) == 1, m
        out.append(lines[0][len("data: "):])
    return out


def chunks_of(r: httpx.Response) -> list[dict]:
    payloads = data_payloads(r.content)
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


# ------------------------------------------------------------------ 1. SSE framing
@pytest.mark.parametrize("path, payload", [
    ("/v1/chat/completions", {"model": "llm", "messages": USER, "stream": True}),
    ("/v1/completions", {"model": "llm", "prompt": "Paris is", "stream": True}),
    ("/v1/audio/speech", {"model": "piper_tts", "input": "Hello.", "stream_format": "sse"}),
])
async def test_sse_events_end_in_lf_lf(engine, path, payload):
    r = await post(engine, path, payload)
    assert r.status_code == 200, r.text
    assert b"\r" not in r.content  # sse-starlette's default separator is \r\n
    payloads = data_payloads(r.content)
    assert len(payloads) >= 2
    if path != "/v1/audio/speech":
        assert payloads[-1] == "[DONE]"
        assert all(json.loads(p) for p in payloads[:-1])
    else:
        assert [json.loads(p)["type"] for p in payloads][-1] == "speech.audio.done"


# ------------------------------------------------------------------ 2. unknown and extension fields
UNKNOWN = [
    ("/v1/chat/completions", {"model": "llm", "messages": [{**USER[0], "tool_calls": []}], "tools": [],
                              "stream_options": {"include_usage": True, "foo": 1}},
     ["tools", "stream_options.foo", "messages.0.tool_calls"]),
    ("/v1/completions", {"model": "llm", "prompt": "Paris is", "best_of": 2}, ["best_of"]),
    ("/v1/audio/speech", {"model": "piper_tts", "input": "Hello.", "response_format": "wav",
                          "task_type": "CustomVoice"}, ["task_type"]),
    ("/v1/images/generations", {"model": "qwen_image", "prompt": "a fox", "colour": "red"}, ["colour"]),
]


@pytest.mark.parametrize("path, payload, names", UNKNOWN)
async def test_unknown_fields_ignored_and_named_by_default(engine, path, payload, names, caplog):
    r = await post(engine, path, payload)
    assert r.status_code == 200, r.text
    assert r.headers["x-ignored-fields"] == ", ".join(names)
    assert all(n in caplog.text for n in names)


@pytest.mark.parametrize("path, payload, names", UNKNOWN)
async def test_unknown_fields_400_with_strict_params(engine, path, payload, names):
    r = await post(engine, path, payload, strict_params=True)
    err = assert_error(r, 400, param=names[0].split(".")[0], code="unknown_parameter")
    assert "Unrecognized request argument" in err["message"] and names[0] in err["message"]


async def test_unknown_edit_form_field_ignored_or_400(engine):
    from test_images_frontend import png_bytes

    for strict in (False, True):
        async with client(engine, strict_params=strict) as c:
            r = await c.post("/v1/images/edits", files={"image": ("a.png", png_bytes(), "image/png")},
                             data={"prompt": "x", "bogus": "1"})
        if strict:
            assert_error(r, 400, param="bogus", code="unknown_parameter")
        else:
            assert r.status_code == 200 and r.headers["x-ignored-fields"] == "bogus"


async def test_known_fields_have_no_header_and_types_stay_strict(engine):
    r = await post(engine, "/v1/chat/completions", {"model": "llm", "messages": USER})
    assert r.status_code == 200 and "x-ignored-fields" not in r.headers
    # issue 9's strict types are unchanged: only unknown *names* are lenient
    for bad in ({"max_tokens": True}, {"n": "2"}, {"stream_options": {"continuous_usage_stats": "yes"}}):
        r = await post(engine, "/v1/chat/completions", {"model": "llm", "messages": USER, **bad})
        assert_error(r, 400)
    r = await post(engine, "/v1/audio/speech", {"model": "piper_tts", "input": "x", "ignore_eos": 1})
    assert_error(r, 400, param="ignore_eos")


async def test_vllm_extension_fields_accepted(engine):
    r = await post(engine, "/v1/audio/speech", {"model": "piper_tts", "input": "Hello.", "ignore_eos": True,
                                                "response_format": "wav"})
    assert r.status_code == 200 and "x-ignored-fields" not in r.headers
    r = await post(engine, "/v1/chat/completions", {"model": "llm", "messages": USER, "ignore_eos": True})
    assert r.status_code == 200 and engine.requests[-1][1].sampling["ignore_eos"] is True


async def test_continuous_usage_stats_on_every_chunk(engine):
    r = await post(engine, "/v1/chat/completions", {
        "model": "llm", "messages": USER, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    chunks = chunks_of(r)
    *per_choice, final = chunks
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == len(ANSWER)
    assert all("usage" in c for c in per_choice)
    counts = [c["usage"]["completion_tokens"] for c in per_choice]
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] == len(ANSWER)
    text_chunks = [c for c in per_choice if c["choices"][0]["delta"].get("content")]
    assert [c["usage"]["completion_tokens"] for c in text_chunks] == list(range(1, len(ANSWER) + 1))
    prompt = final["usage"]["prompt_tokens"]
    assert all(c["usage"]["prompt_tokens"] == prompt for c in per_choice[1:])
    assert all(c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"]
               for c in per_choice)
    # without continuous_usage_stats: usage only on the last chunk (OpenAI)
    r = await post(engine, "/v1/chat/completions", {"model": "llm", "messages": USER, "stream": True,
                                                    "stream_options": {"include_usage": True}})
    assert [("usage" in c) for c in chunks_of(r)] == [False] * (len(chunks_of(r)) - 1) + [True]


async def test_continuous_usage_stats_completions(engine):
    r = await post(engine, "/v1/completions", {
        "model": "llm", "prompt": "Paris is", "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    chunks = chunks_of(r)
    texts = [c for c in chunks[:-1] if c["choices"][0]["text"]]
    assert [c["usage"]["completion_tokens"] for c in texts] == list(range(1, len(ANSWER) + 1))


# ------------------------------------------------------------------ 3. + 4. modality, audio chunks
def client_audio_seconds(chunks: list[dict]) -> float:
    """What vLLM-Omni's benchmark client counts: ``modality == "audio"`` chunks, each data
    opened with ``wave.open``, frames summed over the first chunk's rate."""
    frames, rate = 0, None
    for c in chunks:
        if c.get("modality") != "audio":
            continue
        data = (c["choices"][0]["delta"].get("audio") or {}).get("data")
        if data:
            with wave.open(io.BytesIO(base64.b64decode(data)), "rb") as w:
                rate = rate or w.getframerate()
                frames += w.getnframes()
    return frames / rate if rate else 0.0


async def test_every_chunk_has_its_modality(engine):
    r = await post(engine, "/v1/chat/completions", {"model": "llm", "messages": USER, "stream": True,
                                                    "modalities": ["text", "audio"]})
    chunks = chunks_of(r)
    assert all(c["modality"] in ("text", "audio") for c in chunks)
    for c in chunks[1:-1]:
        delta = c["choices"][0]["delta"]
        assert ("content" in delta) == (c["modality"] == "text")
        assert ("data" in delta.get("audio", {})) == (c["modality"] == "audio")
    assert chunks[0]["modality"] == "text" and chunks[0]["choices"][0]["delta"]["role"] == "assistant"


async def test_streamed_wav_audio_counts_like_vllm_omni(engine):
    """audio.format wav (or none): each chunk a complete WAV, so the client counts all of it."""
    expected = len(engine.expected_audio()) / SR
    for audio in ({"format": "wav", "voice": "joe"}, None):
        payload = {"model": "llm", "messages": USER, "stream": True, "modalities": ["text", "audio"]}
        if audio:
            payload["audio"] = audio
        r = await post(engine, "/v1/chat/completions", payload)
        assert client_audio_seconds(chunks_of(r)) == pytest.approx(expected)


async def test_streamed_pcm16_audio_stays_raw(engine):
    r = await post(engine, "/v1/chat/completions", {"model": "llm", "messages": USER, "stream": True,
                                                    "modalities": ["text", "audio"],
                                                    "audio": {"format": "pcm16", "voice": "joe"}})
    audio = [base64.b64decode(c["choices"][0]["delta"]["audio"]["data"]) for c in chunks_of(r)
             if c["modality"] == "audio" and "data" in c["choices"][0]["delta"].get("audio", {})]
    assert audio and not any(a.startswith(b"RIFF") for a in audio)
    assert sum(len(a) for a in audio) == 2 * len(engine.expected_audio())


# ------------------------------------------------------------------ 6. image chat streams
async def test_streaming_chat_on_image_model(engine):
    r = await post(engine, "/v1/chat/completions", {
        "model": "qwen_image", "messages": [{"role": "user", "content": "a red fox"}], "stream": True,
        "n": 2, "size": "64x48", "seed": 7, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    image_chunk, usage_chunk = chunks_of(r)
    assert image_chunk["modality"] == "image" and image_chunk["object"] == "chat.completion.chunk"
    choice = image_chunk["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["delta"]["role"] == "assistant"
    parts = choice["delta"]["content"]
    assert len(parts) == 2 and all(p["image_url"]["url"].startswith("data:image/png;base64,") for p in parts)
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["num_inference_steps"] >= 2
    from PIL import Image

    img = Image.open(io.BytesIO(base64.b64decode(parts[0]["image_url"]["url"].split(",", 1)[1])))
    assert img.size == (64, 48)


# ------------------------------------------------------------------ 7. stage metrics
async def test_image_stage_metrics_are_each_steps_own_compute(engine):
    """Each ensemble step's STAGE_COMPUTE_MS per image (an ensemble output each), summed over
    the request's images; another request's numbers never enter (the statistics delta did)."""
    from test_images_frontend import FAKE_STAGE_MS, T2I

    async with client(engine) as c:
        await c.post("/v1/images/generations", json={"model": "qwen_image", "prompt": "before", "n": 3})
        r = await c.post("/v1/images/generations", json={"model": "qwen_image", "prompt": "a fox", "n": 2,
                                                         "size": "64x48", "num_inference_steps": 3,
                                                         "return_stage_metrics": True})
    assert r.status_code == 200, r.text
    body = r.json()
    metrics = body["metrics"]
    stages = metrics["stage_metrics"]
    names = T2I.ensemble_steps
    assert sorted(stages) == ["0", "1", "2"]  # stage ids only: vLLM-Omni's --print-stage sorts them by int()
    for i, name in enumerate(names):
        e = stages[str(i)]
        assert e["stage_id"] == i and e["stage_name"] == name and e["calls"] == 2 and e["wall_ms"] is None
        assert e["compute_ms"] == e["stage_gen_time_ms"] == pytest.approx(2 * 3 * FAKE_STAGE_MS[name][1])
    assert all(e["final_output_type"] == "image" for e in stages.values())
    assert [e["output_unit_count"] for e in stages.values()] == [0, 0, 2]  # each image counted once
    assert stages["2"]["image_pixels"] == metrics["image_pixels"] == 2 * 64 * 48
    assert metrics["denoise_step_latency_ms"] == pytest.approx(0.5 * 1000 / 3, abs=1e-3)  # the fake's DENOISE_SECONDS
    assert metrics["request_wall_ms"] == pytest.approx(10.0) and metrics["source"] == "pipeline"
    assert body["stage_durations"] == metrics["stage_durations"] == {
        **{f"stage_{i}_gen_ms": 6 * FAKE_STAGE_MS[n][1] for i, n in enumerate(names)},
        **{f"{n}_ms": 6 * FAKE_STAGE_MS[n][1] for n in names}}  # units in every key
    # not asked for: no metrics
    r = await post(engine, "/v1/images/generations", {"model": "qwen_image", "prompt": "a fox"})
    assert "metrics" not in r.json() and "stage_durations" not in r.json()


async def test_image_chat_stage_metrics(engine):
    for stream in (False, True):
        r = await post(engine, "/v1/chat/completions", {
            "model": "qwen_image", "messages": [{"role": "user", "content": "a fox"}], "stream": stream,
            "return_stage_metrics": True})
        metrics = chunks_of(r)[0]["metrics"] if stream else r.json()["metrics"]
        assert metrics["stage_metrics"]["2"]["output_unit_count"] == 1
        assert metrics["stage_metrics"]["1"]["stage_name"] == "qwen_image_denoiser"


async def _chat_metrics(engine, stream: bool, max_tokens: int | None = None) -> tuple[dict, dict]:
    r = await post(engine, "/v1/chat/completions", {
        "model": "llm", "messages": USER, "stream": stream, "return_stage_metrics": True,
        "modalities": ["text", "audio"], **({"max_tokens": max_tokens} if max_tokens else {}),
        **({"stream_options": {"include_usage": True}} if stream else {})})
    assert r.status_code == 200, r.text
    if stream:
        chunks = chunks_of(r)
        metrics_chunk, usage_chunk = chunks[-2], chunks[-1]
        assert metrics_chunk["choices"] == [] and "usage" in usage_chunk
        return metrics_chunk["metrics"], usage_chunk["usage"]
    return r.json()["metrics"], r.json()["usage"]


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_stage_metrics(engine, stream):
    """A BLS's per-request report (STAGE_COMPUTE_MS + STAGE_METRICS on its last response) becomes
    vLLM-Omni's ``metrics``: the BLS first (its own compute is its exclusive time), then each stage
    it called with the wall time the BLS waited on it as ``stage_gen_time_ms``."""
    engine.report_stages = True
    await post(engine, "/v1/chat/completions", {"model": "llm_tts", "messages": USER})  # another request before
    metrics, usage = await _chat_metrics(engine, stream)
    n = usage["completion_tokens"]
    stages = metrics["stage_metrics"]
    assert [stages[k]["stage_name"] for k in sorted(stages, key=int)] == ["llm_tts", "llm", "piper"]
    bls, llm, piper = (stages[k] for k in ("0", "1", "2"))
    assert bls["calls"] == 1 and bls["compute_ms"] == bls["stage_gen_time_ms"] == pytest.approx(0.1 * n)
    assert bls["wall_ms"] == pytest.approx(metrics["request_wall_ms"]) and bls["wall_ms"] > 0
    assert llm == {"stage_id": 1, "stage_name": "llm", "calls": 1, "wall_ms": pytest.approx(1.0 * n),
                   "compute_ms": pytest.approx(0.9 * n), "stage_gen_time_ms": pytest.approx(1.0 * n)}
    assert piper["calls"] == n and piper["compute_ms"] is None and piper["stage_gen_time_ms"] == pytest.approx(0.5 * n)
    assert metrics["stage_total_ms"] == pytest.approx(1.6 * n)
    assert metrics["stage_durations"]["llm_ms"] == pytest.approx(1.0 * n) and metrics["source"] == "pipeline"
    assert {k: metrics[k] for k in ("final_output_type", "output_unit_type", "num_tokens_in", "num_tokens_out")} == {
        "final_output_type": "audio", "output_unit_type": "token", "num_tokens_in": usage["prompt_tokens"],
        "num_tokens_out": usage["completion_tokens"]}


async def test_chat_stage_metrics_are_per_request_under_concurrency(engine):
    """Two requests at once, 2 and 6 tokens: each gets its own numbers (the global statistics
    delta gave both the mean of both)."""
    import asyncio

    engine.report_stages = True
    (small, _), (large, _) = await asyncio.gather(_chat_metrics(engine, False, 2), _chat_metrics(engine, True, 6))
    assert small["stage_metrics"]["1"]["wall_ms"] == pytest.approx(2.0)
    assert large["stage_metrics"]["1"]["wall_ms"] == pytest.approx(6.0)
    assert small["stage_metrics"]["2"]["calls"] == 2 and large["stage_metrics"]["2"]["calls"] == 6


async def test_a_single_stage_is_timed_by_the_frontend(engine):
    """No BLS report (``llm``: vLLM's engine loop reports no compute): the model's own wall time."""
    metrics, _ = await _chat_metrics(engine, False)
    (only,) = metrics["stage_metrics"].values()
    assert only["stage_name"] == "llm_tts" and only["compute_ms"] is None
    assert only["stage_gen_time_ms"] == only["wall_ms"] == metrics["stage_total_ms"] == metrics["request_wall_ms"]


# ------------------------------------------------------------------ 7. /tokenize, /detokenize
def _with_assets(engine, **assets):
    import dataclasses

    for name, folder in assets.items():
        engine.models[name] = dataclasses.replace(engine.models[name], assets=(folder,))
    return engine


@pytest.mark.parametrize("folder", ["smollm2", "qwen3-omni-tiny"])
async def test_tokenize_matches_the_stages_tokenizer(engine, folder):
    from omni_triton.paths import model_dir

    path = model_dir(folder)
    if not (path / "tokenizer.json").exists():
        pytest.skip(f"{folder} not prepared")
    from transformers import AutoTokenizer  # the stages' tokenizer (tests may import torch)

    ref = AutoTokenizer.from_pretrained(str(path))
    import dataclasses

    _with_assets(engine, llm=folder)
    engine.models["llm_tts"] = dataclasses.replace(engine.models["llm_tts"], depends_on=("llm",))
    messages = [{"role": "system", "content": "Be brief."}, *USER]
    async with client(engine) as c:
        chat_ids = (await c.post("/tokenize", json={"model": "llm", "messages": messages})).json()
        prompt = await c.post("/tokenize", json={"model": "llm", "prompt": "The capital of France is",
                                                 "return_token_strs": True})
        plain = await c.post("/tokenize", json={"model": "llm", "prompt": "The capital of France is",
                                                "add_special_tokens": False})
        # llm_tts has no assets: its tokenizer is that of the stage it calls (depends_on)
        twin = await c.post("/tokenize", json={"model": "llm_tts", "messages": messages})
    text = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = ref(text, add_special_tokens=False)["input_ids"]  # what the llm stage counts
    assert chat_ids["tokens"] == expected and chat_ids["count"] == len(expected)
    assert chat_ids["max_model_len"] == 2048
    body = prompt.json()
    assert body["tokens"] == ref("The capital of France is")["input_ids"]
    assert body["token_strs"] == ref.convert_ids_to_tokens(body["tokens"])
    assert plain.json()["tokens"] == ref("The capital of France is", add_special_tokens=False)["input_ids"]
    assert twin.json()["tokens"] == expected
    async with client(engine) as c:
        r = await c.post("/detokenize", json={"model": "llm", "tokens": expected})
        assert r.json() == {"prompt": ref.decode(expected)}
        bad = await c.post("/detokenize", json={"model": "llm", "tokens": [10**9]})
        assert_error(bad, 400, param="tokens")


async def test_tokenize_errors(engine):
    async with client(engine) as c:
        assert_error(await c.post("/tokenize", json={"model": "llm", "prompt": "x"}), 400,
                     code="tokenizer_unavailable")  # the fake's llm has no prepared folder
        assert_error(await c.post("/tokenize", json={"model": "nope", "prompt": "x"}), 404)
        assert_error(await c.post("/tokenize", json={"model": "piper_tts", "prompt": "x"}), 400,
                     code="unsupported_model")
        _with_assets(engine, llm="smollm2")
        assert_error(await c.post("/tokenize", json={"model": "llm"}), 400, param="prompt")
        assert_error(await c.post("/tokenize", json={"model": "llm", "prompt": 5}), 400, param="prompt")


async def test_tokenize_template_blocks_and_special_tokens_like_transformers(engine, tmp_path, monkeypatch):
    """A tokenizer that adds a BOS and a template with block tags on their own lines: the chat
    path adds no special tokens (the template has them) and trims blocks as transformers does."""
    from omni_triton.paths import model_dir

    src = model_dir("smollm2")
    if not (src / "tokenizer.json").exists():
        pytest.skip("smollm2 not prepared")
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    folder = tmp_path / "models" / "bos-model"
    folder.mkdir(parents=True)
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    bos = tok.token_to_id("<|im_start|>")
    tok.post_processor = TemplateProcessing(single="<|im_start|> $A", special_tokens=[("<|im_start|>", bos)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text((src / "tokenizer_config.json").read_text())
    (folder / "chat_template.jinja").write_text(
        "{% for message in messages %}\n{{ bos_token }}{{ message['role'] }}: {{ message['content'] }}\n"
        "{% endfor %}\n{% if add_generation_prompt %}\nassistant:\n{% endif %}\n")
    monkeypatch.setenv("OMNI_TRITON_CACHE", str(tmp_path))
    _with_assets(engine, llm="bos-model")
    ref = AutoTokenizer.from_pretrained(str(folder))
    async with client(engine) as c:
        chat_ids = (await c.post("/tokenize", json={"model": "llm", "messages": USER})).json()["tokens"]
        prompt_ids = (await c.post("/tokenize", json={"model": "llm", "prompt": "Hi"})).json()["tokens"]
    assert chat_ids == ref(ref.apply_chat_template(USER, tokenize=False, add_generation_prompt=True),
                           add_special_tokens=False)["input_ids"]
    assert prompt_ids == ref("Hi")["input_ids"] and prompt_ids[0] == bos


# ------------------------------------------------------------------ 8. speech sample_rate
@pytest.fixture
def speech_engine():
    from test_frontend import FakeEngine

    return FakeEngine()


def _speech_pcm(engine) -> np.ndarray:
    return np.concatenate(engine.chunks)


async def test_speech_sample_rate_resamples_whole_clip(speech_engine):
    from omni_triton.media.audio import float_to_pcm16, resample

    r = await post(speech_engine, "/v1/audio/speech", {"model": "piper_tts", "input": "Hello.",
                                                       "response_format": "wav", "sample_rate": 24000})
    assert r.status_code == 200, r.text
    assert r.headers["x-sample-rate"] == "24000"
    y, sr = sf.read(io.BytesIO(r.content), dtype="int16")
    expected = resample(_speech_pcm(speech_engine), 22050, 24000)
    assert sr == 24000 and y.tobytes() == float_to_pcm16(expected)
    assert abs(len(y) / 24000 - len(_speech_pcm(speech_engine)) / 22050) < 1e-3  # same duration


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
async def test_speech_sample_rate_streamed_equals_whole_clip(speech_engine, stream_format):
    """vLLM-Omni's TTS client reads streamed PCM as 24 kHz: with sample_rate 24000 its audio
    duration (bytes / 2 / 24000) is the clip's real duration."""
    from omni_triton.media.audio import float_to_pcm16, resample

    r = await post(speech_engine, "/v1/audio/speech", {"model": "piper_tts", "input": "Hello.", "stream": True,
                                                       "stream_format": stream_format, "response_format": "pcm",
                                                       "sample_rate": 24000})
    assert r.status_code == 200, r.text
    if stream_format == "sse":
        events = [json.loads(p) for p in data_payloads(r.content)]
        data = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
        usage = events[-1]["usage"]
        assert usage["sample_rate"] == 24000 and usage["audio_samples"] == len(data) // 2
    else:
        data = r.content
    assert r.headers["x-sample-rate"] == "24000"
    expected = float_to_pcm16(resample(_speech_pcm(speech_engine), 22050, 24000))
    assert data == expected
    true_seconds = len(_speech_pcm(speech_engine)) / 22050
    assert len(data) / 2 / 24000 == pytest.approx(true_seconds, abs=1e-3)


async def test_speech_sample_rate_native_and_unsupported(speech_engine):
    r = await post(speech_engine, "/v1/audio/speech", {"model": "piper_tts", "input": "Hello.",
                                                       "response_format": "pcm", "sample_rate": 22050})
    assert r.status_code == 200 and len(r.content) == 2 * len(_speech_pcm(speech_engine))
    r = await post(speech_engine, "/v1/audio/speech", {"model": "piper_tts", "input": "Hello.", "sample_rate": 12345})
    assert_error(r, 400, param="sample_rate", code="unsupported_sample_rate")
    r = await post(speech_engine, "/v1/audio/speech", {"model": "piper_tts", "input": "Hello.", "sample_rate": 0})
    assert_error(r, 400, param="sample_rate")
    # opus needs 48 kHz: with sample_rate 48000 the 22,050 Hz voice can be sent as opus
    r = await post(speech_engine, "/v1/audio/speech", {"model": "piper_tts", "input": "Hello.",
                                                       "response_format": "opus", "sample_rate": 48000})
    assert r.status_code == 200, r.text


async def test_chat_audio_seconds_counted_in_metrics(engine):
    """The frontend counts the speech it sends in chat answers (the e2e benchmark test compares
    vLLM-Omni's client's audio duration with it)."""
    async with client(engine) as c:
        for stream in (False, True):
            r = await c.post("/v1/chat/completions", json={"model": "llm", "messages": USER, "stream": stream,
                                                           "modalities": ["text", "audio"]})
            assert r.status_code == 200
            _ = r.content
        text = (await c.get("/metrics")).text
    assert metric_total(text, "omni_frontend_audio_seconds_total", model="llm_tts") == pytest.approx(
        2 * len(engine.expected_audio()) / SR)

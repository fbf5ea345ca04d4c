"""``POST /v1/audio/transcriptions`` and ``/v1/audio/translations`` (serving.transcriptions) on
the fake engine, through the official OpenAI SDK where a client would use it: every
response_format, the SSE stream, translation, the OpenAI model aliases, the omni path, segment
order and concurrency, and every refusal (OpenAI error shape, 4xx, the app keeps serving)."""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import threading

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import srt
import webvtt
from fake_engine import FakeEngine, fake_transcript
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from openai_frontend.engine import InferenceError, InvalidRequestError, TritonEngine, model_info_from_config
from openai_frontend.engine.triton import asr_inputs
from openai_frontend.serving import transcriptions as tr
from openai_frontend.serving.transcriptions import TextJoiner, TranscriptionSettings
from tests.helpers.fake_triton import StatefulTriton, fake_triton
from tests.helpers.frontend import frontend_client

pytestmark = pytest.mark.anyio
RATE = 16000


@pytest.fixture
def anyio_backend():
    return "asyncio"


def voiced(seconds: float, rate: int = RATE, seed: int = 0) -> np.ndarray:
    """Speech-like sound the VAD takes for voice: a 120 Hz buzz with its harmonics (a vowel),
    loudness swinging at a syllable rate of 4 Hz, a little noise."""
    t = np.arange(int(seconds * rate)) / rate
    buzz = sum(np.sin(2 * np.pi * 120 * k * t) / k for k in range(1, 12))
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 4 * t)
    noise = 0.01 * np.random.default_rng(seed).standard_normal(len(t))
    return (0.25 * buzz * envelope + noise).astype(np.float32)


def speech_file(pieces: list[float], rate: int = RATE, gap_s: float = 1.0, fmt: str = "WAV") -> bytes:
    """A file of voiced pieces of the given seconds, each followed by ``gap_s`` of silence."""
    parts = []
    for i, seconds in enumerate(pieces):
        parts += [voiced(seconds, rate, seed=i), np.zeros(int(gap_s * rate), np.float32)]
    buf = io.BytesIO()
    sf.write(buf, np.concatenate(parts), rate, format=fmt)
    return buf.getvalue()


class RecordingEngine(FakeEngine):
    """The fake, recording each ASR call (model, samples, language, prompt, task), each chat
    request, and the most ASR calls in flight at once."""

    def __init__(self):
        super().__init__()
        self.asr_calls: list[tuple[str, int, str | None, str | None, str]] = []
        self.chat_requests = []
        self.running = self.peak = 0
        self.closed = 0

    async def transcribe(self, model, audio, language=None, prompt=None, task="transcribe"):
        self.asr_calls.append((model, len(audio), language, prompt, task))
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            async for delta in super().transcribe(model, audio, language, prompt, task):
                yield delta
        finally:
            self.running -= 1
            self.closed += 1

    async def generate(self, model, request):
        self.chat_requests.append((model, request))
        async for chunk in super().generate(model, request):
            yield chunk


def sdk(engine, **settings) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused",
                              http_client=frontend_client(engine, **settings), max_retries=0)


def expected_text(engine: RecordingEngine, task: str = "transcribe") -> str:
    """The joined text the fake answers for the segments it was sent (in segment order)."""
    lengths = [n for _, n, *_ in engine.asr_calls]
    return " ".join("".join(fake_transcript(np.zeros(n), None, None, task)) for n in lengths)


TWO = speech_file([1.0, 2.0])


# --------------------------------------------------------------------------- formats
async def test_json_is_the_default_and_carries_the_duration():
    engine = RecordingEngine()
    r = await sdk(engine).audio.transcriptions.create(file=("a.wav", TWO, "audio/wav"), model="pocketsphinx")
    assert len(engine.asr_calls) == 2  # two voiced pieces, two segments
    assert r.text == expected_text(engine)
    assert r.usage.type == "duration" and r.usage.seconds == pytest.approx(5.0)
    assert all(call[0] == "pocketsphinx" and call[4] == "transcribe" for call in engine.asr_calls)


async def test_text_srt_vtt_and_verbose_json_agree_on_segments():
    engine = RecordingEngine()
    client = sdk(engine)
    f = ("a.wav", TWO, "audio/wav")
    verbose = await client.audio.transcriptions.create(file=f, model="pocketsphinx", response_format="verbose_json",
                                                       timestamp_granularities=["segment"], language="en")
    text = expected_text(engine)[: len(verbose.text)]
    assert verbose.text == text and verbose.language == "english" and verbose.duration == pytest.approx(5.0)
    segs = verbose.segments
    assert [s.id for s in segs] == [0, 1]
    assert " ".join(s.text for s in segs) == verbose.text
    # segment times are the VAD's: the first piece is 0-1 s, the second 2-4 s (padding around)
    assert segs[0].start < 0.5 < 1.0 <= segs[0].end < 2.0 <= segs[1].end and segs[1].start < 2.2
    assert 3.9 < segs[1].end <= 5.0

    plain = await client.audio.transcriptions.create(file=f, model="pocketsphinx", response_format="text")
    assert plain == verbose.text + "\n"
    subs = list(srt.parse(await client.audio.transcriptions.create(file=f, model="pocketsphinx",
                                                                   response_format="srt")))
    assert [s.content for s in subs] == [s.text for s in segs]
    assert [round(s.start.total_seconds(), 2) for s in subs] == [round(s.start, 2) for s in segs]
    assert [round(s.end.total_seconds(), 2) for s in subs] == [round(s.end, 2) for s in segs]
    vtt = webvtt.from_string(await client.audio.transcriptions.create(file=f, model="pocketsphinx",
                                                                      response_format="vtt"))
    assert [c.text for c in vtt] == [s.text for s in segs]
    assert [round(c.start_time.in_milliseconds() / 1000, 2) for c in vtt] == [round(s.start, 2) for s in segs]
    assert [round(c.end_time.in_milliseconds() / 1000, 2) for c in vtt] == [round(s.end, 2) for s in segs]


async def test_stream_yields_deltas_in_segment_order_then_done():
    engine = RecordingEngine()
    # four pieces, the shortest last: the fake answers short segments later, out of order
    data = speech_file([2.5, 1.5, 1.0, 0.6])
    stream = await sdk(engine).audio.transcriptions.create(file=("a.wav", data, "audio/wav"), model="whisper",
                                                           stream=True)
    events = [e async for e in stream]
    assert [e.type for e in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1)
    assert events[-1].type == "transcript.text.done"
    streamed = "".join(e.delta for e in events[:-1])
    assert streamed == events[-1].text == expected_text(engine)
    assert len(events) - 1 == 3 * len(engine.asr_calls)  # every delta of every segment, none merged away
    whole = await sdk(RecordingEngine()).audio.transcriptions.create(file=("a.wav", data, "audio/wav"),
                                                                     model="whisper")
    assert whole.text == streamed


async def test_translation_on_whisper_and_refused_on_pocketsphinx():
    engine = RecordingEngine()
    client = sdk(engine)
    with pytest.warns(DeprecationWarning):  # translations.create is deprecated in SDK 3.57, still OpenAI's API
        r = await client.audio.translations.create(file=("a.wav", TWO, "audio/wav"), model="whisper",
                                                   response_format="verbose_json")
    assert {c[4] for c in engine.asr_calls} == {"translate"}
    assert r.text.startswith("translated") and r.language == "english"
    with pytest.warns(DeprecationWarning), pytest.raises(openai.BadRequestError) as e:
        await client.audio.translations.create(file=("a.wav", TWO, "audio/wav"), model="pocketsphinx")
    assert e.value.body["code"] == "translation_not_supported" and e.value.body["param"] == "model"


@pytest.mark.parametrize("alias", tr.OPENAI_ALIASES)
async def test_openai_model_names_use_the_default_transcription_model(alias):
    engine = RecordingEngine()
    await sdk(engine).audio.transcriptions.create(file=("a.wav", TWO, "audio/wav"), model=alias)
    assert {c[0] for c in engine.asr_calls} == {"pocketsphinx"}
    engine = RecordingEngine()
    await sdk(engine, transcription=TranscriptionSettings(default_model="whisper")).audio.transcriptions.create(
        file=("a.wav", TWO, "audio/wav"), model=alias)
    assert {c[0] for c in engine.asr_calls} == {"whisper"}
    with pytest.raises(openai.NotFoundError, match="stands for the default transcription model 'nope'"):
        await sdk(engine, transcription=TranscriptionSettings(default_model="nope")).audio.transcriptions.create(
            file=("a.wav", TWO, "audio/wav"), model=alias)


async def test_omni_transcribes_through_chat_with_an_instruction():
    engine = RecordingEngine()
    r = await sdk(engine).audio.transcriptions.create(file=("a.wav", TWO, "audio/wav"), model="omni",
                                                      language="de", prompt="Paris", temperature=0.2)
    assert r.text == "The capital of France is Paris. The capital of France is Paris."
    assert not engine.asr_calls and len(engine.chat_requests) == 2
    model, request = engine.chat_requests[0]
    assert model == "qwen3_omni" and request.modalities == ("text",)
    assert request.sampling == {"temperature": 0.2, "max_tokens": tr.OMNI_MAX_TOKENS}
    audio_part, text_part = request.messages[0]["content"]
    assert audio_part["type"] == "input_audio" and audio_part["input_audio"]["format"] == "wav"
    clip, rate = sf.read(io.BytesIO(base64.b64decode(audio_part["input_audio"]["data"])))
    assert rate == RATE and 1.0 < len(clip) / rate < 2.0  # the first segment, at 16 kHz
    assert "Transcribe" in text_part["text"] and "German" in text_part["text"] and "Paris" in text_part["text"]


async def test_prompt_and_language_reach_every_segment():
    engine = RecordingEngine()
    await sdk(engine).audio.transcriptions.create(file=("a.wav", TWO, "audio/wav"), model="whisper",
                                                  language="FR", prompt="Bonjour")
    assert [(c[2], c[3]) for c in engine.asr_calls] == [("fr", "Bonjour")] * 2


async def test_silence_is_an_empty_transcript_without_a_model_call():
    engine = RecordingEngine()
    buf = io.BytesIO()
    sf.write(buf, np.zeros(3 * RATE, np.float32), RATE, format="WAV")
    r = await sdk(engine).audio.transcriptions.create(file=("a.wav", buf.getvalue(), "audio/wav"),
                                                      model="pocketsphinx", response_format="verbose_json")
    assert r.text == "" and r.segments == [] and r.duration == pytest.approx(3.0)
    stream = await sdk(engine).audio.transcriptions.create(file=("a.wav", buf.getvalue(), "audio/wav"),
                                                           model="pocketsphinx", stream=True)
    events = [e async for e in stream]
    assert [(e.type, e.text) for e in events] == [("transcript.text.done", "")]
    assert not engine.asr_calls


def test_speech_running_to_the_end_of_the_file_keeps_its_end():
    # a voiced clip with no trailing silence: its only segment must reach the last sample
    buf = io.BytesIO()
    sf.write(buf, np.concatenate([np.zeros(RATE // 2, np.float32), voiced(1.5)]), RATE, format="WAV")
    audio = tr.prepare_audio(buf.getvalue(), 60.0, 30.0)
    assert audio.segments and audio.segments[-1][1] == audio.samples.size
    assert all(0 <= s < e <= audio.samples.size for s, e in audio.segments)


async def test_other_rates_and_formats_are_resampled_to_16k():
    engine = RecordingEngine()
    data = speech_file([1.0], rate=44100, fmt="FLAC")
    await sdk(engine).audio.transcriptions.create(file=("a.flac", data, "audio/flac"), model="pocketsphinx")
    assert len(engine.asr_calls) == 1 and engine.asr_calls[0][1] <= 2 * RATE  # 16 kHz samples, not 44.1 kHz


# --------------------------------------------------------------------------- segments
async def test_long_audio_is_cut_to_the_model_segment_length_and_sent_with_bounded_concurrency():
    engine = RecordingEngine()
    engine.models["pocketsphinx"] = dataclasses.replace(engine.models["pocketsphinx"], max_audio_s=2.0)
    data = speech_file([5.0, 1.0, 1.0, 1.0, 1.0, 1.0], gap_s=0.8)
    r = await sdk(engine, transcription=TranscriptionSettings(concurrency=2)).audio.transcriptions.create(
        file=("a.wav", data, "audio/wav"), model="pocketsphinx", response_format="verbose_json")
    assert len(engine.asr_calls) >= 8  # 5 s in >= 3 segments, then five more
    assert max(n for _, n, *_ in engine.asr_calls) <= 2 * RATE
    assert engine.peak == 2  # never more than the concurrency in flight, and it was used
    starts = [s.start for s in r.segments]
    assert starts == sorted(starts) and r.segments[-1].end <= r.duration


async def test_a_failing_segment_fails_the_request_and_cancels_the_others():
    class Failing(RecordingEngine):
        async def transcribe(self, model, audio, language=None, prompt=None, task="transcribe"):
            if len(self.asr_calls) == 1:
                self.asr_calls.append((model, len(audio), language, prompt, task))
                raise InferenceError("pocketsphinx: decoder crashed")
            async for d in super().transcribe(model, audio, language, prompt, task):
                yield d

    engine = Failing()
    async with frontend_client(engine, raise_app_exceptions=False) as c:
        r = await c.post("/v1/audio/transcriptions", data={"model": "pocketsphinx"},
                         files={"file": ("a.wav", speech_file([1.0, 1.0, 1.0, 1.0]), "audio/wav")})
        assert r.status_code == 500 and "decoder crashed" in r.json()["error"]["message"]
        assert engine.running == 0  # every segment stream closed
        ok = await c.get("/health")
        assert ok.status_code == 200


async def test_a_failure_mid_stream_is_an_error_event_the_sdk_raises():
    class FailsLater(RecordingEngine):
        async def transcribe(self, model, audio, language=None, prompt=None, task="transcribe"):
            n = len(self.asr_calls)
            async for d in super().transcribe(model, audio, language, prompt, task):
                yield d
            if n == 1:
                raise InferenceError("pocketsphinx: lost the stage")

    stream = await sdk(FailsLater()).audio.transcriptions.create(
        file=("a.wav", speech_file([1.0, 1.0, 1.0]), "audio/wav"), model="pocketsphinx", stream=True)
    got = []
    with pytest.raises(openai.APIError, match="lost the stage"):
        async for event in stream:
            got.append(event)
    assert got and all(e.type == "transcript.text.delta" for e in got)


async def test_ordered_deltas_closing_cancels_running_segments():
    started, closed = [], []

    async def source(samples):
        started.append(len(samples))
        try:
            yield "a"
            await asyncio.sleep(30)
            yield "b"
        finally:
            closed.append(len(samples))

    samples = np.zeros(100, np.float32)
    gen = tr.ordered_deltas(source, samples, [(0, 10), (10, 20), (20, 30)], concurrency=2)
    assert await gen.__anext__() == (0, "a")
    await gen.aclose()
    assert sorted(started) == sorted(closed) == [10, 10]  # the third never started


# --------------------------------------------------------------------------- text joining
@pytest.mark.parametrize("segments", [
    [["heard", " one"], ["heard", " two"]],
    [[" Hello", " world. "], ["  ", " Next", " one", "  "], [], ["x"]],
    [["", "   "], [" a ", " ", "b "], ["c"]],
])
def test_text_joiner_streams_exactly_the_joined_text(segments):
    joiner = TextJoiner()
    sent = "".join(joiner.feed(i, d) for i, seg in enumerate(segments) for d in seg)
    want = " ".join(t for t in ("".join(seg).strip() for seg in segments) if t)
    assert sent == joiner.text == want
    assert [joiner.segment_text(i) for i in range(len(segments))] == ["".join(s).strip() for s in segments]


def test_text_joiner_refuses_segments_out_of_order():
    joiner = TextJoiner()
    joiner.feed(1, "b")
    with pytest.raises(ValueError):
        joiner.feed(0, "a")


# --------------------------------------------------------------------------- off the loop
async def test_decoding_and_vad_run_off_the_event_loop(monkeypatch):
    threads = []
    real = tr.prepare_audio

    def spy(*args):
        threads.append(threading.current_thread() is threading.main_thread())
        return real(*args)

    monkeypatch.setattr(tr, "prepare_audio", spy)
    await sdk(RecordingEngine()).audio.transcriptions.create(file=("a.wav", TWO, "audio/wav"), model="pocketsphinx")
    assert threads == [False]


# --------------------------------------------------------------------------- refusals
def error_of(r: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err
    return err


WAV = speech_file([1.0])


@pytest.mark.parametrize("fields, files, status, code, param", [
    ({"model": "pocketsphinx"}, {}, 400, "missing_required_parameter", "file"),
    ({}, {"file": ("a.wav", WAV, "audio/wav")}, 400, "invalid_value", "model"),
    ({"model": "pocketsphinx"}, {"file": ("a.wav", b"RIFF garbage not audio" * 10, "audio/wav")}, 400,
     "invalid_audio", "file"),
    ({"model": "pocketsphinx"}, {"file": ("a.wav", b"", "audio/wav")}, 400, "invalid_audio", "file"),
    ({"model": "pocketsphinx", "response_format": "diarized_json"}, {"file": ("a.wav", WAV, "audio/wav")}, 400,
     "unsupported_format", "response_format"),
    ({"model": "pocketsphinx", "response_format": "srt", "stream": "true"}, {"file": ("a.wav", WAV, "audio/wav")},
     400, "unsupported_value", "stream"),
    ({"model": "pocketsphinx", "language": "english"}, {"file": ("a.wav", WAV, "audio/wav")}, 400,
     "invalid_language", "language"),
    ({"model": "pocketsphinx", "language": "de"}, {"file": ("a.wav", WAV, "audio/wav")}, 400,
     "unsupported_language", "language"),
    ({"model": "pocketsphinx", "response_format": "verbose_json", "timestamp_granularities[]": "word"},
     {"file": ("a.wav", WAV, "audio/wav")}, 400, "unsupported_value", "timestamp_granularities"),
    ({"model": "pocketsphinx", "timestamp_granularities[]": "segment"}, {"file": ("a.wav", WAV, "audio/wav")}, 400,
     "unsupported_value", "timestamp_granularities"),
    ({"model": "pocketsphinx", "temperature": "1.5"}, {"file": ("a.wav", WAV, "audio/wav")}, 400, "invalid_value",
     "temperature"),
    ({"model": "pocketsphinx", "temperature": "nan"}, {"file": ("a.wav", WAV, "audio/wav")}, 400, "invalid_value",
     "temperature"),
    ({"model": "pocketsphinx", "stream": "maybe"}, {"file": ("a.wav", WAV, "audio/wav")}, 400, "invalid_value",
     "stream"),
    ({"model": "pocketsphinx", "prompt": "x" * 2001}, {"file": ("a.wav", WAV, "audio/wav")}, 400, "invalid_value",
     "prompt"),
    ({"model": "pocketsphinx", "file": "not a file"}, {}, 400, "invalid_file", "file"),
    ({"model": "no-such-model"}, {"file": ("a.wav", WAV, "audio/wav")}, 404, None, "model"),
    ({"model": "piper_tts"}, {"file": ("a.wav", WAV, "audio/wav")}, 400, "model_not_supported", "model"),
    ({"model": "llm"}, {"file": ("a.wav", WAV, "audio/wav")}, 400, "model_not_supported", "model"),
])
async def test_bad_requests_get_a_4xx_in_the_openai_shape(fields, files, status, code, param):
    engine = RecordingEngine()
    async with frontend_client(engine) as c:
        # as the SDK sends them: every field a multipart part
        parts = [(k, (None, v)) for k, v in fields.items()] + list(files.items())
        r = await c.post("/v1/audio/transcriptions", files=parts)
        error_of(r, status, code, param)
        assert not engine.asr_calls
        ok = await c.post("/v1/audio/transcriptions", data={"model": "pocketsphinx"},
                          files={"file": ("a.wav", WAV, "audio/wav")})
        assert ok.status_code == 200, ok.text


async def test_size_limits_413_and_too_long_audio():
    engine = RecordingEngine()
    async with frontend_client(engine, max_upload_bytes=50_000,
                               transcription=TranscriptionSettings(max_audio_s=2.0)) as c:
        big = speech_file([1.0, 1.0])  # ~100 kB of 16-bit WAV
        r = await c.post("/v1/audio/transcriptions", data={"model": "pocketsphinx"},
                         files={"file": ("a.wav", big, "audio/wav")})
        error_of(r, 413, "payload_too_large", "file")
        flac = speech_file([1.0, 1.0], fmt="FLAC")  # small file, 4 s of audio
        assert len(flac) < 50_000
        r = await c.post("/v1/audio/transcriptions", data={"model": "pocketsphinx"},
                         files={"file": ("a.flac", flac, "audio/flac")})
        error_of(r, 400, "audio_too_long", "file")
        assert not engine.asr_calls
    async with frontend_client(engine, max_body_bytes=20_000) as c:
        r = await c.post("/v1/audio/transcriptions", data={"model": "pocketsphinx"},
                         files={"file": ("a.wav", big, "audio/wav")})
        error_of(r, 413)


async def test_not_multipart_and_extra_files_are_refused():
    async with frontend_client(RecordingEngine()) as c:
        r = await c.post("/v1/audio/transcriptions", json={"model": "pocketsphinx", "file": "x"})
        error_of(r, 400, "invalid_content_type")
        r = await c.post("/v1/audio/transcriptions", data={"model": "pocketsphinx"},
                         files=[("file", ("a.wav", WAV, "audio/wav")), ("other", ("b.wav", WAV, "audio/wav"))])
        error_of(r, 400, "invalid_multipart")
        r = await c.post("/v1/audio/transcriptions", files=[("model", (None, "pocketsphinx")),
                                                             ("model", (None, "whisper")),
                                                             ("file", ("a.wav", WAV, "audio/wav"))])
        error_of(r, 400, None, "model")


async def test_unknown_fields_are_ignored_and_named_or_refused_when_strict():
    async with frontend_client(RecordingEngine()) as c:
        r = await c.post("/v1/audio/transcriptions", data={"model": "pocketsphinx", "include[]": "logprobs"},
                         files={"file": ("a.wav", WAV, "audio/wav")})
        assert r.status_code == 200 and "include" in r.headers["x-ignored-fields"]
    async with frontend_client(RecordingEngine(), strict_params=True) as c:
        r = await c.post("/v1/audio/transcriptions", data={"model": "pocketsphinx", "include[]": "logprobs"},
                         files={"file": ("a.wav", WAV, "audio/wav")})
        error_of(r, 400, "unknown_parameter")


async def test_metrics_count_requests_and_audio_seconds():
    async with frontend_client(RecordingEngine()) as c:
        await c.post("/v1/audio/transcriptions", data={"model": "pocketsphinx"},
                     files={"file": ("a.wav", TWO, "audio/wav")})
        await c.post("/v1/audio/transcriptions", data={"model": "pocketsphinx", "language": "de"},
                     files={"file": ("a.wav", TWO, "audio/wav")})
        text = (await c.get("/metrics")).text
    assert ('omni_frontend_transcription_requests_total{api="transcriptions",mode="whole",model="pocketsphinx",'
            'outcome="ok"} 1.0') in text
    assert 'omni_frontend_transcribed_audio_seconds_total{model="pocketsphinx"} 5.0' in text


# --------------------------------------------------------------------------- engine side
def asr_config(name: str, **params: str) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=name, backend="python")
    cfg.model_transaction_policy.decoupled = True
    for inp in ("AUDIO", "LANGUAGE", "PROMPT", "TASK"):
        cfg.input.add(name=inp)
    for out in ("TEXT_DELTA", "STAGE_COMPUTE_MS"):
        cfg.output.add(name=out)
    for k, v in params.items():
        cfg.parameters[k].string_value = v
    return cfg


def test_model_info_reads_the_asr_parameters():
    info = model_info_from_config(asr_config("whisper", task="transcription", sample_rate="16000", max_audio_s="30",
                                             languages="en, de,FR", supports_translation="true"))
    assert info.is_transcription and not info.is_completion and not info.is_chat
    assert info.sample_rate == 16000 and info.max_audio_s == 30.0 and info.languages == ("en", "de", "fr")
    assert info.supports_translation and info.output_modalities == ("text",)
    sphinx = model_info_from_config(asr_config("pocketsphinx", task="transcription", languages="en",
                                               supports_translation="false"))
    assert sphinx.is_transcription and not sphinx.supports_translation
    other = model_info_from_config(asr_config("x", task="text-to-image"))
    assert not other.is_transcription


def test_asr_inputs_send_only_what_is_given_and_declared():
    audio = np.linspace(-1, 1, 160, dtype=np.float64)
    everything = frozenset({"AUDIO", "LANGUAGE", "PROMPT", "TASK"})
    pairs = dict(asr_inputs(audio, "en", "hint", "translate", everything))
    assert set(pairs) == everything
    assert pairs["AUDIO"].dtype == np.float32 and pairs["AUDIO"].shape == (160,)
    assert pairs["TASK"].tolist() == [b"translate"] and pairs["LANGUAGE"].tolist() == [b"en"]
    assert set(dict(asr_inputs(audio, None, None, "transcribe", everything))) == {"AUDIO"}
    assert set(dict(asr_inputs(audio, "en", "hint", "transcribe", frozenset({"AUDIO"})))) == {"AUDIO"}



class AsrTriton(StatefulTriton):
    """A fake Triton serving one ASR model: ``TEXT_DELTA`` responses per request (or an in-band
    ``INVALID_ARG`` error, as the stage's ``ASRInputError`` arrives), recording the requests."""

    def __init__(self, deltas=("the capital", " of france", "")):
        self.states = {"whisper": "READY"}
        self.deltas = deltas
        self.requests: list[pb.ModelInferRequest] = []
        self.error: str | None = None

    async def RepositoryIndex(self, request, context):
        resp = pb.RepositoryIndexResponse()
        resp.models.add(name="whisper", version="1", state="READY")
        return resp

    async def ModelConfig(self, request, context):
        return pb.ModelConfigResponse(config=asr_config("whisper", task="transcription", max_audio_s="30",
                                                        languages="en,de", supports_translation="true"))

    async def ModelStreamInfer(self, request_iterator, context):
        async for req in request_iterator:
            self.requests.append(req)
            if self.error:
                yield pb.ModelStreamInferResponse(error_message=self.error)
                continue
            for i, text in enumerate(self.deltas):
                r = pb.ModelStreamInferResponse()
                ir = r.infer_response
                ir.model_name = "whisper"
                ir.outputs.add(name="TEXT_DELTA", datatype="BYTES", shape=[1])
                data = text.encode()
                ir.raw_output_contents.append(len(data).to_bytes(4, "little") + data)
                ir.parameters["triton_final_response"].bool_param = i == len(self.deltas) - 1
                yield r


async def test_triton_engine_streams_text_deltas_and_maps_invalid_arg_to_400_errors():
    async with fake_triton(AsrTriton()) as triton:
        engine = TritonEngine(triton.url)
        try:
            info = await engine.get_model("whisper")
            assert info.is_transcription and info.supports_translation and info.max_audio_s == 30.0
            audio = np.linspace(-0.5, 0.5, 1600, dtype=np.float32)
            got = [d async for d in engine.transcribe("whisper", audio, "de", "hint", "translate")]
            assert got == ["the capital", " of france"]  # the empty final delta is not yielded
            req = triton.requests[0]
            assert [i.name for i in req.inputs] == ["AUDIO", "LANGUAGE", "PROMPT", "TASK"]
            sent = np.frombuffer(req.raw_input_contents[0], dtype="<f4")
            assert np.array_equal(sent, audio)
            triton.error = "invalid input: LANGUAGE 'xx' is not one of en, de"
            with pytest.raises(InvalidRequestError, match="LANGUAGE 'xx'"):
                async for _ in engine.transcribe("whisper", audio, "xx"):
                    pass
        finally:
            await engine.close()

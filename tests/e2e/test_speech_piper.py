"""End-to-end: the real Piper voice through tritonserver and the OpenAI frontend."""
from __future__ import annotations

import base64
import io
import ipaddress
import json
import re
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from conftest import wait_for_stub_death_report
from speech_reference import assert_piper_sentences, assert_speech_like, piper_reference

from clients.tts_grpc_stream import stream_tts

pytestmark = pytest.mark.e2e

SENTENCE = "The capital of France is Paris."
LONG_TEXT = " ".join(
    f"This is sentence number {n} of a long answer, spoken by the Piper voice." for n in range(1, 13)
)


def _sdk(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.frontend_url}/v1", api_key="unused", max_retries=0)


def test_models_voices_health(stack):
    models = httpx.get(f"{stack.frontend_url}/v1/models").json()
    assert {m["id"] for m in models["data"]} >= {"piper_tts", "tts"}
    voices = httpx.get(f"{stack.frontend_url}/v1/audio/voices").json()
    piper = next(d for d in voices["data"] if d["model"] == "piper_tts")
    assert piper["voices"] == ["joe"] and piper["sample_rate"] == 22050
    assert httpx.get(f"{stack.frontend_url}/health").status_code == 200


def test_openai_sdk_wav_is_real_speech(stack):
    response = _sdk(stack).audio.speech.create(
        model="piper_tts", voice="joe", input=SENTENCE, response_format="wav"
    )
    audio, sr = sf.read(io.BytesIO(response.content), dtype="float32")
    assert sr == 22050
    assert_speech_like(audio, sr, SENTENCE)


@pytest.mark.parametrize("fmt", ["flac", "pcm", "mp3"])
def test_other_formats(stack, fmt):
    r = httpx.post(f"{stack.frontend_url}/v1/audio/speech", timeout=120,
                   json={"model": "piper_tts", "voice": "joe", "input": SENTENCE, "response_format": fmt})
    assert r.status_code == 200, r.text
    if fmt == "pcm":
        assert r.headers["x-sample-rate"] == "22050"
        audio = np.frombuffer(r.content, dtype="<i2").astype(np.float32) / 32767
    else:
        audio, sr = sf.read(io.BytesIO(r.content), dtype="float32")
        assert sr == 22050
    assert_speech_like(audio.reshape(-1) if audio.ndim == 1 else audio[:, 0], 22050, SENTENCE, lossy=fmt == "mp3")


def test_speed_changes_duration(stack):
    def seconds(speed: float) -> float:
        r = httpx.post(f"{stack.frontend_url}/v1/audio/speech", timeout=120,
                       json={"model": "piper_tts", "voice": "joe", "input": SENTENCE,
                             "response_format": "wav", "speed": speed})
        assert r.status_code == 200, r.text
        return sf.info(io.BytesIO(r.content)).duration

    normal, fast = seconds(1.0), seconds(2.0)
    assert fast < 0.75 * normal, (normal, fast)


def test_sse_stream_arrives_while_synthesis_runs(stack):
    """Order of events: the first delta reaches the client while Triton still synthesises."""
    active_at_first_delta = None
    deltas: list[bytes] = []
    done = None
    with httpx.stream("POST", f"{stack.frontend_url}/v1/audio/speech", timeout=300,
                      json={"model": "piper_tts", "voice": "joe", "input": LONG_TEXT,
                            "response_format": "pcm", "stream_format": "sse"}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if event["type"] == "speech.audio.delta":
                if not deltas:
                    active_at_first_delta = stack.in_progress("piper")
                deltas.append(base64.b64decode(event["audio"]))
            elif event["type"] == "speech.audio.done":
                done = event
    assert active_at_first_delta is not None and active_at_first_delta >= 1
    assert len(deltas) >= 12  # one per sentence at least
    assert done is not None and done["usage"]["input_tokens"] > 0
    audio = np.frombuffer(b"".join(deltas), dtype="<i2").astype(np.float32) / 32767
    assert_speech_like(audio, 22050, LONG_TEXT, min_seconds=10)


#: Three long sentences (about 6 s of Piper audio each): long enough that a stream paced to its
#: listener cannot end before half its audio has played (the unpaced bound below).
PACING_TEXT = " ".join(
    f"This is sentence number {n} of a streamed answer, long enough to take several seconds when the "
    "Piper voice speaks it aloud to a listener." for n in (1, 2, 3))


def _piper_max_lead_s() -> float:
    """``max_lead_ms`` of ``model_repository/piper/config.pbtxt``, in seconds."""
    config = (Path(__file__).resolve().parents[2] / "model_repository" / "piper" / "config.pbtxt").read_text()
    m = re.search(r'key: "max_lead_ms" value \{ string_value: "([0-9.]+)" \}', config)
    assert m, "piper's config has no max_lead_ms"
    return float(m.group(1)) / 1000.0


def _sdk_sse_stream(stack, **extra) -> tuple[float, list[tuple[float, float]], float]:
    """``PACING_TEXT`` streamed through the official ``openai`` SDK (``stream_format="sse"``,
    PCM): (request start, [(arrival, audio seconds)] per ``speech.audio.delta``, end), all on
    ``time.monotonic``."""
    deltas: list[tuple[float, float]] = []
    start = time.monotonic()
    with _sdk(stack).audio.speech.with_streaming_response.create(
            model="piper_tts", voice="joe", input=PACING_TEXT, response_format="pcm", stream_format="sse",
            extra_body=extra or None, timeout=300) as response:
        assert response.http_request.url.path.endswith("/audio/speech")
        for line in response.iter_lines():
            if line.startswith("data:"):
                event = json.loads(line[5:])
                assert event["type"] != "speech.audio.error", event
                if event["type"] == "speech.audio.delta":
                    deltas.append((time.monotonic(), len(base64.b64decode(event["audio"])) / 2 / 22050))
    return start, deltas, time.monotonic()


def test_a_streamed_answer_arrives_as_fast_as_it_is_made_by_default(stack):
    """Issue 29: streams are not paced unless asked. Three sentences (about 18 s of audio)
    streamed through the ``openai`` SDK end before half their audio could have played; Piper
    makes them in about a second here. Paced (what the frontend sent for every stream before),
    the last sentence leaves no earlier than ``max_lead_ms`` before the two before it end
    playing, i.e. after two thirds of the audio minus 2 s (> half of it): red when the frontend
    paces by default again, or a stage holds back requests without PACED. A wide margin, not a
    speed target."""
    start, deltas, end = _sdk_sse_stream(stack)
    audio_s = sum(d for _, d in deltas)
    print(f"unpaced: {end - start:.2f} s for {audio_s:.2f} s of audio in {len(deltas)} deltas")
    assert audio_s > 12, f"{audio_s:.1f} s of audio: the text should be three long sentences"
    assert end - start < 0.5 * audio_s, (
        f"the stream took {end - start:.2f} s for {audio_s:.2f} s of audio: held back to its listener")


def test_stream_pacing_realtime_paces_the_stream_to_its_listener(stack):
    """``stream_pacing: "realtime"`` (the opt-in; the frontend sends PACED) synthesises just
    ahead of playback: a sentence leaves piper_tts no earlier than ``max_lead_ms`` before the
    audio sent before it ends playing (its deadline counts from the first delta), so the last
    delta arrives at least (audio before it - max_lead) after the first. Unpaced, the whole
    answer arrives within a second or two (red: drop PACED in the frontend, or set max_lead_ms 0).
    A lower bound only: a slow machine makes it later, never earlier."""
    lead_s = _piper_max_lead_s()
    _, deltas, _ = _sdk_sse_stream(stack, stream_pacing="realtime")
    assert len(deltas) >= 3
    before_last = sum(d for _, d in deltas[:-1])
    waited = deltas[-1][0] - deltas[0][0]
    print(f"realtime: last delta {waited:.2f} s after the first, {before_last:.2f} s of audio before it, "
          f"max_lead {lead_s:.1f} s")
    assert waited >= before_last - lead_s - 0.5, (
        f"last sentence {waited:.2f} s after the first, with {before_last:.2f} s of audio before it: not paced")


def test_an_unknown_stream_pacing_is_a_400(stack):
    with pytest.raises(openai.BadRequestError) as err:
        _sdk(stack).audio.speech.create(model="piper_tts", voice="joe", input=SENTENCE, response_format="pcm",
                                        extra_body={"stream": True, "stream_pacing": "slow"})
    assert err.value.status_code == 400 and err.value.param == "stream_pacing"


def test_raw_stream_with_sdk(stack):
    chunks = []
    text = "First sentence here. Second sentence here."
    with _sdk(stack).audio.speech.with_streaming_response.create(
        model="piper_tts", voice="joe", input=text,
        response_format="wav", extra_body={"stream": True},
    ) as response:
        for chunk in response.iter_bytes():
            chunks.append(chunk)
    data = b"".join(chunks)
    assert data[:4] == b"RIFF"
    audio, sr = sf.read(io.BytesIO(data), dtype="float32")
    assert sr == 22050
    try:
        assert_speech_like(audio, sr, text)
    except AssertionError as exc:
        # CI19 once got 0.81x the reference's duration here (not reproduced in 70 tries, loaded
        # or not): keep what came, for the next person
        kept = Path(stack.triton_log).parent / f"raw_stream_sdk_{time.time():.0f}.wav"
        kept.write_bytes(data)
        raise AssertionError(f"{exc}; {len(chunks)} HTTP chunks of {[len(c) for c in chunks]} bytes, "
                             f"{audio.size} samples, kept in {kept}") from None


def test_grpc_stream_direct_to_piper(stack):
    text = "One sentence. Another sentence. A third."
    result = stream_tts(stack.triton_grpc_url, "piper", text)
    assert len(result.chunks) == 3 and result.sample_rate == 22050
    assert_speech_like(result.audio, 22050, text)
    assert_piper_sentences(result.chunks, result.sample_rate, text)


# neighbouring sentences differ in length by 3x or more: a dropped, repeated or swapped sentence
# changes the count or puts a sentence of another length in a slot
SENTENCES = ("Yes. The capital of France is Paris, a city of bridges, museums and cafes along the river. "
             "No. This sentence has a middling length. Goodbye.")


@pytest.mark.parametrize("speed", [1.0, 1.5])
def test_each_streamed_sentence_is_piper_voice_s_sentence(stack, speed):
    """Per-sentence parity with ``piper.PiperVoice`` itself (tests/e2e/speech_reference.py): one
    response per sentence of ``PiperVoice.phonemize``, each the package's rendering of that
    sentence (length within 30% of its noise-free rendering, spectral envelope).
    Red: the piper stage dropping a sentence."""
    result = stream_tts(stack.triton_grpc_url, "piper", SENTENCES, speed=speed)
    assert_piper_sentences(result.chunks, result.sample_rate, SENTENCES, speed=speed)


def test_grpc_first_audio_arrives_before_the_last_sentence_is_synthesised(stack):
    """Streaming, not buffering: when the first chunk reaches the client, piper_tts has produced
    only part of the answer's audio (its audio-seconds counter, read while the stream is open, is
    below the whole answer's seconds)."""
    before = stack.metric("omni_tts_audio_seconds_total", model="piper")
    at_first = []
    result = stream_tts(stack.triton_grpc_url, "piper", LONG_TEXT, on_chunk=lambda i, _: i == 0 and at_first.append(
        stack.metric("omni_tts_audio_seconds_total", model="piper") - before))
    total = result.audio.size / result.sample_rate
    assert len(result.chunks) >= 12 and at_first
    assert stack.metric("omni_tts_audio_seconds_total", model="piper") - before == pytest.approx(total, rel=1e-3)
    assert at_first[0] < total / 2, f"{at_first[0]:.1f} s of {total:.1f} s synthesised at the first chunk"


BAD_REQUESTS = [
    ({"model": "piper_tts", "voice": "joe", "input": ""}, 400, "input"),
    ({"model": "piper_tts", "voice": "no-such-voice", "input": "hi"}, 400, "voice"),
    ({"model": "no-such-model", "voice": "joe", "input": "hi"}, 404, "model"),
    ({"model": "piper_tts", "voice": "joe", "input": "hi", "response_format": "ogg-vorbis"}, 400, "response_format"),
    ({"model": "piper_tts", "voice": "joe", "input": 123}, 400, "input"),
    ({"model": "piper_tts", "voice": "joe", "input": "hi", "speed": "fast"}, 400, "speed"),
    ({"model": "piper_tts", "voice": "joe", "input": "hi", "speed": 9.0}, 400, "speed"),
    ({"model": "piper_tts", "voice": "joe", "input": "word " * 2000}, 400, "input"),
    ({"model": "tts", "voice": "0", "input": "hi", "speed": 1.5}, 400, "speed"),
    ({"model": "piper_tts", "voice": "joe", "input": "a\x00b"}, 400, "input"),
    ({"model": "piper_tts", "voice": "joe", "input": "hi", "response_format": ""}, 400, "response_format"),
    ({"model": "piper_tts", "voice": "joe", "input": "...", "response_format": "wav"}, 400, "input"),
    ({"model": "piper_tts", "voice": "joe", "input": "...", "stream": True}, 400, "input"),
]


@pytest.mark.parametrize("body,status,param", BAD_REQUESTS)
def test_bad_input_gets_openai_error_and_server_keeps_serving(stack, body, status, param):
    r = httpx.post(f"{stack.frontend_url}/v1/audio/speech", json=body, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["type"] and error["param"] == param
    ok = httpx.post(f"{stack.frontend_url}/v1/audio/speech", timeout=120,
                    json={"model": "piper_tts", "voice": "joe", "input": "Still here.", "response_format": "wav"})
    assert ok.status_code == 200


def test_lone_surrogate_is_a_400(stack):
    r = httpx.post(f"{stack.frontend_url}/v1/audio/speech", headers={"content-type": "application/json"},
                   content=b'{"model": "piper_tts", "voice": "joe", "input": "a\\ud800b"}')
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "input"


def test_triton_listens_on_loopback_only(stack):
    import psutil

    triton_ports = {int(u.rsplit(":", 1)[1].split("/")[0])
                    for u in (stack.triton_http_url, stack.triton_grpc_url, stack.metrics_url)}
    listening = [c for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port in triton_ports]
    def loopback(ip: str) -> bool:  # gRPC listens on the IPv4-mapped form ::ffff:127.0.0.1
        addr = ipaddress.ip_address(ip)
        return (getattr(addr, "ipv4_mapped", None) or addr).is_loopback

    assert listening and all(loopback(c.laddr.ip) for c in listening), listening


def test_malformed_json(stack):
    r = httpx.post(f"{stack.frontend_url}/v1/audio/speech", content=b'{"model": "piper_tts", "input": ',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_sdk_raises_typed_errors(stack):
    client = _sdk(stack)
    with pytest.raises(openai.NotFoundError):
        client.audio.speech.create(model="nope", voice="joe", input="hi")
    with pytest.raises(openai.BadRequestError):
        client.audio.speech.create(model="piper_tts", voice="nobody", input="hi")


def test_client_disconnect_stops_piper(stack):
    """Closing the stream after the first chunk cancels the Triton request: the model counts a
    cancellation (only when synthesis stopped early: a request whose sentences were all
    synthesised is not counted), goes idle, and synthesises far less audio than the whole text's
    (36 sentences)."""
    cancel_text = " ".join([LONG_TEXT] * 3)
    full_seconds = 3 * piper_reference(LONG_TEXT)[0].size / 22050  # the in-process voice, ~2 min
    cancelled_before = stack.metric("omni_tts_cancelled_total", model="piper")
    seconds_before = stack.metric("omni_tts_audio_seconds_total", model="piper")
    with httpx.stream("POST", f"{stack.frontend_url}/v1/audio/speech", timeout=300,
                      json={"model": "piper_tts", "voice": "joe", "input": cancel_text,
                            "response_format": "pcm", "stream": True}) as r:
        assert r.status_code == 200
        next(r.iter_bytes())
    stack.wait_until(lambda: stack.metric("omni_tts_cancelled_total", model="piper") > cancelled_before,
                     "piper_tts never saw the cancellation")
    stack.wait_until(lambda: stack.in_progress("piper") == 0,
                     "piper_tts still synthesising for a gone client")
    produced = stack.metric("omni_tts_audio_seconds_total", model="piper") - seconds_before
    assert produced < full_seconds / 4, f"piper_tts synthesised {produced:.1f} s of {full_seconds:.1f} s after a cancel"
    time.sleep(1.0)
    assert stack.metric("omni_tts_audio_seconds_total", model="piper") - seconds_before == produced
    assert stack.metric("omni_tts_cancelled_total", model="piper") == cancelled_before + 1



@pytest.mark.kills_stub("piper")
def test_killed_stub_is_restarted_by_the_launcher(stack):
    """Triton 2.51 keeps a model READY after its stub process dies and fails every request;
    ``omni-triton serve`` notices the missing stub and loads the model again."""
    import os
    import signal

    import psutil

    def piper_stubs():
        return [p for p in psutil.process_iter(["cmdline"])
                if p.info["cmdline"] and p.info["cmdline"][0].endswith("triton_python_backend_stub")
                and "/piper/" in p.info["cmdline"][1]
                and p.info["cmdline"][5] == str(stack.triton_pid)]

    (stub,) = piper_stubs()
    log_from = os.path.getsize(stack.log_path)
    os.kill(stub.pid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline, "piper_tts never came back after its stub was killed"
        r = httpx.post(f"{stack.frontend_url}/v1/audio/speech", timeout=120,
                       json={"model": "piper_tts", "voice": "joe", "input": "Back again.",
                             "response_format": "wav"})
        if r.status_code == 200:
            break
        time.sleep(1)
    assert [p.pid for p in piper_stubs()] != [stub.pid]
    assert "reloading piper" in open(stack.log_path).read()
    wait_for_stub_death_report(stack, "piper", log_from)  # this test's report, not the next one's


def test_nothing_to_speak_counts_as_a_client_error(stack):
    r = httpx.post(f"{stack.frontend_url}/v1/audio/speech", timeout=60,
                   json={"model": "piper_tts", "voice": "joe", "input": "...", "response_format": "wav"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "no_speech"
    metrics = httpx.get(f"{stack.frontend_url}/metrics").text
    assert 'outcome="invalid_input"' in metrics


def test_the_first_chunk_is_a_phrase_not_a_sentence(stack):
    """Issue 29 item 2 (docs/scheduling.md "The first chunk"): through the server, the first
    response of a stream whose first sentence has no early comma is its first 4 words, under half
    of that sentence's audio; the segments are PiperVoice's renderings of the same segments.
    Red with ``first_chunk_words: "0"`` in the piper config (the whole first sentence)."""
    from speech_reference import piper_sentences

    text = "The quick brown fox jumps over the lazy dog. Good morning, and welcome to the station."
    result = stream_tts(stack.triton_grpc_url, "piper", text)
    first_sentence = piper_sentences(text, noise=False)[0]
    assert len(result.chunks) == 3, [c.size for c in result.chunks]  # phrase, rest, sentence 2
    assert result.chunks[0].size < 0.5 * first_sentence.size, (result.chunks[0].size, first_sentence.size)
    assert_piper_sentences(result.chunks, result.sample_rate, text)

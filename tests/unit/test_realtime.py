"""The Realtime API (``WS /v1/realtime``, docs/realtime.md) on a fake omni engine, through real
uvicorn and the official SDK's realtime clients: GA (``client.realtime.connect``) and beta
(``client.beta.realtime.connect``, ``OpenAI-Beta: realtime=v1``). Covers the event sequences of
both namings, history in the next prompt, the truncation rule, ``conversation.item.truncate``,
cancel and barge-in (the engine's generator closed; no audio after ``response.done``), error
events for malformed events (the session goes on), the limits (error event, then close), auth
and the metrics; input audio transcription (events, both namings, failures, cancellation) and
spoken turns on a model without audio input (sent as their transcript)."""
from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from fake_engine import ASR_MODELS, CHAT_INPUTS, SPEECH_OUT, TEXT_OUTPUTS, FakeEngine, fake_transcript
from tokenizers import Tokenizer
from websockets.exceptions import ConnectionClosed

from clients.bench_common import metric_total
from omni_triton.paths import model_dir
from openai_frontend.app import Settings, create_app
from openai_frontend.engine import GenerationChunk, InvalidRequestError, ModelInfo
from openai_frontend.realtime.conversation import (
    Item,
    Part,
    context_error_tokens,
    heard_prefix,
    item_tokens,
    load_text_counter,
    select_items,
    text_bytes,
    text_counter,
)
from openai_frontend.realtime.protocol import RealtimeError
from tests.helpers.frontend import serve_in_thread

RATE = 24000
OMNI_PARAMS = {"input_modalities": "text,audio", "max_media_parts": "8", "frame_rate_hz": "12.5"}
OMNI = ModelInfo(name="qwen3_omni", served_model_name="omni", inputs=CHAT_INPUTS | {"MODALITIES", "VOICE"},
                 outputs=TEXT_OUTPUTS | SPEECH_OUT, decoupled=True, modalities=("text", "audio"),
                 voices=("Ethan", "Chelsie"), default_voice="Ethan", sample_rate=22050, max_model_len=1024,
                 voice_aliases=(("alloy", "Ethan"),), parameters=OMNI_PARAMS)
TEXT_ONLY_IN = ModelInfo(name="qwen2_5_omni", served_model_name="qwen25_omni", inputs=OMNI.inputs,
                         outputs=OMNI.outputs, decoupled=True, modalities=("text", "audio"), voices=("Chelsie",),
                         default_voice="Chelsie", sample_rate=24000, max_model_len=1024)
SMALL = ModelInfo(name="small_omni", inputs=OMNI.inputs, outputs=OMNI.outputs, decoupled=True,
                  modalities=("text", "audio"), voices=("Ethan",), default_voice="Ethan", sample_rate=24000,
                  max_model_len=160, parameters=OMNI_PARAMS)
LLM = ModelInfo(name="llm", inputs=CHAT_INPUTS, outputs=TEXT_OUTPUTS, decoupled=True, modalities=("text",))
POCKETSPHINX = ASR_MODELS[0]  # the default transcription model (``whisper-1`` stands for it)


class OmniEngine(FakeEngine):
    """Answers every request with ``words`` text deltas, each followed by ``chunk_s`` of audio at
    the model's rate, ``delay_s`` apart; records the requests and counts streams closed early."""

    def __init__(self, words: int = 4, delay_s: float = 0.0, chunk_s: float = 0.1):
        super().__init__((OMNI, TEXT_ONLY_IN, SMALL, LLM, POCKETSPHINX))
        self.words, self.delay_s, self.chunk_s = words, delay_s, chunk_s
        self.requests: list = []
        self.cancelled = 0

    async def generate(self, model, request):
        self.requests.append(request)
        rate = self.models[model].sample_rate or 24000
        prompt = len(json.dumps(request.messages)) // 100
        done = False
        try:
            for i in range(self.words):
                await asyncio.sleep(self.delay_s)
                last = i == self.words - 1
                yield GenerationChunk(text=f"word{i} ", finish_reason="stop" if last else None, prompt_tokens=prompt,
                                      completion_tokens=i + 1)
                if "audio" in (request.modalities or ()):
                    yield GenerationChunk(audio=np.full(int(self.chunk_s * rate), 0.1, np.float32), sample_rate=rate)
            done = True
        finally:
            if not done:
                self.cancelled += 1


@pytest.fixture()
def server():
    """Start a frontend on an engine: ``server(engine, **settings) -> port``."""
    started = []

    def start(engine, **settings):
        srv, thread, port = serve_in_thread(create_app(engine, Settings(**settings)))
        started.append((srv, thread))
        return port

    yield start
    for srv, thread in started:
        srv.should_exit = True
        thread.join(10)


def sdk(port: int, key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", websocket_base_url=f"ws://127.0.0.1:{port}/v1",
                              api_key=key, max_retries=0)


def pcm_tone(ms: int, amplitude: int = 3000) -> bytes:
    n = ms * RATE // 1000
    return (np.sin(np.arange(n) * 2 * np.pi * 220 / RATE) * amplitude).astype("<i2").tobytes()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def until(conn, kind: str, timeout_s: float = 10.0):
    """(the first event of type ``kind``, every event up to it)."""
    seen = []
    async with asyncio.timeout(timeout_s):
        async for ev in conn:
            seen.append(ev)
            if ev.type == kind:
                return ev, seen
    raise AssertionError(f"closed before {kind}: {[e.type for e in seen]}")


NO_VAD_GA = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}


async def turn(conn, pcm: bytes, response: dict | None = None):
    await conn.input_audio_buffer.append(audio=b64(pcm))
    await conn.input_audio_buffer.commit()
    await conn.response.create(**({"response": response} if response else {}))
    return await until(conn, "response.done")


# --------------------------------------------------------------------------- namings
def test_ga_event_sequence_and_audio(server):
    engine = OmniEngine(words=3)
    port = server(engine)

    async def run():
        async with sdk(port).realtime.connect(model="omni") as conn:
            created, _ = await until(conn, "session.created")
            await conn.session.update(session=NO_VAD_GA)
            updated, _ = await until(conn, "session.updated")
            done, events = await turn(conn, pcm_tone(500))
            return created, updated, done, events

    created, updated, done, events = asyncio.run(run())
    assert created.session.model == "omni" and created.session.output_modalities == ["audio"]
    assert created.session.audio.input.turn_detection.type == "server_vad"  # OpenAI's default
    assert updated.session.audio.input.turn_detection is None
    kinds = [e.type for e in events]
    deltas = [k for k in kinds if k.endswith(".delta")]
    head = [k for k in kinds if not k.endswith(".delta")]
    assert head == ["input_audio_buffer.committed", "conversation.item.created", "response.created",
                    "response.output_item.added", "conversation.item.created", "response.content_part.added",
                    "response.output_audio.done", "response.output_audio_transcript.done",
                    "response.content_part.done", "response.output_item.done", "response.done"], head
    assert set(deltas) == {"response.output_audio.delta", "response.output_audio_transcript.delta"}
    audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    # 3 x 0.1 s at 22050 Hz, resampled to 24 kHz PCM16
    assert abs(len(audio) // 2 - int(0.3 * RATE)) <= 24
    item = done.response.output[0]
    assert done.response.status == "completed" and item.status == "completed"
    assert item.content[0].type == "output_audio" and item.content[0].transcript == "word0 word1 word2 "
    assert done.response.usage.input_tokens > 0 and done.response.usage.output_token_details.text_tokens == 3
    assert done.response.usage.output_token_details.audio_tokens == 4  # 0.3 s x 12.5 frames/s, rounded up
    request = engine.requests[0]
    assert request.modalities == ("text", "audio") and request.voice == "Ethan" and request.paced


def test_beta_event_names_text_and_audio(server):
    port = server(OmniEngine(words=2))

    async def run():
        async with sdk(port).beta.realtime.connect(model="omni") as conn:
            created, _ = await until(conn, "session.created")
            await conn.session.update(session={"turn_detection": None, "modalities": ["text"], "voice": "Chelsie"})
            await until(conn, "session.updated")
            await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                      "content": [{"type": "input_text", "text": "hi"}]})
            await conn.response.create()
            text_done, text_events = await until(conn, "response.done")
            await conn.response.create(response={"modalities": ["text", "audio"]})
            audio_done, audio_events = await until(conn, "response.done")
            return created, text_done, text_events, audio_done, audio_events

    created, text_done, text_events, audio_done, audio_events = asyncio.run(run())
    assert created.session.input_audio_format == "pcm16" and created.session.modalities == ["text", "audio"]
    assert {"response.text.delta", "response.text.done"} <= {e.type for e in text_events}
    assert text_done.response.output[0].content[0].type == "text"
    kinds = {e.type for e in audio_events}
    assert {"response.audio.delta", "response.audio_transcript.delta", "response.audio.done",
            "response.audio_transcript.done"} <= kinds, kinds
    assert audio_done.response.output[0].content[0].type == "audio"
    assert not any(k.startswith("response.output_") and "item" not in k for k in kinds)


# --------------------------------------------------------------------------- conversation
def _wav_pcm(data_b64: str) -> bytes:
    samples, rate = sf.read(io.BytesIO(base64.b64decode(data_b64)), dtype="int16")
    assert rate == RATE
    return samples.astype("<i2").tobytes()


def test_next_prompt_carries_the_conversation(server):
    engine = OmniEngine(words=2)
    port = server(engine)
    first, second = pcm_tone(400), pcm_tone(300, 5000)

    async def run():
        async with sdk(port).realtime.connect(model="omni") as conn:
            await conn.session.update(session={**NO_VAD_GA, "instructions": "Answer briefly."})
            a, _ = await turn(conn, first)
            b, _ = await turn(conn, second)
            return a, b

    a, b = asyncio.run(run())
    messages = engine.requests[1].messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"] == "Answer briefly."
    assert _wav_pcm(messages[1]["content"][0]["input_audio"]["data"]) == first
    assert messages[2]["content"] == "word0 word1 "
    assert _wav_pcm(messages[3]["content"][0]["input_audio"]["data"]) == second
    assert b.response.usage.input_tokens > a.response.usage.input_tokens


def test_created_items_audio_and_text_go_into_the_prompt(server):
    """``conversation.item.create``: a user audio item (base64 PCM16 24 kHz), an assistant text
    item and a system item placed with ``previous_item_id``: all in the next prompt, in order."""
    engine = OmniEngine(words=1)
    port = server(engine)
    pcm = pcm_tone(250)

    async def run():
        async with sdk(port).beta.realtime.connect(model="omni") as conn:
            await conn.session.update(session={"turn_detection": None})
            await conn.conversation.item.create(item={"id": "u1", "type": "message", "role": "user", "content": [
                {"type": "input_audio", "audio": b64(pcm)}, {"type": "input_text", "text": "and this"}]})
            await conn.conversation.item.create(item={"id": "a1", "type": "message", "role": "assistant",
                                                      "content": [{"type": "text", "text": "Earlier answer."}]})
            await conn.conversation.item.create(previous_item_id="root", item={
                "type": "message", "role": "system", "content": [{"type": "input_text", "text": "Be kind."}]})
            await conn.conversation.item.create(item={"id": "u2", "type": "message", "role": "user",
                                                      "content": [{"type": "input_text", "text": "Go on."}]})
            created = [(await until(conn, "conversation.item.created"))[0] for _ in range(4)]
            await conn.conversation.item.create(item={"id": "u2", "type": "message", "role": "user",
                                                      "content": [{"type": "input_text", "text": "again"}]})
            dup, _ = await until(conn, "error")
            await conn.conversation.item.retrieve(item_id="u1")
            retrieved, _ = await until(conn, "conversation.item.retrieved")
            assert base64.b64decode(retrieved.item.content[0].audio) == pcm
            await conn.conversation.item.delete(item_id="a1")
            deleted, _ = await until(conn, "conversation.item.deleted")
            assert deleted.item_id == "a1"
            await conn.conversation.item.create(previous_item_id="u1", item={
                "id": "a1", "type": "message", "role": "assistant", "content": [
                    {"type": "text", "text": "Earlier answer."}]})
            await until(conn, "conversation.item.created")
            await conn.response.create()
            await until(conn, "response.done")
            return created, dup

    created, dup = asyncio.run(run())
    assert created[0].item.content[0].type == "input_audio" and created[1].item.content[0].type == "text"
    assert created[2].previous_item_id is None and dup.error.code == "item_already_exists"
    messages = engine.requests[0].messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"] == "Be kind." and messages[2]["content"] == "Earlier answer."
    assert _wav_pcm(messages[1]["content"][0]["input_audio"]["data"]) == pcm
    assert messages[1]["content"][1] == {"type": "text", "text": "and this"}


def _text_item(i: int, chars: int = 30) -> Item:
    return Item(f"item_{i}", "user", [Part("input_text", text="x" * chars)])


def test_truncation_rule_drops_the_oldest_whole_items():
    items = [_text_item(i) for i in range(10)]
    per = item_tokens(items[0])  # 16 (template) + 30 bytes
    assert per == 46
    kept = select_items(items, budget=per * 4 + 5, max_media_parts=None)
    assert [i.id for i in kept] == [f"item_{i}" for i in range(6, 10)]  # the newest 4, in order
    audio = [Item(f"a{i}", "user", [Part("input_audio", audio_ms=1000)]) for i in range(5)]
    assert [i.id for i in select_items(audio, budget=10_000, max_media_parts=3)] == ["a2", "a3", "a4"]
    with pytest.raises(RealtimeError) as err:
        select_items([_text_item(0, chars=3000)], budget=100, max_media_parts=None)
    assert err.value.code == "context_length_exceeded"


def test_truncation_in_a_session_keeps_the_newest_items(server):
    engine = OmniEngine(words=1)
    port = server(engine)

    async def run():
        async with sdk(port).realtime.connect(model="small_omni") as conn:
            await conn.session.update(session={**NO_VAD_GA, "output_modalities": ["text"]})
            for i in range(10):
                await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": f"turn {i} " + "y" * 20}]})
            await conn.response.create(response={"max_output_tokens": 16})
            return await until(conn, "response.done")

    done, _ = asyncio.run(run())
    assert done.response.status == "completed"
    texts = [m["content"][0]["text"] for m in engine.requests[0].messages]
    # context 160 - 16 reserved - 16 generation prompt = 128 tokens; 16 + 27 bytes = 43 per item:
    # the newest 2 fit (86)
    assert texts == [f"turn {i} " + "y" * 20 for i in range(8, 10)]


def test_item_truncate_cuts_the_transcript_to_what_was_heard(server):
    engine = OmniEngine(words=4)
    port = server(engine)

    async def run():
        async with sdk(port).realtime.connect(model="omni") as conn:
            await conn.session.update(session=NO_VAD_GA)
            done, _ = await turn(conn, pcm_tone(300))
            item = done.response.output[0]
            await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=200)
            truncated, _ = await until(conn, "conversation.item.truncated")
            await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=99_999)
            too_far, _ = await until(conn, "error")
            await conn.response.create()
            await until(conn, "response.done")
            return item, truncated, too_far

    item, truncated, too_far = asyncio.run(run())
    assert truncated.item_id == item.id and truncated.audio_end_ms == 200
    assert too_far.error.code == "invalid_value" and too_far.error.param == "audio_end_ms"
    assistant = [m for m in engine.requests[1].messages if m["role"] == "assistant"]
    assert assistant == [{"role": "assistant", "content": "word0 word1"}]  # 200 of 400 ms: half the words
    assert heard_prefix("a b c d", 100, 400) == "a"


# --------------------------------------------------------------------------- cancel, barge-in
def test_response_cancel_stops_the_engine_and_no_audio_follows_done(server):
    engine = OmniEngine(words=50, delay_s=0.05)
    port = server(engine)

    async def run():
        async with sdk(port).realtime.connect(model="omni") as conn:
            await conn.session.update(session=NO_VAD_GA)
            await conn.input_audio_buffer.append(audio=b64(pcm_tone(300)))
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            first, before = await until(conn, "response.output_audio.delta")
            await conn.response.cancel()
            done, during = await until(conn, "response.done")
            late = []
            try:
                async with asyncio.timeout(0.5):
                    async for ev in conn:
                        late.append(ev)
            except TimeoutError:
                pass
            await conn.response.cancel()
            nothing, _ = await until(conn, "error")
            return done, before + during, late, nothing

    done, events, late, nothing = asyncio.run(run())
    assert done.response.status == "cancelled" and done.response.status_details.reason == "client_cancelled"
    assert engine.cancelled == 1
    item = done.response.output[0]
    sent = sum(len(base64.b64decode(e.delta)) for e in events if e.type == "response.output_audio.delta")
    assert item.status == "incomplete" and sent > 0
    assert not [e for e in late if e.type.endswith(".delta")]
    assert nothing.error.code == "response_cancel_not_active"


@pytest.fixture(scope="module")
def piper_pcm():
    """Piper's "The capital of France is Paris." as PCM16 24 kHz."""
    from omni_triton.media.audio import float_to_pcm16, resample
    from omni_triton.paths import model_dir
    from omni_triton.stages.piper import PiperSpeaker, discover_voices

    voices = discover_voices(model_dir("piper-voices"))
    if not voices:
        pytest.skip("Piper voice not prepared (omni-triton prepare --models piper_tts)")
    parts = list(PiperSpeaker(voices).synthesize("The capital of France is Paris."))
    audio = np.concatenate([p.audio for p in parts])
    return float_to_pcm16(resample(audio, parts[0].sample_rate, RATE))


def test_server_vad_turn_then_barge_in(server, piper_pcm):
    """Server VAD: speech -> speech_started/stopped -> committed -> a response; speech during
    the response cancels it (``turn_detected``), the engine's stream is closed."""
    engine = OmniEngine(words=100, delay_s=0.05)
    port = server(engine)
    silence = bytes(RATE * 2)

    async def run():
        async with sdk(port).realtime.connect(model="omni") as conn:
            await until(conn, "session.created")
            await conn.input_audio_buffer.append(audio=b64(silence + piper_pcm + silence))
            _, seen = await until(conn, "response.output_audio.delta")
            await conn.input_audio_buffer.append(audio=b64(piper_pcm))
            done, seen2 = await until(conn, "response.done")
            return seen, done, seen2

    seen, done, seen2 = asyncio.run(run())
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert metric_total(metrics, "omni_frontend_realtime_barge_in_seconds_count", reason="turn_detected") == 1
    assert metric_total(metrics, "omni_frontend_realtime_speech_stop_to_first_audio_seconds_count") == 1
    kinds = [e.type for e in seen]
    assert kinds[:4] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                         "input_audio_buffer.committed", "conversation.item.created"], kinds
    started, stopped = seen[0], seen[1]
    assert 600 <= started.audio_start_ms <= 900  # 1000 ms of silence - 300 ms prefix padding
    assert seen2[0].type == "input_audio_buffer.speech_started"
    assert done.response.status == "cancelled" and done.response.status_details.reason == "turn_detected"
    assert engine.cancelled == 1
    # the user item holds the speech: from the speech start (prefix padded) to the speech stop
    user_audio = _wav_pcm(engine.requests[0].messages[-1]["content"][0]["input_audio"]["data"])
    assert abs(len(user_audio) // 2 - (stopped.audio_end_ms - started.audio_start_ms) * RATE // 1000) <= 24 * 30


def test_speech_longer_than_the_buffer_is_committed_at_the_limit(server, piper_pcm):
    """Server VAD, speech longer than ``--realtime-max-buffer-s``: no error; the turn is ended at
    the limit (speech_stopped, committed) and the VAD goes on with the rest."""
    port = server(OmniEngine(words=1), realtime_max_buffer_s=1.0)
    speech = piper_pcm + piper_pcm  # ~4 s of speech, pauses shorter than the 500 ms silence

    async def run():
        async with sdk(port).realtime.connect(model="omni") as conn:
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": {
                "type": "server_vad", "create_response": False}}}})
            await until(conn, "session.updated")
            step = RATE // 10 * 2
            for i in range(0, len(speech), step):
                await conn.input_audio_buffer.append(audio=b64(speech[i:i + step]))
            await conn.input_audio_buffer.append(audio=b64(bytes(RATE * 2)))  # 1 s of silence
            events = []
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    async for ev in conn:
                        events.append(ev)
            return events

    events = asyncio.run(run())
    kinds = [e.type for e in events]
    assert "error" not in kinds, [e for e in events if e.type == "error"]
    stops = [e for e in events if e.type == "input_audio_buffer.speech_stopped"]
    starts = [e for e in events if e.type == "input_audio_buffer.speech_started"]
    assert len(stops) >= 2 and kinds.count("input_audio_buffer.committed") == len(stops)
    assert stops[0].audio_end_ms - starts[0].audio_start_ms <= 1100  # cut at the 1 s buffer


# --------------------------------------------------------------------------- errors, limits
def test_malformed_events_get_error_events_and_the_session_goes_on(server):
    port = server(OmniEngine(words=2, delay_s=0.05), realtime_max_event_bytes=10_000, realtime_max_buffer_s=1.0)

    async def run():
        codes = []
        async with sdk(port).realtime.connect(model="omni") as conn:
            await conn.session.update(session=NO_VAD_GA)  # the buffer holds every append
            await until(conn, "session.updated")
            for raw in ("{not json", "[1, 2]", '{"type": "nope", "event_id": "ev1"}',
                        '{"type": "input_audio_buffer.append", "audio": "@@@"}',
                        '{"type": "input_audio_buffer.append", "audio": "AA=="}',  # 1 byte: not PCM16
                        json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 20_000}),
                        json.dumps({"type": "input_audio_buffer.commit"}),
                        json.dumps({"type": "session.update", "session": {"type": "realtime", "bogus": 1}}),
                        json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
                            "input": {"format": {"type": "audio/pcmu"}}}}}),
                        json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
                            "input": {"turn_detection": {"type": "semantic_vad"}}}}}),
                        json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
                            "output": {"voice": "nobody"}}}}),
                        json.dumps({"type": "conversation.item.create", "item": {"type": "function_call"}}),
                        json.dumps({"type": "conversation.item.delete", "item_id": "item_missing"})):
                await conn.send_raw(raw)
                err, _ = await until(conn, "error")
                codes.append((err.error.code, err.error.param, err.error.event_id))
            for _ in range(11):  # 11 x 0.1 s: over the 1 s buffer
                await conn.input_audio_buffer.append(audio=b64(pcm_tone(100)))
            full, _ = await until(conn, "error")
            await conn.input_audio_buffer.clear()
            await until(conn, "input_audio_buffer.cleared")
            await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                      "content": [{"type": "input_text", "text": "hi"}]})
            await conn.response.create()
            await until(conn, "response.created")
            await conn.response.create()
            busy, _ = await until(conn, "error")
            done, _ = await until(conn, "response.done")
        return codes, full, busy, done

    codes, full, busy, done = asyncio.run(run())
    assert codes == [("invalid_json", None, None), ("invalid_event", None, None), ("invalid_value", "type", "ev1"),
                     ("invalid_base64", "audio", None), ("invalid_audio", "audio", None),
                     ("event_too_large", None, None), ("input_audio_buffer_commit_empty", None, None),
                     ("unknown_parameter", "session.bogus", None),
                     ("unsupported_audio_format", "session.audio.input.format", None),
                     ("unsupported_turn_detection", "session.audio.input.turn_detection.type", None),
                     ("invalid_voice", "session.audio.output.voice", None),
                     ("unsupported_item_type", "item.type", None), ("item_not_found", "item_id", None)]
    assert full.error.code == "input_audio_buffer_full"
    assert busy.error.code == "conversation_already_has_active_response"
    assert done.response.status == "completed"


async def _closed(client, model: str = "omni", before=None) -> tuple[str, int | None]:
    """(the error code, the close code) of a new session the server ends; ``before(conn)`` runs first."""
    conn = await client.realtime.connect(model=model).enter()
    try:
        if before is not None:
            await before(conn)
        err, _ = await until(conn, "error")
        with pytest.raises(ConnectionClosed) as closed:
            await conn.recv()
        return err.error.code, closed.value.rcvd.code if closed.value.rcvd else None
    finally:
        with contextlib.suppress(Exception):
            await conn.close()


def test_limits_error_then_close_and_the_server_keeps_serving(server):
    port = server(OmniEngine(words=2), realtime_max_sessions=1, realtime_idle_timeout_s=0.5,
                  realtime_max_session_s=2.0)

    async def busy(conn):  # events often enough not to idle out, until the session length ends it
        await until(conn, "session.created")
        for _ in range(20):
            await asyncio.sleep(0.3)
            try:
                await conn.input_audio_buffer.append(audio=b64(bytes(480)))
            except ConnectionClosed:  # expired meanwhile: its error event is still to be read
                return

    async def run():
        client = sdk(port)
        results = {}

        async def second(conn):
            await until(conn, "session.created")
            results["too_many"] = await _closed(client)

        results["idle"] = await _closed(client, before=second)
        results["expired"] = await _closed(client, before=busy)  # the slot was free again
        results["unknown"] = await _closed(client, "nope")
        results["no_voice"] = await _closed(client, "llm")
        return results

    r = asyncio.run(run())
    too_many, idle, expired, unknown, no_voice = (r[k] for k in ("too_many", "idle", "expired", "unknown",
                                                                    "no_voice"))

    assert too_many == ("too_many_sessions", 1013)
    assert idle == ("idle_timeout", 1008)
    assert expired == ("session_expired", 1008)
    assert unknown[0] == "model_not_found" and no_voice[0] == "model_not_supported"


TRANSCRIPTION_EVENTS = ("conversation.item.input_audio_transcription.delta",
                        "conversation.item.input_audio_transcription.completed",
                        "conversation.item.input_audio_transcription.failed")


async def collect(conn, done_kinds: set[str], timeout_s: float = 10.0) -> list:
    """Every event until one of each type in ``done_kinds`` has come (in any order)."""
    seen, waiting = [], set(done_kinds)
    async with asyncio.timeout(timeout_s):
        async for ev in conn:
            seen.append(ev)
            waiting.discard(ev.type)
            if not waiting:
                return seen
    raise AssertionError(f"closed before {waiting}: {[e.type for e in seen]}")


def _heard(pcm: bytes) -> str:
    """The fake ASR's transcript of ``pcm``'s VAD segments, joined as the server joins them."""
    from openai_frontend.serving.transcriptions import prepare_samples
    audio = prepare_samples(np.frombuffer(pcm, "<i2").astype(np.float32) / 32768, RATE, 30.0)
    assert audio.segments, "the VAD found no speech"
    return " ".join("".join(fake_transcript(audio.samples[a:b], None, None, "transcribe")).strip()
                    for a, b in audio.segments)


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_input_audio_transcription_events(server, piper_pcm, beta):
    """``transcription`` on: the committed item is transcribed (delta events, then ``.completed``
    with the whole transcript and usage) concurrently with the response; the item's part gets
    the transcript (``conversation.item.retrieve``); GA and beta field names."""
    engine = OmniEngine(words=3, delay_s=0.05)
    port = server(engine)
    pcm = bytes(RATE) + piper_pcm + bytes(RATE)
    transcription = {"model": "whisper-1", "language": "en"}

    async def run():
        client = sdk(port)
        connect = client.beta.realtime.connect if beta else client.realtime.connect
        async with connect(model="omni") as conn:
            if beta:
                await conn.session.update(session={"turn_detection": None, "input_audio_transcription": transcription})
            else:
                await conn.session.update(session={"type": "realtime", "audio": {"input": {
                    "turn_detection": None, "transcription": transcription}}})
            updated, _ = await until(conn, "session.updated")
            await conn.input_audio_buffer.append(audio=b64(pcm))
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            events = await collect(conn, {"response.done", TRANSCRIPTION_EVENTS[1]})
            item_id = next(e for e in events if e.type == "input_audio_buffer.committed").item_id
            await conn.conversation.item.retrieve(item_id=item_id)
            retrieved, _ = await until(conn, "conversation.item.retrieved")
            return updated, events, retrieved

    updated, events, retrieved = asyncio.run(run())
    shown = updated.session.input_audio_transcription if beta else updated.session.audio.input.transcription
    assert shown.model == "whisper-1" and shown.language == "en"
    kinds = [e.type for e in events]
    committed = kinds.index("input_audio_buffer.committed")
    assert kinds[committed + 1] == "conversation.item.created"
    deltas = [e for e in events if e.type == TRANSCRIPTION_EVENTS[0]]
    completed = next(e for e in events if e.type == TRANSCRIPTION_EVENTS[1])
    assert deltas and committed < kinds.index(TRANSCRIPTION_EVENTS[0]) < kinds.index(TRANSCRIPTION_EVENTS[1])
    item_id = events[committed].item_id
    assert {(e.item_id, e.content_index) for e in [*deltas, completed]} == {(item_id, 0)}
    assert completed.transcript == "".join(e.delta for e in deltas) == _heard(pcm)
    assert completed.usage.type == "duration"
    assert completed.usage.seconds == pytest.approx(len(pcm) / 2 / RATE, abs=1e-3)
    # concurrently with the response: the transcription ended while it ran (the fake answers in 0.15 s)
    assert kinds.index(TRANSCRIPTION_EVENTS[1]) < kinds.index("response.done")
    assert retrieved.item.content[0].transcript == completed.transcript
    assert "input_audio" in json.dumps(engine.requests[0].messages)  # omni hears the audio itself


class FailingASR(OmniEngine):
    """Transcription fails (the model refuses the audio), or hangs until cancelled (``hang``)."""

    def __init__(self, hang: bool = False, **kw):
        super().__init__(**kw)
        self.hang, self.asr_cancelled = hang, 0

    async def transcribe(self, model, audio, language=None, prompt=None, task="transcribe"):
        if not self.hang:
            raise InvalidRequestError("AUDIO is not speech the model knows")
        try:
            await asyncio.sleep(60)
            yield "never"
        except asyncio.CancelledError:
            self.asr_cancelled += 1
            raise


def test_failed_transcription_sends_failed_and_the_session_goes_on(server, piper_pcm):
    engine = FailingASR(words=2)
    port = server(engine)

    async def run():
        async with sdk(port).realtime.connect(model="omni") as conn:
            await conn.session.update(session={"type": "realtime", "audio": {"input": {
                "turn_detection": None, "transcription": {"model": "whisper-1"}}}})
            await until(conn, "session.updated")
            await conn.input_audio_buffer.append(audio=b64(piper_pcm))
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            first = await collect(conn, {"response.done", TRANSCRIPTION_EVENTS[2]})
            second, _ = await turn(conn, piper_pcm)
            # a model without audio input cannot answer audio whose transcript failed
            async with sdk(port).realtime.connect(model="qwen25_omni") as conn2:
                await conn2.session.update(session=NO_VAD_GA)
                text_only, _ = await turn(conn2, piper_pcm)
            return first, second, text_only

    first, second, text_only = asyncio.run(run())
    failed = next(e for e in first if e.type == TRANSCRIPTION_EVENTS[2])
    assert failed.content_index == 0 and failed.item_id == next(
        e for e in first if e.type == "input_audio_buffer.committed").item_id
    assert failed.error.code == "invalid_value" and "not speech" in failed.error.message
    assert not [e for e in first if e.type == TRANSCRIPTION_EVENTS[1]]
    assert next(e for e in first if e.type == "response.done").response.status == "completed"
    assert second.response.status == "completed"
    assert text_only.response.status == "failed"
    assert text_only.response.status_details.error.code == "input_audio_transcription_failed"


def test_closing_the_session_cancels_running_transcriptions(server, piper_pcm):
    engine = FailingASR(hang=True, words=1)
    port = server(engine)

    async def run():
        async with sdk(port).realtime.connect(model="omni") as conn:
            await conn.session.update(session={"type": "realtime", "audio": {"input": {
                "turn_detection": None, "transcription": {"model": "pocketsphinx"}}}})
            await until(conn, "session.updated")
            await conn.input_audio_buffer.append(audio=b64(piper_pcm))
            await conn.input_audio_buffer.commit()
            await until(conn, "conversation.item.created")
            await asyncio.sleep(0.3)  # the transcription is waiting in the engine
        for _ in range(50):
            if engine.asr_cancelled:
                break
            await asyncio.sleep(0.05)

    asyncio.run(run())
    assert engine.asr_cancelled == 1


def test_bad_transcription_settings_get_error_events(server):
    port = server(OmniEngine(words=1))

    async def run():
        codes = []
        async with sdk(port).realtime.connect(model="omni") as conn:
            for transcription in ({"model": "nope"}, {"model": "whisper-1", "language": "xx"},
                                  {"model": "pocketsphinx", "bogus": 1}, {"model": 5}):
                await conn.send_raw(json.dumps({"type": "session.update", "session": {
                    "type": "realtime", "audio": {"input": {"transcription": transcription}}}}))
                err, _ = await until(conn, "error")
                codes.append((err.error.code, err.error.param))
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"transcription": None}}})
            updated, _ = await until(conn, "session.updated")
        return codes, updated

    codes, updated = asyncio.run(run())
    param = "session.audio.input.transcription"
    assert codes == [("model_not_found", f"{param}.model"), ("unsupported_language", f"{param}.language"),
                     ("unknown_parameter", f"{param}.bogus"), ("invalid_type", f"{param}.model")]
    assert updated.session.audio.input.transcription is None


def test_model_without_audio_input_gets_the_transcript(server, piper_pcm):
    """``qwen25_omni`` (no ``audio`` input): transcription is on by default (the default
    transcription model), the response waits for the transcript and its prompt carries it as
    text; with transcription turned off a spoken turn fails (``unsupported_content_part``)."""
    engine = OmniEngine(words=2)
    port = server(engine)

    async def run():
        async with sdk(port).realtime.connect(model="qwen25_omni") as conn:
            created, _ = await until(conn, "session.created")
            await conn.session.update(session=NO_VAD_GA)
            await until(conn, "session.updated")
            done, events = await turn(conn, piper_pcm)
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"transcription": None}}})
            await until(conn, "session.updated")
            off, _ = await turn(conn, piper_pcm)
        return created, done, events, off

    created, done, events, off = asyncio.run(run())
    assert created.session.audio.input.transcription.model == "pocketsphinx"
    completed = next(e for e in events if e.type == TRANSCRIPTION_EVENTS[1])
    assert done.response.status == "completed"
    kinds = [e.type for e in events]
    assert kinds.index(TRANSCRIPTION_EVENTS[1]) < kinds.index("response.output_audio_transcript.delta")
    user = engine.requests[0].messages[-1]
    assert user == {"role": "user", "content": [{"type": "text", "text": completed.transcript}]}
    assert completed.transcript.startswith("heard")
    assert off.response.status == "failed"
    assert off.response.status_details.error.code == "unsupported_content_part"


def test_api_key_is_checked_on_the_handshake(server):
    port = server(OmniEngine(words=1), api_key="secret")

    async def run():
        with pytest.raises(Exception) as refused:
            async with sdk(port, key="wrong").realtime.connect(model="omni") as conn:
                await until(conn, "session.created")
        async with sdk(port, key="secret").realtime.connect(model="omni") as conn:
            created, _ = await until(conn, "session.created")
        return refused.value, created

    refused, created = asyncio.run(run())
    assert "401" in str(refused) and created.session.id


def test_metrics(server):
    port = server(OmniEngine(words=2))

    async def run():
        async with sdk(port).realtime.connect(model="omni") as conn:
            await conn.session.update(session=NO_VAD_GA)
            await turn(conn, pcm_tone(300))
            return httpx.get(f"http://127.0.0.1:{port}/metrics").text

    during = asyncio.run(run())
    after = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert metric_total(during, "omni_frontend_realtime_sessions") == 1
    assert metric_total(during, "omni_frontend_realtime_commit_to_first_audio_seconds_count", model="omni") == 1
    assert metric_total(after, "omni_frontend_realtime_sessions") == 0


def test_payload_sized_work_runs_off_the_event_loop(monkeypatch):
    """Base64 decoding of a large append, its VAD pass, the parse of a large event, the WAV of the
    committed audio, its transcription's resample + VAD segmentation and the output's resample +
    PCM16 + base64 run on worker threads."""
    import threading

    from starlette.testclient import TestClient

    from omni_triton.media.vad import StreamingVAD
    from openai_frontend.realtime import session as session_module
    from openai_frontend.serving import realtime as serving_module

    threads: dict[str, set[int]] = {}

    def spy(name, fn, large=lambda *args: True):
        def wrapped(*args, **kwargs):
            if large(*args):
                threads.setdefault(name, set()).add(threading.get_ident())
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(session_module, "decode_b64", spy("decode", session_module.decode_b64))
    monkeypatch.setattr(session_module, "prepare_audio", spy("wav", session_module.prepare_audio))
    monkeypatch.setattr(session_module, "_prepare_pcm", spy("transcribe", session_module._prepare_pcm))
    monkeypatch.setattr(serving_module, "_parse", spy("parse", serving_module._parse,
                                                      lambda raw, *_: len(raw) > serving_module.INLINE_PARSE_CHARS))
    monkeypatch.setattr(StreamingVAD, "feed", spy("vad", StreamingVAD.feed))
    session_class = session_module.RealtimeSession
    monkeypatch.setattr(session_class, "_encode", spy("encode", session_class._encode))
    with TestClient(create_app(OmniEngine(words=2), Settings())) as tc, \
            tc.websocket_connect("/v1/realtime?model=omni") as ws:
        loop_thread = tc.portal.call(threading.get_ident)
        assert ws.receive_json()["type"] == "session.created"
        ws.send_json({"type": "input_audio_buffer.append", "audio": b64(bytes(2 * RATE * 5))})  # 5 s of silence
        ws.send_json({"type": "session.update", "session": {"type": "realtime", "audio": {
            "input": {"turn_detection": None, "transcription": {"model": "whisper-1"}}}}})
        assert ws.receive_json()["type"] == "session.updated"
        ws.send_json({"type": "input_audio_buffer.append", "audio": b64(pcm_tone(3000))})
        ws.send_json({"type": "input_audio_buffer.commit"})
        ws.send_json({"type": "response.create"})
        waiting = {"response.done", "conversation.item.input_audio_transcription.completed"}
        while waiting:
            waiting.discard(ws.receive_json()["type"])
    for name in ("decode", "vad", "parse", "wav", "encode", "transcribe"):
        assert threads.get(name) and loop_thread not in threads[name], (name, threads, loop_thread)


class CountingEngine(OmniEngine):
    """Counts each prompt as the omni thinker does with a byte-level BPE tokenizer and Qwen's chat
    template (``<|im_start|>role\\n...<|im_end|>\\n``, audio 13 tokens per started second), times
    ``per_byte``, and refuses it with the thinker's messages
    (omni_triton/stages/qwen3_omni/thinker.py) when it does not fit ``max_model_len``."""

    def __init__(self, per_byte: int = 1, **kw):
        super().__init__(**kw)
        self.per_byte = per_byte
        self.refused = 0

    def count(self, messages) -> int:
        n = 1 + 10  # <|im_start|>assistant\n
        for m in messages:
            n += 3 + len(m["role"].encode())
            parts = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
            for p in parts:
                if p["type"] == "text":
                    n += len(p["text"].encode()) * self.per_byte
                else:
                    pcm = _wav_pcm(p["input_audio"]["data"])
                    n += 2 + 13 * -(-len(pcm) // (2 * RATE))
        return n

    async def generate(self, model, request):
        ctx = self.models[model].max_model_len
        n = self.count(request.messages)
        max_tokens = request.sampling.get("max_tokens", ctx - n)
        if n >= ctx or n + max_tokens > ctx:
            self.requests.append(request)
            self.refused += 1
            raise InvalidRequestError(f"the prompt has {n} tokens; this model's context is max_model_len={ctx}"
                                      if n >= ctx else
                                      f"prompt ({n} tokens) + max_tokens ({max_tokens}) exceeds max_model_len={ctx}")
        async for chunk in super().generate(model, request):
            yield chunk


def _user_text(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def _respond(conn, **params):
    await conn.response.create(**({"response": params} if params else {}))
    done, _ = await until(conn, "response.done")
    return done.response


def test_cjk_history_is_left_out_not_failed(server):
    """An older 720-character Chinese item (2160 UTF-8 bytes, 1 token per byte for a byte-level
    BPE) then "你好" with max_output_tokens 256 on a 1024-token model: the old item is left out."""
    engine = CountingEngine(words=1)
    port = server(engine)

    async def run():
        async with sdk(port).realtime.connect(model="omni") as conn:
            await conn.session.update(session={**NO_VAD_GA, "output_modalities": ["text"], "max_output_tokens": 256})
            for text in ["北京是中国的首都。" * 80, "你好"]:
                await conn.conversation.item.create(item=_user_text(text))
            return [await _respond(conn), await _respond(conn)]

    for resp in asyncio.run(run()):
        assert resp.status == "completed", resp.status_details
    assert engine.refused == 0
    assert [m["content"][0]["text"] for m in engine.requests[0].messages] == ["你好"]


def test_long_english_history_after_a_barge_in_fits(server):
    """After a barge-in (an assistant audio item truncated to what was heard) with a long English
    transcript, the next turn with max_output_tokens 512 leaves the old items out (the estimate of
    1 token per 3 characters was below the byte-level count: 'prompt (790 tokens) + max_tokens
    (512) exceeds max_model_len=1024')."""
    engine = CountingEngine(words=1)
    port = server(engine)
    story = " ".join(f"word{i}" for i in range(120))  # 7 bytes a word

    async def run():
        async with sdk(port).realtime.connect(model="omni") as conn:
            await conn.session.update(session={**NO_VAD_GA, "output_modalities": ["text"], "max_output_tokens": 512,
                                               "instructions": "Answer briefly. " * 4})
            await conn.conversation.item.create(item=_user_text("Tell me a long story please."))
            await conn.conversation.item.create(item={"type": "message", "role": "assistant", "content": [
                {"type": "output_audio", "transcript": story}]})
            created, _ = await until(conn, "conversation.item.created")
            await conn.conversation.item.truncate(item_id=created.item.id, content_index=0, audio_end_ms=0)
            await conn.conversation.item.create(item=_user_text("Stop. " + "What is the capital of France? " * 8))
            return await _respond(conn)

    resp = asyncio.run(run())
    assert resp.status == "completed", resp.status_details
    assert engine.refused == 0


def test_context_refusal_is_retried_with_fewer_items_and_the_session_goes_on(server):
    """A model whose tokens outnumber the estimate (2 per byte here): its refusal names the real
    count; the response is retried once with fewer old items, and later responses fit."""
    engine = CountingEngine(per_byte=2, words=1)
    port = server(engine)

    async def run():
        async with sdk(port).realtime.connect(model="omni") as conn:
            await conn.session.update(session={**NO_VAD_GA, "output_modalities": ["text"], "max_output_tokens": 256})
            for i in range(6):
                await conn.conversation.item.create(item=_user_text(f"turn {i} " + "z" * 100))
            first = await _respond(conn)
            await conn.conversation.item.create(item=_user_text("and now? " + "q" * 100))
            return first, await _respond(conn)

    first, second = asyncio.run(run())
    assert first.status == "completed", first.status_details
    assert second.status == "completed", second.status_details
    refused, retried = engine.requests[0], engine.requests[1]
    assert engine.refused >= 1 and len(retried.messages) < len(refused.messages)
    assert retried.messages[-1] == refused.messages[-1]  # the newest item kept


def test_context_error_tokens_reads_the_models_refusals():
    assert context_error_tokens("the prompt has 2179 tokens; this model's context is max_model_len=1024") == 2179
    assert context_error_tokens("qwen3_omni_thinker: prompt (790 tokens) + max_tokens (512) exceeds "
                                "max_model_len=1024") == 790
    assert context_error_tokens("the prompt has 2 media placeholders but the request carries {}") is None


def test_max_output_tokens_above_the_context_is_refused(server):
    engine = OmniEngine(words=1)
    port = server(engine)

    async def run():
        async with sdk(port).realtime.connect(model="omni") as conn:
            await conn.session.update(session={**NO_VAD_GA, "output_modalities": ["text"], "max_output_tokens": 4096})
            err, _ = await until(conn, "error")
            await conn.conversation.item.create(item=_user_text("hi"))
            await conn.response.create(response={"max_output_tokens": 2000})
            err2, _ = await until(conn, "error")
            ok = await _respond(conn)
            return err, err2, ok

    err, err2, ok = asyncio.run(run())
    assert err.error.code == "invalid_value" and err.error.param == "session.max_output_tokens"
    assert "max_model_len=1024" in err.error.message
    assert err2.error.code == "invalid_value" and err2.error.param == "response.max_output_tokens"
    assert ok.status == "completed" and ok.max_output_tokens == "inf"  # the session kept its old value


def test_text_is_counted_with_the_models_tokenizer_when_it_is_reachable():
    """A model whose ``assets`` folder holds ``tokenizer.json`` (the tiny Qwen3-Omni that
    scripts/setup.sh prepares) is counted with it, as /tokenize does; one without falls back to
    UTF-8 bytes."""
    folder = model_dir("qwen3-omni-tiny")
    if not (folder / "tokenizer.json").exists():
        pytest.skip("qwen3-omni-tiny is not prepared (scripts/setup.sh)")
    info = ModelInfo(name="rt_count_omni", inputs=OMNI.inputs, outputs=OMNI.outputs, decoupled=True,
                     assets=("qwen3-omni-tiny",), max_model_len=1024)
    bare = ModelInfo(name="rt_count_bare", inputs=OMNI.inputs, outputs=OMNI.outputs, decoupled=True)
    engine = FakeEngine((info, bare))
    asyncio.run(load_text_counter(engine, info))
    asyncio.run(load_text_counter(engine, bare))
    reference = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in ["北京是中国的首都。" * 80, "What is the capital of France? " * 10, ""]:
        real = len(reference.encode(text, add_special_tokens=False).ids)
        assert text_counter("rt_count_omni")(text) == real <= text_bytes(text)
        assert text_counter("rt_count_bare")(text) == text_bytes(text)

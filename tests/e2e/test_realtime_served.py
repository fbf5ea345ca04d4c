"""End-to-end: the Realtime API (``WS /v1/realtime``, docs/realtime.md) through the official
OpenAI SDK's realtime clients (``client.realtime.connect``: GA; ``client.beta.realtime.connect``:
beta) -> frontend -> Triton's omni BLS (thinker -> talker -> code2wav).

User speech is real speech: Piper (``piper_tts``) speaks the turns, at 24 kHz PCM16 as the
protocol carries it. Run with ``OMNI_TRITON_E2E_MODELS=piper,qwen3_omni`` (add ``qwen2_5_omni``
and ``pocketsphinx`` for the text-input model's sessions and input audio transcription).
"""
from __future__ import annotations

import asyncio
import base64
import time

import httpx
import numpy as np
import openai
import pytest
from websockets.exceptions import ConnectionClosed

pytestmark = pytest.mark.e2e

RATE = 24000
TURN_1 = "The capital of France is Paris."
TURN_2 = "What is the weather like in Berlin today?"
#: a short answer keeps each turn fast (the tiny thinker's text is noise anyway)
MAX_TOKENS = 8


def _served(stack) -> set[str]:
    return {m["id"] for m in httpx.get(f"{stack.frontend_url}/v1/models", timeout=10).json()["data"]}


@pytest.fixture(scope="module")
def served(stack):
    models = _served(stack)
    if "omni" not in models or "piper_tts" not in models:
        pytest.skip("needs omni (qwen3_omni) and piper_tts")
    return models


def speak(stack, text: str) -> bytes:
    """Piper's PCM16 24 kHz of ``text`` (the frontend resamples with soxr)."""
    r = httpx.post(f"{stack.frontend_url}/v1/audio/speech", timeout=120,
                   json={"model": "piper_tts", "voice": "joe", "input": text, "response_format": "pcm",
                         "sample_rate": RATE})
    r.raise_for_status()
    return r.content


def silence(ms: int) -> bytes:
    return bytes(ms * RATE // 1000 * 2)


def client(stack) -> openai.AsyncOpenAI:
    host = stack.frontend_url.removeprefix("http://")
    return openai.AsyncOpenAI(base_url=f"{stack.frontend_url}/v1", websocket_base_url=f"ws://{host}/v1",
                              api_key="unused", max_retries=0)


def b64(pcm: bytes) -> str:
    return base64.b64encode(pcm).decode("ascii")


async def until(conn, kind: str, timeout_s: float = 120.0, seen: list | None = None):
    """Events up to (and with) the first of type ``kind``; ``seen`` collects them."""
    seen = [] if seen is None else seen
    async with asyncio.timeout(timeout_s):
        async for ev in conn:
            seen.append(ev)
            if ev.type == kind:
                return ev, seen
    raise AssertionError(f"the connection closed before {kind}: {[e.type for e in seen]}")


async def append(conn, pcm: bytes, chunk_ms: int = 100, realtime: float = 0.0) -> None:
    """Append ``pcm`` in ``chunk_ms`` pieces (``realtime`` > 0: sleep that share of each piece's length)."""
    step = chunk_ms * RATE // 1000 * 2
    for i in range(0, len(pcm), step):
        await conn.input_audio_buffer.append(audio=b64(pcm[i:i + step]))
        if realtime:
            await asyncio.sleep(chunk_ms / 1000 * realtime)


async def spoken_turn(conn, pcm: bytes):
    """Commit ``pcm`` as a user turn and answer it: (response.done event, all events)."""
    await append(conn, pcm, chunk_ms=500)
    await conn.input_audio_buffer.commit()
    await conn.response.create(response={"max_output_tokens": MAX_TOKENS})
    return await until(conn, "response.done")


def test_ga_sdk_answers_a_committed_audio_turn_with_audio(stack, served):
    """The GA client, unchanged: session.update (no VAD), a spoken turn, response.create ->
    the GA event sequence with audio deltas (PCM16 24 kHz) and a completed response with usage."""
    pcm = speak(stack, TURN_1)

    async def run():
        async with client(stack).realtime.connect(model="omni") as conn:
            created, _ = await until(conn, "session.created")
            assert created.session.type == "realtime" and created.session.audio.input.format.rate == RATE
            await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"],
                                               "audio": {"input": {"turn_detection": None},
                                                         "output": {"voice": "alloy"}}})
            updated, _ = await until(conn, "session.updated")
            assert updated.session.audio.input.turn_detection is None
            return await spoken_turn(conn, pcm)

    done, events = asyncio.run(run())
    kinds = [e.type for e in events]
    for kind in ("input_audio_buffer.committed", "conversation.item.created", "response.created",
                 "response.output_item.added", "response.content_part.added", "response.output_audio.delta",
                 "response.output_audio.done", "response.output_audio_transcript.done", "response.output_item.done"):
        assert kind in kinds, (kind, kinds)
    audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    assert len(audio) > RATE // 10 and len(audio) % 2 == 0  # >= 50 ms of PCM16
    # the tiny random thinker rarely says EOS: MAX_TOKENS ends it (OpenAI: incomplete, max_output_tokens)
    assert done.response.status in ("completed", "incomplete"), done.response.status_details
    if done.response.status == "incomplete":
        assert done.response.status_details.reason == "max_output_tokens"
    assert done.response.usage.input_tokens > 0 and done.response.output[0].role == "assistant"
    transcript = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    assert done.response.output[0].content[0].transcript == transcript


def test_second_turn_prompt_holds_the_first(stack, served):
    """Two spoken turns in one session: the second response's prompt holds the first turn (its
    user audio and the assistant's answer): its input tokens exceed those of the same second
    turn alone in a new session by about the first turn's prompt plus answer."""
    one, two = speak(stack, TURN_1), speak(stack, TURN_2)

    async def run():
        async with client(stack).realtime.connect(model="omni") as conn:
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            first, _ = await spoken_turn(conn, one)
            second, _ = await spoken_turn(conn, two)
        async with client(stack).realtime.connect(model="omni") as conn:
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            alone, _ = await spoken_turn(conn, two)
        return first.response, second.response, alone.response

    first, second, alone = asyncio.run(run())
    assert {first.status, second.status, alone.status} <= {"completed", "incomplete"}
    grew = second.usage.input_tokens - alone.usage.input_tokens
    # the first turn's user message (its audio tokens) and the assistant's answer (text tokens)
    assert grew >= first.usage.input_tokens - 16, (first.usage, second.usage, alone.usage)


def test_barge_in_cancels_the_stages_and_no_audio_follows_done(stack, served):
    """Server VAD: a spoken turn starts a response; speech while it answers cancels it
    (``turn_detected``): Triton's thinker/talker cancel counters move, the response ends
    ``cancelled`` with its item ``incomplete`` holding what was sent, and no audio delta of it
    follows ``response.done``."""
    turn, interrupt = speak(stack, TURN_1), speak(stack, TURN_2)
    before = (stack.metric("omni_thinker_cancelled_total") + stack.metric("omni_talker_cancelled_total"))

    async def run():
        async with client(stack).realtime.connect(model="omni") as conn:
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": {
                "type": "server_vad", "silence_duration_ms": 400}}}})
            await until(conn, "session.updated")
            await append(conn, silence(500) + turn + silence(800))
            seen: list = []
            await until(conn, "response.output_audio.delta", seen=seen)
            response_id = seen[-1].response_id
            # the user talks over the answer (sent as fast as the socket takes it)
            await append(conn, silence(200) + interrupt)
            done, seen2 = await until(conn, "response.done", seen=[])
            assert done.response.id == response_id
            assert "input_audio_buffer.speech_started" in [e.type for e in seen2]
            late: list = []
            try:
                async with asyncio.timeout(3):
                    async for ev in conn:
                        late.append(ev)
            except TimeoutError:
                pass
            return done.response, seen + seen2, late, response_id

    response, events, late, response_id = asyncio.run(run())
    assert response.status == "cancelled" and response.status_details.reason == "turn_detected"
    item = response.output[0]
    assert item.status == "incomplete"
    sent = sum(len(base64.b64decode(e.delta)) for e in events
               if e.type == "response.output_audio.delta" and e.response_id == response_id)
    assert sent > 0
    assert not [e for e in late if e.type == "response.output_audio.delta" and e.response_id == response_id]
    stack.wait_until(lambda: stack.metric("omni_thinker_cancelled_total")
                     + stack.metric("omni_talker_cancelled_total") > before,
                     "neither the thinker nor the talker counted a cancelled request", 30)


def test_server_vad_finds_the_spoken_utterance(stack, served):
    """Server VAD on Piper speech with 1 s of silence before and 1.5 s after:
    ``speech_started.audio_start_ms`` ~ 1000 - prefix padding, ``speech_stopped.audio_end_ms`` ~
    the speech's end + silence_duration_ms; the committed item follows (create_response off)."""
    pcm = speak(stack, TURN_1)
    samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
    loud = np.flatnonzero(np.abs(samples) > 0.02)
    voice_start = 1000 + loud[0] * 1000 // RATE
    voice_end = 1000 + loud[-1] * 1000 // RATE

    async def run():
        async with client(stack).realtime.connect(model="omni") as conn:
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": {
                "type": "server_vad", "prefix_padding_ms": 300, "silence_duration_ms": 500,
                "create_response": False}}}})
            await until(conn, "session.updated")
            await append(conn, silence(1000) + pcm + silence(1500))
            started, _ = await until(conn, "input_audio_buffer.speech_started", 30)
            stopped, _ = await until(conn, "input_audio_buffer.speech_stopped", 30)
            committed, _ = await until(conn, "input_audio_buffer.committed", 30)
            return started, stopped, committed

    started, stopped, committed = asyncio.run(run())
    assert abs(started.audio_start_ms - (voice_start - 300)) <= 200, (started.audio_start_ms, voice_start)
    assert abs(stopped.audio_end_ms - (voice_end + 500)) <= 250, (stopped.audio_end_ms, voice_end)
    assert started.item_id == stopped.item_id == committed.item_id


def test_malformed_events_get_error_events_and_the_session_goes_on(stack, served):
    """Bad JSON, an unknown type, bad base64 and an append over the event size limit each get an
    ``error`` event with its code; the session then still answers."""
    async def run():
        async with client(stack).realtime.connect(model="omni") as conn:
            await until(conn, "session.created")
            codes = []
            for raw in ("{not json", '{"type": "no.such.event"}',
                        '{"type": "input_audio_buffer.append", "audio": "***not base64***"}',
                        '{"type": "input_audio_buffer.append", "audio": "' + "A" * (5 << 20) + '"}'):
                await conn.send_raw(raw)
                err, _ = await until(conn, "error", 30)
                codes.append(err.error.code)
            await conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
            updated, _ = await until(conn, "session.updated", 30)
            return codes, updated

    codes, updated = asyncio.run(run())
    assert codes == ["invalid_json", "invalid_value", "invalid_base64", "event_too_large"]
    assert updated.session.instructions == "Be brief."


def test_beta_naming_text_turn(stack, served):
    """The beta client (``OpenAI-Beta: realtime=v1``): a text item, beta event names
    (``response.audio.delta``, ``response.audio_transcript.delta``)."""
    async def run():
        async with client(stack).beta.realtime.connect(model="omni") as conn:
            created, _ = await until(conn, "session.created")
            assert created.session.input_audio_format == "pcm16"
            await conn.session.update(session={"turn_detection": None, "modalities": ["text", "audio"]})
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": TURN_1}]})
            await conn.response.create(response={"max_response_output_tokens": MAX_TOKENS})
            return await until(conn, "response.done")

    done, events = asyncio.run(run())
    kinds = {e.type for e in events}
    assert {"response.audio.delta", "response.audio_transcript.delta", "response.audio.done"} <= kinds, kinds
    assert done.response.status in ("completed", "incomplete")


def test_too_many_sessions_error_then_close_and_the_server_keeps_serving(stack, served):
    """A limit: one session over ``--realtime-max-sessions`` (32) gets ``too_many_sessions`` and a
    1013 close; once one closes, a new session is served."""
    async def run():
        sdk = client(stack)
        managers = [sdk.realtime.connect(model="omni") for _ in range(32)]
        conns = [await m.enter() for m in managers]
        try:
            for c in conns:
                await until(c, "session.created", 30)
            async with sdk.realtime.connect(model="omni") as extra:
                err, _ = await until(extra, "error", 30)
                with pytest.raises(ConnectionClosed) as closed:
                    await extra.recv()
            code = closed.value.rcvd.code if closed.value.rcvd else None
        finally:
            for c in conns:
                await c.close()
        await asyncio.sleep(0.5)
        async with sdk.realtime.connect(model="omni") as conn:
            again, _ = await until(conn, "session.created", 30)
        return err, code, again

    err, code, again = asyncio.run(run())
    assert err.error.code == "too_many_sessions" and code == 1013
    assert again.session.id


def _words(text: str) -> str:
    """Lower case, letters, digits and single spaces (what WER compares)."""
    return " ".join("".join(c for c in text.lower() if c.isalnum() or c.isspace()).split())


async def until_all(conn, kinds: set[str], timeout_s: float = 120.0) -> list:
    """Events until one of each type in ``kinds`` has come, in any order."""
    seen, waiting = [], set(kinds)
    async with asyncio.timeout(timeout_s):
        async for ev in conn:
            seen.append(ev)
            waiting.discard(ev.type)
            if not waiting:
                return seen
    raise AssertionError(f"the connection closed before {waiting}: {[e.type for e in seen]}")


COMPLETED = "conversation.item.input_audio_transcription.completed"


def test_input_audio_transcription_of_a_spoken_turn(stack, served):
    """``audio.input.transcription`` {model: whisper-1} (the default transcription model,
    pocketsphinx): a committed Piper turn gets delta events and a ``.completed`` transcript close
    to the text (WER by jiwer, loose bound), alongside the response."""
    if "pocketsphinx" not in served:
        pytest.skip("pocketsphinx not served")
    import jiwer

    pcm = silence(300) + speak(stack, TURN_1) + silence(300)

    async def run():
        async with client(stack).realtime.connect(model="omni") as conn:
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "audio": {
                "input": {"turn_detection": None, "transcription": {"model": "whisper-1", "language": "en"}}}})
            updated, _ = await until(conn, "session.updated")
            await append(conn, pcm, chunk_ms=500)
            await conn.input_audio_buffer.commit()
            await conn.response.create(response={"max_output_tokens": MAX_TOKENS})
            return updated, await until_all(conn, {"response.done", COMPLETED})

    updated, events = asyncio.run(run())
    assert updated.session.audio.input.transcription.model == "whisper-1"
    assert not [e for e in events if e.type.endswith(".failed")], events
    item_id = next(e for e in events if e.type == "input_audio_buffer.committed").item_id
    completed = next(e for e in events if e.type == COMPLETED)
    deltas = [e.delta for e in events if e.type == "conversation.item.input_audio_transcription.delta"]
    assert completed.item_id == item_id and completed.content_index == 0
    assert "".join(deltas) == completed.transcript
    wer = jiwer.wer(_words(TURN_1), _words(completed.transcript))
    print(f"realtime transcription: {completed.transcript!r} WER {wer:.2f}")
    assert wer <= 0.5, (completed.transcript, wer)
    assert completed.usage.type == "duration" and completed.usage.seconds > 1.0


def test_qwen25_omni_text_and_spoken_turns(stack, served):
    """``qwen25_omni`` (text input only): a text turn answered with audio; a spoken turn is
    transcribed (transcription on by default, pocketsphinx) and answered from its transcript:
    a response with text (docs/realtime.md "Models without audio input")."""
    if "qwen25_omni" not in served or "pocketsphinx" not in served:
        pytest.skip("qwen25_omni and pocketsphinx not served")
    pcm = silence(300) + speak(stack, TURN_1) + silence(300)

    async def run():
        async with client(stack).realtime.connect(model="qwen25_omni") as conn:
            created, _ = await until(conn, "session.created")
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": TURN_1}]})
            await conn.response.create(response={"max_output_tokens": MAX_TOKENS})
            text_done, events = await until(conn, "response.done")
            await append(conn, pcm, chunk_ms=500)
            await conn.input_audio_buffer.commit()
            await conn.response.create(response={"max_output_tokens": MAX_TOKENS, "output_modalities": ["text"]})
            spoken = await until_all(conn, {"response.done", COMPLETED})
            return created, text_done, events, spoken

    created, text_done, events, spoken = asyncio.run(run())
    assert created.session.audio.input.transcription.model == "pocketsphinx"
    assert text_done.response.status in ("completed", "incomplete")
    assert any(e.type == "response.output_audio.delta" for e in events)
    kinds = [e.type for e in spoken]
    done = next(e for e in spoken if e.type == "response.done")
    # the tiny random thinker rarely says EOS: MAX_TOKENS may end it (incomplete, max_output_tokens)
    assert done.response.status in ("completed", "incomplete"), done.response.status_details
    assert kinds.index(COMPLETED) < kinds.index("response.output_text.delta")  # the prompt waited for it
    text = "".join(e.delta for e in spoken if e.type == "response.output_text.delta")
    assert text and done.response.output[0].content[0].text == text
    assert "capital" in next(e for e in spoken if e.type == COMPLETED).transcript


def test_frontend_metrics_count_realtime(stack, served):
    """The frontend's realtime histograms have samples after the tests above (commit -> first
    audio, speech stop -> first audio, barge-in) and the sessions gauge is back to 0."""
    text = httpx.get(f"{stack.frontend_url}/metrics", timeout=10).text
    from clients.bench_common import metric_total

    assert metric_total(text, "omni_frontend_realtime_commit_to_first_audio_seconds_count") >= 1
    assert metric_total(text, "omni_frontend_realtime_speech_stop_to_first_audio_seconds_count") >= 1
    assert metric_total(text, "omni_frontend_realtime_barge_in_seconds_count") >= 1
    deadline = time.monotonic() + 10
    while metric_total(httpx.get(f"{stack.frontend_url}/metrics", timeout=10).text,
                       "omni_frontend_realtime_sessions") != 0:
        assert time.monotonic() < deadline, "realtime sessions gauge never went back to 0"
        time.sleep(0.2)


def test_cjk_history_is_left_out_and_max_output_tokens_is_checked(stack):
    """The tiny omni thinker's byte-level tokenizer counts a 720-character Chinese item as ~2160
    tokens: with "你好" after it and max_output_tokens 256 on max_model_len 1024, the old item is
    left out (docs/realtime.md "Context") and later responses work; max_output_tokens 4096 is
    refused at session.update with invalid_value naming max_model_len."""
    if "omni" not in _served(stack):
        pytest.skip("needs omni (qwen3_omni)")

    async def run():
        async with client(stack).realtime.connect(model="omni") as conn:
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                               "max_output_tokens": 4096, "audio": {"input": {"turn_detection": None}}})
            refused, _ = await until(conn, "error")
            await conn.session.update(session={"type": "realtime", "max_output_tokens": 256})
            for text in ["北京是中国的首都。" * 80, "你好"]:
                await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": text}]})
            done = []
            for params in ({}, {"max_output_tokens": MAX_TOKENS}):
                await conn.response.create(**({"response": params} if params else {}))
                ev, _ = await until(conn, "response.done")
                done.append(ev.response)
            return refused, done

    refused, done = asyncio.run(run())
    assert refused.error.code == "invalid_value" and "max_model_len=1024" in refused.error.message
    for resp in done:
        assert resp.status in ("completed", "incomplete"), resp.status_details
        assert 0 < resp.usage.input_tokens < 1024 - 256


def test_the_turn_after_a_barge_in_fits_the_context(stack, served):
    """max_output_tokens 512 on max_model_len 1024 (the tester's case: the turn after a barge-in
    failed with 'prompt (790 tokens) + max_tokens (512) exceeds max_model_len=1024'): the
    response to the interrupting turn starts (old items left out as needed, docs/realtime.md
    "Context"); it is cancelled once it has sent something."""
    turn, interrupt = speak(stack, TURN_1), speak(stack, TURN_2)

    async def run():
        async with client(stack).realtime.connect(model="omni") as conn:
            await conn.session.update(session={"type": "realtime", "max_output_tokens": 512, "audio": {"input": {
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 400}}}})
            await until(conn, "session.updated")
            await append(conn, silence(500) + turn + silence(800))
            first, _ = await until(conn, "response.output_audio.delta")
            await append(conn, silence(200) + interrupt + silence(800))
            async with asyncio.timeout(180):
                async for ev in conn:
                    if ev.type == "response.done" and ev.response.id != first.response_id:
                        return ev.response.status, ev.response.status_details
                    if ev.type.startswith("response.output_audio") and ev.response_id != first.response_id:
                        await conn.response.cancel()
                        done, _ = await until(conn, "response.done")
                        return done.response.status, done.response.status_details
            raise AssertionError("the connection closed")

    status, details = asyncio.run(run())
    assert status in ("completed", "incomplete", "cancelled"), details

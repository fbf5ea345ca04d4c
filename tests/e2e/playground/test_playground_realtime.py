"""The playground's Realtime tab in Chromium against the real stack: a fake microphone plays real
speech (Piper's, through ``llm_tts``) on a loop, so the page streams it to ``WS /v1/realtime``,
server VAD ends the turn, the omni model's spoken answer plays, and the next loop of the speech
starts while the answer still plays: a barge-in, which must silence playback at once. Run with
``OMNI_TRITON_E2E_MODELS=llm_tts,qwen3_omni`` (``omni`` hears audio itself: no transcription
model needed)."""
from __future__ import annotations

import base64
import wave

import httpx
import pytest

from tests.helpers.playground import new_page, open_tab, shot

pytestmark = pytest.mark.e2e

#: silence after the speech in the looped microphone file: VAD ends the turn after 500 ms of it,
#: the answer (~4 s of audio at 32 tokens) starts playing within about a second, and the speech
#: comes back while it still plays
TRAILING_SILENCE_S = 2.0


def _served(stack) -> set[str]:
    return {m["id"] for m in httpx.get(f"{stack.frontend_url}/v1/models", timeout=10).json()["data"]}


@pytest.fixture(scope="module")
def mic_wav(stack, tmp_path_factory):
    """A WAV of real speech (Piper's voice via llm_tts' spoken answer) with silence around it."""
    if not {"omni", "llm_tts"} <= _served(stack):
        pytest.skip("needs omni (qwen3_omni) and llm_tts served (OMNI_TRITON_E2E_MODELS=llm_tts,qwen3_omni)")
    r = httpx.post(f"{stack.frontend_url}/v1/chat/completions", timeout=180, json={
        "model": "llm_tts", "temperature": 0, "max_tokens": 20, "modalities": ["text", "audio"],
        "audio": {"format": "wav", "voice": "joe"},
        "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    r.raise_for_status()
    path = tmp_path_factory.mktemp("mic") / "speech.wav"
    speech = path.with_name("answer.wav")
    speech.write_bytes(base64.b64decode(r.json()["choices"][0]["message"]["audio"]["data"]))
    with wave.open(str(speech)) as src:
        rate, pcm = src.getframerate(), src.readframes(src.getnframes())
    assert len(pcm) / 2 / rate > 1.0, "the speech is too short to be a turn"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(bytes(int(0.5 * rate) * 2) + pcm + bytes(int(TRAILING_SILENCE_S * rate) * 2))
    return path


@pytest.fixture
def mic_page(chromium_launch, stack, mic_wav):
    """A page in a browser of its own whose fake microphone loops ``mic_wav``."""
    browser = chromium_launch([f"--use-file-for-fake-audio-capture={mic_wav}"])
    page = new_page(browser, stack.frontend_url)
    yield page
    page.context.close()


def _status(page) -> dict:
    return page.eval_on_selector("[data-testid=rt-status]", "n => ({...n.dataset})")


def _until(page, condition: str, timeout_ms: int) -> dict:
    page.wait_for_function("() => { const d = document.querySelector('[data-testid=rt-status]').dataset; "
                           f"return {condition}; }}", timeout=timeout_ms)
    return _status(page)


def test_talk_hear_the_answer_and_barge_in(mic_page, stack, artifact_dir, first_output):
    page = mic_page
    open_tab(page, "realtime")
    page.wait_for_selector("[data-testid=rt-model] option[value=omni]", state="attached")
    page.select_option("[data-testid=rt-model]", "omni")
    page.fill("[data-testid=rt-max-tokens]", "32")
    page.click("[data-testid=rt-connect]")
    # the page streams the microphone, the server hears a turn and answers
    s = _until(page, "parseInt(d.sentMs || '0') > 500", 30_000)
    s = _until(page, "parseInt(d.speechStarted || '0') >= 1", 60_000)
    s = _until(page, "parseInt(d.audioDeltas || '0') >= 1", 120_000)
    assert page.is_hidden("[data-testid=rt-error]"), page.inner_text("[data-testid=rt-error]")
    # the answer plays: audio time advances
    s = _until(page, "parseFloat(d.audioTime || '0') > 0.3", 30_000)
    assert float(s["ttfpMs"]) > 0, s
    first_output["realtime"] = round(float(s["ttfpMs"]) / 1000, 3)  # end of the user's turn -> first sound
    # the looped speech comes back while the answer plays: barge-in
    s = _until(page, "parseInt(d.bargeIns || '0') >= 1", 120_000)
    assert float(s["cutSeconds"]) > 0.2, f"the answer had ended before the user spoke again: {s}"
    heard = float(s["playedAtBargeIn"])
    # playback stopped at once: no audio time passes while the user speaks (the speech lasts > 1 s
    # and its own answer only comes after it and 500 ms of silence)
    page.wait_for_timeout(800)
    after = _status(page)
    assert int(after.get("bargeIns", "0")) >= 1
    assert float(after["audioTime"]) - heard < 0.05, (s, after)
    assert page.locator("#tab-realtime .msg.interrupted").count() >= 1
    assert page.locator("#tab-realtime .msg.user").count() >= 1
    assert page.is_hidden("[data-testid=rt-error]"), page.inner_text("[data-testid=rt-error]")
    shot(page, artifact_dir, "realtime")
    page.click("[data-testid=rt-connect]")  # stop
    page.wait_for_selector("[data-testid=rt-status][data-state=closed]")
    assert not page.errors, page.errors


def test_a_model_realtime_refuses_shows_the_api_error(page, stack):
    open_tab(page, "realtime")
    page.wait_for_selector("[data-testid=rt-model] option", state="attached")
    # a name the server does not serve (the list only offers served models: add one by hand)
    page.eval_on_selector("[data-testid=rt-model]",
                          "s => { s.append(new Option('no-such-model', 'no-such-model')); s.value = 'no-such-model'; }")
    page.click("[data-testid=rt-connect]")
    page.wait_for_selector("[data-testid=rt-error]:not([hidden])", timeout=30_000)
    text = page.inner_text("[data-testid=rt-error]")
    assert "no-such-model" in text and "model_not_found" in text, text
    page.wait_for_selector("[data-testid=rt-status][data-state=closed]", timeout=10_000)

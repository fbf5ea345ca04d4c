"""The playground's Chat tab in Chromium against the real stack (``llm_tts``: SmolLM2 + Piper,
``omni``: the tiny Qwen3-Omni): the answer streams as text, a speaking model's spoken answer plays
while the stream is still arriving, attachments reach the omni model, and the API's refusal of an
attachment is shown. Run with ``OMNI_TRITON_E2E_MODELS=llm_tts,qwen3_omni``."""
from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from tests.helpers.playground import open_tab, shot

pytestmark = pytest.mark.e2e


def _png(size: int = 32) -> bytes:
    """A small RGB PNG (a gradient)."""
    from PIL import Image
    ramp = np.linspace(0, 255, size, dtype=np.uint8)
    rgb = np.stack([np.tile(ramp, (size, 1)), np.tile(ramp[:, None], (1, size)),
                    np.full((size, size), 128, np.uint8)], -1)
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="PNG")
    return out.getvalue()


def _wav(seconds: float = 0.5, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2").tobytes()
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return out.getvalue()


def _models(page) -> list[str]:
    return page.eval_on_selector_all("[data-testid=chat-model] option", "os => os.map(o => o.value)")


def _need(page, *models: str) -> None:
    page.wait_for_selector("[data-testid=chat-model] option[value]:not([value=''])", state="attached")
    missing = [m for m in models if m not in _models(page)]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} served (OMNI_TRITON_E2E_MODELS=llm_tts,qwen3_omni)")


def _status(page) -> dict:
    return page.eval_on_selector("[data-testid=chat-status]", "n => ({...n.dataset})")


def _ask(page, model: str, text: str, *, speak: bool, max_tokens: int, files=(), timeout_ms: int = 180_000,
         text_while_streaming: bool = False) -> dict:
    page.select_option("[data-testid=chat-model]", model)
    if page.is_visible("[data-testid=chat-speak]"):
        page.set_checked("[data-testid=chat-speak]", speak)
    page.fill("[data-testid=chat-max-tokens]", str(max_tokens))
    for f in files:
        page.set_input_files("[data-testid=chat-attach]", files=[f])
    page.fill("[data-testid=chat-input]", text)
    page.click("[data-testid=chat-send]")
    if text_while_streaming:  # text is shown before the stream ends (not buffered to the end)
        page.wait_for_function("() => { const a = document.querySelector('[data-testid=chat-answer]');"
                               " return a && a.textContent.length > 0 &&"
                               " document.querySelector('[data-testid=chat-status]').dataset.streamDone === 'false'; }",
                               timeout=timeout_ms)
    page.wait_for_function("() => document.querySelector('[data-testid=chat-status]').dataset.streamDone === 'true'",
                           timeout=timeout_ms)
    return _status(page)


def test_the_answer_streams_and_its_speech_plays_while_streaming(page, stack, artifact_dir, first_output):
    open_tab(page, "chat")
    _need(page, "llm_tts")
    page.select_option("[data-testid=chat-model]", "llm_tts")
    page.wait_for_selector("[data-testid=chat-voice] option[value=joe]", state="attached")
    s = _ask(page, "llm_tts", "Tell me about Paris in a few sentences.", speak=True, max_tokens=100,
             text_while_streaming=True)
    assert page.is_hidden("[data-testid=chat-error]"), page.inner_text("[data-testid=chat-error]")
    answer = page.inner_text("[data-testid=chat-answer]")
    assert len(answer) > 20, answer
    # text streamed: many deltas, the first long before the end
    assert int(s["textChunks"]) > 5, s
    assert float(s["ttftMs"]) < float(s["doneMs"]), s
    # speech streamed and played before the stream ended (a page that buffered the whole answer
    # before playing it would have played 0 s at that moment)
    assert int(s["audioBytes"]) > 22050, s
    assert float(s["audioAtDone"]) > 0.0, s
    assert float(s["ttfpMs"]) < float(s["doneMs"]), s
    # and playback goes on after the stream
    beyond = float(s["audioAtDone"]) + 0.3
    page.wait_for_function(
        f"() => parseFloat(document.querySelector('[data-testid=chat-status]').dataset.audioTime) > {beyond}",
        timeout=15_000)
    first_output["chat"] = round(float(s["ttfpMs"]) / 1000, 3)  # the send click -> first sound
    first_output["chat_first_text"] = round(float(s["ttftMs"]) / 1000, 3)
    shot(page, artifact_dir, "chat")
    assert not page.errors, page.errors


def test_an_attached_image_and_audio_reach_the_omni_model(page, stack, tmp_path):
    open_tab(page, "chat")
    _need(page, "omni")
    png = tmp_path / "dot.png"
    png.write_bytes(_png())
    wav = tmp_path / "tone.wav"
    wav.write_bytes(_wav())
    plain = _ask(page, "omni", "What is this?", speak=False, max_tokens=4)
    assert page.is_hidden("[data-testid=chat-error]"), page.inner_text("[data-testid=chat-error]")
    page.click("[data-testid=chat-clear]")
    with_media = _ask(page, "omni", "What is this?", speak=False, max_tokens=4, files=[png, wav])
    assert page.is_hidden("[data-testid=chat-error]"), page.inner_text("[data-testid=chat-error]")
    # the image's and the audio's tokens are in the prompt the thinker saw
    assert int(with_media["promptTokens"]) > int(plain["promptTokens"]), (plain, with_media)
    user = page.inner_text("#tab-chat .msg.user >> nth=-1")
    assert "dot.png" in user and "tone.wav" in user, user
    assert page.locator("[data-testid=chat-attachments] .chip").count() == 0  # sent, not kept
    assert not page.errors, page.errors


def test_an_attachment_the_model_refuses_shows_the_api_error(page, stack, tmp_path):
    open_tab(page, "chat")
    _need(page, "llm_tts")
    png = tmp_path / "dot.png"
    png.write_bytes(_png())
    _ask(page, "llm_tts", "What is this?", speak=False, max_tokens=4, files=[png])
    page.wait_for_selector("[data-testid=chat-error]:not([hidden])")
    text = page.inner_text("[data-testid=chat-error]")
    assert "HTTP 400" in text and "image_url" in text and "unsupported_content_part" in text, text
    # the refused attachment is kept for another try, the failed turn is not in the conversation
    assert page.locator("[data-testid=chat-attachments] .chip").count() == 1
    assert page.locator("[data-testid=chat-answer]").count() == 0
    assert page.input_value("[data-testid=chat-input]") == "What is this?"  # and so are the words

"""The playground's Voices tab in Chromium against the real stack (Qwen3-TTS clones and designs):
a consent from the microphone (MediaRecorder's WebM, decoded by the server) or a file, a voice
cloned from an uploaded WAV that is listed, speaks and is deleted, a designed voice, and the API's
error messages for bad input."""
from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.helpers.playground import open_tab, shot

pytestmark = pytest.mark.e2e

STATUS = "[data-testid=voices-status]"


@pytest.fixture(scope="module")
def voiced_wav(tmp_path_factory) -> Path:
    """3 s of a voiced sound (a gliding 140 Hz tone with harmonics, syllable-like envelope),
    24 kHz 16-bit WAV: the server's clip limits are 1-30 s."""
    rate = 24000
    t = np.arange(3 * rate) / rate
    phase = 2 * np.pi * np.cumsum(140 + 20 * np.sin(2 * np.pi * 0.7 * t)) / rate
    wave = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t) ** 2) * 0.2
    path = tmp_path_factory.mktemp("voices") / "sample.wav"
    sf.write(path, wave.astype(np.float32), rate, subtype="PCM_16")
    return path


def _uploaded(page) -> dict[str, dict]:
    body = page.request.get("/v1/audio/voices").json()
    return {v["name"]: v for v in body["uploaded_voices"]}


def _open(page):
    open_tab(page, "voices")
    page.wait_for_selector("[data-testid=speak-voice] option", state="attached")
    if not page.query_selector("[data-testid=speak-model] option[value=qwen3_tts]"):
        pytest.skip("qwen3_tts is not served (OMNI_TRITON_E2E_MODELS)")


def _store_consent(page, name: str) -> str:
    page.fill("[data-testid=consent-name]", name)
    page.click("[data-testid=consent-create]")
    result = page.wait_for_selector("[data-testid=consent-result]:has-text('cons_')", timeout=30_000)
    consent = result.text_content().split()[1]
    assert page.get_attribute(f"[data-testid=consent-row][data-id={consent}]", "data-id") == consent
    return consent


def _speak_and_wait(page) -> dict:
    page.wait_for_function(
        """s => { const e = document.querySelector(s);
                  return e.dataset.state === "error" || parseFloat(e.dataset.audioTime) > 0; }""",
        arg=STATUS, timeout=120_000)
    page.wait_for_function("s => ['playing', 'done', 'error'].includes(document.querySelector(s).dataset.state)",
                           arg=STATUS, timeout=120_000)
    status = page.eval_on_selector(STATUS, "e => ({...e.dataset})")
    assert status["state"] != "error", page.text_content("[data-testid=voices-error]")
    return status


def test_a_voice_cloned_from_an_uploaded_wav_is_listed_speaks_and_is_deleted(page, stack, artifact_dir, voiced_wav,
                                                                             first_output):
    _open(page)
    page.set_input_files("[data-testid=consent-file]", str(voiced_wav))
    consent = _store_consent(page, "uploaded consent")

    name = f"pg-clone-{uuid.uuid4().hex[:8]}"
    page.fill("[data-testid=clone-name]", name)
    assert page.input_value("[data-testid=clone-consent]") == consent  # the new consent is chosen
    page.set_input_files("[data-testid=sample-file]", str(voiced_wav))
    page.click("[data-testid=clone-create]")
    row = page.wait_for_selector(f"[data-testid=voice-row][data-name={name}]", timeout=60_000)
    voice_id = row.get_attribute("data-id")
    stored = _uploaded(page)[name]
    assert stored["id"] == voice_id and stored["type"] == "audio_sample" and stored["consent"] == consent
    assert stored["seconds"] == pytest.approx(3.0, abs=0.05)
    assert "cloned" in row.text_content()

    # Speak with it (the row's button picks the voice and a model that can use it)
    page.click(f"[data-testid=voice-row][data-name={name}] [data-testid=voice-speak]")
    assert page.input_value("[data-testid=speak-voice]") == voice_id
    assert page.input_value("[data-testid=speak-model]") == "qwen3_tts"
    status = _speak_and_wait(page)
    assert status["sampleRate"] == "24000"
    page.wait_for_selector(f"{STATUS}[data-stream-done=true]", timeout=120_000)
    ttfp = page.text_content("[data-testid=voices-ttfp]")
    first_output["voices"] = float(ttfp.split()[0])  # Qwen3-TTS (tiny), the cloned voice
    print(f"voices tab (qwen3_tts clone): TTFP {ttfp}, RTF {page.text_content('[data-testid=voices-rtf]')}")
    assert float(page.eval_on_selector(STATUS, "e => e.dataset.audioSeconds")) > 0.2
    shot(page, artifact_dir, "voices")

    page.click(f"[data-testid=voice-row][data-name={name}] [data-testid=voice-delete]")
    page.wait_for_selector(f"[data-testid=voice-row][data-name={name}]", state="detached")
    assert name not in _uploaded(page)
    assert page.query_selector(f"[data-testid=speak-voice] option[value={voice_id}]") is None
    assert not page.errors, page.errors


def test_a_consent_recorded_from_the_microphone(page, stack):
    """Chromium's fake microphone (a beep) through MediaRecorder: WebM/Opus, which the server
    decodes (PyAV) like any upload."""
    _open(page)
    page.click("[data-testid=consent-record]")
    page.wait_for_selector("[data-testid=consent-record][data-recording=true]")
    page.wait_for_timeout(2000)  # the server wants 1-30 s
    page.click("[data-testid=consent-record]")
    source = page.wait_for_selector("[data-testid=consent-source][data-ready]")
    assert "audio/webm" in source.text_content()
    consent = _store_consent(page, "recorded consent")
    assert page.request.get(f"/v1/audio/voice_consents/{consent}").json()["name"] == "recorded consent"
    assert not page.errors, page.errors


def test_a_designed_voice_speaks(page, stack):
    _open(page)
    name = f"pg-design-{uuid.uuid4().hex[:8]}"
    page.fill("[data-testid=design-name]", name)
    page.fill("[data-testid=design-prompt]", "A calm, low narrator voice")
    page.click("[data-testid=design-create]")
    row = page.wait_for_selector(f"[data-testid=voice-row][data-name={name}]", timeout=30_000)
    assert "A calm, low narrator voice" in row.text_content() and "designed" in row.text_content()
    assert page.input_value("[data-testid=speak-voice]") == row.get_attribute("data-id")
    page.click("[data-testid=speak-play]")
    _speak_and_wait(page)
    page.click(f"[data-testid=voice-row][data-name={name}] [data-testid=voice-delete]")
    page.wait_for_selector(f"[data-testid=voice-row][data-name={name}]", state="detached")
    assert not page.errors, page.errors


def test_bad_input_shows_the_api_errors(page, stack, voiced_wav):
    _open(page)
    # a clone without a consent: the server's consent_required, not a rule of the page
    page.fill("[data-testid=clone-name]", "no-consent")
    page.set_input_files("[data-testid=sample-file]", str(voiced_wav))
    page.select_option("[data-testid=clone-consent]", "")
    page.click("[data-testid=clone-create]")
    box = page.wait_for_selector("[data-testid=clone-error]:not([hidden])")
    assert "Missing required parameter: 'consent'" in box.text_content()
    assert "consent_required" in box.text_content()
    assert "no-consent" not in _uploaded(page)

    # a consent recording that is too short (0.3 s; the server's minimum is 1 s)
    short = voiced_wav.with_name("short.wav")
    data, rate = sf.read(voiced_wav, dtype="float32")
    sf.write(short, data[: int(0.3 * rate)], rate)
    page.fill("[data-testid=consent-name]", "too short")
    page.set_input_files("[data-testid=consent-file]", str(short))
    page.click("[data-testid=consent-create]")
    box = page.wait_for_selector("[data-testid=consent-error]:not([hidden])")
    assert "audio_too_short" in box.text_content()

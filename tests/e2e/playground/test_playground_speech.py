"""The playground's Speech tab in Chromium against the real stack (Piper): speech plays while it
streams (the page's audio time advances before the last byte), TTFP / first byte / RTF are shown,
the downloaded WAV is the audio that played, and the API's error message shows for bad input."""
from __future__ import annotations

import os
import re
import signal

import httpx
import pytest
import soundfile as sf

from tests.helpers.playground import open_tab, shot
from tests.helpers.stubs import stub_processes

pytestmark = pytest.mark.e2e

STATUS = "[data-testid=speech-status]"
#: long enough that a paced stream lasts several seconds (Piper: about 9 s of speech)
TEXT = ("One, two, three. This is a long enough text to be paced in real time. It keeps going for a "
        "while so that the stream lasts several seconds. And then it ends.")


def _status(page) -> dict:
    return page.eval_on_selector(STATUS, "e => ({...e.dataset})")


def _seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+\.\d+) s", text.strip())
    assert match, f"not a figure in seconds: {text!r}"
    return float(match.group(1))


def _open(page):
    open_tab(page, "speech")
    page.wait_for_selector("[data-testid=speech-voice] option[value=joe]", state="attached")
    page.select_option("[data-testid=speech-model]", "piper_tts")


def test_speech_plays_while_it_streams_and_the_wav_downloads(page, stack, artifact_dir, first_output):
    _open(page)
    page.fill("[data-testid=speech-text]", TEXT)
    page.check("[data-testid=speech-pacing]")
    page.click("[data-testid=speech-play]")

    # paced to real time, the stream lasts about as long as its audio: sound is heard (the
    # AudioContext's clock) before the last byte arrives
    page.wait_for_function(
        """s => { const e = document.querySelector(s);
                  return e.dataset.streamDone === "false" && parseFloat(e.dataset.audioTime) > 0.3; }""",
        arg=STATUS, timeout=90_000)
    during = _status(page)
    assert during["state"] == "streaming", during

    # played out: every second that arrived has sounded
    page.wait_for_selector(f"{STATUS}[data-state=done]", timeout=90_000)
    after = _status(page)
    assert after["streamDone"] == "true", after
    audio_seconds = float(after["audioSeconds"])
    assert audio_seconds > 3, after
    assert abs(float(after["audioTime"]) - audio_seconds) < 0.01, after

    ttfp = _seconds(page.text_content("[data-testid=speech-ttfp]"))
    ttfb = _seconds(page.text_content("[data-testid=speech-ttfb]"))
    assert 0 < ttfb <= ttfp < 30, (ttfb, ttfp)
    assert _seconds(page.text_content("[data-testid=speech-audio-seconds]")) == pytest.approx(audio_seconds, abs=0.006)
    rtf = float(page.text_content("[data-testid=speech-rtf]"))
    assert 0 < rtf < 5, rtf
    first_output["speech"] = ttfp  # Piper, paced
    print(f"speech tab (piper, paced): TTFP {ttfp:.2f} s, first byte {ttfb:.2f} s, "
          f"{audio_seconds:.2f} s of audio, RTF {rtf:.3f}")

    with page.expect_download() as download:
        page.click("[data-testid=speech-download]")
    data, rate = sf.read(download.value.path(), dtype="float32")
    assert rate == 22050 == int(after["sampleRate"])
    assert len(data) / rate == pytest.approx(audio_seconds, abs=0.002)  # the audio that played
    assert float(abs(data).max()) > 0.05  # speech, not silence
    shot(page, artifact_dir, "speech")
    assert not page.errors, page.errors


def test_stop_aborts_the_stream_and_silences(page, stack):
    _open(page)
    page.fill("[data-testid=speech-text]", TEXT)
    page.check("[data-testid=speech-pacing]")
    page.click("[data-testid=speech-play]")
    page.wait_for_function("s => parseFloat(document.querySelector(s).dataset.audioTime) > 0.2", arg=STATUS,
                           timeout=90_000)
    page.click("[data-testid=speech-stop]")
    page.wait_for_selector(f"{STATUS}[data-state=stopped]")
    stopped = _status(page)
    page.wait_for_timeout(2500)  # the paced stream would have sent its next sentence by now
    later = _status(page)
    assert float(later["audioTime"]) == pytest.approx(float(stopped["audioTime"]), abs=0.001)  # silent
    assert later["audioSeconds"] == stopped["audioSeconds"]  # nothing more arrived: the fetch was aborted
    assert float(later["audioSeconds"]) < 8  # a whole clip is ~9 s
    assert page.is_disabled("[data-testid=speech-stop]")
    assert not page.errors, page.errors


def test_bad_input_shows_the_api_error(page, stack):
    _open(page)
    page.fill("[data-testid=speech-text]", "")
    page.click("[data-testid=speech-play]")
    box = page.wait_for_selector("[data-testid=speech-error]:not([hidden])")
    assert "'input' must not be empty" in box.text_content()
    assert "HTTP 400" in box.text_content() and "empty_input" in box.text_content()
    assert _status(page)["state"] == "error"

    # a speed outside the API's range: the server's message, not a limit of the page
    page.fill("[data-testid=speech-text]", "Hello.")
    page.fill("[data-testid=speech-speed]", "9")
    page.click("[data-testid=speech-play]")
    page.wait_for_function("s => document.querySelector(s).textContent.includes('speed')",
                           arg="[data-testid=speech-error]")
    assert page.is_visible("[data-testid=speech-error]")


@pytest.mark.kills_stub("piper")
def test_a_stage_killed_mid_stream_shows_a_cut_off_error_and_speech_works_again(page, stack):
    """kill -9 of the piper stub while the page plays its stream: the page says the stream was
    cut off (a WAV stream cannot carry the server's error), not a bare "network error"; once
    serve has reloaded piper, the same page speaks again."""
    from tests.e2e.conftest import wait_for_stub_death_report

    _open(page)
    page.fill("[data-testid=speech-text]", TEXT)
    page.check("[data-testid=speech-pacing]")
    page.click("[data-testid=speech-play]")
    page.wait_for_function(
        "s => parseFloat(document.querySelector(s).dataset.audioTime) > 0.3", arg=STATUS, timeout=90_000)
    (stub,) = stub_processes("piper", stack.triton_pid)
    log_from = os.path.getsize(stack.log_path)
    os.kill(stub.pid, signal.SIGKILL)
    error = page.wait_for_selector("[data-testid=speech-error]:not([hidden])", timeout=60_000)
    assert "cut off" in error.inner_text() and "Retry" in error.inner_text(), error.inner_text()
    wait_for_stub_death_report(stack, "piper", log_from)
    stack.wait_until(lambda: httpx.post(f"{stack.frontend_url}/v1/audio/speech", timeout=120, json={
        "model": "piper_tts", "input": "Back.", "response_format": "wav"}).status_code == 200,
        "piper_tts did not come back", timeout_s=120)
    page.fill("[data-testid=speech-text]", "Back again.")
    page.uncheck("[data-testid=speech-pacing]")
    page.click("[data-testid=speech-play]")
    page.wait_for_selector(f"{STATUS}[data-state=done]", timeout=60_000)
    assert page.is_hidden("[data-testid=speech-error]")

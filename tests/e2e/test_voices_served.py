"""End-to-end (issue 11): custom voices, OpenAI voice names, batches and the speech WebSocket
through the real tritonserver + a frontend of this test's own (so it can be restarted on the same
voice store), driven by the official ``openai`` SDK and a real WebSocket client (``websockets``).

``OMNI_TRITON_E2E_MODELS=piper_tts`` is enough for everything but cloning/speaking with stored
voices: those tests need ``qwen3_tts`` + ``qwen3_tts_voice_prompt`` and skip with a reason when
the stack does not serve them.
"""
from __future__ import annotations

import base64
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from websockets.sync.client import connect as ws_connect

from omni_triton.serve.process import free_port

pytestmark = pytest.mark.e2e

QWEN3 = ("qwen3_tts", "qwen3_tts_voice_prompt")


class Frontend:
    """``python -m openai_frontend`` on the stack's Triton with its own voice store."""

    def __init__(self, triton_url: str, store: Path, log: Path, models: list[str], admin_key: str = ""):
        self.port = free_port()
        self.env = {**os.environ, "OMNI_TRITON_ADMIN_KEY": admin_key}  # Triton's restricted APIs
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "openai_frontend", "--triton-url", triton_url, "--port", str(self.port),
                    "--models", ",".join(models), "--voice-storage-dir", str(store),
                    "--voice-max-seconds", "10", "--voice-max-upload-bytes", str(2 << 20),
                    "--video-storage-dir", str(store / "videos"), "--log-level", "warning"]
        self.log = log
        self.proc = None

    def start(self) -> Frontend:
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, env=self.env)
        deadline = time.monotonic() + 120
        try:
            while True:
                assert self.proc.poll() is None, self.log.read_text()[-3000:]
                assert time.monotonic() < deadline, "frontend not healthy in time:\n" + self.log.read_text()[-3000:]
                try:
                    if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.3)
        except BaseException:  # a frontend that never got healthy must not outlive the test session
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def sdk(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/audio/speech/stream"


@pytest.fixture(scope="module")
def served(stack) -> set[str]:
    """The READY models of the stack's Triton (internal stages such as qwen3_tts_voice_prompt
    included: /v1/models lists only what clients call)."""
    index = httpx.post(f"{stack.triton_http_url}/v2/repository/index", json={}, timeout=10,
                       headers=stack.admin_headers).json()
    return {m["name"] for m in index if m.get("state") == "READY"}


@pytest.fixture(scope="module")
def frontend(stack, served, tmp_path_factory):
    models = ["piper"] + [m for m in QWEN3 if m in served]
    fe = Frontend(stack.triton_grpc_url, tmp_path_factory.mktemp("voices"),
                  tmp_path_factory.mktemp("fe") / "frontend.log", models, stack.admin_key).start()
    yield fe
    fe.stop()


@pytest.fixture
def qwen3(served):
    missing = [m for m in QWEN3 if m not in served]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} served (branch qwen3tts; OMNI_TRITON_E2E_MODELS)")


def wav(seconds: float, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32),
             rate, format="WAV")
    return buf.getvalue()


def consent_id(sdk: openai.OpenAI) -> str:
    return sdk.audio.voice_consents.create(name="speaker", language="en-US",
                                           recording=("consent.wav", wav(1.5), "audio/wav")).id


# --------------------------------------------------------------------------- piper_tts is enough
def test_openai_voice_names_speak_on_piper(frontend):
    sdk = frontend.sdk()
    for name in ("alloy", "cedar"):
        r = sdk.audio.speech.create(model="piper_tts", voice=name, input="Hello there.", response_format="wav")
        y, sr = sf.read(io.BytesIO(r.content))
        assert sr == 22050 and np.abs(y).max() > 0.05  # (Piper is not deterministic: no byte equality)
    listed = httpx.get(f"{frontend.url}/v1/audio/voices").json()
    piper = next(d for d in listed["data"] if d["model"] == "piper_tts")
    assert piper["voices"] == ["joe"] and piper["openai_voices"]["alloy"] == "joe"


def test_websocket_audio_before_the_last_text(frontend):
    """The first sentence's audio arrives while the second is still being typed."""
    with ws_connect(frontend.ws_url, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "session.config", "model": "piper_tts", "voice": "alloy",
                            "response_format": "wav"}))
        ws.send(json.dumps({"type": "input.text", "text": "The first sentence is complete. The sec"}))
        start = json.loads(ws.recv(timeout=120))
        assert start["type"] == "audio.start" and start["sentence_text"] == "The first sentence is complete."
        first = ws.recv(timeout=120)
        assert isinstance(first, bytes)
        y, sr = sf.read(io.BytesIO(first))
        assert sr == 22050 and len(y) > sr // 2 and np.abs(y).max() > 0.05
        assert json.loads(ws.recv(timeout=60))["total_bytes"] == len(first)
        # only now is the rest of the text sent
        ws.send(json.dumps({"type": "input.text", "text": "ond one ends here"}))
        ws.send(json.dumps({"type": "input.done"}))
        start2 = json.loads(ws.recv(timeout=120))
        assert start2["sentence_text"] == "The second one ends here" and start2["sentence_index"] == 1
        assert isinstance(ws.recv(timeout=120), bytes)
        assert json.loads(ws.recv(timeout=60))["type"] == "audio.done"
        assert json.loads(ws.recv(timeout=60)) == {"type": "session.done", "utterance_index": 0,
                                                    "total_sentences": 2}
        # streamed PCM chunks for the next utterance, same connection
        ws.send(json.dumps({"type": "session.config", "model": "piper_tts", "stream_audio": True}))
        ws.send(json.dumps({"type": "input.text", "text": "Streaming this time."}))
        ws.send(json.dumps({"type": "input.done"}))
        assert json.loads(ws.recv(timeout=120))["format"] == "pcm"
        total = 0
        while isinstance(msg := ws.recv(timeout=120), bytes):
            total += len(msg)
        assert json.loads(msg) == {"type": "audio.done", "utterance_index": 1, "sentence_index": 0,
                                   "total_bytes": total, "error": False} and total > 22050
        ws.send(json.dumps({"type": "session.close"}))
        assert json.loads(ws.recv(timeout=60))["type"] == "session.done"


def test_batch_with_one_bad_item(frontend):
    r = httpx.post(f"{frontend.url}/v1/audio/speech/batch", timeout=300, json={
        "model": "piper_tts", "voice": "nova",
        "items": [{"input": "First item."}, {"input": ""}, {"input": "Third item.", "response_format": "flac"}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["total"], body["succeeded"], body["failed"]) == (3, 2, 1)
    assert body["results"][1]["status"] == "error" and body["results"][1]["param"] == "input"
    for item in (body["results"][0], body["results"][2]):
        y, sr = sf.read(io.BytesIO(base64.b64decode(item["audio_data"])))
        assert sr == 22050 and np.abs(y).max() > 0.05


def test_designed_voice_survives_a_restart(frontend):
    sdk = frontend.sdk()
    voice = sdk.audio.voices.create(name="narrator", type="prompt", prompt="A calm, low narrator voice")
    assert voice.type == "prompt" and voice.id.startswith("voice_")
    frontend.stop()
    frontend.start()
    listed = httpx.get(f"{frontend.url}/v1/audio/voices").json()["uploaded_voices"]
    assert [(v["id"], v["name"], v["prompt"]) for v in listed] == [(voice.id, "narrator", "A calm, low narrator voice")]
    assert sdk.audio.voices.delete(voice.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        sdk.audio.voices.delete(voice.id)


def test_voice_consents_with_the_sdk(frontend):
    sdk = frontend.sdk()
    cid = consent_id(sdk)
    assert sdk.audio.voice_consents.retrieve(cid).name == "speaker"
    assert sdk.audio.voice_consents.update(cid, name="renamed").name == "renamed"
    assert cid in [c.id for c in sdk.audio.voice_consents.list()]
    assert sdk.audio.voice_consents.delete(cid).deleted is True
    with pytest.raises(openai.NotFoundError):
        sdk.audio.voice_consents.retrieve(cid)


BAD = [
    # (what, request, status, code)
    ("no consent", dict(data={"name": "x"}, files={"audio_sample": ("a.wav", wav(2), "audio/wav")}), 400,
     "consent_required"),
    ("unknown consent", dict(data={"name": "x", "consent": "cons_nope"},
                             files={"audio_sample": ("a.wav", wav(2), "audio/wav")}), 400, "invalid_consent"),
    ("no name", dict(data={"type": "prompt", "prompt": "p"}), 400, "missing_required_parameter"),
    ("blank prompt", dict(data={"name": "x", "type": "prompt", "prompt": " "}), 400, "missing_required_parameter"),
    ("bad type", dict(data={"name": "x", "type": "song"}), 400, "invalid_value"),
]


@pytest.mark.parametrize("what, req, status, code", BAD, ids=[b[0] for b in BAD])
def test_bad_voice_uploads(frontend, what, req, status, code):
    r = httpx.post(f"{frontend.url}/v1/audio/voices", timeout=60, **req)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code


def test_bad_audio_and_ids(frontend, served):
    sdk = frontend.sdk()
    cid = consent_id(sdk)
    clip = {"name": "x", "consent": cid}
    cases = [("not audio", b"hello" * 100, 400, "invalid_audio"), ("too short", wav(0.3), 400, "audio_too_short"),
             ("too long", wav(10.5, 8000), 400, "audio_too_long"),
             ("too big", b"\0" * (3 << 20), 413, "file_too_large")]
    for what, data, status, code in cases:
        r = httpx.post(f"{frontend.url}/v1/audio/voices", data=clip, timeout=60,
                       files={"audio_sample": ("a.wav", data, "audio/wav")})
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), what
    if "qwen3_tts_voice_prompt" not in served:  # a valid clip with nothing to compute its prompt
        r = httpx.post(f"{frontend.url}/v1/audio/voices", data=clip, timeout=60,
                       files={"audio_sample": ("a.wav", wav(2), "audio/wav")})
        assert r.json()["error"]["code"] == "voice_cloning_unavailable"
    sdk.audio.voices.create(name="dup", type="prompt", prompt="p")
    with pytest.raises(openai.ConflictError):
        sdk.audio.voices.create(name="dup", type="prompt", prompt="q")
    assert httpx.get(f"{frontend.url}/v1/audio/voices").json()["uploaded_voices"][-1]["prompt"] == "p"
    sdk.audio.voices.delete(next(v["id"] for v in httpx.get(f"{frontend.url}/v1/audio/voices").json()["uploaded_voices"]
                                 if v["name"] == "dup"))
    with pytest.raises(openai.NotFoundError):
        sdk.audio.voices.delete("voice_unknown")
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.speech.create(model="piper_tts", voice={"id": "voice_unknown"}, input="hi")
    assert e.value.body["code"] == "invalid_voice"
    with pytest.raises(openai.BadRequestError) as e:
        sdk.audio.speech.create(model="piper_tts", voice="joe", input="hi", instructions="whisper")
    assert e.value.body["code"] == "unsupported_instructions"
    r = httpx.post(f"{frontend.url}/v1/audio/speech/batch", json={"model": "piper_tts", "items": [{"input": "x"}] * 33})
    assert r.status_code == 400
    with ws_connect(frontend.ws_url, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "session.config", "model": "piper_tts", "voice": "nobody"}))
        assert json.loads(ws.recv(timeout=30))["code"] == "invalid_voice"
        ws.send("{")
        assert json.loads(ws.recv(timeout=30))["code"] == "invalid_json"


# --------------------------------------------------------------------------- qwen3_tts
def test_clone_speak_delete_404(frontend, qwen3):
    sdk = frontend.sdk()
    voice = sdk.audio.voices.create(name="clone", audio_sample=("me.wav", wav(3.0, 44100), "audio/wav"),
                                    consent=consent_id(sdk), extra_body={"ref_text": "A short reference sentence."})
    assert voice.type == "audio_sample"
    audio = sdk.audio.speech.create(model="qwen3_tts", voice={"id": voice.id}, input="Hello.", response_format="wav")
    y, sr = sf.read(io.BytesIO(audio.content))
    assert len(y) > 0 and sr == 24000
    named = sdk.audio.speech.create(model="qwen3_tts", voice="vivian", input="Hello.", response_format="wav")
    assert named.content != audio.content  # the clone's prompt reached the model (not its default speaker)
    frontend.stop()
    frontend.start()  # the clone (clip + prompt) survives a restart
    again = sdk.audio.speech.create(model="qwen3_tts", voice={"id": voice.id}, input="Hello.", response_format="wav")
    assert again.content == audio.content  # greedy decoding: the same prompt speaks the same audio
    sdk.audio.voices.delete(voice.id)
    with pytest.raises(openai.BadRequestError):
        sdk.audio.speech.create(model="qwen3_tts", voice={"id": voice.id}, input="Hello.")
    with pytest.raises(openai.NotFoundError):
        sdk.audio.voices.delete(voice.id)


def test_designed_voice_and_custom_voice_instructions(frontend, qwen3):
    sdk = frontend.sdk()
    voice = sdk.audio.voices.create(name="designed", type="prompt", prompt="A bright, young female voice")
    designed = sdk.audio.speech.create(model="qwen3_tts", voice={"id": voice.id}, input="Hi.", response_format="wav")
    assert len(sf.read(io.BytesIO(designed.content))[0]) > 0
    styled = sdk.audio.speech.create(model="qwen3_tts", voice="alloy", input="Hi.", response_format="wav",
                                     instructions="Speak slowly and warmly")
    assert len(sf.read(io.BytesIO(styled.content))[0]) > 0
    sdk.audio.voices.delete(voice.id)

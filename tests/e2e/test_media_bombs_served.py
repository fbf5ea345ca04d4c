"""End-to-end: decompression bombs (issue 23 item 2) posted to the real endpoints that decode
client media, on the real server: each gets a 4xx in the OpenAI error shape naming the field, and
no process of the stack (the frontend, every Triton Python stub) grows its peak RSS by more than
100 MB while it is handled (``VmHWM`` reset through ``/proc/<pid>/clear_refs`` before each post).

- audio (FLAC, FLAC without a length, OGG Vorbis, OGG Opus, MP3, WAV at 1 Hz):
  ``POST /v1/audio/voice_consents`` (``recording``) and ``POST /v1/audio/voices``
  (``audio_sample``), decoded by the frontend (any model set: piper_tts is enough);
  ``ref_audio`` of ``/v1/audio/speech`` when ``qwen3_tts`` is served; chat ``input_audio`` when
  ``qwen3_omni`` is served (decoded in the ``qwen3_omni_thinker`` stub);
- images (PNG 20000x20000 and 9000x9000, GIF with a lying frame size): ``/v1/images/edits``
  (``qwen_image_edit``), ``/v1/videos`` ``input_reference`` (``wan_i2v``), chat ``image_url``
  (``qwen3_omni``), each when its model is served;
- video (MP4, 16 frames of 2048x2048): chat ``video_url`` (``qwen3_omni``).

Bombs: ``tests/unit/media_bombs.py``. Run with few models:
``OMNI_TRITON_E2E_MODELS=piper_tts flock /tmp/omni-server.lock .venv/bin/python -m pytest -q
tests/e2e/test_media_bombs_served.py``.
"""
from __future__ import annotations

import base64
import io
import sys
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from media_bombs import AUDIO_BOMBS, IMAGE_BOMBS, MB, MIME, bomb

pytestmark = pytest.mark.e2e

RSS_BOUND = 100 * MB


def _served(stack) -> set[str]:
    return {m["id"] for m in httpx.get(f"{stack.frontend_url}/v1/models", timeout=10).json()["data"]}


def _processes(stack) -> dict[str, psutil.Process]:
    """The frontend and every Python stub of this session's tritonserver, by a readable name."""
    out = {}
    for p in psutil.Process(stack.serve_pid).children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if "openai_frontend" in " ".join(cmd):
            out["frontend"] = p
        elif cmd and cmd[0].endswith("triton_python_backend_stub") and len(cmd) > 5 and cmd[5] == str(stack.triton_pid):
            out[f"stub {Path(cmd[1]).parent.parent.name} {cmd[2][-12:]}"] = p
    assert "frontend" in out, "no frontend process under serve"
    return out


def _vm(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _post_measured(stack, post) -> tuple[httpx.Response, dict[str, float]]:
    """``post()`` with every process's peak RSS reset first; returns the response and each
    process's growth in MB (peak during the post minus RSS before it)."""
    procs = _processes(stack)
    before = {}
    for name, p in procs.items():
        with open(f"/proc/{p.pid}/clear_refs", "w") as f:
            f.write("5")
        before[name] = _vm(p.pid, "VmRSS")
    r = post()
    return r, {name: round((_vm(p.pid, "VmHWM") - before[name]) / MB, 1) for name, p in procs.items()}


def _report(label: str, r: httpx.Response, growth: dict[str, float]) -> None:
    """One line per bomb for the record (``pytest -s``): endpoint field, bomb, status, code and
    the process that grew most."""
    worst = max(growth, key=growth.get)
    try:
        code = r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = r.text[:60]
    print(f"\nBOMB {label:32s} {r.status_code} {code!s:28s} {worst:28s} +{growth[worst]} MB")


def _assert_refused(r: httpx.Response, growth: dict[str, float], param: str, name: str = "") -> None:
    _report(f"{param} {name}", r, growth)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"], err
    assert max(growth.values()) * MB <= RSS_BOUND, growth
    health = r.request.url.copy_with(path="/health", query=None)
    assert httpx.get(health, timeout=10).status_code == 200  # and the server serves on


def _wav(seconds: float = 2.0, rate: int = 24000) -> bytes:
    import soundfile as sf

    buf = io.BytesIO()
    t = np.arange(int(seconds * rate)) / rate
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


@pytest.fixture(scope="module")
def consent_id(stack) -> str:
    r = httpx.post(f"{stack.frontend_url}/v1/audio/voice_consents", data={"name": "bombs", "language": "en"},
                   files={"recording": ("ok.wav", _wav(), "audio/wav")}, timeout=60)
    assert r.status_code == 200, r.text
    yield r.json()["id"]
    httpx.delete(f"{stack.frontend_url}/v1/audio/voice_consents/{r.json()['id']}", timeout=30)


@pytest.mark.parametrize("name", list(AUDIO_BOMBS))
def test_audio_bomb_on_consents_and_voices(stack, consent_id, name):
    url, data = stack.frontend_url, bomb(name)
    r, growth = _post_measured(stack, lambda: httpx.post(
        f"{url}/v1/audio/voice_consents", data={"name": f"bomb {name}", "language": "en"},
        files={"recording": (f"bomb.{name}", data, MIME[name])}, timeout=120))
    _assert_refused(r, growth, "recording", name)
    r, growth = _post_measured(stack, lambda: httpx.post(
        f"{url}/v1/audio/voices", data={"name": f"bomb {name}", "consent": consent_id},
        files={"audio_sample": (f"bomb.{name}", data, MIME[name])}, timeout=120))
    _assert_refused(r, growth, "audio_sample", name)


@pytest.mark.parametrize("name", list(AUDIO_BOMBS))
def test_audio_bomb_as_ref_audio(stack, name):
    if "qwen3_tts" not in _served(stack):
        pytest.skip("qwen3_tts not served")
    url = f"data:{MIME[name]};base64," + base64.b64encode(bomb(name)).decode()
    r, growth = _post_measured(stack, lambda: httpx.post(
        f"{stack.frontend_url}/v1/audio/speech", timeout=120,
        json={"model": "qwen3_tts", "input": "Hello.", "ref_audio": url, "ref_text": "Hello."}))
    _assert_refused(r, growth, "ref_audio", name)


@pytest.mark.parametrize("name", list(IMAGE_BOMBS))
def test_image_bomb_on_edits_and_image_to_video(stack, name):
    served, data = _served(stack), bomb(name)
    if not {"qwen_image_edit", "wan_i2v"} & served:
        pytest.skip("neither qwen_image_edit nor wan_i2v served")
    if "qwen_image_edit" in served:
        r, growth = _post_measured(stack, lambda: httpx.post(
            f"{stack.frontend_url}/v1/images/edits", data={"model": "qwen_image_edit", "prompt": "x"},
            files={"image": (f"bomb.{name}", data, MIME[name])}, timeout=120))
        _assert_refused(r, growth, "image", name)
    if "wan_i2v" in served:
        r, growth = _post_measured(stack, lambda: httpx.post(
            f"{stack.frontend_url}/v1/videos", data={"model": "wan_i2v", "prompt": "x"},
            files={"input_reference": (f"bomb.{name}", data, MIME[name])}, timeout=120))
        _assert_refused(r, growth, "input_reference", name)


def _chat_part(name: str) -> dict:
    b64 = base64.b64encode(bomb(name)).decode()
    if name in AUDIO_BOMBS:
        return {"type": "input_audio", "input_audio": {"data": b64, "format": "mp3" if name == "mp3" else "wav"}}
    kind = "video_url" if name == "mp4" else "image_url"
    return {"type": kind, kind: {"url": f"data:{MIME[name]};base64,{b64}"}}


@pytest.mark.parametrize("name", [*AUDIO_BOMBS, *IMAGE_BOMBS, "mp4"])
def test_bomb_as_chat_media(stack, name):
    """Decoded in the ``qwen3_omni_thinker`` stub (the ``qwen3_omni`` BLS passes the parts on): its RSS
    (and every other stub's) is measured."""
    if "omni" not in _served(stack):
        pytest.skip("omni not served")
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, _chat_part(name)]}]
    r, growth = _post_measured(stack, lambda: httpx.post(
        f"{stack.frontend_url}/v1/chat/completions", timeout=300,
        json={"model": "omni", "messages": messages, "max_tokens": 4, "modalities": ["text"]}))
    _report(f"chat {_chat_part(name)['type']} {name}", r, growth)
    assert 400 <= r.status_code < 500, r.text
    assert max(growth.values()) * MB <= RSS_BOUND, growth

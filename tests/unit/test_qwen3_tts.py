"""Qwen3-TTS stage logic: the torch-free parts here; the engine (talker batching, parity with the
package, cancel, codec) in the Qwen3-TTS environment through ``qwen3_tts_engine_checks.py``."""
import subprocess
from pathlib import Path

import numpy as np
import pytest

from omni_triton.contracts.qwen3_tts import Qwen3TtsInputError
from omni_triton.stages.qwen3_tts.request import Qwen3TtsRequest, VoicePrompt, choose_task, validate_request
from omni_triton.stages.qwen3_tts.streaming import ContextSchedule, validate_chunk

ROOT = Path(__file__).resolve().parents[2]
QWEN_PY = ROOT / ".venv-qwen3-tts" / "bin" / "python"


def test_choose_task_follows_the_contract():
    assert choose_task(None, "ryan", None, False) == "custom_voice"
    assert choose_task(None, "ryan", "happily", False) == "custom_voice"
    assert choose_task(None, None, "a deep voice", False) == "voice_design"
    assert choose_task(None, None, None, True) == "base"
    assert choose_task("voice_design", "ryan", None, True) == "voice_design"
    with pytest.raises(Qwen3TtsInputError):
        choose_task("sing", None, None, False)


def test_validate_request():
    ok = Qwen3TtsRequest("custom_voice", "Hi.", "English", "Ryan")
    assert validate_request(ok, {"ryan"}, {"english"}) is ok
    for bad in (Qwen3TtsRequest("custom_voice", " ", speaker="ryan"),
                Qwen3TtsRequest("custom_voice", "Hi", speaker="bob"),
                Qwen3TtsRequest("voice_design", "Hi"), Qwen3TtsRequest("base", "Hi"),
                Qwen3TtsRequest("custom_voice", "Hi", "Klingon", "ryan"),
                Qwen3TtsRequest("custom_voice", "Hi", speaker="ryan", max_new_tokens=0)):
        with pytest.raises(Qwen3TtsInputError):
            validate_request(bad, {"ryan"}, {"english"})


def test_voice_prompt_bytes_round_trip():
    p = VoicePrompt(np.arange(12, dtype=np.int64).reshape(3, 4), np.ones(8, np.float32), False, True, "words")
    q = VoicePrompt.from_bytes(p.to_bytes())
    assert np.array_equal(q.ref_code, p.ref_code) and np.array_equal(q.ref_spk_embedding, p.ref_spk_embedding)
    assert (q.x_vector_only_mode, q.icl_mode, q.ref_text) == (False, True, "words")
    x = VoicePrompt.from_bytes(VoicePrompt(None, np.ones(8, np.float32), True, False).to_bytes())
    assert x.ref_code is None and x.x_vector_only_mode and x.ref_text is None
    with pytest.raises(Qwen3TtsInputError):
        VoicePrompt.from_bytes(b"junk")


def test_context_schedule_keeps_the_small_first_chunk_after_the_reference():
    s = ContextSchedule(5, 25, 25, context=30)
    assert s.push(30) == [] and s.push(34) == []
    assert s.push(35) == [(5, 35, 25)]  # 5 new frames with 25 reference frames as context
    assert s.push(60) == [(10, 60, 25)]
    assert s.flush(62) == [(35, 62, 25)]


def test_validate_chunk():
    codes, left = validate_chunk(np.zeros((1, 6, 4), np.int64), np.array([[2]]), 4, 64)
    assert codes.shape == (6, 4) and left == 2
    for bad, lft in ((np.zeros((6, 3), np.int64), 0), (np.full((6, 4), 64), 0), (np.zeros((6, 4), np.int64), 6)):
        with pytest.raises(Qwen3TtsInputError):
            validate_chunk(bad, np.array([lft]), 4, 64)


@pytest.mark.skipif(not QWEN_PY.exists(), reason="no .venv-qwen3-tts (scripts/setup_qwen3_tts.sh)")
def test_engine_in_the_qwen3_tts_environment():
    """Parity with the package, batched == solo across speakers, scheduler cancel, ragged codec
    batches (tests/unit/qwen3_tts_engine_checks.py, in the package's own environment)."""
    from omni_triton.paths import model_dir

    ckpt = model_dir("qwen3-tts-tiny")
    if not (ckpt / "manifest.json").is_file():
        from omni_triton.prepare import prepare

        prepare(["qwen3_tts"])
    out = subprocess.run([str(QWEN_PY), str(ROOT / "tests/unit/qwen3_tts_engine_checks.py"), str(ckpt)],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [line for line in out.stdout.splitlines() if line.startswith("ok ")] == [
        "ok parity", "ok batched_equals_solo", "ok scheduler_cancel_and_forms", "ok ragged_decode"]

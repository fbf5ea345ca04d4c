"""The ASR contract's request checks (omni_triton.contracts.asr): every bad input is an
ASRInputError (INVALID_ARG, HTTP 400), a good one comes back normalised."""
from __future__ import annotations

import numpy as np
import pytest

from omni_triton.contracts.asr import SAMPLE_RATE, ASRInputError, asr_inputs, parse_asr_request

OK = {"languages": ("en", "de"), "supports_translation": True, "max_audio_s": 30.0}


def test_a_good_request_is_normalised():
    audio = np.zeros(SAMPLE_RATE, np.float64)
    req = parse_asr_request(audio, " EN ", "Omni-Triton", "", **OK)
    assert req.audio.dtype == np.float32 and req.audio.shape == (SAMPLE_RATE,)
    assert (req.language, req.prompt, req.task) == ("en", "Omni-Triton", "transcribe")
    assert parse_asr_request(audio, None, None, "translate", **OK).task == "translate"


@pytest.mark.parametrize("audio, language, prompt, task, match", [
    (np.zeros(0, np.float32), None, None, None, "empty"),
    (None, None, None, None, "empty"),
    (np.zeros(30 * SAMPLE_RATE + 1, np.float32), None, None, None, "at most 30 s"),
    (np.array([0.0, np.nan], np.float32), None, None, None, "NaN"),
    (np.zeros(10, np.float32), "xx", None, None, "language 'xx'"),
    (np.zeros(10, np.float32), None, None, "summarize", "task 'summarize'"),
    (np.zeros(10, np.float32), None, "p" * 2001, None, "prompt is 2001"),
])
def test_bad_inputs_are_asr_input_errors(audio, language, prompt, task, match):
    with pytest.raises(ASRInputError, match=match):
        parse_asr_request(audio, language, prompt, task, **OK)


def test_translate_needs_a_model_that_can():
    with pytest.raises(ASRInputError, match="cannot translate"):
        parse_asr_request(np.zeros(10, np.float32), None, None, "translate",
                          languages=("en",), supports_translation=False, max_audio_s=30)


def test_inputs_carry_only_what_is_given():
    names = [n for n, _ in asr_inputs(np.zeros(4, np.float32))]
    assert names == ["AUDIO"]
    pairs = dict(asr_inputs(np.zeros(4, np.float64), "en", "hint", "translate"))
    assert pairs["AUDIO"].dtype == np.float32 and pairs["TASK"][0] == b"translate"

"""End-to-end: multimodal input of ``qwen3_omni`` (audio, image and video content parts) through the
official OpenAI SDK -> frontend -> Triton (the ``qwen3_omni`` BLS passes the parts on,
``qwen3_omni_thinker`` decodes them, runs the processor and encodes them with its own audio/vision
towers, ``qwen3_omni_talker`` gets the grids the reference gives it, from the thinker through the BLS).

Reference: transformers alone, in this test process on the same prepared checkpoint. The inputs
come from transformers' ``Qwen3OmniMoeProcessor`` (its chat template, placeholder expansion,
``WhisperFeatureExtractor`` and ``Qwen2VLImageProcessorPil``), none of the project's processor or
tokenizer code; the media bytes are decoded with soundfile + soxr (audio, to 16 kHz) and Pillow
(image). Then ``Qwen3OmniMoeForConditionalGeneration.generate``: greedy thinker and talker with the
talker settings of ``model_repository/qwen3_omni_talker/config.pbtxt``. Text: equal. Audio: the WAV the
frontend returns (16-bit PCM: <= 2^-15 rounding) within WAVE_TOL = 2e-4 of the reference waveform
(the chunked decode's tolerance, tests/unit/test_qwen3_omni.py), for the audio part and the image
part.

The reference processor lives in tests/helpers/qwen3_omni_reference.py. A content fault of the served
audio preprocessing does not show here (the tiny checkpoint's audio tower answers any clip of one
length alike); tests/unit/test_qwen3_omni_media.py compares the served processor's ids and tensors
with transformers' processor directly.
"""
from __future__ import annotations

import base64
import io
import threading

import httpx
import numpy as np
import openai
import pytest

from omni_triton.paths import model_dir
from omni_triton.serve.repository import available_models, model_parameters
from tests.helpers.qwen3_omni_reference import transformers_inputs, transformers_processor

pytestmark = pytest.mark.e2e

WAVE_TOL = 2e-4 + 2 ** -15
MAX_TOKENS = 12


def _served(stack) -> set[str]:
    return {m["id"] for m in httpx.get(f"{stack.frontend_url}/v1/models", timeout=10).json()["data"]}


@pytest.fixture(scope="module")
def sdk(stack):
    if "omni" not in _served(stack):
        pytest.skip("omni not served")
    return openai.OpenAI(base_url=f"{stack.frontend_url}/v1", api_key="unused", max_retries=0, timeout=300)


def _wav_b64(seconds=1.5, rate=22050, freq=330.0) -> str:
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def _png_url(w=128, h=96, seed=3) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3)).astype(np.uint8)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


AUDIO_PART = {"type": "input_audio", "input_audio": {"data": _wav_b64(), "format": "wav"}}
IMAGE_PART = {"type": "image_url", "image_url": {"url": _png_url()}}


def _messages(part, text="What do you hear or see?"):
    return [{"role": "user", "content": [{"type": "text", "text": text}, part]}]


@pytest.fixture(scope="module")
def reference():
    """messages (one user turn: text + one audio or image part) -> (text, waveform) of
    transformers' generate on transformers' processor's inputs."""
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from omni_triton.checkpoints.qwen3_omni import write_processor_files

    torch.set_num_threads(1)
    path = model_dir("qwen3-omni-tiny")
    write_processor_files(path)
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path).eval()
    proc = transformers_processor(path)
    eos = model.config.im_end_token_id
    talker = model_parameters(available_models()["qwen3_omni_talker"])
    lock = threading.Lock()

    def run(messages):
        inputs = transformers_inputs(proc, messages)
        with lock, torch.inference_mode():
            seq, wav = model.generate(
                **inputs, speaker="Ethan", return_audio=True, thinker_max_new_tokens=MAX_TOKENS,
                thinker_eos_token_id=eos, talker_do_sample=talker["do_sample"] == "true",
                talker_repetition_penalty=float(talker["repetition_penalty"]),
                talker_max_new_tokens=int(talker["default_max_frames"]),
                talker_min_new_tokens=int(talker["default_min_frames"]))
        prompt_len = inputs["input_ids"].shape[1]
        return proc.tokenizer.decode(seq[0, prompt_len:], skip_special_tokens=True), wav[0, 0].float().numpy()

    return run


def _ask(sdk, messages, audio=True, **kw):
    return sdk.chat.completions.create(
        model="omni", messages=messages, temperature=0, max_tokens=MAX_TOKENS,
        modalities=["text", "audio"] if audio else ["text"],
        **({"audio": {"voice": "Ethan", "format": "wav"}} if audio else {}), **kw)


def test_audio_part_text_and_speech_equal_reference_generate(sdk, reference):
    ref_text, ref_wav = reference(_messages(AUDIO_PART))
    r = _ask(sdk, _messages(AUDIO_PART))
    msg = r.choices[0].message
    assert msg.content == ref_text
    wav = _wav(msg)
    assert wav.shape == ref_wav.shape
    assert np.abs(wav - ref_wav).max() <= WAVE_TOL
    assert r.usage.prompt_tokens > 40  # the clip's audio tokens are in the prompt


def _wav(msg):
    import soundfile as sf

    wav, rate = sf.read(io.BytesIO(base64.b64decode(msg.audio.data)), dtype="float32")
    assert rate == 24000
    return wav


def test_image_part_text_and_speech_equal_reference_generate(sdk, reference):
    """Speech too: an image prompt's talker needs the image grid the reference passes it (the
    omni BLS forwards it to qwen3_omni_talker; without it the codes differ)."""
    ref_text, ref_wav = reference(_messages(IMAGE_PART))
    r = _ask(sdk, _messages(IMAGE_PART))
    assert r.choices[0].message.content == ref_text
    wav = _wav(r.choices[0].message)
    assert wav.shape == ref_wav.shape and np.abs(wav - ref_wav).max() <= WAVE_TOL
    # the same question without the image is another prompt (the image reached the thinker)
    plain = _ask(sdk, [{"role": "user", "content": "What do you hear or see?"}], audio=False)
    assert plain.usage.prompt_tokens < r.usage.prompt_tokens


def test_video_part_answers_in_text_and_stream(sdk):
    from omni_triton.media.video import encode_mp4

    px = np.random.default_rng(4).integers(0, 255, (8, 64, 64, 3)).astype(np.uint8)
    url = "data:video/mp4;base64," + base64.b64encode(encode_mp4(px, 4)).decode()
    stream = _ask(sdk, _messages({"type": "video_url", "video_url": {"url": url}}), audio=False, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text


def _huge_png_url() -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4200, 4200), (0, 0, 0)).save(buf, "PNG")  # 17.6 MP > the 16.7 MP limit, ~50 KB
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("part, match", [
    ({"type": "input_audio", "input_audio": {"data": "not*base64!", "format": "wav"}}, "invalid base64"),
    ({"type": "input_audio", "input_audio": {"data": _png_url().split(",", 1)[1], "format": "wav"}}, "audio"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8gd29ybGQ="}}, "not a decodable image"),
    ({"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/a.png"}}, "not enabled"),
    ("huge", "over the limit"),
], ids=["corrupt-base64", "not-audio", "not-image", "url-disabled", "huge-image"])
def test_bad_parts_are_400_and_the_server_keeps_serving(sdk, part, match):
    part = {"type": "image_url", "image_url": {"url": _huge_png_url()}} if part == "huge" else part
    with pytest.raises(openai.BadRequestError, match=match):
        _ask(sdk, _messages(part), audio=False)
    assert _ask(sdk, [{"role": "user", "content": "Hi"}], audio=False).choices[0].message.content is not None


def test_text_only_model_names_the_part(stack):
    if "llm" not in _served(stack):
        pytest.skip("llm not served")
    client = openai.OpenAI(base_url=f"{stack.frontend_url}/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError, match="The model 'llm' does not accept input_audio parts"):
        client.chat.completions.create(model="llm", messages=_messages(AUDIO_PART))

"""Multimodal input of the Qwen3-Omni stages (tiny random checkpoint with its audio and vision
towers), no Triton: ``input_audio`` / ``image_url`` / ``video_url`` parts through the processor
(``omni_triton/stages/qwen3_omni/inputs.py``) and the pipeline equal the reference
``Qwen3OmniMoeForConditionalGeneration.generate`` given the same processor tensors.

Text: equal. Codes: equal (one decode of the pipeline's codes is the reference waveform bit for
bit). Streamed waveform: the chunked decode's tolerance of ``test_qwen3_omni.py`` (WAVE_TOL, same
reason: 25 frames of left context vs the pre-transformer's 72-frame window).
"""
from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
torch.set_num_threads(1)

from omni_triton.checkpoints import qwen3_omni as ckpt  # noqa: E402
from omni_triton.contracts import chat  # noqa: E402
from omni_triton.contracts.tensors import InputError  # noqa: E402
from omni_triton.media.inputs import MediaInputError, MediaLimits  # noqa: E402
from omni_triton.stages import qwen3_omni as qo  # noqa: E402
from omni_triton.stages.qwen3_omni import inputs as qi  # noqa: E402

WAVE_TOL = 2e-4
TALKER = qo.TalkerSettings(max_frames=40, min_frames=20, do_sample=False)
MAX_TOKENS = 12


def wav_b64(seconds=1.5, rate=22050, freq=440.0, channels=2) -> str:
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    x = (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, np.stack([x] * channels, axis=1) if channels > 1 else x, rate, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def png_url(h=96, w=128, seed=0) -> str:
    from PIL import Image

    img = np.random.default_rng(seed).integers(0, 255, (h, w, 3)).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def mp4_url(frames=8, fps=4, seed=1) -> str:
    from omni_triton.media.video import encode_mp4

    px = np.random.default_rng(seed).integers(0, 255, (frames, 64, 64, 3)).astype(np.uint8)
    return "data:video/mp4;base64," + base64.b64encode(encode_mp4(px, fps)).decode()


AUDIO_PART = {"type": "input_audio", "input_audio": {"data": wav_b64(), "format": "wav"}}
IMAGE_PART = {"type": "image_url", "image_url": {"url": png_url()}}
VIDEO_PART = {"type": "video_url", "video_url": {"url": mp4_url()}}


def messages(*parts, text="What is this?"):
    return json.dumps([{"role": "user", "content": [{"type": "text", "text": text}, *parts]}])


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
    return ckpt.build_tiny_qwen3_omni(tmp_path_factory.mktemp("omni") / "qwen3-omni-tiny", seed=0)


@pytest.fixture(scope="module")
def stages(omni_dir):
    return (qo.OmniThinker.from_pretrained(omni_dir), qo.OmniTalker.from_pretrained(omni_dir),
            qo.OmniCode2Wav.from_pretrained(omni_dir), qo.OmniProcessor.from_pretrained(omni_dir))


@pytest.fixture(scope="module")
def reference(omni_dir):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(omni_dir).eval()


def _prepare(stages, msgs, audio=True):
    thinker, _, _, proc = stages
    return qo.prepare_multimodal_request(thinker, None, msgs, json.dumps({"max_tokens": MAX_TOKENS}), 32, 1024,
                                         audio, proc)


def _reference(reference, thinker, ids, media):
    seq, wav = reference.generate(
        torch.tensor([ids]), speaker="Ethan", return_audio=True, thinker_max_new_tokens=MAX_TOKENS,
        thinker_eos_token_id=thinker.eos_token_id, talker_do_sample=False,
        talker_max_new_tokens=TALKER.max_frames, talker_min_new_tokens=TALKER.min_frames, **media.thinker_kwargs())
    return thinker.tokenizer.decode(seq[0, len(ids):], skip_special_tokens=True), wav[0, 0].numpy()


@pytest.mark.parametrize("part", [AUDIO_PART, IMAGE_PART, VIDEO_PART], ids=["audio", "image", "video"])
def test_multimodal_pipeline_matches_reference_generate(stages, reference, part):
    thinker, talker, decoder, _ = stages
    ids, sampling, media = _prepare(stages, messages(part))
    kind = chat.part_modality(part)
    assert media.counts == {k: int(k == kind) for k in ("audio", "image", "video")}
    token = {"audio": thinker.config.thinker_config.audio_token_id,
             "image": thinker.config.thinker_config.image_token_id,
             "video": thinker.config.thinker_config.video_token_id}[kind]
    assert ids.count(token) > 1  # the placeholder expanded to the encoder's token count
    res = qo.run_pipeline(thinker, talker, decoder, ids, sampling, "Ethan", TALKER, media=media)
    text, wav = _reference(reference, thinker, ids, media)
    assert res.text == text
    np.testing.assert_array_equal(decoder.decode([res.codes])[0], wav)  # same codes, same decoder
    assert res.audio.shape == wav.shape and np.abs(res.audio - wav).max() <= WAVE_TOL


def test_the_media_reach_the_thinker_and_the_talker(stages):
    """What the parity test relies on: the answer depends on the media (features reach the
    thinker's towers) and, for an image, the talker's rope positions depend on the grid the
    reference passes it (a talker without ``image_grid_thw`` speaks differently)."""
    thinker, talker, decoder, proc = stages
    ids, s, media = _prepare(stages, messages(IMAGE_PART))
    other = proc([qi.MediaItem("image", _image(png_url(seed=5)))])
    assert other.pixel_values.shape == media.pixel_values.shape
    out = [step for step in thinker.stream(ids, s, True, media=media)][-1].output
    out2 = [step for step in thinker.stream(ids, s, True, media=other)][-1].output
    assert not np.array_equal(out.hidden, out2.hidden)
    assert set(out.talker_media) == {"image_grid_thw"}
    codes = np.concatenate(list(talker.stream(out, "Ethan", TALKER)))
    out.talker_media = None
    assert not np.array_equal(codes, np.concatenate(list(talker.stream(out, "Ethan", TALKER))))


def _image(url):
    from omni_triton.media.inputs import decode_image, parse_data_url

    return decode_image(parse_data_url(url, "t", 1 << 24)[1], "t", 1 << 24)


def test_placeholders_with_tensors_equal_data_parts(stages):
    """A caller that ran the processor itself may send placeholders + tensors (the stage API; the
    omni BLS sends the data parts as they came since issue 28): the same prompt either way."""
    thinker, _, _, proc = stages
    ids, _, media = _prepare(stages, messages(AUDIO_PART, IMAGE_PART))
    placeholders = chat.placeholder_messages(chat.parse_messages(messages(AUDIO_PART, IMAGE_PART), qi.MEDIA_ACCEPT))
    ids2, _, media2 = qo.prepare_multimodal_request(thinker, None, json.dumps(placeholders), None, 32, 1024, True,
                                                    proc, media)
    assert ids2 == ids and media2 is media
    with pytest.raises(chat.ChatInputError, match="no media tensors"):
        qo.prepare_multimodal_request(thinker, None, json.dumps(placeholders), None, 32, 1024, True, proc, None)
    with pytest.raises(chat.ChatInputError, match="placeholders"):
        one = json.dumps([{"role": "user", "content": [{"type": "audio"}]}])
        qo.prepare_multimodal_request(thinker, None, one, None, 32, 1024, True, proc, media)
    with pytest.raises(chat.ChatInputError, match="media tensors need MESSAGES"):
        qo.prepare_multimodal_request(thinker, "hi", None, None, 32, 1024, False, proc, media)
    # text-only messages through the multimodal path: the same ids as before
    text = json.dumps([{"role": "user", "content": "Hello"}])
    assert qo.prepare_multimodal_request(thinker, None, text, None, 32, 1024, True, proc)[0] == \
        qo.prepare_thinker_request(thinker, None, text, None, 32, 1024, True)[0]


def test_bad_parts_are_input_errors(stages):
    thinker, _, _, proc = stages
    small = qi.OmniProcessor(proc.feature_extractor, proc.image_processor, limits=MediaLimits(max_image_pixels=64 * 64))
    cases = [
        (messages({"type": "input_audio", "input_audio": {"data": "%%%not base64", "format": "wav"}}), proc, "base64"),
        (messages({"type": "input_audio", "input_audio": {"data": png_url().split(",", 1)[1], "format": "wav"}}),
         proc, "not (a decodable audio|an audio) file"),
        (messages({"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}), proc,
         "not a decodable image"),
        (messages({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}), proc, "data URLs"),
        (messages(IMAGE_PART), small, "over the limit"),
        (messages({"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + wav_b64()}}), proc,
         "not a video file"),
    ]
    for msgs, p, match in cases:
        with pytest.raises(InputError, match=match):  # ChatInputError or MediaInputError: INVALID_ARG, 400
            qo.prepare_multimodal_request(thinker, None, msgs, None, 32, 1024, True, p)
    assert issubclass(MediaInputError, InputError)


def test_video_patchify_matches_the_image_processor_layout(stages):
    """``patchify_video`` (the torchvision-free stand-in for ``Qwen2VLVideoProcessor.patchify``):
    two identical frames give exactly the image processor's patches of that frame (which repeats
    an image over the temporal axis), each patch vector is ordered (C, T, ph, pw), an odd frame
    count repeats the last frame, and ``unpatchify_image`` inverts the image layout."""
    ip = stages[3].image_processor
    p, m, t = ip.patch_size, ip.merge_size, ip.temporal_patch_size
    rng = np.random.default_rng(0)
    frame = rng.standard_normal((3, 64, 96)).astype(np.float32)
    image_patches, gh, gw = ip.patchify(frame, patch_size=p, merge_size=m, temporal_patch_size=t)
    video_patches, grid = qi.patchify_video(np.stack([frame, frame]), p, m, t)
    assert grid == (1, gh, gw) and np.array_equal(video_patches, image_patches)
    np.testing.assert_array_equal(qi.unpatchify_image(np.asarray(image_patches), 64, 96, p, m, t), frame)
    frames = np.stack([np.full((3, 64, 96), 10 * k, np.float32) + np.arange(3)[:, None, None] for k in range(3)])
    patches, grid = qi.patchify_video(frames, p, m, t)
    assert grid == (2, 4, 6) and patches.shape == (2 * 4 * 6, 3 * t * p * p)
    first = patches[0].reshape(3, t, p, p)[:, :, 0, 0]  # channel c of frame k = 10k + c
    np.testing.assert_array_equal(first, [[0, 10], [1, 11], [2, 12]])
    last = patches[-1].reshape(3, t, p, p)[:, :, 0, 0]  # frames 2 and 2 (repeated)
    np.testing.assert_array_equal(last, [[20, 20], [21, 21], [22, 22]])


def test_audio_and_image_in_one_prompt_speak_like_the_fixed_reference(stages, omni_dir):
    """An audio part and an image part together: the reference's talker fails on its own config
    (no ``audio_config``, transformers 5.19); with the thinker's audio_config given to it
    (``give_talker_the_audio_config``, what ``OmniTalker`` does) the reference speaks, and the
    pipeline's text and audio equal it."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    thinker, talker, decoder, _ = stages
    ids, sampling, media = _prepare(stages, messages(AUDIO_PART, IMAGE_PART))
    assert media.counts == {"audio": 1, "image": 1, "video": 0}
    res = qo.run_pipeline(thinker, talker, decoder, ids, sampling, "Ethan", TALKER, media=media)
    reference = Qwen3OmniMoeForConditionalGeneration.from_pretrained(omni_dir).eval()
    with pytest.raises(AttributeError, match="audio_config"):
        _reference(reference, thinker, ids, media)
    from omni_triton.stages.qwen3_omni.talker import give_talker_the_audio_config

    give_talker_the_audio_config(reference)
    text, wav = _reference(reference, thinker, ids, media)
    assert res.text == text and res.audio.size > 0
    np.testing.assert_array_equal(decoder.decode([res.codes])[0], wav)


MONO_AUDIO_PART = {"type": "input_audio", "input_audio": {"data": wav_b64(channels=1, freq=330.0), "format": "wav"}}


@pytest.mark.parametrize("part", [MONO_AUDIO_PART, IMAGE_PART], ids=["audio", "image"])
def test_served_processor_inputs_equal_transformers_processor(stages, omni_dir, part):
    """The served path's prompt ids and media tensors (the project's decoding, chat template,
    placeholder expansion and processor parts: what ``qwen3_omni`` hands ``qwen3_omni_thinker``)
    equal what transformers' ``Qwen3OmniMoeProcessor`` makes of the same OpenAI turn
    (tests/helpers/qwen3_omni_reference.py). The generate parity (here and in
    tests/e2e/test_omni_media.py) cannot see every preprocessing fault: the tiny checkpoint's audio
    tower answers noise, silence and a sine alike (its output moves by ~5e-6), so only this
    tensor comparison catches, e.g., shifted or dropped audio samples."""
    from tests.helpers.qwen3_omni_reference import transformers_inputs, transformers_processor

    msgs = json.loads(messages(part))
    ids, _, media = _prepare(stages, json.dumps(msgs))
    ref = transformers_inputs(transformers_processor(omni_dir), msgs)
    assert ids == ref["input_ids"][0].tolist()
    if part is MONO_AUDIO_PART:
        np.testing.assert_array_equal(media.feature_attention_mask, ref["feature_attention_mask"].numpy())
        np.testing.assert_allclose(media.input_features, ref["input_features"].numpy(), rtol=0, atol=1e-5)
        assert media.pixel_values is None
    else:
        np.testing.assert_array_equal(media.image_grid_thw, ref["image_grid_thw"].numpy())
        np.testing.assert_allclose(media.pixel_values, ref["pixel_values"].numpy(), rtol=0, atol=1e-5)
        assert media.input_features is None

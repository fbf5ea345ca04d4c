"""The diffusion role bases (``omni_triton/adapters/diffusion_stages.py``) and the family
differences the Qwen-Image and Wan adapters keep. No Triton (``fake_pb_utils``) and no model: the
family's stage module is a stand-in that records what the base hands it."""
import sys
import types

import numpy as np
import pytest

from tests.unit import fake_pb_utils as pb

sys.modules.setdefault("triton_python_backend_utils", pb)

from omni_triton.adapters import diffusion_stages as ds  # noqa: E402
from omni_triton.adapters import qwen_image, wan  # noqa: E402
from omni_triton.contracts import qwen_image as im  # noqa: E402
from omni_triton.contracts import wan as vc  # noqa: E402

DIM = 3


def _embed(text: str) -> np.ndarray:
    """A recognisable ``[len(text) + 1, DIM]`` embedding of ``text``."""
    return np.full((len(text) + 1, DIM), float(sum(map(ord, text))), np.float32)


def _request(inputs: dict) -> pb.FakeRequest:
    return pb.FakeRequest({k: np.array([[v.encode()]], dtype=object) for k, v in inputs.items()})


def _qwen_encoder():
    calls = []
    stage = qwen_image.QwenImageTextEncoder.__new__(qwen_image.QwenImageTextEncoder)
    stage.edit, stage.pipe = False, None
    stage.d = types.SimpleNamespace(encode_prompts=lambda pipe, texts, images: calls.append(texts) or [
        _embed(t) for t in texts])
    return stage, calls


def _wan_encoder():
    calls = []
    stage = wan.WanTextEncoder.__new__(wan.WanTextEncoder)
    stage.pipe = None
    stage.d = types.SimpleNamespace(encode_prompts=lambda pipe, texts: calls.append(texts) or [
        _embed(t) for t in texts])
    return stage, calls


def test_family_classes_sit_on_the_role_bases():
    assert issubclass(qwen_image.QwenImageTextEncoder, ds.DiffusionTextEncoder)
    assert issubclass(wan.WanTextEncoder, ds.DiffusionTextEncoder)
    assert issubclass(qwen_image.QwenImageDenoiser, ds.DiffusionDenoiser)
    assert issubclass(wan.WanDenoiser, ds.DiffusionDenoiser) and issubclass(wan.WanI2VDenoiser, wan.WanDenoiser)
    from omni_triton.adapters.batched_stream import BatchedDecoupledStage

    assert issubclass(wan.WanDenoiser, BatchedDecoupledStage)  # STEP progress per request
    assert issubclass(qwen_image.QwenImageVaeEncoder, ds.DiffusionVaeEncoder)
    assert issubclass(wan.WanVaeEncoder, ds.DiffusionVaeEncoder)
    assert issubclass(qwen_image.QwenImageVaeDecoder, ds.DiffusionVaeDecoder)
    assert issubclass(wan.WanVaeDecoder, ds.DiffusionVaeDecoder)


@pytest.mark.parametrize("make, c", [(_qwen_encoder, im), (_wan_encoder, vc)], ids=["qwen_image", "wan"])
def test_one_encode_per_batch_and_each_request_gets_its_own_embeddings(make, c):
    stage, calls = make()
    items = [stage.parse(_request(r)) for r in (
        {c.PROMPT: "a cat", c.NEGATIVE_PROMPT: "blurry"}, {c.PROMPT: "a dog"},
        {c.PROMPT: "an owl", c.NEGATIVE_PROMPT: "dark!"})]
    results = stage.run(items)
    assert calls == [["a cat", "blurry", "a dog", "an owl", "dark!"]]  # one call, request order
    wanted = [("a cat", "blurry"), ("a dog", None), ("an owl", "dark!")]
    for (prompt, negative), result in zip(wanted, results, strict=True):
        out = stage.outputs(result)
        np.testing.assert_array_equal(out[c.PROMPT_EMBEDS], _embed(prompt)[None])
        want = _embed(negative)[None] if negative else np.zeros((1, 0, DIM), np.float32)
        np.testing.assert_array_equal(out[c.NEGATIVE_PROMPT_EMBEDS], want)
        assert out[c.NEGATIVE_PROMPT_EMBEDS].dtype == np.float32


def test_an_empty_negative_prompt_is_none_for_qwen_image_and_encoded_for_wan():
    qwen, qwen_calls = _qwen_encoder()
    out = qwen.outputs(qwen.run([qwen.parse(_request({im.PROMPT: "a cat", im.NEGATIVE_PROMPT: ""}))])[0])
    assert qwen_calls == [["a cat"]] and out[im.NEGATIVE_PROMPT_EMBEDS].shape == (1, 0, DIM)
    video, wan_calls = _wan_encoder()
    out = video.outputs(video.run([video.parse(_request({vc.PROMPT: "a cat", vc.NEGATIVE_PROMPT: ""}))])[0])
    assert wan_calls == [["a cat", ""]] and out[vc.NEGATIVE_PROMPT_EMBEDS].shape == (1, 1, DIM)


@pytest.mark.parametrize("make, c, error", [(_qwen_encoder, im, im.ImageInputError),
                                            (_wan_encoder, vc, vc.VideoInputError)], ids=["qwen_image", "wan"])
def test_a_missing_or_blank_prompt_is_the_family_input_error(make, c, error):
    stage, _ = make()
    with pytest.raises(error, match=f"missing input {c.PROMPT}"):
        stage.parse(_request({c.NEGATIVE_PROMPT: "x"}))
    with pytest.raises(error, match="PROMPT is empty"):
        stage.parse(_request({c.PROMPT: "  "}))


@pytest.mark.parametrize("cls, c", [(qwen_image.QwenImageDenoiser, im), (wan.WanDenoiser, vc)],
                         ids=["qwen_image", "wan"])
def test_denoiser_final_outputs(cls, c):
    stage = cls.__new__(cls)
    latents = np.ones((4, 2), np.float32)
    out = stage.final_outputs(latents, 7, 1.5)
    assert out[c.LATENTS].shape == (1, 4, 2) and out[c.LATENTS].dtype == np.float32
    assert out[c.NUM_STEPS].dtype == np.int32 and out[c.NUM_STEPS].tolist() == [[7]]
    assert out[c.DENOISE_SECONDS].dtype == np.float32 and out[c.DENOISE_SECONDS].tolist() == [[1.5]]

"""The Stable Audio adapters (``omni_triton/adapters/stable_audio.py``) without Triton
(``fake_pb_utils``): the text encoder's prompt / negative slots, the denoiser's input checks, the
VAE decoder's latents check, the config limits defaulting to the checkpoint's. The stage module is
the real one; the pipeline a stand-in where no model is needed."""
import sys
import types

import numpy as np
import pytest

from tests.unit import fake_pb_utils as pb

sys.modules.setdefault("triton_python_backend_utils", pb)

from omni_triton.adapters import stable_audio as adapter  # noqa: E402
from omni_triton.contracts import stable_audio as ac  # noqa: E402

L, D = 6, 4


def _request(**inputs) -> pb.FakeRequest:
    def arr(v):
        if isinstance(v, str):
            return np.array([[v.encode()]], dtype=object)
        return np.asarray(v)[None]
    return pb.FakeRequest({k: arr(v) for k, v in inputs.items()})


def _scalars(**kw):
    base = dict(AUDIO_START_S=np.array([0.0]), AUDIO_END_S=np.array([1.0]), NUM_INFERENCE_STEPS=np.array([4], np.int32),
                GUIDANCE_SCALE=np.array([7.0], np.float32), SEED=np.array([3], np.int64))
    base.update(kw)
    return base


def test_text_encoder_slots_prompts_and_negatives():
    stage = adapter.StableAudioTextEncoder.__new__(adapter.StableAudioTextEncoder)
    seen = []

    def encode(pipe, texts, negative):
        seen.append((list(texts), list(negative)))
        return [(np.full((L, D), len(t), np.float32), np.ones(L, np.int64)) for t in texts]

    stage.pipe, stage.d = None, types.SimpleNamespace(encode_prompts=encode)
    results = stage.run([("rain", "hiss"), ("wind", None)])
    assert seen == [(["rain", "hiss", "wind"], [False, True, False])]
    out = stage.outputs(results[0])
    assert out[ac.PROMPT_EMBEDS].shape == (1, L, D) and out[ac.PROMPT_EMBEDS][0, 0, 0] == 4
    assert out[ac.NEGATIVE_PROMPT_EMBEDS][0, 0, 0] == 4 and out[ac.NEGATIVE_ATTENTION_MASK].shape == (1, L)
    out = stage.outputs(results[1])  # no negative prompt: [1, 0, D] / [1, 0]
    assert out[ac.NEGATIVE_PROMPT_EMBEDS].shape == (1, 0, D) and out[ac.NEGATIVE_ATTENTION_MASK].shape == (1, 0)


def _denoiser():
    from omni_triton.stages import stable_audio

    stage = adapter.StableAudioDenoiser.__new__(adapter.StableAudioDenoiser)
    stage.d, stage.limits = stable_audio, ac.AudioLimits(max_seconds=4.0, min_value=0.0, max_value=8.0, max_steps=20)
    return stage


def test_denoiser_parses_one_request():
    emb, mask = np.ones((L, D), np.float32), np.ones(L, np.int64)
    item = _denoiser().parse(_request(PROMPT_EMBEDS=emb, ATTENTION_MASK=mask, NEGATIVE_PROMPT_EMBEDS=emb,
                                      NEGATIVE_ATTENTION_MASK=mask, **_scalars()))
    assert item.has_negative and (item.audio_end_s, item.steps, item.seed, item.guidance_scale) == (1.0, 4, 3, 7.0)
    item = _denoiser().parse(_request(PROMPT_EMBEDS=emb, ATTENTION_MASK=mask,
                                      NEGATIVE_PROMPT_EMBEDS=np.zeros((0, D), np.float32),
                                      NEGATIVE_ATTENTION_MASK=np.zeros(0, np.int64), **_scalars()))
    assert not item.has_negative


@pytest.mark.parametrize("change, match", [
    (dict(ATTENTION_MASK=np.ones(L - 1, np.int64)), "ATTENTION_MASK"),
    (dict(NEGATIVE_PROMPT_EMBEDS=np.ones((L + 1, D), np.float32), NEGATIVE_ATTENTION_MASK=np.ones(L + 1, np.int64)),
     "must match"),
    (dict(AUDIO_END_S=np.array([5.0])), "at most 4"),
    (dict(NUM_INFERENCE_STEPS=np.array([21], np.int32)), "num_inference_steps"),
])
def test_denoiser_refuses_bad_inputs(change, match):
    inputs = dict(PROMPT_EMBEDS=np.ones((L, D), np.float32), ATTENTION_MASK=np.ones(L, np.int64), **_scalars())
    inputs.update(change)
    with pytest.raises(ac.AudioGenerateInputError, match=match):
        _denoiser().parse(_request(**inputs))


def test_bls_parses_and_checks_before_any_stage_call():
    stage = adapter.StableAudioPipeline.__new__(adapter.StableAudioPipeline)
    stage.limits = ac.AudioLimits(max_seconds=4.0, min_value=0.0, max_value=8.0, max_steps=20)
    job = stage.parse(_request(PROMPT="rain", NEGATIVE_PROMPT="hiss", **_scalars()))
    assert (job.prompt, job.negative, job.scalars["audio_end_s"]) == ("rain", "hiss", 1.0)
    for bad, match in ((dict(PROMPT="  "), "empty"), (dict(PROMPT="x", AUDIO_END_S=np.array([0.0])), "greater")):
        with pytest.raises(ac.AudioGenerateInputError, match=match):
            stage.parse(_request(**{**_scalars(), **bad}))


def test_stage_limits_default_to_the_checkpoint_and_refuse_more():
    from omni_triton.stages import stable_audio

    stage = adapter.StableAudioVaeDecoder.__new__(adapter.StableAudioVaeDecoder)
    config = types.SimpleNamespace
    stage.d = stable_audio
    stage.pipe = types.SimpleNamespace(
        vae=types.SimpleNamespace(config=config(sampling_rate=16000, audio_channels=2), hop_length=256),
        transformer=types.SimpleNamespace(config=config(sample_size=256)),
        projection_model=types.SimpleNamespace(config=config(min_value=0, max_value=8)),
        tokenizer=types.SimpleNamespace(model_max_length=64))
    assert stage.stage_limits({}).max_seconds == pytest.approx(4.096)
    assert stage.stage_limits({"max_seconds": "2"}).max_seconds == 2.0
    with pytest.raises(ValueError, match="max_seconds"):
        stage.stage_limits({"max_seconds": "47.55"})


def test_text_encoder_refuses_too_many_tokens_as_invalid_input():
    """The refusal carries ``invalid input: `` (2.51 delivers a BLS callee's INVALID_ARG as INTERNAL;
    the BLS's ``StageError.invalid`` reads the prefix) so the client gets a 400."""
    from omni_triton.contracts.tensors import INVALID_INPUT_PREFIX
    from omni_triton.stages import stable_audio

    class Tokenizer:
        model_max_length = 4

        def __call__(self, text):
            return types.SimpleNamespace(input_ids=text.split() + ["</s>"])

    stage = adapter.StableAudioTextEncoder.__new__(adapter.StableAudioTextEncoder)
    stage.d, stage.pipe, stage.input_error = stable_audio, types.SimpleNamespace(tokenizer=Tokenizer()), \
        ac.AudioGenerateInputError
    assert stage.parse(_request(PROMPT="a b c", NEGATIVE_PROMPT="d")) == ("a b c", "d")
    with pytest.raises(ac.AudioGenerateInputError, match=f"^{INVALID_INPUT_PREFIX}.*NEGATIVE_PROMPT has 6 tokens"):
        stage.parse(_request(PROMPT="a", NEGATIVE_PROMPT="a b c d e"))

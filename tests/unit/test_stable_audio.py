"""Stable Audio Open stages (tiny random StableAudioPipeline), no Triton.

Parity: the stage split (T5 encode -> denoise -> Oobleck decode) run in-process for one request
equals ``StableAudioPipeline.__call__`` bit for bit (float waveform), with and without a negative
prompt, with CFG off, with a start offset. Inside a batch each item keeps its own generator (its
initial noise and its own Brownian tree for the SDE noise), so a batched item differs from the
same item alone only by the batched GEMMs' float rounding (measured: <= 6e-6 absolute on latents
of magnitude ~4, <= 6e-7 on the waveform).
"""
from __future__ import annotations

import io
import json
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("torchsde")
torch.set_num_threads(1)

from omni_triton.checkpoints import stable_audio as cs  # noqa: E402
from omni_triton.contracts import stable_audio as ac  # noqa: E402
from omni_triton.stages import stable_audio as sa  # noqa: E402
from omni_triton.stages.stable_audio.reference import staged_item  # noqa: E402

LATENT_ATOL = 1e-4  # batched vs single GEMM summation order (measured 6e-6)
AUDIO_ATOL = 1e-5  # the same on the waveform (measured 6e-7)
PROMPT = "A dog barking in the distance"


@pytest.fixture(autouse=True)
def _quiet_torchsde():
    with warnings.catch_warnings():  # torchsde warns that the first/last sigma lies a float ulp outside its tree
        warnings.filterwarnings("ignore", message="Should have", category=UserWarning)
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return cs.build_tiny_stable_audio(tmp_path_factory.mktemp("sa") / cs.NAME)


@pytest.fixture(scope="module")
def pipe(model_dir):
    return sa.load_pipeline(model_dir)


def test_builder_writes_a_stable_audio_folder(model_dir, pipe):
    from diffusers import (
        AutoencoderOobleck,
        CosineDPMSolverMultistepScheduler,
        StableAudioDiTModel,
        StableAudioPipeline,
    )

    assert type(pipe) is StableAudioPipeline
    assert isinstance(pipe.transformer, StableAudioDiTModel) and isinstance(pipe.vae, AutoencoderOobleck)
    assert isinstance(pipe.scheduler, CosineDPMSolverMultistepScheduler)
    assert json.loads((model_dir / "manifest.json").read_text())["pipeline"] == "StableAudioPipeline"
    size = sum(p.stat().st_size for p in model_dir.rglob("*") if p.is_file())
    assert size < 5 * 2**20, size
    mtime = (model_dir / "manifest.json").stat().st_mtime_ns
    cs.build_tiny_stable_audio(model_dir)  # idempotent
    assert (model_dir / "manifest.json").stat().st_mtime_ns == mtime


def test_limits_come_from_the_checkpoint_configs(pipe):
    lim = sa.limits(pipe)
    spec = cs.TinyStableAudioSpec()
    assert lim.max_seconds == pytest.approx(spec.sample_size * 256 / spec.sampling_rate) == pytest.approx(4.096)
    assert (lim.min_value, lim.max_value, lim.sample_rate, lim.channels, lim.max_tokens) == (0.0, 8.0, 16000, 2, 64)
    sa.check_config_limits(pipe, 4.096, 0.0, 8.0)
    with pytest.raises(ValueError, match="max_seconds"):
        sa.check_config_limits(pipe, 47.55, 0.0, 8.0)  # the served config may not promise more
    with pytest.raises(ValueError, match="seconds range"):
        sa.check_config_limits(pipe, 4.0, 0.0, 512.0)


@pytest.mark.parametrize("kw", [
    dict(negative_prompt="low quality, noisy"),
    dict(),  # CFG with the pipeline's zero unconditional embeddings
    dict(guidance_scale=1.0, negative_prompt="ignored without CFG"),
    dict(audio_start_s=0.5, audio_end_s=1.7, negative_prompt="hiss"),
], ids=["negative", "no-negative", "no-cfg", "start-offset"])
def test_staged_equals_the_pipeline_bit_for_bit(pipe, kw):
    args = dict(audio_end_s=2.3, steps=5, seed=11, guidance_scale=7.0)
    args.update(kw)
    ref = sa.reference_audio(pipe, PROMPT, **args)
    got = sa.staged_audio(pipe, PROMPT, **args)
    sr = pipe.vae.config.sampling_rate
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert got.shape == (2, int(args["audio_end_s"] * sr) - int(args.get("audio_start_s", 0.0) * sr))
    assert np.array_equal(got, ref)
    assert np.abs(got).max() > 1e-3  # audible noise, not silence


@pytest.mark.parametrize("wrong", ["seconds", "negative"])
def test_parity_can_fail(pipe, wrong):
    """The red: a stage wired wrong (the seconds conditioning dropped, or the negative prompt
    not sent) changes the waveform, and the comparison sees it."""
    args = dict(audio_end_s=2.0, steps=4, seed=3, negative_prompt="low quality")
    ref = sa.reference_audio(pipe, PROMPT, **args)
    item = staged_item(pipe, PROMPT, **args)
    if wrong == "seconds":
        item.audio_end_s = 4.0  # the denoiser conditioned on the model's default span
    else:
        item.negative_prompt_embeds = item.negative_attention_mask = None
    lat = sa.denoise(pipe, [item])[0].latents
    got = sa.vae_decode(pipe, [lat], [(0.0, 2.0)])[0]
    assert got.shape == ref.shape and not np.allclose(got, ref, atol=AUDIO_ATOL)


def test_batched_items_keep_their_own_noise(pipe):
    items = [staged_item(pipe, p, audio_end_s=2.0, steps=5, seed=s, negative_prompt="noise")
             for p, s in ((PROMPT, 1), ("Rain on a tin roof", 2), ("Birds at dawn", 3))]
    batched = sa.denoise(pipe, items)
    assert len({id(r) for r in batched}) == 3 and all(r.steps == 5 and not r.interrupted for r in batched)
    for item, r in zip(items, batched, strict=True):
        alone = sa.denoise(pipe, [item])[0].latents
        assert np.abs(alone - r.latents).max() < LATENT_ATOL
        a, b = sa.vae_decode(pipe, [alone, r.latents], [(0.0, 2.0)] * 2)
        assert np.abs(a - b).max() < AUDIO_ATOL
    assert not np.allclose(batched[0].latents, batched[1].latents)  # different seeds, different clips


def test_incompatible_items_run_in_separate_calls(pipe):
    a = staged_item(pipe, PROMPT, audio_end_s=2.0, steps=3, seed=1, negative_prompt="noise")
    b = staged_item(pipe, PROMPT, audio_end_s=1.0, steps=3, seed=1)
    assert sa.denoise_key(a) != sa.denoise_key(b)
    calls = []
    res = sa.denoise(pipe, [a, b], lambda idx, step, total: calls.append((tuple(idx), step)) and False)
    assert [c for c in calls if c[1] == 1] == [((0,), 1), ((1,), 1)]
    assert all(r.latents is not None for r in res)


def test_progress_per_step_and_stop_at_a_step_boundary(pipe):
    item = staged_item(pipe, PROMPT, audio_end_s=1.0, steps=6, seed=4)
    seen = []
    r = sa.denoise(pipe, [item], lambda idx, step, total: seen.append((step, total)) or False)[0]
    assert seen == [(s, 6) for s in range(1, 7)] and r.steps == 6 and not r.interrupted
    seen.clear()
    r = sa.denoise(pipe, [item], lambda idx, step, total: seen.append(step) or step == 2)[0]
    assert seen == [1, 2] and r.interrupted and r.steps == 2 and r.latents is None
    # the pipeline is usable afterwards (set_timesteps resets the scheduler) and still exact
    again = sa.denoise(pipe, [item])[0].latents
    ref = sa.denoise(pipe, [item])[0].latents
    assert np.array_equal(again, ref)


def test_prompt_token_limit(pipe):
    assert sa.check_prompt_tokens(pipe, PROMPT) < 64
    with pytest.raises(ac.AudioGenerateInputError, match="at most 64"):
        sa.check_prompt_tokens(pipe, "dog " * 200)


def test_contract_limits():
    lim = ac.AudioLimits(max_seconds=4.096, min_value=0.0, max_value=8.0, max_steps=50)
    lim.check(0.0, 4.096, 2, 7.0)
    lim.check(3.0, 7.0)
    for args, match in [((0.0, 5.0), "at most 4.096"), ((2.0, 1.0), "greater than"), ((-1.0, 1.0), "audio_start"),
                        ((0.0, 9.0), "audio_end"), ((0.0, float("nan")), "audio_end"), ((0.0, 1.0, 1), "steps"),
                        ((0.0, 1.0, 51), "steps"), ((0.0, 1.0, 4, 101.0), "guidance")]:
        with pytest.raises(ac.AudioGenerateInputError, match=match):
            lim.check(*args)


def test_wav_and_flac_round_trip_the_waveform_exactly(pipe):
    """The frontend's encoding (stereo, 16-bit, libsndfile) keeps every sample: decoded WAV / FLAC
    equal the PCM16 quantisation of the float waveform."""
    import soundfile as sf

    from omni_triton.media.audio import float_to_pcm16, get_format
    from openai_frontend.serving.audio_generate import encode_clip

    audio = sa.staged_audio(pipe, PROMPT, audio_end_s=1.5, steps=3, seed=2)
    want = np.frombuffer(float_to_pcm16(audio.T), "<i2").reshape(-1, 2)
    for name in ("wav", "flac"):
        data = encode_clip(audio, 16000, get_format(name))
        got, sr = sf.read(io.BytesIO(data), dtype="int16")
        assert sr == 16000 and got.shape == (audio.shape[1], 2) and np.array_equal(got, want), name


def test_mp3_decodes_with_pyav(pipe):
    av = pytest.importorskip("av")
    from omni_triton.media.audio import SUPPORTED_FORMATS, get_format
    from openai_frontend.serving.audio_generate import encode_clip

    if "mp3" not in SUPPORTED_FORMATS:
        pytest.skip("libsndfile without MP3")
    audio = sa.staged_audio(pipe, PROMPT, audio_end_s=1.0, steps=3, seed=2)
    data = encode_clip(audio, 16000, get_format("mp3"))
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name.startswith("mp3") and stream.rate == 16000 and stream.channels == 2
        samples = sum(frame.samples for frame in container.decode(stream))
    assert abs(samples - audio.shape[1]) < 2000  # the encoder's padding

"""Wan2.2 image-to-video stages (tiny random WanImageToVideoPipeline, A14B form), no Triton.

Parity: the ``wan_i2v`` split (T2V text encoder -> VAE encode of the reference frame -> I2V
denoiser -> T2V VAE decoder) run in-process for one request equals
``WanImageToVideoPipeline.__call__(image=...)`` bit for bit. Inside a batch each item keeps its
own seed and its own condition; the batched DiT GEMMs sum in a different order than single ones,
so batched latents are compared with the T2V tolerance (``test_wan.py``).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
torch.set_num_threads(1)

from omni_triton.checkpoints import wan as cw  # noqa: E402
from omni_triton.contracts import wan as vc  # noqa: E402
from omni_triton.stages import wan  # noqa: E402

LATENT_ATOL = 1e-4  # batched vs single GEMM summation order (as text-to-video)
FRAME_ATOL = 2  # uint8 levels, same reason
KW = dict(height=32, width=48, num_frames=5, steps=3, negative_prompt="blurry", guidance_scale=4.0)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("wan")
    t2v = cw.build_tiny_wan(root / "wan2.2-t2v-tiny", cw.KIND_T2V)
    return t2v, cw.build_tiny_wan(root / "wan2.2-i2v-tiny", cw.KIND_I2V, shared=t2v)


@pytest.fixture(scope="module")
def pipes(dirs):
    return wan.load_pipeline(dirs[0]), wan.load_pipeline(dirs[1])


def _image(seed: int, width: int = 48, height: int = 32):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


def test_builder_writes_the_wan22_i2v_form(dirs, pipes):
    from diffusers import WanImageToVideoPipeline

    _, i2v_dir = dirs
    t2v, i2v = pipes
    assert type(i2v) is WanImageToVideoPipeline and wan.is_i2v(i2v) and not wan.is_i2v(t2v)
    index = json.loads((i2v_dir / "model_index.json").read_text())
    assert index["image_encoder"] == [None, None] and index["transformer_2"] == ["diffusers", "WanTransformer3DModel"]
    assert i2v.config.boundary_ratio == cw.TinyWanSpec().boundary_ratio_i2v and not i2v.config.expand_timesteps
    z = i2v.vae.config.z_dim
    assert i2v.transformer.config.in_channels == 2 * z + 4 and i2v.transformer.config.image_dim is None
    assert sum(p.stat().st_size for p in i2v_dir.rglob("*") if p.is_file()) < 10 * 2**20


def test_i2v_shares_the_t2v_text_encoder_and_vae(dirs, pipes):
    """Why wan_i2v may reuse wan_t2v_text_encoder and wan_t2v_vae_decoder."""
    t2v_dir, i2v_dir = dirs
    for part in ("text_encoder/model.safetensors", "vae/diffusion_pytorch_model.safetensors"):
        assert (t2v_dir / part).read_bytes() == (i2v_dir / part).read_bytes(), part
    t2v, i2v = pipes
    assert t2v.tokenizer.get_vocab() == i2v.tokenizer.get_vocab()
    for prompt in ("a cat walks on the grass", "blurry", "Überbelichtet, statisch 123"):
        assert t2v.tokenizer(prompt).input_ids == i2v.tokenizer(prompt).input_ids


@pytest.mark.parametrize("extra", [{}, dict(guidance_scale=1.0), dict(guidance_scale_2=2.0, boundary_ratio=0.5,
                                                                      flow_shift=6.0)],
                         ids=["cfg", "no-cfg", "two-expert-overrides"])
def test_staged_split_equals_the_pipeline_call(pipes, extra):
    t2v, i2v = pipes
    kw = {**KW, **extra}
    ref = wan.reference_i2v_frames(i2v, _image(1), "a cat walks on the grass", seed=7, **kw)
    got = wan.staged_i2v_frames(i2v, _image(1), "a cat walks on the grass", seed=7, t2v_pipe=t2v, **kw)
    assert ref.shape == (5, 32, 48, 3) and ref.dtype == np.uint8
    assert np.array_equal(ref, got)
    assert i2v.config.boundary_ratio == cw.TinyWanSpec().boundary_ratio_i2v
    # outside a denoise call the VAE encodes for real (the hook only answers inside one)
    video = torch.zeros(1, 3, 5, 32, 48)
    with torch.no_grad():
        assert torch.equal(i2v.vae.encode(video).latent_dist.mode(),
                           type(i2v.vae).encode(i2v.vae, video).latent_dist.mode())


def test_the_condition_drives_the_video(pipes):
    t2v, i2v = pipes
    a = wan.staged_i2v_frames(i2v, _image(1), "a cat", seed=3, t2v_pipe=t2v, **KW)
    b = wan.staged_i2v_frames(i2v, _image(2), "a cat", seed=3, t2v_pipe=t2v, **KW)
    assert not np.array_equal(a, b)


def _item(pipes, image, prompt, seed, **kw):
    t2v, i2v = pipes
    embeds, neg = wan.encode_prompts(t2v, [prompt, "blurry"])
    args = dict(height=32, width=48, num_frames=5, steps=3, guidance_scale=4.0)
    args.update(kw)
    cond = wan.vae_encode_condition(i2v, [image], args["num_frames"])[0]
    return wan.VideoDenoiseItem(embeds, seed=seed, negative_prompt_embeds=neg, condition=cond, **args)


def test_condition_latents_shape(pipes):
    _, i2v = pipes
    (c,) = wan.vae_encode_condition(i2v, [np.asarray(_image(1))], 9)
    assert c.shape == (16, 3, 4, 6) and c.dtype == np.float32


def test_each_seed_and_image_holds_inside_a_batch(pipes):
    t2v, i2v = pipes
    items = [_item(pipes, _image(1), "a cat walks", 1), _item(pipes, _image(2), "a red fox runs", 2)]
    alone = [wan.denoise(i2v, [i])[0].latents for i in items]
    calls = []
    batch = wan.denoise(i2v, items, lambda idx, s, t: calls.append(tuple(idx)) or False)
    assert calls == [(0, 1)] * 3  # one pipeline call for both
    for a, b in zip(alone, batch, strict=True):
        np.testing.assert_allclose(b.latents, a, atol=LATENT_ATOL, rtol=0)
    fa, fb = wan.vae_decode(t2v, alone), wan.vae_decode(t2v, [b.latents for b in batch])
    for a, b in zip(fa, fb, strict=True):
        assert np.abs(a.astype(int) - b).max() <= FRAME_ATOL
    assert not np.allclose(batch[0].latents, batch[1].latents)


def test_concurrent_calls_keep_their_own_conditions(pipes):
    """Two threads denoising on one pipeline: the calls are serialised (a diffusers pipeline
    keeps per-call state) and each call's VAE-encode hook answers with its own conditions."""
    import threading

    _, i2v = pipes
    items = [_item(pipes, _image(i), "a cat", i, steps=2) for i in (1, 2)]
    alone = [wan.denoise(i2v, [it])[0].latents for it in items]
    errors, got = [], {}

    def run(k):
        try:
            got[k] = wan.denoise(i2v, [items[k]])[0].latents
        except Exception as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for k in (0, 1):
        assert np.array_equal(got[k], alone[k])


def test_interrupt_stops_the_i2v_loop_at_the_next_step(pipes):
    _, i2v = pipes
    steps = []
    r = wan.denoise(i2v, [_item(pipes, _image(1), "a cat", 1, steps=5)], lambda idx, s, t: steps.append(s) or s >= 2)[0]
    assert steps == [1, 2] and r.steps == 2 and r.interrupted


def test_a_condition_of_the_wrong_size_is_refused(pipes):
    _, i2v = pipes
    item = _item(pipes, _image(1), "a cat", 1)
    item.num_frames = 9
    with pytest.raises(ValueError, match="condition latents"):
        wan.denoise(i2v, [item])


def test_the_input_image_must_match_the_request_size():
    vc.check_input_image(np.zeros((32, 48, 3), np.uint8), 32, 48)
    for bad in (np.zeros((48, 32, 3), np.uint8), np.zeros((32, 48, 4), np.uint8), np.zeros((32, 48, 3), np.float32)):
        with pytest.raises(vc.VideoInputError, match="INPUT_IMAGE"):
            vc.check_input_image(bad, 32, 48)

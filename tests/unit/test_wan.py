"""Wan2.2 video stages (tiny random WanPipeline, two-expert form), no Triton.

Parity: the stage split (encode -> denoise -> VAE decode) run in-process for one request equals
``WanPipeline.__call__`` bit for bit. Inside a batch an item's noise comes from its own seed; the
batched DiT GEMMs sum in a different order than single ones, so batched latents are compared
with a tolerance (measured: <= 3e-6 absolute on latents of magnitude ~1, at most 1 level of 255
on the frames).
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

LATENT_ATOL = 1e-4  # batched vs single GEMM summation order
FRAME_ATOL = 2  # uint8 levels, same reason
KW = dict(height=32, width=32, num_frames=5, steps=3, negative_prompt="blurry", guidance_scale=4.0)


@pytest.fixture(scope="module")
def t2v_dir(tmp_path_factory):
    return cw.build_tiny_wan(tmp_path_factory.mktemp("wan") / "wan2.2-t2v-tiny", cw.KIND_T2V)


@pytest.fixture(scope="module")
def pipe(t2v_dir):
    return wan.load_pipeline(t2v_dir)


def test_builder_writes_a_two_expert_wan22_folder(t2v_dir, pipe):
    from diffusers import WanPipeline, WanTransformer3DModel

    assert type(pipe) is WanPipeline
    assert isinstance(pipe.transformer, WanTransformer3DModel) and isinstance(pipe.transformer_2, WanTransformer3DModel)
    assert pipe.config.boundary_ratio == cw.TinyWanSpec().boundary_ratio_t2v
    index = json.loads((t2v_dir / "model_index.json").read_text())
    assert index["transformer_2"] == ["diffusers", "WanTransformer3DModel"]
    size = sum(p.stat().st_size for p in t2v_dir.rglob("*") if p.is_file())
    assert size < 10 * 2**20, size
    # the experts are different random weights
    w1 = next(pipe.transformer.parameters())
    w2 = next(pipe.transformer_2.parameters())
    assert not torch.equal(w1, w2)


def test_builder_is_idempotent_and_seeded(t2v_dir, tmp_path):
    manifest = (t2v_dir / "manifest.json").stat().st_mtime_ns
    cw.build_tiny_wan(t2v_dir, cw.KIND_T2V)
    assert (t2v_dir / "manifest.json").stat().st_mtime_ns == manifest
    other = cw.build_tiny_wan(tmp_path / "again", cw.KIND_T2V)
    a = (t2v_dir / "transformer_2" / "diffusion_pytorch_model.safetensors").read_bytes()
    b = (other / "transformer_2" / "diffusion_pytorch_model.safetensors").read_bytes()
    assert a == b


@pytest.mark.parametrize("extra", [{}, dict(guidance_scale_2=2.0, boundary_ratio=0.5, flow_shift=6.0)],
                         ids=["defaults", "two-expert-overrides"])
def test_staged_split_equals_the_pipeline_call(pipe, extra):
    ref = wan.reference_frames(pipe, "a cat walks on the grass", seed=7, **KW, **extra)
    got = wan.staged_frames(pipe, "a cat walks on the grass", seed=7, **KW, **extra)
    assert ref.shape == (5, 32, 32, 3) and ref.dtype == np.uint8
    assert np.array_equal(ref, got)
    # the pipeline's own config is restored after an override
    assert pipe.config.boundary_ratio == cw.TinyWanSpec().boundary_ratio_t2v
    assert pipe.scheduler.config.flow_shift == cw.TinyWanSpec().flow_shift


def test_overrides_change_the_video(pipe):
    a = wan.staged_frames(pipe, "a cat", seed=1, **KW)
    b = wan.staged_frames(pipe, "a cat", seed=1, **KW, boundary_ratio=0.0)  # high-noise expert only
    c = wan.staged_frames(pipe, "a cat", seed=1, **KW, flow_shift=9.0)
    assert not np.array_equal(a, b) and not np.array_equal(a, c)


def _item(pipe, prompt, seed, **kw):
    embeds, neg = wan.encode_prompts(pipe, [prompt, "blurry"])
    args = dict(height=32, width=32, num_frames=5, steps=3, guidance_scale=4.0)
    args.update(kw)
    return wan.VideoDenoiseItem(embeds, seed=seed, negative_prompt_embeds=neg, **args)


def test_each_seed_holds_inside_a_batch(pipe):
    items = [_item(pipe, "a cat walks", 1), _item(pipe, "a red fox runs through the snow", 2)]
    alone = [wan.denoise(pipe, [i])[0].latents for i in items]
    batch = wan.denoise(pipe, items)
    for a, b in zip(alone, batch, strict=True):
        np.testing.assert_allclose(b.latents, a, atol=LATENT_ATOL, rtol=0)
    fa, fb = wan.vae_decode(pipe, alone), wan.vae_decode(pipe, [b.latents for b in batch])
    for a, b in zip(fa, fb, strict=True):
        assert np.abs(a.astype(int) - b).max() <= FRAME_ATOL
    assert not np.allclose(batch[0].latents, batch[1].latents)


def test_incompatible_items_run_in_separate_calls(pipe):
    items = [_item(pipe, "a cat", 1), _item(pipe, "a cat", 1, steps=2)]
    calls = []
    results = wan.denoise(pipe, items, lambda idx, step, total: calls.append((tuple(idx), step, total)) or False)
    assert calls == [((0,), 1, 3), ((0,), 2, 3), ((0,), 3, 3), ((1,), 1, 2), ((1,), 2, 2)]
    assert [r.steps for r in results] == [3, 2]


def test_interrupt_stops_the_loop_at_the_next_step(pipe):
    forwards = []
    handles = [m.register_forward_hook(lambda *a: forwards.append(1)) for m in (pipe.transformer, pipe.transformer_2)]
    try:
        steps = []
        r = wan.denoise(pipe, [_item(pipe, "a cat", 1, steps=6)], lambda idx, s, t: steps.append(s) or s >= 2)[0]
    finally:
        for h in handles:
            h.remove()
    assert steps == [1, 2] and r.steps == 2 and r.interrupted
    assert len(forwards) == 2 * 2  # cond + uncond per step, two steps only
    full = wan.denoise(pipe, [_item(pipe, "a cat", 1, steps=6)], lambda idx, s, t: False)[0]
    assert full.steps == 6 and not full.interrupted


def test_embeddings_are_unpadded_and_repadded_exactly(pipe):
    (e,) = wan.encode_prompts(pipe, ["a cat walks"])
    with torch.no_grad():  # as __call__ runs it
        full = pipe._get_t5_prompt_embeds(prompt=["a cat walks"], max_sequence_length=512, device=torch.device("cpu"))
    assert e.shape[0] < 512 and e.dtype == np.float32
    assert torch.equal(wan.text_encoder.pad_embeds([e]), full)
    assert not full[0, e.shape[0]:].any()
    with pytest.raises(ValueError):
        wan.text_encoder.pad_embeds([np.zeros((513, e.shape[1]), np.float32)])


@pytest.mark.parametrize("bad", [dict(height=40), dict(width=8), dict(num_frames=8), dict(num_frames=85),
                                 dict(steps=1), dict(steps=51), dict(height=2048)])
def test_limits_refuse_what_the_pipeline_would_round(bad):
    args = dict(height=32, width=32, num_frames=9, steps=4)
    args.update(bad)
    with pytest.raises(vc.VideoInputError):
        vc.VideoLimits().check(**args)
    vc.VideoLimits().check(32, 32, 9, 4)


@pytest.mark.parametrize("bad", [dict(guidance_scale=-1), dict(guidance_scale=float("nan")),
                                 dict(guidance_scale_2=1e9), dict(boundary_ratio=1.5), dict(flow_shift=0.0)])
def test_scales_are_bounded(bad):
    args = dict(guidance_scale=4.0, guidance_scale_2=None, boundary_ratio=None, flow_shift=None)
    args.update(bad)
    with pytest.raises(vc.VideoInputError):
        vc.check_scales(**args)

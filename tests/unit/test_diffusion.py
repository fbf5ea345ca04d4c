"""Diffusion stages (tiny random Qwen-Image / Qwen-Image-Edit), no Triton.

Parity: the stage split (encode -> [VAE encode] -> denoise -> VAE decode) run in-process for one
request equals the diffusers pipeline's ``__call__`` bit for bit. Inside a batch an item's noise
comes from its own seed; batched DiT/attention GEMMs sum in a different order than single ones,
so batched latents are compared with a tolerance (measured: <= 5e-7 absolute on latents of
magnitude ~1, at most 1 level of 255 on the images).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
torch.set_num_threads(1)

from PIL import Image  # noqa: E402

from omni_triton.checkpoints import qwen_image as qi  # noqa: E402
from omni_triton.contracts.image import Limits  # noqa: E402
from omni_triton.stages import qwen_image as d  # noqa: E402

LATENT_ATOL = 1e-5  # batched vs single GEMM summation order
IMAGE_ATOL = 2  # uint8 levels, same reason


@pytest.fixture(scope="module")
def t2i_dir(tmp_path_factory):
    return qi.build_tiny_qwen_image(tmp_path_factory.mktemp("qi") / "qwen-image-tiny", qi.KIND_T2I)


@pytest.fixture(scope="module")
def edit_dir(tmp_path_factory):
    return qi.build_tiny_qwen_image(tmp_path_factory.mktemp("qie") / "qwen-image-edit-tiny", qi.KIND_EDIT)


@pytest.fixture(scope="module")
def pipe(t2i_dir):
    return d.load_pipeline(t2i_dir)


@pytest.fixture(scope="module")
def edit_pipe(edit_dir):
    return d.load_pipeline(edit_dir)


@pytest.fixture(scope="module")
def condition():
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (40, 56, 3), dtype=np.uint8), "RGB")


# ------------------------------------------------------------------ tiny build
def test_builder_writes_real_pipeline_folders(t2i_dir, edit_dir, pipe, edit_pipe):
    from diffusers import QwenImageEditPipeline, QwenImagePipeline

    assert type(pipe) is QwenImagePipeline and type(edit_pipe) is QwenImageEditPipeline
    index = json.loads((edit_dir / "model_index.json").read_text())
    assert index["processor"] == ["transformers", "Qwen2VLProcessor"]
    assert index["text_encoder"] == ["transformers", "Qwen2_5_VLForConditionalGeneration"]
    assert not d.is_edit_pipeline(pipe) and d.is_edit_pipeline(edit_pipe)
    assert d.size_multiple(pipe) == 16
    # the prompt templates' special tokens are single tokens
    for token in qi.SPECIAL_TOKENS:
        assert len(pipe.tokenizer(token).input_ids) == 1


def test_builder_idempotent(t2i_dir):
    before = {p: p.stat().st_mtime_ns for p in t2i_dir.rglob("*") if p.is_file()}
    assert qi.build_tiny_qwen_image(t2i_dir, qi.KIND_T2I) == t2i_dir
    assert before == {p: p.stat().st_mtime_ns for p in t2i_dir.rglob("*") if p.is_file()}
    spec = qi.TinyQwenImageSpec()
    assert spec.config_hash(0, qi.KIND_T2I) != spec.config_hash(1, qi.KIND_T2I)
    assert spec.config_hash(0, qi.KIND_T2I) != spec.config_hash(0, qi.KIND_EDIT)


def test_same_seed_same_weights(pipe, edit_pipe):
    a, b = pipe.transformer.state_dict(), edit_pipe.transformer.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------ parity with __call__
@pytest.mark.parametrize("kwargs", [
    dict(height=64, width=64, steps=2, seed=3),
    dict(height=32, width=48, steps=3, seed=11, negative_prompt="blurry", true_cfg_scale=3.0),
])
def test_stage_split_equals_pipeline_call(pipe, kwargs):
    ref = d.reference_images(pipe, "a red fox in the snow", **kwargs)
    got = d.staged_images(pipe, "a red fox in the snow", **kwargs)
    assert got.shape == (kwargs["height"], kwargs["width"], 3) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, ref)
    assert ref.std() > 1  # not a constant image


@pytest.mark.parametrize("kwargs", [
    dict(height=64, width=64, steps=2, seed=3),
    dict(height=32, width=32, steps=2, seed=5, negative_prompt=" ", true_cfg_scale=2.0),
])
def test_edit_stage_split_equals_pipeline_call(edit_pipe, condition, kwargs):
    ref = d.reference_images(edit_pipe, "make the sky purple", image=condition, **kwargs)
    got = d.staged_images(edit_pipe, "make the sky purple", image=condition, **kwargs)
    np.testing.assert_array_equal(got, ref)


def test_edit_depends_on_the_condition_image(edit_pipe, condition):
    other = Image.fromarray(255 - np.asarray(condition), "RGB")
    a = d.staged_images(edit_pipe, "make it blue", height=32, width=32, steps=2, seed=1, image=condition)
    b = d.staged_images(edit_pipe, "make it blue", height=32, width=32, steps=2, seed=1, image=other)
    assert not np.array_equal(a, b)


# ------------------------------------------------------------------ batching
def test_encode_batch_equals_single(pipe):
    prompts = ["a red fox", "a cat wearing a hat in the snow", "a blue sky", "a red cat"]
    batch = d.encode_prompts(pipe, prompts)
    for p, e in zip(prompts, batch, strict=True):
        single = d.encode_prompts(pipe, [p])[0]
        assert e.dtype == np.float32 and e.ndim == 2
        np.testing.assert_array_equal(e, single)  # grouped by length: never padded


def test_seed_per_item_inside_a_batch(pipe):
    prompts = ["a red fox", "a cat wearing a hat in the snow", "a blue sky", "a red fox"]
    embeds = d.encode_prompts(pipe, prompts)
    items = [d.DenoiseItem(e, 64, 64, 3, seed) for e, seed in zip(embeds, [1, 2, 3, 1], strict=True)]
    together = d.denoise(pipe, items)  # one pipeline call: same size/steps/CFG
    alone = [d.denoise(pipe, [it])[0] for it in items]
    for t, a in zip(together, alone, strict=True):
        assert t.steps == 3 and t.latents.shape == a.latents.shape == (16, 16)
        np.testing.assert_allclose(t.latents, a.latents, atol=LATENT_ATOL, rtol=0)
    # items 0 and 3: same prompt and seed at different batch positions -> same latents
    np.testing.assert_allclose(together[0].latents, together[3].latents, atol=LATENT_ATOL, rtol=0)
    # different seeds -> different noise
    assert np.abs(together[0].latents - together[2].latents).mean() > 0.1
    imgs_t = d.vae_decode(pipe, [t.latents for t in together], [(64, 64)] * 4)
    imgs_a = d.vae_decode(pipe, [a.latents for a in alone], [(64, 64)] * 4)
    for t, a in zip(imgs_t, imgs_a, strict=True):
        assert np.abs(t.astype(int) - a).max() <= IMAGE_ATOL


def test_edit_batch_seed_per_item(edit_pipe, condition):
    resized, _ = d.condition_image(edit_pipe, condition)
    embeds = d.encode_prompts(edit_pipe, ["make it purple", "add a rainbow please"], [resized, resized])
    latents = d.vae_encode(edit_pipe, [condition])[0]
    items = [d.DenoiseItem(e, 32, 32, 2, seed, image=condition, image_latents=latents)
             for e, seed in zip(embeds, (1, 2), strict=True)]
    together = d.denoise(edit_pipe, items)
    for t, item in zip(together, items, strict=True):
        alone = d.denoise(edit_pipe, [item])[0]
        np.testing.assert_allclose(t.latents, alone.latents, atol=LATENT_ATOL, rtol=0)


def test_incompatible_items_run_as_separate_groups(pipe):
    e = d.encode_prompts(pipe, ["a red fox"])[0]
    items = [d.DenoiseItem(e, 64, 64, 2, 1), d.DenoiseItem(e, 32, 48, 2, 1),
             d.DenoiseItem(e, 64, 64, 3, 1), d.DenoiseItem(e, 64, 64, 2, 2)]
    assert len({d.denoise_key(i) for i in items}) == 3  # items 0 and 3 share a call
    res = d.denoise(pipe, items)
    assert [r.latents.shape for r in res] == [(16, 16), (6, 16), (16, 16), (16, 16)]
    assert [r.steps for r in res] == [2, 2, 3, 2]
    images = d.vae_decode(pipe, [r.latents for r in res], [(64, 64), (32, 48), (64, 64), (64, 64)])
    assert [i.shape for i in images] == [(64, 64, 3), (32, 48, 3), (64, 64, 3), (64, 64, 3)]
    ref = d.reference_images(pipe, "a red fox", height=32, width=48, steps=2, seed=1)
    np.testing.assert_array_equal(images[1], ref)  # alone in its group: bit-exact


def test_a_batch_whose_clients_all_left_stops_at_the_next_step(pipe):
    """A started image batch stops once every one of its requests is cancelled (it used to run to
    its last step for clients that were gone); one live request keeps the call going."""
    e = d.encode_prompts(pipe, ["a red fox"])[0]
    forwards = []
    hook = pipe.transformer.register_forward_hook(lambda *a: forwards.append(1))
    polls = {"a": 0}

    def gone_after_two():
        polls["a"] += 1
        return polls["a"] >= 2

    try:
        items = [d.DenoiseItem(e, 32, 32, 6, 1, cancelled=gone_after_two),
                 d.DenoiseItem(e, 32, 32, 6, 2, cancelled=lambda: True)]
        results = d.denoise(pipe, items)
        assert [r.steps for r in results] == [2, 2] and all(r.interrupted for r in results)
        assert len(forwards) == 2  # one batched DiT forward per step, two steps
        forwards.clear()
        items = [d.DenoiseItem(e, 32, 32, 4, 1, cancelled=lambda: False),
                 d.DenoiseItem(e, 32, 32, 4, 2, cancelled=lambda: True)]
        results = d.denoise(pipe, items)
        assert [r.steps for r in results] == [4, 4] and not any(r.interrupted for r in results)
        assert len(forwards) == 4
    finally:
        hook.remove()


def test_cfg_changes_the_image(pipe):
    plain = d.staged_images(pipe, "a red fox", height=32, width=32, steps=2, seed=4)
    cfg = d.staged_images(pipe, "a red fox", height=32, width=32, steps=2, seed=4,
                          negative_prompt="blurry", true_cfg_scale=4.0)
    assert not np.array_equal(plain, cfg)


def test_progress_log(caplog, pipe):
    e = d.encode_prompts(pipe, ["a red fox"])[0]
    with caplog.at_level("DEBUG", logger="omni_triton.diffusion"):
        d.denoise(pipe, [d.DenoiseItem(e, 32, 32, 3, 1)], label="t", progress_interval_s=0.0)
    steps = [r.getMessage() for r in caplog.records if "step" in r.getMessage()]
    assert any("step 1/3" in m for m in steps) and any("step 3/3" in m for m in steps)


# ------------------------------------------------------------------ validation
def test_limits():
    limits = Limits(16, 256, 10)
    limits.check(64, 32, 2)
    for h, w, s in [(60, 64, 2), (64, 0, 2), (272, 64, 2), (64, 64, 0), (64, 64, 1), (64, 64, 11)]:
        with pytest.raises(ValueError):
            limits.check(h, w, s)


def test_image_from_array():
    img = d.image_from_array(np.zeros((5, 7, 3), np.uint8))
    assert img.size == (7, 5) and img.mode == "RGB"
    for bad in (np.zeros((5, 7), np.uint8), np.zeros((5, 7, 4), np.uint8), np.zeros((5, 7, 3), np.float32)):
        with pytest.raises(ValueError):
            d.image_from_array(bad)


@pytest.mark.parametrize("size", [(4096, 4), (2, 4096), (4096, 1)])
def test_check_condition_image_rejects_what_the_text_encoder_cannot_encode(edit_pipe, size):
    """These uploads made the edit text encoder raise inside the batched call (a 500 for every
    request batched with them); the per-item check rejects each one alone, and the same image
    does fail the pipeline's own encode, so the check is not stricter than needed."""
    image = Image.new("RGB", size)
    with pytest.raises(ValueError, match="aspect ratio"):
        d.check_condition_image(edit_pipe, image)
    with pytest.raises(ValueError):  # 4096x1 fails already while resizing (width 0)
        d.encode_prompts(edit_pipe, ["x"], [d.condition_image(edit_pipe, image)[0]])


def test_check_condition_image_accepts_what_the_frontend_lets_through(edit_pipe, condition):
    """The frontend lets through aspect ratios up to 100:1 (serving.images.MAX_CONDITION_ASPECT_RATIO)."""
    from openai_frontend.serving.images import MAX_CONDITION_ASPECT_RATIO

    for size in [condition.size, (MAX_CONDITION_ASPECT_RATIO, 1), (1, MAX_CONDITION_ASPECT_RATIO),
                 (837, 10), (1000, 11)]:
        d.check_condition_image(edit_pipe, Image.new("RGB", size))


@pytest.mark.parametrize("true_cfg, guidance", [
    (float("inf"), None), (1e308, None), (float("nan"), None), (-1.0, None), (101.0, None),
    (4.0, float("inf")), (4.0, float("nan")), (4.0, 1e308)])
def test_check_guidance_rejects_non_finite_and_huge_scales(true_cfg, guidance):
    with pytest.raises(ValueError):
        d.check_guidance(true_cfg, guidance)


def test_check_guidance_accepts_the_usual_range():
    from openai_frontend.schemas import MAX_GUIDANCE_SCALE

    assert MAX_GUIDANCE_SCALE == d.MAX_GUIDANCE_SCALE
    for true_cfg, guidance in [(None, None), (0.0, 0.0), (4.0, None), (100.0, 100.0), (1.0, -1.0)]:
        d.check_guidance(true_cfg, guidance)

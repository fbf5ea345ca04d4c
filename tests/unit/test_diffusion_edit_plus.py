"""Multi-image edit stages (tiny random Qwen-Image-Edit-Plus, diffusers ``QwenImageEditPlusPipeline``),
no Triton.

Parity: the stage split (VAE encode each image -> pack -> unpack -> encode prompt with the images ->
denoise -> VAE decode) run in-process equals ``QwenImageEditPlusPipeline.__call__`` bit for bit,
the latents as well as the uint8 image. The tiny model's image barely depends on its condition
images (swapping two of them changes a few pixels by 1 level), so the latents are compared too:
there a swap or a dropped image is far above float noise (:func:`test_each_image_and_its_order_matter`).
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
from omni_triton.stages import qwen_image as d  # noqa: E402


@pytest.fixture(scope="module")
def plus_dir(tmp_path_factory):
    return qi.build_tiny_qwen_image(tmp_path_factory.mktemp("qiep") / "qwen-image-edit-plus-tiny", qi.KIND_EDIT_PLUS)


@pytest.fixture(scope="module")
def pipe(plus_dir):
    return d.load_pipeline(plus_dir)


@pytest.fixture(scope="module")
def images():
    """Two condition images of different aspect ratios (so their latents differ in shape too)."""
    rng = np.random.default_rng(0)
    a = Image.fromarray(rng.integers(0, 256, (40, 56, 3), dtype=np.uint8), "RGB")
    b = Image.fromarray(np.full((56, 40, 3), (250, 20, 20), np.uint8), "RGB")
    return [a, b]


def reference_latents(pipe, prompt, images, **kw):
    """``__call__`` up to its latents (``output_type="latent"``)."""
    with torch.no_grad():
        return pipe(prompt=prompt, image=images, height=kw["height"], width=kw["width"],
                    num_inference_steps=kw["steps"], true_cfg_scale=1.0,
                    generator=torch.Generator().manual_seed(kw["seed"]), output_type="latent").images[0].numpy()


def staged_item(pipe, prompt, images, **kw):
    conds = [d.condition_image(pipe, im)[0] for im in images]
    embeds = d.encode_prompts(pipe, [prompt], [conds])[0]
    packed = d.pack_image_latents(pipe, d.vae_encode(pipe, images))
    latents = d.unpack_image_latents(pipe, packed, [im.size for im in images])
    return d.DenoiseItem(embeds, kw["height"], kw["width"], kw["steps"], kw["seed"], image=list(images),
                         image_latents=latents)


KW = dict(height=32, width=48, steps=2, seed=3)


# ------------------------------------------------------------------ checkpoint
def test_builder_writes_an_edit_plus_folder_with_the_edit_weights(plus_dir, pipe, tmp_path):
    from diffusers import QwenImageEditPlusPipeline

    assert type(pipe) is QwenImageEditPlusPipeline
    index = json.loads((plus_dir / "model_index.json").read_text())
    assert index["_class_name"] == "QwenImageEditPlusPipeline"
    assert index["processor"] == ["transformers", "Qwen2VLProcessor"]
    assert d.is_edit_pipeline(pipe) and d.is_multi_image_pipeline(pipe) and d.max_prompts_per_call(pipe) == 1
    spec = qi.TinyQwenImageSpec()
    assert spec.config_hash(0, qi.KIND_EDIT) != spec.config_hash(0, qi.KIND_EDIT_PLUS)
    edit = d.load_pipeline(qi.build_tiny_qwen_image(tmp_path / "edit", qi.KIND_EDIT))
    assert not d.is_multi_image_pipeline(edit) and d.max_prompts_per_call(edit) is None
    for name in ("transformer", "vae", "text_encoder"):
        mine, theirs = getattr(pipe, name).state_dict(), getattr(edit, name).state_dict()
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


# ------------------------------------------------------------------ parity
def test_stage_split_equals_pipeline_call(pipe, images):
    ref = d.reference_images(pipe, "make it red", image=images, true_cfg_scale=1.0, **KW)
    got = d.staged_images(pipe, "make it red", image=images, true_cfg_scale=1.0, **KW)
    assert got.shape == (32, 48, 3) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, ref)
    result = d.denoise(pipe, [staged_item(pipe, "make it red", images, **KW)])[0]
    np.testing.assert_array_equal(result.latents, reference_latents(pipe, "make it red", images, **KW))


def test_stage_split_with_cfg_equals_pipeline_call(pipe, images):
    kw = dict(height=32, width=32, steps=2, seed=5, negative_prompt=" ", true_cfg_scale=2.0)
    ref = d.reference_images(pipe, "add a rainbow", image=images[1:], **kw)
    np.testing.assert_array_equal(d.staged_images(pipe, "add a rainbow", image=images[1:], **kw), ref)


def test_each_image_and_its_order_matter(pipe, images):
    """What a miswired stage would do moves the latents far above float noise (the image itself
    by only a level or so on the tiny model)."""
    ref = reference_latents(pipe, "make it red", images, **KW)
    swapped = reference_latents(pipe, "make it red", images[::-1], **KW)
    assert np.abs(swapped - ref).max() > 1e-4
    item = staged_item(pipe, "make it red", images, **KW)
    item.image_latents = [item.image_latents[0], np.zeros_like(item.image_latents[1])]  # dropped latents
    assert np.abs(d.denoise(pipe, [item])[0].latents - ref).max() > 1e-3


def test_latents_in_the_wrong_order_fail_loudly(pipe, images):
    item = staged_item(pipe, "make it red", images, **KW)
    latents = item.image_latents
    item.image_latents = latents[::-1]
    with pytest.raises(ValueError, match="needs latents"):
        d.denoise(pipe, [item])
    item.image_latents = latents[:1]
    with pytest.raises(ValueError, match="more condition images"):
        d.denoise(pipe, [item])


# ------------------------------------------------------------------ batching
def test_a_batch_runs_one_call_per_request_and_equals_each_alone(pipe, images):
    """diffusers refuses batch_size > 1 for the Plus pipeline: the denoiser splits even
    compatible items into calls of one, so a batched item equals itself alone bit for bit."""
    items = [staged_item(pipe, "make it red", images, **{**KW, "seed": s}) for s in (1, 2)]
    assert d.denoise_key(items[0]) == d.denoise_key(items[1])
    forwards = []
    hook = pipe.transformer.register_forward_hook(lambda m, args, kwargs=None, out=None: forwards.append(1))
    try:
        together = d.denoise(pipe, items)
    finally:
        hook.remove()
    assert len(forwards) == 2 * KW["steps"]  # one call (one forward per step) per item
    for t, item in zip(together, items, strict=True):
        np.testing.assert_array_equal(t.latents, d.denoise(pipe, [item])[0].latents)
    assert np.abs(together[0].latents - together[1].latents).mean() > 0.1  # own seeds


def test_denoise_key_covers_every_condition_size(pipe, images):
    a = staged_item(pipe, "x", images, **KW)
    b = staged_item(pipe, "x", images[:1], **KW)
    c = staged_item(pipe, "x", images[::-1], **KW)
    assert len({d.denoise_key(a), d.denoise_key(b), d.denoise_key(c)}) == 3


def test_prompts_are_encoded_one_by_one_and_equal_alone(pipe, images):
    conds = [d.condition_image(pipe, im)[0] for im in images]
    batch = d.encode_prompts(pipe, ["make it red", "a cat", "a cat"], [conds, conds[:1], conds[::-1]])
    for e, (p, c) in zip(batch, [("make it red", conds), ("a cat", conds[:1]), ("a cat", conds[::-1])], strict=True):
        np.testing.assert_array_equal(e, d.encode_prompts(pipe, [p], [c])[0])
    assert not np.array_equal(batch[1], batch[2])  # one picture vs two in the template


# ------------------------------------------------------------------ sizes and checks
def test_condition_sizes_follow_the_plus_pipeline(pipe, images):
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus

    for im in images:
        w, h = im.size
        assert d.edit_condition_size(pipe, im.size) == plus.calculate_dimensions(plus.CONDITION_IMAGE_SIZE, w / h)
        assert d.vae_condition_size(pipe, im.size) == plus.calculate_dimensions(plus.VAE_IMAGE_SIZE, w / h)
        resized, tensor = d.condition_image(pipe, im)
        assert resized.size == d.edit_condition_size(pipe, im.size)
        assert tuple(tensor.shape) == (3, 1, *d.vae_condition_size(pipe, im.size)[::-1])


def test_pack_unpack_latents_round_trip(pipe, images):
    latents = d.vae_encode(pipe, images)
    packed = d.pack_image_latents(pipe, latents)
    z = pipe.vae.config.z_dim
    assert packed.shape == (sum(lat.shape[2] * lat.shape[3] // 4 for lat in latents), 4 * z)
    for got, want in zip(d.unpack_image_latents(pipe, packed, [im.size for im in images]), latents, strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="IMAGE_LATENTS"):
        d.unpack_image_latents(pipe, packed[1:], [im.size for im in images])
    with pytest.raises(ValueError, match="IMAGE_LATENTS"):
        d.unpack_image_latents(pipe, packed, [images[0].size])


@pytest.mark.parametrize("size", [(2000, 4), (4, 2000), (4096, 1)])
def test_check_condition_image_rejects_what_the_plus_text_encoder_cannot_encode(pipe, size):
    """Refused per request, and the pipeline's own preparation/encoding does fail on them (so the
    check is not stricter than needed; 1000x4 resizes to 6080x32 at ~384x384, which it encodes)."""
    image = Image.new("RGB", size)
    with pytest.raises(ValueError, match="aspect ratio"):
        d.check_condition_image(pipe, image)
    with pytest.raises(ValueError):
        d.encode_prompts(pipe, ["x"], [[d.condition_image(pipe, image)[0]]])


def test_check_condition_image_accepts_what_the_frontend_lets_through(pipe, images):
    from openai_frontend.serving.images import MAX_CONDITION_ASPECT_RATIO

    for size in [images[0].size, (MAX_CONDITION_ASPECT_RATIO, 1), (1, MAX_CONDITION_ASPECT_RATIO), (837, 10),
                 (1000, 4)]:
        d.check_condition_image(pipe, Image.new("RGB", size))

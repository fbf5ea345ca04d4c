"""Masked inpainting stages (diffusers ``QwenImageInpaintPipeline`` on the tiny Qwen-Image
weights), no Triton.

Parity: the stage split (VAE encode of image + masked image -> text encode -> denoise -> VAE
decode, ``staged_images``/``staged_inpaint``) against the pipeline's own ``__call__`` with the
same weights, seed and mask (``reference_images``): bit-exact for a request alone; inside a batch
within ``LATENT_ATOL``/``IMAGE_ATOL`` (batched DiT GEMMs sum in another order; measured below).
The mask comes from an OpenAI-style RGBA mask through ``diffusers_mask_from_alpha`` (alpha 0 =
edit -> white = repaint).
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
torch.set_num_threads(1)

from PIL import Image  # noqa: E402

from omni_triton.checkpoints import qwen_image as qi  # noqa: E402
from omni_triton.contracts.image import check_strength, diffusers_mask_from_alpha  # noqa: E402
from omni_triton.stages import qwen_image as d  # noqa: E402

LATENT_ATOL = 1e-5  # batched vs single GEMM summation order (as tests/unit/test_diffusion.py)
IMAGE_ATOL = 2  # uint8 levels, same reason
PIPELINE = "QwenImageInpaintPipeline"


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    folder = qi.build_tiny_qwen_image(tmp_path_factory.mktemp("qi") / "qwen-image-tiny", qi.KIND_T2I)
    return d.load_pipeline(folder, PIPELINE)


def _image(seed: int, h: int = 40, w: int = 56) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def _openai_mask(h: int = 40, w: int = 56, box=(8, 30, 10, 40)) -> np.ndarray:
    """An OpenAI-style RGBA mask: opaque, with a fully transparent box (the area to edit)."""
    rgba = np.full((h, w, 4), 255, np.uint8)
    y0, y1, x0, x1 = box
    rgba[y0:y1, x0:x1, 3] = 0
    return rgba


def _mask(rgba: np.ndarray) -> Image.Image:
    return d.mask_from_array(diffusers_mask_from_alpha(rgba[..., 3]))


@pytest.fixture(scope="module")
def image():
    return _image(0)


@pytest.fixture(scope="module")
def mask():
    return _mask(_openai_mask())


def test_loads_the_inpaint_pipeline_from_the_qwen_image_folder(pipe):
    from diffusers import QwenImageInpaintPipeline

    assert type(pipe) is QwenImageInpaintPipeline
    assert d.is_inpaint_pipeline(pipe) and not d.is_edit_pipeline(pipe)
    from omni_triton.stages.diffusion_pipeline import load_float32_pipeline

    with pytest.raises(ValueError, match="not a diffusers pipeline"):
        load_float32_pipeline("/nonexistent", "ImageInputError")


def test_mask_conversion_openai_to_diffusers():
    alpha = np.array([[0, 1, 128, 255]], np.uint8)
    np.testing.assert_array_equal(diffusers_mask_from_alpha(alpha), [[255, 0, 0, 0]])
    with pytest.raises(ValueError):
        diffusers_mask_from_alpha(np.zeros((2, 2, 1), np.uint8))


def test_strength_default_is_the_pipelines(pipe):
    """The ensemble's ``default_strength`` parameter (read by the frontend, which has no
    diffusers) is ``__call__``'s own default."""
    from pathlib import Path

    default = inspect.signature(type(pipe).__call__).parameters["strength"].default
    config = (Path(__file__).parents[2] / "ensembles" / "qwen_image_inpaint" / "config.pbtxt").read_text()
    assert f'key: "default_strength" value {{ string_value: "{default}" }}' in config
    for bad in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            check_strength(bad)
    check_strength(1.0)


# ------------------------------------------------------------------ parity with __call__
@pytest.mark.parametrize("kwargs", [
    dict(height=64, width=64, steps=2, seed=3),  # strength: the pipeline's default (0.6)
    dict(height=32, width=48, steps=5, seed=11, strength=0.6),  # 5 * 0.6 = 3 steps (FP64 matters)
    dict(height=48, width=32, steps=3, seed=7, strength=1.0, negative_prompt="blurry", true_cfg_scale=3.0),
])
def test_inpaint_stage_split_equals_pipeline_call(pipe, image, mask, kwargs):
    ref = d.reference_images(pipe, "a red fox in the snow", image=image, mask=mask, **kwargs)
    got = d.staged_images(pipe, "a red fox in the snow", image=image, mask=mask, **kwargs)
    assert got.shape == (kwargs["height"], kwargs["width"], 3) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, ref)
    assert ref.std() > 1


def test_inpaint_depends_on_the_mask(pipe, image, mask):
    """The kept area follows the mask: an inverted mask gives another image, and the parity
    above would fail with it (the red this test suite was checked with)."""
    inverted = Image.fromarray(255 - np.asarray(mask), "L")
    kw = dict(height=32, width=32, steps=2, seed=1, strength=1.0)
    a = d.reference_images(pipe, "a cat", image=image, mask=mask, **kw)
    b = d.staged_images(pipe, "a cat", image=image, mask=inverted, **kw)
    assert not np.array_equal(a, b)


def test_posteriors_are_deterministic_and_sampled_in_the_denoiser(pipe, image, mask):
    """The VAE-encode stage returns posterior parameters (no randomness): the denoiser's pipeline
    call samples them with the request's generator, so two seeds differ."""
    m1, = d.image_posteriors(pipe, [image], [(32, 32)])
    m2, = d.image_posteriors(pipe, [image], [(32, 32)])
    z = pipe.vae.config.z_dim
    assert m1.shape == (2 * z, 1, 4, 4) and m1.dtype == np.float32
    np.testing.assert_array_equal(m1, m2)
    kw = dict(height=32, width=32, steps=2, strength=1.0)
    a = d.staged_images(pipe, "a cat", image=image, mask=mask, seed=1, **kw)
    b = d.staged_images(pipe, "a cat", image=image, mask=mask, seed=2, **kw)
    assert not np.array_equal(a, b)


def test_the_pipeline_never_reads_masked_image_latents(pipe, image, mask):
    """Why the VAE-encode stage does not encode the masked image: ``__call__``'s output is the
    same whatever ``masked_image_latents`` holds (diffusers 0.42.1's loop uses them only for a
    64-channel transformer). Fails when a diffusers upgrade starts reading them."""
    def run(**extra):
        with torch.no_grad():
            return pipe(prompt="a cat", image=image, mask_image=mask, height=32, width=32, num_inference_steps=2,
                        strength=0.8, true_cfg_scale=1.0, generator=torch.Generator().manual_seed(4),
                        output_type="np", **extra).images[0]

    noise = torch.randn(1, pipe.vae.config.z_dim, 1, 4, 4, generator=torch.Generator().manual_seed(9)) * 10
    np.testing.assert_array_equal(run(), run(masked_image_latents=noise))


def test_precomputed_posteriors_refuse_an_unexpected_call(pipe, image):
    m, = d.image_posteriors(pipe, [image], [(32, 32)])
    with d.precomputed_posteriors(pipe, [m, m]):
        with pytest.raises(ValueError, match="does not match"):
            pipe.vae.encode(torch.zeros(1, 3, 1, 64, 64))
        pipe.vae.encode(torch.zeros(1, 3, 1, 32, 32))
        with pytest.raises(ValueError, match="more than 2"):
            pipe.vae.encode(torch.zeros(1, 3, 1, 32, 32))
    assert "encode" not in vars(pipe.vae)  # the hook is gone


# ------------------------------------------------------------------ batching
def test_inpaint_batch_within_tolerance_of_alone(pipe):
    """Three requests (different images, masks, prompts, seeds) batched in every stage vs each
    alone through the pipeline's ``__call__``."""
    images = [_image(1), _image(2, 24, 24), _image(1)]
    masks = [_mask(_openai_mask()), _mask(_openai_mask(24, 24, (0, 12, 0, 24))), _mask(_openai_mask())]
    prompts = ["a red fox", "a cat wearing a hat in the snow", "a red fox"]
    seeds = [1, 2, 1]
    kw = dict(height=32, width=32, steps=3, strength=0.8)
    together = d.staged_inpaint(pipe, prompts, seeds=seeds, images=images, masks=masks, **kw)
    worst = 0
    for got, p, s, im, m in zip(together, prompts, seeds, images, masks, strict=True):
        ref = d.reference_images(pipe, p, image=im, mask=m, seed=s, **kw)
        worst = max(worst, int(np.abs(got.astype(int) - ref).max()))
    assert worst <= IMAGE_ATOL
    np.testing.assert_array_equal(together[0], together[2])  # same inputs, other batch slots: same noise
    assert not np.array_equal(together[0], together[1])


def test_denoise_key_separates_strengths(pipe, image, mask):
    e = d.encode_prompts(pipe, ["a red fox"])[0]
    items = [d.DenoiseItem(e, 32, 32, 2, 1, image=image, mask=mask, strength=s) for s in (0.6, 0.6, 1.0)]
    plain = d.DenoiseItem(e, 32, 32, 2, 1)
    assert len({d.denoise_key(i) for i in [*items, plain]}) == 3


def test_check_mask_and_mask_from_array(image):
    d.check_mask(image, Image.new("L", image.size))
    with pytest.raises(ValueError, match="image's size"):
        d.check_mask(image, Image.new("L", (image.size[0] + 1, image.size[1])))
    with pytest.raises(ValueError, match="uint8"):
        d.mask_from_array(np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        d.mask_from_array(np.zeros((4, 4), np.float32))

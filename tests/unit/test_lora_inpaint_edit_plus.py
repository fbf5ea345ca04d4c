"""Per-request LoRA on masked inpainting (``QwenImageInpaintPipeline``) and multi-image edit
(``QwenImageEditPlusPipeline``), in-process (no Triton; docs/lora.md).

Parity: the stage split with an adapter (the denoiser's ``LoraCache``), a request alone in its
pipeline call, equals diffusers' own ``load_lora_weights`` + ``set_adapters`` on a fresh pipeline
of the same class with the same seed, bit for bit; and the adapter changes the image (so the
test could see an adapter that was dropped on the way). The served path is
tests/e2e/test_lora_served_inpaint_edit_plus.py.
"""
from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("peft")
torch.set_num_threads(1)

from PIL import Image  # noqa: E402

from omni_triton.checkpoints import qwen_image as qi  # noqa: E402
from omni_triton.checkpoints.qwen_image_lora import transformer_manifest, write_lora  # noqa: E402
from omni_triton.contracts import lora as cl  # noqa: E402
from omni_triton.stages import qwen_image as d  # noqa: E402

INPAINT = "QwenImageInpaintPipeline"
PROMPT = "a red balloon"


def _image(seed: int, h: int, w: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def _mask(h: int = 40, w: int = 56) -> Image.Image:
    m = np.zeros((h, w), np.uint8)
    m[8:30, 10:40] = 255  # diffusers' convention: white = repaint
    return Image.fromarray(m, "L")


@pytest.fixture(scope="module")
def t2i_dir(tmp_path_factory):
    return qi.build_tiny_qwen_image(tmp_path_factory.mktemp("qi") / "qwen-image-tiny", qi.KIND_T2I)


@pytest.fixture(scope="module")
def plus_dir(tmp_path_factory):
    return qi.build_tiny_qwen_image(tmp_path_factory.mktemp("qiep") / "qwen-image-edit-plus-tiny",
                                    qi.KIND_EDIT_PLUS)


@pytest.fixture(scope="module")
def inpaint_pipe(t2i_dir):
    return d.load_pipeline(t2i_dir, INPAINT)


@pytest.fixture(scope="module")
def plus_pipe(plus_dir):
    return d.load_pipeline(plus_dir)


def _store(directory, src) -> str:
    """Copy ``src`` into the LoRA directory under its SHA-256 (the frontend registry's layout)."""
    lora_id = hashlib.sha256(src.read_bytes()).hexdigest()
    shutil.copyfile(src, cl.adapter_file(directory, lora_id))
    return lora_id


@pytest.fixture(scope="module")
def loras(tmp_path_factory, inpaint_pipe):
    """Two diffusers-format adapters written against the inpaint pipeline's transformer (the
    tiny Qwen-Image transformer; edit-plus has the same Linear shapes: test_manifests_fit)."""
    directory = tmp_path_factory.mktemp("loras")
    manifest = transformer_manifest(inpaint_pipe)
    out = {}
    for name, seed, rank in (("a", 1, 4), ("b", 2, 8)):
        src = write_lora(directory / "src" / f"{name}.safetensors", manifest, seed=seed, rank=rank)
        out[name] = (_store(directory, src), src)
    return directory, out


def _cache(pipe, directory) -> d.LoraCache:
    for old in list(getattr(pipe.transformer, "peft_config", {})):
        pipe.delete_adapters(old)
    return d.LoraCache(pipe, directory, max_loras=2)


def _fresh(folder, src, scale: float, pipeline: str | None = None):
    """diffusers alone: a fresh pipeline with ``load_lora_weights`` + ``set_adapters``."""
    fresh = d.load_pipeline(folder, pipeline) if pipeline else d.load_pipeline(folder)
    fresh.load_lora_weights(str(src), adapter_name="ref")
    fresh.set_adapters(["ref"], adapter_weights=[scale])
    return fresh


INPAINT_KW = dict(height=32, width=64, steps=5, seed=21, strength=0.6)


@pytest.mark.parametrize("name,scale", [("a", 1.0), ("b", 0.6)])
def test_inpaint_lora_alone_equals_diffusers(t2i_dir, inpaint_pipe, loras, name, scale):
    directory, ids = loras
    lora_id, src = ids[name]
    image, mask = _image(0, 40, 56), _mask()
    cache = _cache(inpaint_pipe, directory)
    got = d.staged_images(inpaint_pipe, PROMPT, image=image, mask=mask, lora=d.LoraSpec(lora_id, scale),
                          loras=cache, **INPAINT_KW)
    ref = d.reference_images(_fresh(t2i_dir, src, scale, INPAINT), PROMPT, image=image, mask=mask, **INPAINT_KW)
    np.testing.assert_array_equal(got, ref)
    base = d.reference_images(d.load_pipeline(t2i_dir, INPAINT), PROMPT, image=image, mask=mask, **INPAINT_KW)
    assert np.abs(got.astype(int) - base).max() > 0  # the adapter changes the image
    # and without an adapter the same pipeline is back to the plain call, bit for bit
    np.testing.assert_array_equal(
        d.staged_images(inpaint_pipe, PROMPT, image=image, mask=mask, loras=cache, **INPAINT_KW), base)


PLUS_KW = dict(height=32, width=48, steps=2, seed=3, true_cfg_scale=1.0)


def _plus_latents(pipe, images, lora=None, loras=None):
    """The staged denoiser's latents (the tiny edit-plus image barely moves: compare latents too,
    as tests/unit/test_diffusion_edit_plus.py does)."""
    conds = [d.condition_image(pipe, im)[0] for im in images]
    embeds = d.encode_prompts(pipe, [PROMPT], [conds])[0]
    packed = d.pack_image_latents(pipe, d.vae_encode(pipe, images))
    item = d.DenoiseItem(embeds, PLUS_KW["height"], PLUS_KW["width"], PLUS_KW["steps"], PLUS_KW["seed"],
                         image=list(images), image_latents=d.unpack_image_latents(pipe, packed,
                                                                                  [im.size for im in images]),
                         lora=lora)
    return d.denoise(pipe, [item], loras=loras)[0].latents


def _reference_latents(pipe, images):
    with torch.no_grad():
        return pipe(prompt=PROMPT, image=images, height=PLUS_KW["height"], width=PLUS_KW["width"],
                    num_inference_steps=PLUS_KW["steps"], true_cfg_scale=1.0,
                    generator=torch.Generator().manual_seed(PLUS_KW["seed"]),
                    output_type="latent").images[0].numpy()


@pytest.mark.parametrize("name,scale", [("a", 1.0), ("b", 0.6)])
def test_edit_plus_lora_alone_equals_diffusers(plus_dir, plus_pipe, loras, name, scale):
    directory, ids = loras
    lora_id, src = ids[name]
    images = [_image(0, 40, 56), _image(5, 56, 40)]
    cache = _cache(plus_pipe, directory)
    spec = d.LoraSpec(lora_id, scale)
    got = d.staged_images(plus_pipe, PROMPT, image=images, lora=spec, loras=cache, **PLUS_KW)
    fresh = _fresh(plus_dir, src, scale)
    np.testing.assert_array_equal(got, d.reference_images(fresh, PROMPT, image=images, **PLUS_KW))
    latents = _plus_latents(plus_pipe, images, spec, cache)
    np.testing.assert_array_equal(latents, _reference_latents(fresh, images))
    plain = d.load_pipeline(plus_dir)
    base = _reference_latents(plain, images)
    assert np.abs(latents - base).max() > 1e-3  # the adapter changes the latents
    np.testing.assert_array_equal(_plus_latents(plus_pipe, images, None, cache), base)  # and off again


def test_manifests_fit(inpaint_pipe, plus_pipe, loras, tmp_path):
    """Each denoiser writes ``targets/<model>.json`` (what the frontend checks uploads against);
    an adapter made for qwen_image's transformer fits both (same tiny Qwen-Image DiT shapes), one
    with a wrong shape is ``lora_incompatible`` for both."""
    directory, ids = loras
    with open(ids["a"][1], "rb") as f:
        modules = cl.inspect(cl.read_header(f, ids["a"][1].stat().st_size)).modules
    for pipe, model in ((inpaint_pipe, "qwen_image_inpaint_denoiser"), (plus_pipe, "qwen_image_edit_plus_denoiser")):
        path = d.write_manifest(pipe, tmp_path, model)
        assert path == cl.manifest_file(tmp_path, model)
        data = json.loads(path.read_text())
        assert data["model"] == model and data["modules"] == transformer_manifest(pipe)
        cl.check_against(modules, data["modules"], model)
        bad = dict(modules)
        key = next(iter(bad))
        r, i, o = bad[key]
        bad[key] = (r, i + 1, o)
        with pytest.raises(cl.LoraFileError) as err:
            cl.check_against(bad, data["modules"], model)
        assert err.value.code == "lora_incompatible"

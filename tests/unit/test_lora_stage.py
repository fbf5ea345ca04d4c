"""Per-request LoRA in the Qwen-Image denoiser, in-process (no Triton; docs/lora.md).

Parity: a request with an adapter, alone in its pipeline call, equals diffusers' own
``load_lora_weights`` + ``set_adapters`` on a fresh pipeline with the same seed, bit for bit; a
request without an adapter stays bit-exact with a pipeline that never loaded one. Grouping: items
with different adapters or scales never share a pipeline call. LRU eviction within ``max_loras``.
"""
from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
pytest.importorskip("peft")
torch.set_num_threads(1)

from omni_triton.checkpoints import qwen_image as qi  # noqa: E402
from omni_triton.checkpoints.qwen_image_lora import transformer_manifest, write_lora  # noqa: E402
from omni_triton.contracts import lora as cl  # noqa: E402
from omni_triton.stages import qwen_image as d  # noqa: E402

KW = dict(height=64, width=64, steps=2, seed=3)
PROMPT = "a red fox in the snow"
LATENT_ATOL = 1e-5  # batched vs single GEMM summation order (tests/unit/test_diffusion.py)


@pytest.fixture(scope="module")
def t2i_dir(tmp_path_factory):
    return qi.build_tiny_qwen_image(tmp_path_factory.mktemp("qi") / "qwen-image-tiny", qi.KIND_T2I)


@pytest.fixture(scope="module")
def pipe(t2i_dir):
    return d.load_pipeline(t2i_dir)


@pytest.fixture(scope="module")
def manifest(pipe):
    return transformer_manifest(pipe)


def store(directory, src) -> str:
    """Copy ``src`` into the LoRA directory under its SHA-256 (what the frontend's registry does)."""
    lora_id = hashlib.sha256(src.read_bytes()).hexdigest()
    shutil.copyfile(src, cl.adapter_file(directory, lora_id))
    return lora_id


@pytest.fixture(scope="module")
def loras(tmp_path_factory, manifest):
    """Three diffusers-format adapters in a LoRA directory: ``{name: (id, source file)}``."""
    directory = tmp_path_factory.mktemp("loras")
    out = {}
    for name, seed, rank in (("a", 1, 4), ("b", 2, 8), ("c", 3, 2)):
        src = write_lora(directory / "src" / f"{name}.safetensors", manifest, seed=seed, rank=rank)
        out[name] = (store(directory, src), src)
    return directory, out


def new_cache(pipe, directory, max_loras: int = 2) -> d.LoraCache:
    """A LoraCache on ``pipe`` with no adapter loaded (one cache per pipeline, as in the stage)."""
    for old in list(getattr(pipe.transformer, "peft_config", {})):
        pipe.delete_adapters(old)
    return d.LoraCache(pipe, directory, max_loras=max_loras)


def fresh_reference(t2i_dir, src, scale: float, **kw) -> np.ndarray:
    """diffusers alone: a fresh pipeline, ``load_lora_weights`` + ``set_adapters``, ``__call__``."""
    fresh = d.load_pipeline(t2i_dir)
    fresh.load_lora_weights(str(src), adapter_name="ref")
    fresh.set_adapters(["ref"], adapter_weights=[scale])
    return d.reference_images(fresh, PROMPT, **kw)


@pytest.mark.parametrize("name,scale", [("a", 1.0), ("b", 0.6)])
def test_lora_alone_equals_diffusers_load_lora_weights(t2i_dir, pipe, loras, name, scale):
    directory, ids = loras
    lora_id, src = ids[name]
    cache = new_cache(pipe, directory, 2)
    got = d.staged_images(pipe, PROMPT, lora=d.LoraSpec(lora_id, scale), loras=cache, **KW)
    ref = fresh_reference(t2i_dir, src, scale, **KW)
    np.testing.assert_array_equal(got, ref)
    base = d.reference_images(d.load_pipeline(t2i_dir), PROMPT, **KW)
    assert np.abs(got.astype(int) - base).max() > 0  # the adapter changes the image
    cache.activate(None)


def test_without_lora_stays_bit_exact_after_adapters_were_loaded(t2i_dir, pipe, loras):
    directory, ids = loras
    cache = new_cache(pipe, directory, 4)
    d.staged_images(pipe, PROMPT, lora=d.LoraSpec(ids["a"][0], 1.0), loras=cache, **KW)
    got = d.staged_images(pipe, PROMPT, loras=cache, **KW)
    ref = d.reference_images(d.load_pipeline(t2i_dir), PROMPT, **KW)
    np.testing.assert_array_equal(got, ref)
    cfg = dict(height=32, width=48, steps=2, seed=7, negative_prompt="blurry", true_cfg_scale=3.0)
    np.testing.assert_array_equal(d.staged_images(pipe, PROMPT, loras=cache, **cfg),
                                  d.reference_images(d.load_pipeline(t2i_dir), PROMPT, **cfg))


def test_scale_changes_the_output(pipe, loras):
    directory, ids = loras
    cache = new_cache(pipe, directory, 2)
    a = d.staged_images(pipe, PROMPT, lora=d.LoraSpec(ids["a"][0], 1.0), loras=cache, **KW)
    half = d.staged_images(pipe, PROMPT, lora=d.LoraSpec(ids["a"][0], 0.5), loras=cache, **KW)
    zero = d.staged_images(pipe, PROMPT, lora=d.LoraSpec(ids["a"][0], 0.0), loras=cache, **KW)
    none = d.staged_images(pipe, PROMPT, loras=cache, **KW)
    assert not np.array_equal(a, half)
    np.testing.assert_array_equal(zero, none)  # weight 0: the LoRA term is multiplied by 0


def test_denoise_key_separates_adapters_and_scales(pipe):
    e = d.encode_prompts(pipe, ["a red fox"])[0]
    a, b = "a" * 64, "b" * 64
    items = [d.DenoiseItem(e, 64, 64, 2, 1, lora=d.LoraSpec(a, 1.0)),
             d.DenoiseItem(e, 64, 64, 2, 2, lora=d.LoraSpec(a, 1.0)),
             d.DenoiseItem(e, 64, 64, 2, 1, lora=d.LoraSpec(a, 0.5)),
             d.DenoiseItem(e, 64, 64, 2, 1, lora=d.LoraSpec(b, 1.0)),
             d.DenoiseItem(e, 64, 64, 2, 1)]
    keys = [d.denoise_key(i) for i in items]
    assert keys[0] == keys[1] and len(set(keys)) == 4


def test_mixed_batch_runs_one_call_per_adapter_and_scale(pipe, loras):
    """Each item of a mixed batch equals its single run; singletons bit for bit."""
    directory, ids = loras
    cache = new_cache(pipe, directory, 3)
    e = d.encode_prompts(pipe, [PROMPT, "a blue sky"])
    specs = [d.LoraSpec(ids["a"][0], 1.0), d.LoraSpec(ids["b"][0], 1.0), d.LoraSpec(ids["a"][0], 0.5),
             None, d.LoraSpec(ids["a"][0], 1.0)]
    items = [d.DenoiseItem(e[i % 2], 64, 64, 2, 10 + i, lora=s) for i, s in enumerate(specs)]
    calls = []
    real = pipe.__class__.__call__

    def counting(self, *args, **kwargs):
        calls.append((self.transformer.active_adapters() if cache.active else [], len(kwargs["generator"])))
        return real(self, *args, **kwargs)

    pipe.__class__.__call__ = counting
    try:
        together = d.denoise(pipe, items, loras=cache)
    finally:
        pipe.__class__.__call__ = real
    assert sorted(n for _, n in calls) == [1, 1, 1, 2]  # a@1 (items 0 and 4) share one call
    for i, item in enumerate(items):
        alone = d.denoise(pipe, [item], loras=cache)[0]
        if i in (0, 4):
            np.testing.assert_allclose(together[i].latents, alone.latents, atol=LATENT_ATOL, rtol=0)
        else:
            np.testing.assert_array_equal(together[i].latents, alone.latents)
    assert np.abs(together[0].latents - together[2].latents).max() > 1e-3  # scales differ


def test_lru_eviction_within_max_loras(pipe, loras):
    directory, ids = loras
    a, b, c = (ids[k][0] for k in "abc")
    cache = new_cache(pipe, directory, 2)
    cache.activate(d.LoraSpec(a))
    cache.activate(d.LoraSpec(b))
    cache.activate(d.LoraSpec(a))  # a is now the most recently used
    cache.activate(d.LoraSpec(c))  # evicts b
    assert list(cache.loaded) == [a, c] and cache.evictions == 1 and cache.loads == 3
    assert set(pipe.transformer.peft_config) == {a, c}
    cache.activate(d.LoraSpec(b))  # evicts a
    assert list(cache.loaded) == [c, b] and set(pipe.transformer.peft_config) == {c, b}
    cache.activate(None)


def test_a_bad_adapter_fails_only_its_requests(t2i_dir, pipe, loras, tmp_path, manifest):
    directory, ids = loras
    # lora_A's in_features (7) do not fit to_q (32 -> 32): a file that passed no registry check
    from safetensors.numpy import save_file
    m = "transformer.transformer_blocks.0.attn.to_q"
    save_file({f"{m}.lora_A.weight": np.ones((4, 7), np.float32), f"{m}.lora_B.weight": np.ones((32, 4), np.float32)},
              str(tmp_path / "bad.safetensors"))
    bad = store(directory, tmp_path / "bad.safetensors")
    cache = new_cache(pipe, directory, 2)
    e = d.encode_prompts(pipe, [PROMPT])[0]
    items = [d.DenoiseItem(e, 64, 64, 2, 3, lora=d.LoraSpec(bad)), d.DenoiseItem(e, 64, 64, 2, 3),
             d.DenoiseItem(e, 64, 64, 2, 3, lora=d.LoraSpec("0" * 64)),
             d.DenoiseItem(e, 64, 64, 2, 3, lora=d.LoraSpec(ids["a"][0]))]
    res = d.denoise(pipe, items, loras=cache)
    assert isinstance(res[0], d.LoraLoadError) and "cannot be loaded" in str(res[0])
    assert isinstance(res[2], d.LoraLoadError) and res[2].code == "lora_not_found"
    assert isinstance(res[1], d.DenoiseResult) and isinstance(res[3], d.DenoiseResult)
    assert bad not in getattr(pipe.transformer, "peft_config", {})
    image = d.vae_decode(pipe, [res[1].latents], [(64, 64)])[0]
    np.testing.assert_array_equal(image, d.reference_images(d.load_pipeline(t2i_dir), PROMPT, **KW))
    cache.activate(None)


def test_a_file_that_does_not_match_its_id_is_refused(pipe, loras, tmp_path):
    directory, ids = loras
    fake = "f" * 64
    shutil.copyfile(ids["a"][1], cl.adapter_file(directory, fake))
    with pytest.raises(d.LoraLoadError, match="does not match its id"):
        new_cache(pipe, directory).activate(d.LoraSpec(fake))
    with pytest.raises(cl.LoraFileError):
        new_cache(pipe, directory).activate(d.LoraSpec("../../etc/passwd"))


def test_peft_format_equals_peft_itself(t2i_dir, pipe, manifest, tmp_path):
    """A PEFT folder (lora_alpha = 2 r) stored in its canonical form scales by alpha / r as PEFT does."""
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = write_lora(tmp_path / "peft", manifest, fmt="peft", rank=4, seed=5, lora_alpha=8)
    src = folder / "adapter_model.safetensors"
    config = __import__("json").loads((folder / "adapter_config.json").read_text())
    with open(src, "rb") as f:
        header = cl.read_header(f, src.stat().st_size)
        info = cl.inspect(header, adapter_config=config)
        assert info.format == cl.FORMAT_PEFT and info.needs_rewrite and cl.DIFFUSERS_METADATA_KEY in info.metadata
        with open(tmp_path / "canonical.safetensors", "wb") as out:
            cl.write_canonical(f, out, header, info)
    directory = tmp_path / "dir"
    directory.mkdir()
    lora_id = store(directory, tmp_path / "canonical.safetensors")
    cache = new_cache(pipe, directory, 4)
    got = d.staged_images(pipe, PROMPT, lora=d.LoraSpec(lora_id, 1.0), loras=cache, **KW)
    cache.activate(None)
    fresh = d.load_pipeline(t2i_dir)
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, target_modules=config["target_modules"]),
                            fresh.transformer, adapter_name="default")
    sd = {k.removeprefix("base_model.model."): v for k, v in load_file(str(src)).items()}
    result = set_peft_model_state_dict(fresh.transformer, sd, adapter_name="default")
    assert not [k for k in result.unexpected_keys if "lora" in k]
    np.testing.assert_array_equal(got, d.reference_images(fresh, PROMPT, **KW))


def test_manifest_lists_the_transformer_linears(pipe, tmp_path, manifest):
    path = d.write_manifest(pipe, tmp_path, "qwen_image_denoiser")
    data = __import__("json").loads(path.read_text())
    assert data["model"] == "qwen_image_denoiser" and data["modules"] == manifest
    assert data["modules"]["transformer_blocks.0.attn.to_q"] == [32, 32]

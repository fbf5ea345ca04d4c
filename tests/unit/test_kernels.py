"""omni_triton.kernels: the attention backend choice falls back to torch SDPA with a reason when a
device or package is missing, auto picks by what is present, step caches map to diffusers' hooks,
and apply() really sets both on the tiny Qwen-Image transformer."""
import importlib.util

import pytest

from omni_triton import kernels


def test_attention_backend_choice_and_fallbacks(monkeypatch):
    assert kernels.choose_attention_backend("auto", cuda=False) == ("native", "auto: no CUDA device, torch SDPA")
    backend, reason = kernels.choose_attention_backend("flash", cuda=False)
    assert backend == "native" and "needs CUDA" in reason
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: None if name in ("flash_attn", "sageattention") else real(name))
    assert kernels.choose_attention_backend("auto", cuda=True)[0] == "_native_cudnn"
    backend, reason = kernels.choose_attention_backend("sage", cuda=True)
    assert backend == "native" and "sageattention" in reason
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "flash_attn" else None)
    assert kernels.choose_attention_backend("auto", cuda=True)[0] == "flash"
    with pytest.raises(ValueError, match="attention backend 'fast'"):
        kernels.choose_attention_backend("fast", cuda=False)


def test_cache_configs():
    from diffusers.hooks import FirstBlockCacheConfig, PyramidAttentionBroadcastConfig

    assert kernels.cache_config("none") is None
    assert isinstance(kernels.cache_config("first_block", threshold=0.1), FirstBlockCacheConfig)
    assert kernels.cache_config("taylorseer", cache_interval=3).cache_interval == 3
    assert isinstance(kernels.cache_config("pab", current_timestep_callback=lambda: 0), PyramidAttentionBroadcastConfig)
    with pytest.raises(ValueError, match="step cache 'magic'"):
        kernels.cache_config("magic")


@pytest.mark.parametrize("cache", ["none", "first_block", "taylorseer"])
def test_apply_sets_backend_and_cache_on_the_tiny_transformer(cache):
    from diffusers import QwenImageTransformer2DModel

    from omni_triton.checkpoints.qwen_image import checkpoint_dir

    transformer = QwenImageTransformer2DModel.from_pretrained(str(checkpoint_dir("qwen-image-tiny") / "transformer"))
    line = kernels.apply(transformer, "flash", cache, cuda=False)
    assert line.startswith("attention=native (flash needs CUDA") and line.endswith(f"step_cache={cache}")
    processors = [m.processor for m in transformer.modules() if hasattr(m, "processor")]
    assert processors and all(getattr(p, "_attention_backend", None) == "native" for p in processors)
    assert transformer.is_cache_enabled == (cache != "none")


def test_stage_config_choice_reaches_both_wan_experts():
    """The denoisers' config.pbtxt parameters (attention_backend, step_cache, step_cache_<option>)
    reach every transformer of the pipeline, Wan2.2's second expert included."""
    from omni_triton.checkpoints.wan import checkpoint_dir
    from omni_triton.stages import wan

    pipe = wan.load_pipeline(checkpoint_dir("wan2.2-t2v-tiny"))
    line = kernels.apply_from_params(pipe, {"attention_backend": "auto", "step_cache": "first_block",
                                            "step_cache_threshold": "0.1"}, cuda=False)
    assert line.count("attention=native") == 2 and "transformer_2:" in line
    assert pipe.transformer.is_cache_enabled and pipe.transformer_2.is_cache_enabled


def test_every_denoiser_config_names_its_kernels():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for model in ("qwen_image_denoiser", "qwen_image_edit_denoiser", "wan_t2v_denoiser"):
        text = (root / "model_repository" / model / "config.pbtxt").read_text()
        assert 'key: "attention_backend"' in text and 'key: "step_cache"' in text, model

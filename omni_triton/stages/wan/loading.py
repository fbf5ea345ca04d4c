"""Loading a Wan2.2 pipeline folder."""
from __future__ import annotations

from pathlib import Path

from omni_triton.stages.diffusion_pipeline import load_float32_pipeline


def load_pipeline(path: Path | str):
    """``DiffusionPipeline.from_pretrained`` on a prepared Wan folder (float32, CPU), progress
    bars off. Returns a ``WanPipeline`` or ``WanImageToVideoPipeline``.

    ``WanTransformer3DModel`` declares ``_keep_in_fp32_modules``, which diffusers 0.42 only
    honours with ``low_cpu_mem_usage`` (it needs ``accelerate``, not installed here). Loading in
    float32 keeps every module in float32 anyway, so the declaration is lifted for the load.
    """
    from diffusers import WanTransformer3DModel

    keep = WanTransformer3DModel._keep_in_fp32_modules
    WanTransformer3DModel._keep_in_fp32_modules = None
    try:
        pipe = load_float32_pipeline(path)
    finally:
        WanTransformer3DModel._keep_in_fp32_modules = keep
    _guard_i2v_prompt_clean()
    return pipe


def _guard_i2v_prompt_clean() -> None:
    """diffusers 0.42's ``pipeline_wan_i2v.basic_clean`` calls ``ftfy.fix_text`` without the
    ``is_ftfy_available()`` guard that ``pipeline_wan`` has, so ``WanImageToVideoPipeline`` with a
    text prompt raises ``NameError: ftfy`` when ftfy is not installed (it is not here). Without
    ftfy the module gets an identity ``fix_text``: the text-to-video pipeline's behaviour
    without ftfy (and what the served ``wan_t2v_text_encoder`` does for both pipelines)."""
    from diffusers.pipelines.wan import pipeline_wan_i2v
    from diffusers.utils import is_ftfy_available

    if not is_ftfy_available() and not hasattr(pipeline_wan_i2v, "ftfy"):
        import types

        pipeline_wan_i2v.ftfy = types.SimpleNamespace(fix_text=lambda text: text)


def is_i2v(pipe) -> bool:
    """True for ``WanImageToVideoPipeline`` (its experts take noise + mask + condition channels)."""
    from diffusers import WanImageToVideoPipeline

    return isinstance(pipe, WanImageToVideoPipeline)


def size_multiple(pipe) -> int:
    """Height/width must be multiples of this: the VAE's spatial factor (8) times the DiT's
    spatial patch (2) = 16 (the pipeline would silently round other sizes down)."""
    patch = (pipe.transformer or pipe.transformer_2).config.patch_size
    return pipe.vae_scale_factor_spatial * int(patch[1])


def frame_multiple(pipe) -> int:
    """``num_frames - 1`` must be a multiple of this (the VAE's temporal factor, 4)."""
    return int(pipe.vae_scale_factor_temporal)

"""Attention backend and step cache for the diffusion transformers (``kernels/README.md``).

Both come from diffusers 0.42 itself: ``ModelMixin.set_attention_backend`` (its attention
dispatcher) and ``ModelMixin.enable_cache`` (its hooks). This module only decides what to ask for
on this machine and says what ran:

- :func:`choose_attention_backend`: ``"auto"`` is torch SDPA (``native``) on CPU; on CUDA it is
  ``flash`` when the ``flash_attn`` package is importable, else ``sage`` when ``sageattention`` is,
  else ``_native_cudnn`` (SDPA's cuDNN kernel). A named backend whose package or device is missing
  falls back to ``native`` with the reason.
- :func:`cache_config`: ``"none"``, ``"first_block"`` (FirstBlockCacheConfig), ``"taylorseer"``
  (TaylorSeerCacheConfig) or ``"pab"`` (PyramidAttentionBroadcastConfig), with its options.
- :func:`apply`: both on a transformer, returning the log line.
"""
from __future__ import annotations

import importlib.util

#: backend name -> (python package it needs, needs CUDA)
_NEEDS = {"native": (None, False), "flash": ("flash_attn", True), "sage": ("sageattention", True),
          "_native_cudnn": (None, True), "_native_flash": (None, True), "_native_efficient": (None, True),
          "xformers": ("xformers", True)}
STEP_CACHES = ("none", "first_block", "taylorseer", "pab")


def choose_attention_backend(requested: str = "auto", cuda: bool | None = None) -> tuple[str, str]:
    """The diffusers attention backend to use and why.

    Args:
        requested: ``"auto"`` or a key of the table above.
        cuda: whether a CUDA device is used (default: ``torch.cuda.is_available()``).

    Returns:
        ``(backend, reason)``; ``backend`` is always runnable here (``native`` as the fallback).

    Raises:
        ValueError: an unknown backend name.
    """
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    have = lambda pkg: pkg is None or importlib.util.find_spec(pkg) is not None  # noqa: E731
    if requested == "auto":
        if not cuda:
            return "native", "auto: no CUDA device, torch SDPA"
        for name in ("flash", "sage", "_native_cudnn"):
            if have(_NEEDS[name][0]):
                return name, f"auto: CUDA and {_NEEDS[name][0] or 'torch'} present"
    if requested not in _NEEDS:
        raise ValueError(f"attention backend {requested!r}: expected auto or one of {', '.join(_NEEDS)}")
    package, needs_cuda = _NEEDS[requested]
    if needs_cuda and not cuda:
        return "native", f"{requested} needs CUDA: fell back to torch SDPA"
    if not have(package):
        return "native", f"{requested} needs the {package} package: fell back to torch SDPA"
    return requested, "as configured"


def cache_config(name: str = "none", **options):
    """A diffusers cache config for ``transformer.enable_cache``, or ``None`` for ``"none"``.

    Options (defaults in brackets): first_block ``threshold`` [0.05]; taylorseer
    ``cache_interval`` [2], ``disable_cache_before_step`` [1], ``max_order`` [1]; pab
    ``spatial_attention_block_skip_range`` [2] and ``timestep_skip_range`` [(0, 1000)] (PAB decides
    by the pipeline's ``current_timestep``).

    Raises:
        ValueError: an unknown cache name.
    """
    from diffusers.hooks import FirstBlockCacheConfig, PyramidAttentionBroadcastConfig, TaylorSeerCacheConfig

    if name == "none":
        return None
    if name == "first_block":
        return FirstBlockCacheConfig(threshold=float(options.get("threshold", 0.05)))
    if name == "taylorseer":
        return TaylorSeerCacheConfig(cache_interval=int(options.get("cache_interval", 2)),
                                     disable_cache_before_step=int(options.get("disable_cache_before_step", 1)),
                                     max_order=int(options.get("max_order", 1)))
    if name == "pab":
        return PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=int(options.get("spatial_attention_block_skip_range", 2)),
            spatial_attention_timestep_skip_range=tuple(options.get("timestep_skip_range", (0, 1000))),
            current_timestep_callback=options["current_timestep_callback"])
    raise ValueError(f"step cache {name!r}: expected one of {', '.join(STEP_CACHES)}")


def apply(transformer, attention: str = "auto", step_cache: str = "none", cuda: bool | None = None,
          **cache_options) -> str:
    """Set the attention backend and step cache on a diffusers transformer; returns the log line
    (``"attention=<backend> (<reason>); step_cache=<name>"``)."""
    backend, reason = choose_attention_backend(attention, cuda)
    transformer.set_attention_backend(backend)
    config = cache_config(step_cache, **cache_options)
    if config is not None:
        transformer.enable_cache(config)
    return f"attention={backend} ({reason}); step_cache={step_cache}"


def apply_from_params(pipe, params: dict[str, str], cuda: bool | None = None) -> str:
    """Apply the stage config's choice to every transformer of a diffusers pipeline
    (``transformer``, and ``transformer_2`` of Wan2.2's second expert); returns the log line.

    Config parameters (``config.pbtxt``): ``attention_backend`` (``auto``), ``step_cache``
    (``none``) and its options as ``step_cache_<option>`` (e.g. ``step_cache_threshold``). PAB
    reads the pipeline's ``current_timestep``.

    Raises:
        ValueError: an unknown backend or cache name.
    """
    attention = params.get("attention_backend", "auto")
    step_cache = params.get("step_cache", "none")
    options = {k[len("step_cache_"):]: v for k, v in params.items() if k.startswith("step_cache_")}
    if step_cache == "pab":
        options["current_timestep_callback"] = lambda: pipe.current_timestep
    lines = []
    for name in ("transformer", "transformer_2"):
        transformer = getattr(pipe, name, None)
        if transformer is not None:
            lines.append(f"{name}: {apply(transformer, attention, step_cache, cuda, **options)}")
    return "; ".join(lines)

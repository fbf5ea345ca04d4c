"""Helpers shared by the tiny-checkpoint builders: build-once folders marked complete by a
manifest, its reader, and the kaiming conv init that makes random codec decoders audible.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

MANIFEST = "manifest.json"


def kaiming_init_conv_(mod: torch.nn.Module, gen: torch.Generator) -> None:
    """Kaiming-normal init of one ``Conv1d``/``ConvTranspose1d`` (fan-in from its weight shape),
    bias zeroed. Random codec decoders with their default conv init give ~1e-8 amplitude."""
    if isinstance(mod, torch.nn.Conv1d):
        fan_in = mod.weight[0].numel()
    else:
        fan_in = mod.weight.shape[0] // max(mod.groups, 1) * mod.weight.shape[-1]
    mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) * (2.0 / max(fan_in, 1)) ** 0.5)
    if mod.bias is not None:
        mod.bias.zero_()


def kaiming_init_convs_(module: torch.nn.Module, gen: torch.Generator, last_conv: torch.nn.Module,
                        last_conv_scale: float) -> None:
    """Kaiming-init every conv of a random codec decoder (module order), then scale ``last_conv``
    (the one producing the waveform) by ``last_conv_scale`` so the output is noise-like, neither
    silent (~1e-8) nor clipped."""
    for mod in module.modules():
        if isinstance(mod, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
            kaiming_init_conv_(mod, gen)
    last_conv.weight.mul_(last_conv_scale)


def build_once(out_dir: Path, config_hash: str, build: Callable[[Path, str], None]) -> Path:
    """Run ``build(out_dir, config_hash)`` unless ``out_dir/manifest.json`` already records
    ``config_hash``; return ``out_dir``. ``build`` must write the manifest last (it marks the build
    complete). Several Triton models may start at once and all find the folder missing: one builds
    under a file lock, the others wait on it and then see the finished manifest."""
    import fcntl

    if _manifest_hash(out_dir) == config_hash:
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _manifest_hash(out_dir) == config_hash:
            return out_dir
        (out_dir / MANIFEST).unlink(missing_ok=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        build(out_dir, config_hash)
    return out_dir


def _manifest_hash(out_dir: Path) -> str | None:
    try:
        return json.loads((out_dir / MANIFEST).read_text()).get("config_hash")
    except (OSError, ValueError):
        return None


def read_manifest(model_dir: Path) -> dict:
    """The builder's ``manifest.json`` of ``model_dir`` ({} when absent, e.g. a real checkpoint)."""
    p = Path(model_dir) / MANIFEST
    return json.loads(p.read_text()) if p.is_file() else {}

"""Per-request LoRA in the denoiser (docs/lora.md): adapters loaded into the running pipeline with
diffusers' own ``load_lora_weights`` / ``set_adapters`` / ``delete_adapters``, at most
``max_loras`` at once (least recently used evicted), each from the LoRA directory only.

A pipeline call runs one adapter at one scale (``denoise_key`` holds both), or none: then the
LoRA layers are switched off (``disable_lora``: PEFT's layers return the base layer's output
unchanged), so a request without LoRA is bit-exact with a pipeline that never saw an adapter.
"""
from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from omni_triton.contracts.lora import LoraFileError, adapter_file, check_scale, manifest_file, manifest_of

LOGGER = logging.getLogger("omni_triton.diffusion")


@dataclass(frozen=True)
class LoraSpec:
    """One request's adapter: ``id`` (hex SHA-256 of its file in the LoRA directory) and
    ``scale`` (its ``set_adapters`` weight)."""

    id: str
    scale: float = 1.0


class LoraLoadError(LoraFileError):
    """The adapter cannot be loaded into this pipeline (missing or corrupt file, keys or shapes the
    transformer does not have). Only the requests naming it fail (INVALID_ARG)."""


def write_manifest(pipe, directory: Path, model: str) -> Path:
    """Write ``<directory>/targets/<model>.json``: every ``torch.nn.Linear`` of ``pipe.transformer``
    as ``name -> [in_features, out_features]`` (what an adapter may target), atomically."""
    import json
    import os

    import torch

    # a layer PEFT already wrapped (adapters loaded before) is listed under its own name
    linears = ((name.removesuffix(".base_layer"), m.in_features, m.out_features)
               for name, m in pipe.transformer.named_modules()
               if isinstance(m, torch.nn.Linear) and ".lora_" not in name)
    path = manifest_file(directory, model)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"model": model, "modules": manifest_of(linears)}, sort_keys=True))
    os.replace(tmp, path)
    return path


class LoraCache:
    """The adapters loaded into one pipeline, least recently used first.

    Args:
        pipe: a diffusers pipeline with ``LoraLoaderMixin`` (``QwenImagePipeline``...).
        directory: the LoRA directory (``contracts.lora.lora_dir()``); adapters are only ever
            read from ``<directory>/<id>.safetensors``.
        max_loras: adapters kept loaded at once (>= 1); loading one more deletes the least
            recently used (``pipe.delete_adapters``).
        verify: re-hash each file when loading it and refuse it unless its SHA-256 is its id.

    Not thread-safe: the denoiser runs one pipeline call at a time.
    """

    def __init__(self, pipe, directory: Path, max_loras: int = 4, verify: bool = True):
        if max_loras < 1:
            raise ValueError(f"max_loras={max_loras}: must be >= 1")
        self.pipe, self.directory, self.max_loras, self.verify = pipe, Path(directory), max_loras, verify
        self.loaded: OrderedDict[str, None] = OrderedDict()
        self.active: LoraSpec | None = None
        self.loads = self.evictions = 0

    def _load(self, lora_id: str) -> None:
        path = adapter_file(self.directory, lora_id)
        if not path.is_file():
            raise LoraLoadError(f"LoRA adapter {lora_id[:12]}... is not in the LoRA directory "
                                "(deleted, or registered with another server)", code="lora_not_found")
        if self.verify:
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            if digest.hexdigest() != lora_id:
                raise LoraLoadError(f"LoRA adapter file {path.name} does not match its id (corrupt)")
        while len(self.loaded) >= self.max_loras:
            old, _ = self.loaded.popitem(last=False)
            self.pipe.delete_adapters(old)
            self.evictions += 1
            LOGGER.info("LoRA %s... evicted (max_loras=%d)", old[:12], self.max_loras)
        try:
            self.pipe.load_lora_weights(str(path), adapter_name=lora_id)
        except Exception as exc:
            # a half-injected adapter must not stay behind: delete whatever got registered
            try:
                if lora_id in getattr(self.pipe.transformer, "peft_config", {}):
                    self.pipe.delete_adapters(lora_id)
            except Exception:
                LOGGER.exception("LoRA %s...: cleaning up a failed load", lora_id[:12])
            raise LoraLoadError(f"LoRA adapter {lora_id[:12]}... cannot be loaded into this model: "
                                f"{type(exc).__name__}: {exc}") from exc
        self.loaded[lora_id] = None
        self.loads += 1
        LOGGER.info("LoRA %s... loaded (%d of at most %d)", lora_id[:12], len(self.loaded), self.max_loras)

    def activate(self, spec: LoraSpec | None) -> None:
        """Make ``spec`` the only active adapter at its scale (loading it first if needed), or
        switch every adapter off for ``None``.

        Raises:
            LoraLoadError: the adapter cannot be loaded (nothing else changes; the next call with
                another adapter or none works as before).
        """
        if spec is None:
            if self.loaded and self.active is not None:
                self.pipe.disable_lora()
            self.active = None
            return
        check_scale(spec.scale)
        if spec.id in self.loaded:
            self.loaded.move_to_end(spec.id)
        else:
            self._load(spec.id)
        if self.active != spec:
            self.pipe.enable_lora()
            self.pipe.set_adapters([spec.id], adapter_weights=[float(spec.scale)])
        self.active = spec

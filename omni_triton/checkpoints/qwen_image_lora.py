"""Tiny random LoRA adapters for the tiny Qwen-Image transformers (tests and benchmarks;
docs/lora.md). No hub is reachable here, so adapters are made locally with a fixed seed, in the
key formats the server accepts (``omni_triton.contracts.lora``).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

#: Linear layers of every transformer block a typical Qwen-Image LoRA trains (attention
#: projections of the image and text streams)
DEFAULT_TARGETS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                   "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out")


def transformer_manifest(pipe) -> dict[str, list[int]]:
    """``name -> [in_features, out_features]`` of every Linear of ``pipe.transformer`` (the
    manifest a denoiser writes: ``stages.qwen_image.lora.write_manifest``)."""
    import torch

    return {name.removesuffix(".base_layer"): [m.in_features, m.out_features]
            for name, m in pipe.transformer.named_modules()
            if isinstance(m, torch.nn.Linear) and ".lora_" not in name}


def lora_tensors(manifest: dict[str, list[int]], *, rank: int = 4, seed: int = 0, std: float = 1.0,
                 targets: tuple[str, ...] = DEFAULT_TARGETS) -> dict[str, np.ndarray]:
    """Random ``float32`` LoRA matrices ``{module: (A [rank, in], B [out, rank])}`` flattened to
    ``{"<module>.lora_A.weight": A, "<module>.lora_B.weight": B}`` for the manifest's modules
    whose name ends with one of ``targets``. B is not zero (trained adapters' B is not), so the
    adapter changes the image. ``std``: standard deviation of both factors."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name in sorted(manifest):
        if not name.endswith(targets):
            continue
        in_f, out_f = manifest[name]
        out[f"{name}.lora_A.weight"] = rng.normal(0, std, (rank, in_f)).astype(np.float32)
        out[f"{name}.lora_B.weight"] = rng.normal(0, std, (out_f, rank)).astype(np.float32)
    if not out:
        raise ValueError(f"no module of the manifest ends with one of {targets}")
    return out


def write_lora(path: Path, manifest: dict[str, list[int]], *, fmt: str = "diffusers", rank: int = 4,
               seed: int = 0, std: float = 1.0, lora_alpha: float | None = None,
               targets: tuple[str, ...] = DEFAULT_TARGETS) -> Path:
    """Write a random LoRA for the manifest's transformer.

    ``fmt``: ``diffusers`` (one ``.safetensors`` at ``path``, keys ``transformer.<m>.lora_A.weight``)
    or ``peft`` (a PEFT folder at ``path``: ``adapter_model.safetensors`` with keys
    ``base_model.model.<m>.lora_A.weight`` and ``adapter_config.json`` with ``r``, ``lora_alpha``
    (default: ``rank``) and ``target_modules``). Returns the file (diffusers) or folder (peft).
    """
    from safetensors.numpy import save_file

    tensors = lora_tensors(manifest, rank=rank, seed=seed, std=std, targets=targets)
    path = Path(path)
    if fmt == "diffusers":
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({f"transformer.{k}": v for k, v in tensors.items()}, str(path))
        return path
    if fmt != "peft":
        raise ValueError(f"fmt={fmt!r}: diffusers or peft")
    path.mkdir(parents=True, exist_ok=True)
    save_file({f"base_model.model.{k}": v for k, v in tensors.items()}, str(path / "adapter_model.safetensors"))
    modules = sorted({k.rsplit(".lora_", 1)[0] for k in tensors})
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": lora_alpha if lora_alpha is not None else rank,
        "target_modules": modules, "lora_dropout": 0.0, "bias": "none"}, indent=2))
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m omni_triton.checkpoints.qwen_image_lora OUT``: a random test adapter for a served
    Qwen-Image denoiser, from the manifest it wrote at start (``<lora dir>/targets/<model>.json``;
    the server must have loaded that denoiser once). Exit status 1 with a message when the manifest
    is missing."""
    import argparse

    from omni_triton.contracts.lora import lora_dir, manifest_file

    p = argparse.ArgumentParser(description="Write a random LoRA adapter for a served Qwen-Image denoiser")
    p.add_argument("out", type=Path, help="the .safetensors to write (diffusers keys)")
    p.add_argument("--model", default="qwen_image_denoiser", help="the denoiser whose transformer it fits")
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    path = manifest_file(lora_dir(), args.model)
    if not path.is_file():
        print(f"{path} is missing: start the server and load {args.model} once (any qwen_image request)")
        return 1
    modules = json.loads(path.read_text())["modules"]
    print(write_lora(args.out, modules, rank=args.rank, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""GPU model repository generator for ``docker/`` (``docker/Dockerfile.gpu``).

The GPU repository is *generated* from the CPU one (``model_repository/`` and ``ensembles/``), not
kept as a second copy: every ``config.pbtxt`` is parsed with Triton's own ``ModelConfig`` protobuf,
a profile (``docker/gpu_profile.json``) replaces instance groups (``KIND_GPU``, count, gpus) and
parameters (real Hugging Face checkpoints in place of the embedded tiny ones), and the result is
written with the model's ``1/model.py`` binding copied beside it. Inputs, outputs, batching and
decoupled-ness are never touched, so the generated configs match the same contracts
(``tests/unit/test_deploy.py`` runs the ``tests/unit/test_contracts.py`` checks on them).

Profile format (JSON)::

    {"models": {"<model>": {"instance_group": [{"kind": "KIND_GPU", "count": 1, "gpus": [0]}],
                             "parameters": {"model_name": "Qwen3-Omni-30B-A3B-Instruct"}}},
     "slots": {"<name>": {"status": "...", "models": [...], "checkpoint": "..."}},
     "checkpoints": {"<cache folder>": "<Hugging Face repo id>"}}

``slots`` are pipelines whose stages other work adds later (Wan2.2, Qwen3-TTS): listed, not
generated. ``checkpoints`` tells the container's entrypoint what to download into the cache.
Usage: ``python -m omni_triton.deploy gpu-repository OUT [--profile docker/gpu_profile.json]``.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "model_repository", ROOT / "ensembles")
DEFAULT_PROFILE = ROOT / "docker" / "gpu_profile.json"


class ProfileError(ValueError):
    """The profile names a model that is not served, or a field ``ModelConfig`` does not have."""


def read_config(path: Path) -> model_config_pb2.ModelConfig:
    """Parse one ``config.pbtxt`` into Triton's ``ModelConfig`` (text_format.ParseError on a typo)."""
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def apply_profile(config: model_config_pb2.ModelConfig, entry: dict) -> model_config_pb2.ModelConfig:
    """Return a copy of ``config`` with ``entry``'s instance groups and parameters.

    Args:
        config: the CPU config.
        entry: ``{"instance_group": [{"kind": "KIND_GPU", "count": N, "gpus": [...]}, ...],
            "parameters": {key: string value}}``; both optional. Instance groups replace the
            config's; parameters are set (added or overwritten) one by one.

    Raises:
        ProfileError: an unknown key or instance-group field.
    """
    out = model_config_pb2.ModelConfig()
    out.CopyFrom(config)
    unknown = set(entry) - {"instance_group", "parameters", "comment"}
    if unknown:
        raise ProfileError(f"{config.name}: unknown profile keys {sorted(unknown)}")
    if "instance_group" in entry:
        del out.instance_group[:]
        for group in entry["instance_group"]:
            extra = set(group) - {"kind", "count", "gpus"}
            if extra:
                raise ProfileError(f"{config.name}: unknown instance_group fields {sorted(extra)}")
            added = out.instance_group.add()
            try:
                added.kind = model_config_pb2.ModelInstanceGroup.Kind.Value(group.get("kind", "KIND_GPU"))
            except ValueError as e:
                raise ProfileError(f"{config.name}: {e}") from e
            added.count = int(group.get("count", 1))
            added.gpus.extend(int(g) for g in group.get("gpus", []))
    for key, value in entry.get("parameters", {}).items():
        out.parameters[key].string_value = str(value)
    return out


def load_profile(path: Path = DEFAULT_PROFILE) -> dict:
    """The GPU profile (JSON, format in the module docstring)."""
    return json.loads(path.read_text())


def served_configs() -> dict[str, Path]:
    """Model name -> its CPU ``config.pbtxt`` (stages, BLS models and ensembles)."""
    return {p.parent.name: p for src in SOURCES for p in sorted(src.glob("*/config.pbtxt"))}


def gpu_repository(out: Path, profile: dict) -> list[str]:
    """Write the GPU repositories into ``out``: ``out/model_repository/<model>`` and
    ``out/ensembles/<model>``, the same split as the checkout (the GPU image moves both over its
    copy of the source tree, so ``omni-triton serve`` serves them unchanged).

    Every served model is written: those named in ``profile["models"]`` with their entry applied,
    the others (light BLS models, ensembles) unchanged. ``out`` is replaced.

    Returns:
        the model names written, sorted.

    Raises:
        ProfileError: the profile names a model that is not served.
    """
    configs = served_configs()
    unknown = set(profile) - {"comment", "models", "slots", "checkpoints"}
    if unknown:
        raise ProfileError(f"unknown profile keys {sorted(unknown)}")
    missing = set(profile.get("models", {})) - set(configs)
    if missing:
        raise ProfileError(f"profile names models that are not served: {sorted(missing)}")
    if out.exists():
        shutil.rmtree(out)
    for name, path in configs.items():
        dest = out / path.parent.parent.name / name
        shutil.copytree(path.parent, dest, ignore=shutil.ignore_patterns("__pycache__"))
        config = apply_profile(read_config(path), profile.get("models", {}).get(name, {}))
        header = f"# generated by omni_triton.deploy from {path.relative_to(ROOT)} (do not edit)\n"
        (dest / "config.pbtxt").write_text(header + text_format.MessageToString(config))
    return sorted(configs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="generate the GPU model repository")
    sub = parser.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("gpu-repository")
    gen.add_argument("out", type=Path)
    gen.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    ck = sub.add_parser("checkpoints", help="print 'cache-folder repo-id' lines of the profile")
    ck.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    args = parser.parse_args(argv)
    profile = load_profile(args.profile)
    if args.cmd == "checkpoints":
        for folder, repo in profile.get("checkpoints", {}).items():
            print(folder, repo)
        return 0
    names = gpu_repository(args.out, profile)
    print(f"{len(names)} models in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

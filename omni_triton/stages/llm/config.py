"""Engine arguments and environment of the ``llm`` stage from its ``config.pbtxt`` parameters.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- engine configuration


@dataclass
class EngineConfig:
    """What the ``llm`` model reads from its ``config.pbtxt``.

    Attributes:
        engine_args: keyword arguments of vLLM ``AsyncEngineArgs`` (``model`` made absolute).
        env: environment variables set before vLLM is imported (``VLLM_CPU_KVCACHE_SPACE``...).
        max_model_len: context length in tokens (prompt + completion).
        default_max_tokens: completion cap when a request sets no ``max_tokens``.
    """

    engine_args: dict[str, Any]
    env: dict[str, str]
    max_model_len: int
    default_max_tokens: int


def parse_engine_config(params: dict[str, str], models_root: Path) -> EngineConfig:
    """Engine arguments from the model's parameters.

    Args:
        params: the ``parameters`` of ``config.pbtxt`` as strings. ``engine_args``: JSON object of
            ``AsyncEngineArgs`` fields; its ``model`` (and ``tokenizer``) may be relative to
            ``models_root``. ``engine_env``: JSON object of environment variables.
            ``max_model_len`` (optional, read by the frontend too): must equal
            ``engine_args["max_model_len"]`` when both are set. ``default_max_tokens`` (default 512).
        models_root: the prepared models folder (``<cache>/models``).

    Raises:
        ValueError: missing/invalid JSON, no ``model``, or inconsistent ``max_model_len``.
    """
    try:
        engine_args = json.loads(params.get("engine_args", ""))
    except json.JSONDecodeError as exc:
        raise ValueError(f"parameter engine_args is not valid JSON: {exc}") from exc
    if not isinstance(engine_args, dict) or not engine_args.get("model"):
        raise ValueError("parameter engine_args must be a JSON object with a 'model'")
    try:
        env = json.loads(params.get("engine_env", "{}") or "{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"parameter engine_env is not valid JSON: {exc}") from exc
    if not isinstance(env, dict):
        raise ValueError("parameter engine_env must be a JSON object")
    for key in ("model", "tokenizer"):
        if key in engine_args and not Path(engine_args[key]).is_absolute():
            engine_args[key] = str(Path(models_root) / engine_args[key])
    declared = params.get("max_model_len")
    if "max_model_len" not in engine_args and declared:
        engine_args["max_model_len"] = int(declared)
    if "max_model_len" not in engine_args:
        raise ValueError("set max_model_len (engine_args or parameter)")
    max_model_len = int(engine_args["max_model_len"])
    if declared and int(declared) != max_model_len:
        raise ValueError(f"parameter max_model_len={declared} differs from engine_args' {max_model_len}")
    default_max_tokens = int(params.get("default_max_tokens", "512"))
    if default_max_tokens < 1:
        raise ValueError("default_max_tokens must be >= 1")
    return EngineConfig(engine_args=engine_args, env={k: str(v) for k, v in env.items()},
                        max_model_len=max_model_len, default_max_tokens=default_max_tokens)

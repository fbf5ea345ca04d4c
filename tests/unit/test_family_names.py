"""One family, one name (issue 24 item 1): every Triton model, stage package and adapter module is
named after its model family, and the family rename did not change a name OpenAI clients use."""
from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from openai_frontend.engine.model_info import model_info_from_config

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("llm", "piper", "csm", "qwen3_omni", "qwen2_5_omni", "qwen3_tts", "qwen_image", "wan", "whisper",
            "pocketsphinx", "stable_audio")
# Triton name -> the OpenAI name it had before the rename (config parameter served_model_name)
RENAMED = {"csm": "tts", "qwen3_omni": "omni", "qwen2_5_omni": "qwen25_omni", "piper": "piper_tts"}


def _config(name: str):
    return text_format.Parse((ROOT / "model_repository" / name / "config.pbtxt").read_text(),
                             model_config_pb2.ModelConfig())


@pytest.mark.parametrize("triton, api", sorted(RENAMED.items()))
def test_renamed_pipelines_keep_their_openai_name(triton, api):
    info = model_info_from_config(_config(triton))
    assert info.name == triton
    assert info.public_name == api  # what /v1/models lists and clients send as "model"


def test_every_model_folder_is_named_after_its_family():
    models = sorted(p.parent.name for p in (ROOT / "model_repository").glob("*/config.pbtxt"))
    strays = [m for m in models if not any(m == f or m.startswith(f + "_") for f in FAMILIES)]
    assert models and not strays



@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_has_its_stage_package_and_adapter(family):
    pkg = ROOT / "omni_triton"
    assert (pkg / "stages" / family / "__init__.py").is_file()
    assert (pkg / "adapters" / f"{family}.py").is_file()


# The import rules between layers (contracts/ at the bottom; runtime/, checkpoints/, media/ below
# stages/ and adapters/; family adapters independent of each other) are import-linter contracts in
# pyproject.toml, run by tests/unit/test_lint.py::test_import_contracts_hold (they also catch
# indirect chains, which the hand-written AST checks that stood here did not).


def test_the_adapter_independence_contract_names_every_family():
    """A family added to FAMILIES is also kept independent of the others by import-linter."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (independent,) = [c for c in contracts if c["type"] == "independence"]
    assert sorted(independent["modules"]) == sorted(f"omni_triton.adapters.{f}" for f in FAMILIES)


def test_a_pipeline_whose_stage_is_down_keeps_its_openai_name():
    """`model="tts"` while csm_talker is unloaded is a 503 naming the stage, not a 404: the
    UNAVAILABLE copy keeps served_model_name (tests/e2e/test_speech_codec.py checks it served)."""
    from openai_frontend.engine.model_info import ModelInfo, unready_dependencies

    info = ModelInfo(name="csm", served_model_name="tts", depends_on=("csm_talker", "csm_code2wav"))
    down = unready_dependencies(info, {"csm_talker": ("UNAVAILABLE", ""), "csm_code2wav": ("READY", "")})
    assert not down.ready and "csm_talker" in down.reason
    assert down.served_model_name == "tts"

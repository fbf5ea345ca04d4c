"""docker/gpu_profile.json through omni_triton.deploy: the generated GPU repository holds every
served model, each config still matches its contract (the test_contracts.py check), the profiled
stages run as KIND_GPU with the real checkpoints, nothing else changes, and profile mistakes are
refused."""
import json

import pytest
from test_contracts import test_config_matches_contract  # the same check the CPU configs pass

from omni_triton import deploy

PROFILE = deploy.load_profile()


@pytest.fixture(scope="module")
def gpu_repo(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "model_repository"
    names = deploy.gpu_repository(out, PROFILE)
    assert names == sorted(deploy.served_configs())
    return out


@pytest.mark.parametrize("model", sorted(deploy.served_configs()))
def test_generated_config_matches_contract(gpu_repo, model):
    source = deploy.served_configs()[model]
    path = gpu_repo / source.parent.parent.name / model / "config.pbtxt"
    test_config_matches_contract(path)
    cpu = deploy.read_config(deploy.served_configs()[model])
    gpu = deploy.read_config(path)
    if model in PROFILE["models"]:
        entry = PROFILE["models"][model]
        for key, value in entry.get("parameters", {}).items():
            assert gpu.parameters[key].string_value == value
        if "instance_group" in entry:
            assert [g.kind for g in gpu.instance_group] == [deploy.model_config_pb2.ModelInstanceGroup.KIND_GPU]
        if (path.parent / "1").exists():
            assert (path.parent / "1" / "model.py").read_text() == \
                (deploy.served_configs()[model].parent / "1" / "model.py").read_text()
    else:
        assert gpu == cpu


def test_every_heavy_stage_is_on_the_gpu():
    """The stages that hold model weights (diffusion, Omni, the vLLM LLM) are profiled KIND_GPU."""
    heavy = [m for m in deploy.served_configs()
             if m.startswith(("qwen_image", "qwen3_omni_", "stable_audio_"))
             and m not in ("qwen_image", "qwen_image_edit", "qwen_image_edit_plus", "qwen_image_inpaint")] + ["llm"]
    # the prefixes must keep matching after a rename (they matched nothing after tts/omni became csm/qwen3_omni)
    assert {"qwen3_omni_thinker", "qwen3_omni_talker", "qwen_image_denoiser"} <= set(heavy)
    for model in heavy:
        assert PROFILE["models"][model]["instance_group"][0]["kind"] == "KIND_GPU", model
    assert set(PROFILE["slots"]) == {"wan2_2", "qwen3_tts"}
    engine = json.loads(PROFILE["models"]["llm"]["parameters"]["engine_args"])
    assert engine["model"] in PROFILE["checkpoints"]


def test_profile_mistakes_are_refused(tmp_path):
    with pytest.raises(deploy.ProfileError, match="not served"):
        deploy.gpu_repository(tmp_path / "r", {"models": {"no_such_model": {}}})
    with pytest.raises(deploy.ProfileError, match="unknown instance_group fields"):
        deploy.gpu_repository(tmp_path / "r", {"models": {"llm": {"instance_group": [{"kind": "KIND_GPU", "gpu": 0}]}}})
    with pytest.raises(deploy.ProfileError, match="KIND_TPU"):
        deploy.gpu_repository(tmp_path / "r", {"models": {"llm": {"instance_group": [{"kind": "KIND_TPU"}]}}})
    with pytest.raises(deploy.ProfileError, match="unknown profile keys"):
        deploy.gpu_repository(tmp_path / "r", {"model": {}})

"""The model graph of omni_triton.serve.repository that serve's stub watch acts on (and on-demand
loading will reuse): who hangs when a stub dies (``dependents``), which decoupled callees of a BLS
model are restarted with it (``stream_callees``), and which models lack a stub
(``server.missing_instances``). Throw-away repositories, no tritonserver."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from omni_triton.cli import build_parser
from omni_triton.serve.repository import dependents, on_demand_pipelines, stream_callees
from omni_triton.serve.server import missing_instances
from omni_triton.serve.supervisor import on_demand_args


def _model(repo: Path, name: str, extra: str = "", backend: str = "python") -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent(f"""\
        name: "{name}"
        backend: "{backend}"
        max_batch_size: 0
        input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        """) + extra + "\n")
    return folder


def _depends_on(*names: str) -> str:
    return f'parameters {{ key: "depends_on" value {{ string_value: "{", ".join(names)}" }} }}'


DECOUPLED = "model_transaction_policy { decoupled: true }"


def test_dependents_follow_the_graph_transitively_and_only_among_loaded(tmp_path):
    _model(tmp_path, "stage")
    _model(tmp_path, "bls", _depends_on("stage"))
    _model(tmp_path, "outer", _depends_on("bls"))  # needs stage only through bls
    _model(tmp_path, "other")
    loaded = ["outer", "bls", "stage", "other"]  # a dependent listed before what it needs
    assert dependents("stage", loaded, [tmp_path]) == ["outer", "bls", "stage"]
    assert dependents("bls", loaded, [tmp_path]) == ["outer", "bls"]
    assert dependents("stage", ["stage", "outer"], [tmp_path]) == ["stage"]  # bls not loaded
    assert dependents("ghost", loaded, [tmp_path]) == ["ghost"]


def test_stream_callees_are_the_loaded_decoupled_models_a_bls_reads(tmp_path):
    _model(tmp_path, "talker", DECOUPLED)
    _model(tmp_path, "code2wav", DECOUPLED)
    _model(tmp_path, "plain")  # not decoupled: a dead caller does not wedge it
    _model(tmp_path, "bls", _depends_on("talker", "plain", "code2wav"))
    _model(tmp_path, "notbls", _depends_on("talker"), backend="onnxruntime")
    loaded = ["talker", "code2wav", "plain", "bls", "notbls"]
    assert stream_callees("bls", loaded, [tmp_path]) == ["talker", "code2wav"]
    assert stream_callees("bls", ["talker", "bls"], [tmp_path]) == ["talker"]
    assert stream_callees("notbls", loaded, [tmp_path]) == []
    assert stream_callees("talker", loaded, [tmp_path]) == []  # no depends_on
    assert stream_callees("ghost", loaded, [tmp_path]) == []


def test_missing_instances_counts_each_instance():
    assert missing_instances({"a": 2, "b": 1, "c": 1}, {"a": 1, "b": 1}) == ["a", "c"]
    assert missing_instances({"a": 2}, {"a": 2}) == []


def test_a_served_model_name_selects_its_triton_model():
    """`serve --models tts` kept working through the family rename: the OpenAI name resolves to
    the Triton model that serves it (csm), with its stages."""
    from omni_triton.serve.repository import resolve_models, triton_name

    assert triton_name("tts") == "csm"
    assert triton_name("piper_tts") == "piper"
    assert triton_name("llm") == "llm"
    assert resolve_models(["tts"]) == resolve_models(["csm"])
    assert resolve_models(["tts"])[-1] == "csm"


def _served_as(name: str) -> str:
    return f'parameters {{ key: "served_model_name" value {{ string_value: "{name}" }} }}'


def test_on_demand_all_is_every_pipeline_not_started_by_triton_name(tmp_path):
    _model(tmp_path, "piper", _served_as("piper_tts"))
    _model(tmp_path, "stage")
    _model(tmp_path, "bls", _depends_on("stage"))
    _model(tmp_path, "llm")
    pipelines = ["piper_tts", "bls", "llm"]
    # a started OpenAI name (piper_tts) excludes its Triton model; a pipeline that merely shares
    # a model with the started ones stays on demand
    assert on_demand_pipelines("all", ["piper_tts", "stage"], pipelines, [tmp_path]) == ["bls", "llm"]
    assert on_demand_pipelines("none", [], pipelines, [tmp_path]) == []
    assert on_demand_pipelines("llm, piper_tts,llm", ["stage"], pipelines, [tmp_path]) == ["llm", "piper"]


def test_on_demand_names_an_unknown_model(tmp_path):
    _model(tmp_path, "bls", _depends_on("gone"))
    with pytest.raises(KeyError, match="gone"):
        on_demand_pipelines("bls", [], ["bls"], [tmp_path])


def test_serve_passes_on_demand_flags_to_the_frontend(tmp_path):
    args = build_parser().parse_args(["serve", "--keep-alive", "60", "--memory-budget", "6GiB",
                                      "--load-timeout", "30"])
    assert args.models == "piper" and args.on_demand == "all"
    flags = on_demand_args(args, ["csm", "qwen3_tts"], [tmp_path])
    assert flags == ["--on-demand", "csm,qwen3_tts", "--keep-alive", "60.0", "--load-timeout", "30.0",
                     "--memory-budget", str(6 << 30), "--model-repository", str(tmp_path)]
    assert on_demand_args(args, [], [tmp_path]) == []  # nothing on demand: the frontend as before
    from openai_frontend.__main__ import parse_args

    parsed = parse_args(flags)  # the frontend accepts every flag serve passes
    assert parsed.on_demand == "csm,qwen3_tts" and parsed.model_repository == [str(tmp_path)]
    assert parsed.memory_budget == 6 << 30 and parsed.keep_alive == 60.0


@pytest.mark.parametrize("size", ["lots", "0", "-1GiB"])
def test_a_memory_budget_that_is_not_a_size_is_refused(size, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--memory-budget", size])
    assert "--memory-budget" in capsys.readouterr().err

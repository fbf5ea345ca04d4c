"""Every ``config.pbtxt`` of ``model_repository/`` and ``ensembles/`` matches its contract in
``omni_triton.contracts`` (names, datatypes, dims, optional flags, decoupled-ness, batching), and
the contracts package stays torch-free (the frontend imports it)."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from omni_triton.contracts import CONTRACTS, chat, image, probe, speech
from omni_triton.contracts import csm as cs
from omni_triton.contracts.tensors import (
    InputError,
    audio_outputs,
    first_float,
    first_int,
    first_str,
    first_value,
    infer_input,
    scalar_int,
    triton_datatype,
    utf8_array,
    wrap_inputs,
)

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(ROOT.glob("model_repository/*/config.pbtxt")) + sorted(ROOT.glob("ensembles/*/config.pbtxt"))
# config.pbtxt spells datatypes TYPE_<X>; BYTES tensors are TYPE_STRING there.
_CONFIG_TYPE = {"BYTES": "TYPE_STRING"}


def _config(path: Path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def _tensors(entries):
    return {t.name: (model_config_pb2.DataType.Name(t.data_type), tuple(t.dims), getattr(t, "optional", False))
            for t in entries}


def _spec(tensors, with_optional=True):
    return {t.name: (_CONFIG_TYPE.get(t.datatype, f"TYPE_{t.datatype}"), t.dims, t.optional if with_optional else False)
            for t in tensors}


def test_every_model_has_a_contract():
    names = {p.parent.name for p in CONFIGS}
    assert names == set(CONTRACTS), (names ^ set(CONTRACTS))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.parent.name)
def test_config_matches_contract(path):
    config = _config(path)
    contract = CONTRACTS[path.parent.name]
    assert config.name == path.parent.name
    assert _tensors(config.input) == _spec(contract.inputs)
    assert _tensors(config.output) == _spec(contract.outputs, with_optional=False)
    assert config.model_transaction_policy.decoupled == contract.decoupled
    assert (config.max_batch_size > 0) == contract.batched


def test_the_check_fails_on_a_drifted_config(tmp_path):
    """The comparison above notices a renamed tensor, a wrong dtype and a lost optional flag."""
    text = (ROOT / "model_repository/csm/config.pbtxt").read_text()
    contract = CONTRACTS["csm"]
    for old, new in [('name: "AUDIO"', 'name: "PCM"'), ("TYPE_FP32 dims: [ -1 ]", "TYPE_INT16 dims: [ -1 ]"),
                     ("TYPE_INT32 dims: [ 1 ] optional: true", "TYPE_INT32 dims: [ 1 ]")]:
        assert old in text
        broken = text_format.Parse(text.replace(old, new, 1), model_config_pb2.ModelConfig())
        assert (_tensors(broken.input), _tensors(broken.output)) != (_spec(contract.inputs),
                                                                     _spec(contract.outputs, False))


def test_contracts_do_not_import_torch():
    code = "import sys, omni_triton.contracts; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_bytes_helpers_round_trip():
    array = utf8_array("héllo ☃")
    assert array.dtype == np.object_ and array.shape == (1,) and first_str(array) == "héllo ☃"
    assert first_str(None) is None and first_str(np.zeros(0, np.object_)) is None
    with pytest.raises(UnicodeEncodeError):
        utf8_array("\ud800")


def test_scalar_readers():
    assert first_int(np.array([[7]], np.int32)) == 7 and type(first_int(np.array([7], np.int64))) is int
    assert first_float(np.array([0.5], np.float32)) == 0.5 and first_value(np.array([b"x"], np.object_)) == b"x"
    assert first_int(None) is None and first_float(np.zeros(0, np.float32)) is None
    assert scalar_int(np.array([3], np.int32), "N") == 3
    with pytest.raises(chat.ChatInputError, match="PROMPT_LEN is missing or empty"):
        scalar_int(np.zeros(0, np.int32), "PROMPT_LEN", chat.ChatInputError)
    with pytest.raises(InputError):
        scalar_int(None, "SEED")


def _as_triton(outputs):
    """Outputs as a stage's response carries them (str -> BYTES [1])."""
    return {k: utf8_array(v) if isinstance(v, str) else v for k, v in outputs.items()}


def test_text_response_round_trip_matches_the_chat_contracts():
    out = chat.text_response("Grüße", "stop", 5, 2)
    for contract in (CONTRACTS["llm"], CONTRACTS["qwen3_omni_thinker"], CONTRACTS["qwen2_5_omni_thinker"]):
        specs = {t.name: t for t in contract.outputs}
        for name, value in _as_triton(out).items():
            assert triton_datatype(value) == specs[name].datatype and value.shape == specs[name].dims
    back = chat.TextResponse.from_tensors(_as_triton(out))
    assert back == chat.TextResponse("Grüße", "stop", 5, 2) and back.counts == (5, 2)
    with pytest.raises(KeyError):
        chat.TextResponse.from_tensors({chat.TEXT_DELTA: utf8_array("x")})
    audio = audio_outputs(np.arange(4, dtype=np.float64)[::2], 24000)
    assert audio[chat.AUDIO].dtype == np.float32 and audio[chat.AUDIO].flags.c_contiguous
    assert audio_outputs(None, 16000)[chat.AUDIO].shape == (0,) and first_int(audio[chat.SAMPLE_RATE]) == 24000


class _FakeInferInput:
    def __init__(self, name, shape, datatype):
        self.name, self.shape, self.datatype, self.data = name, shape, datatype, None

    def set_data_from_numpy(self, array):
        self.data = array


def test_chat_inputs_builder():
    pairs = chat.chat_inputs(messages=[{"role": "user", "content": "Grüße"}], sampling={"max_tokens": 3},
                             modalities=["text"], voice="joe", declared={"MESSAGES", "SAMPLING_PARAMETERS"})
    assert [n for n, _ in pairs] == [chat.MESSAGES, chat.SAMPLING_PARAMETERS]  # undeclared ones left out
    assert "Grüße" in first_str(pairs[0][1])
    assert [n for n, _ in chat.chat_inputs(prompt="hi", sampling={})] == [chat.PROMPT]
    wrapped = wrap_inputs(chat.chat_inputs(prompt="hi", voice="joe"), lambda n, a: infer_input(_FakeInferInput, n, a))
    assert [(t.name, t.shape, t.datatype) for t in wrapped] == [("PROMPT", [1], "BYTES"), ("VOICE", [1], "BYTES")]
    assert {triton_datatype(a) for _, a in image.image_inputs("p", width=16, height=16, steps=2, seed=1)} == {
        "BYTES", "INT32", "FP32", "INT64"}
    assert [n for n, _ in speech.speech_inputs("t", speed=1.0, max_frames=5)] == ["TEXT", "SPEED", "MAX_FRAMES"]


def test_one_sampling_parser_for_every_chat_model():
    assert chat.parse_sampling(None) == {}
    assert chat.parse_sampling('{"stop": "x", "top_k": null}') == {"stop": ["x"]}
    for bad in ['{"temperature": -1}', '{"max_tokens": 0}', '{"top_p": 0}', "[1]", "nope", '{"stop": [1]}',
                '{"stop": [""]}', '{"min_tokens": 9, "max_tokens": 3}', '{"best_of": 2}', '{"max_tokens": 1.5}',
                '{"max_tokens": true}', '{"seed": 18446744073709551616}']:
        with pytest.raises(chat.ChatInputError):
            chat.parse_sampling(bad)
    with pytest.raises(chat.ChatInputError, match="not supported by this model"):
        chat.parse_sampling('{"min_p": 0.1}', supported=("temperature", "max_tokens"))


def test_frame_budget_follows_the_input_length():
    budget = cs.FrameBudget(frames_per_char=2.5, floor=100)
    assert budget.for_text("Hi.") == 100
    long_text = "word " * 200  # 1000 characters: far more than 8 s of speech
    assert budget.for_text(long_text) == 2500 > 100
    with pytest.raises(ValueError):
        cs.FrameBudget(frames_per_char=0)


@pytest.mark.parametrize("name", sorted(probe.CONTRACTS))
def test_probe_configs_match_their_contracts(name):
    """The diagnostic models of clients/probe_repository/ (issue 9 reproduction)."""
    config = _config(ROOT / "clients" / "probe_repository" / name / "config.pbtxt")
    contract = probe.CONTRACTS[name]
    assert config.name == name
    assert _tensors(config.input) == _spec(contract.inputs)
    assert _tensors(config.output) == _spec(contract.outputs, with_optional=False)
    assert config.model_transaction_policy.decoupled == contract.decoupled


@pytest.mark.parametrize("path", sorted(ROOT.glob("ensembles/*/config.pbtxt")), ids=lambda p: p.parent.name)
def test_no_ensemble_runs_two_steps_of_a_request_at_once(path):
    """Every two steps of an ensemble depend on each other, one way (a chain, never a fork):
    Triton 2.51 never ends an ensemble request whose step failed while another of its steps was
    running (``EnsembleContext::PrepareSteps`` drops that step's completion; fixed upstream in
    core #466). qwen_image_edit's parallel text/VAE encoders left every bad condition image (and
    every cancel in that phase) in flight forever: the model could no longer unload and each CI
    shutdown waited out Triton's exit timeout."""
    steps = _config(path).ensemble_scheduling.step
    produced = [set(s.output_map.values()) for s in steps]
    after = {i: {j for j in range(len(steps)) if produced[j] & set(steps[i].input_map.values())}
             for i in range(len(steps))}  # i reads an output of each j
    changed = True
    while changed:  # transitive closure
        changed = False
        for i in after:
            more = set().union(*(after[j] for j in after[i])) - after[i]
            if more:
                after[i] |= more
                changed = True
    forks = [(steps[i].model_name, steps[j].model_name) for i in range(len(steps)) for j in range(i)
             if i not in after[j] and j not in after[i]]
    assert not forks, f"steps that can run at once: {forks}"

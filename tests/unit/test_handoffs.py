"""The named stage-to-stage hand-offs of ``omni_triton.contracts`` (``thinker_to_talker``,
``talker_to_code2wav``, the CSM and Qwen2.5-Omni ones) against the ``config.pbtxt`` of the stages that
produce and consume them: every tensor a hand-off builds is declared there with its datatype and
rank (batch dim included for batched models), every required input is built, and
``from_tensors(to_tensors())`` gives the hand-off back."""
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from omni_triton.contracts import codec as cd
from omni_triton.contracts import csm as cs
from omni_triton.contracts import omni_stages as om
from omni_triton.contracts import qwen2_5_omni as q25
from omni_triton.contracts import qwen3_omni as q3

ROOT = Path(__file__).resolve().parents[2]
H = 4  # hidden size of the example tensors
_TYPE = {np.dtype(np.int64): "TYPE_INT64", np.dtype(np.int32): "TYPE_INT32", np.dtype(np.float32): "TYPE_FP32",
         np.dtype(np.bool_): "TYPE_BOOL", np.dtype(np.object_): "TYPE_STRING"}


def _config(model: str):
    path = ROOT / "model_repository" / model / "config.pbtxt"
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def _thinker_to_talker(**kw):
    return om.ThinkerToTalker(np.arange(6, dtype=np.int64), 3, np.ones((5, H), np.float32), np.ones((5, H), np.float32),
                              np.ones((3, H), np.float32), **kw)


# (hand-off, models whose outputs carry its tensors, models that take it as inputs)
HANDOFFS = {
    "thinker_to_talker": (_thinker_to_talker(voice="Ethan", max_frames=8),
                          ["qwen3_omni_thinker", "qwen2_5_omni_thinker"], ["qwen3_omni_talker", "qwen2_5_omni_talker"]),
    "thinker_to_talker+media": (_thinker_to_talker(media=((q3.AUDIO_FEATURE_LENGTHS, np.array([7], np.int64)),
                                                           (q3.IMAGE_GRID_THW, np.ones((1, 3), np.int64)))),
                                [], ["qwen3_omni_talker"]),
    "talker_to_code2wav": (cd.TalkerToCode2Wav(np.zeros((4, 16), np.int64), 1),
                           ["csm_talker", "qwen3_omni_talker"], ["csm_code2wav", "qwen3_omni_code2wav"]),
    "talker_to_code2wav+due": (cd.TalkerToCode2Wav(np.zeros((4, 16), np.int64), 1, due_s=-0.25), [],
                               ["qwen3_tts_code2wav"]),
    "csm_to_talker": (cs.CsmToTalker("Hello there.", 1, max_frames=8, min_frames=2, paced=True), [], ["csm_talker"]),
    "talker_to_token2wav": (q25.TalkerToToken2Wav(np.arange(5, dtype=np.int64), "Chelsie", 3), ["qwen2_5_omni_talker"],
                            ["qwen2_5_omni_token2wav"]),
}


def _check(name, array, spec, batched):
    assert _TYPE[array.dtype] == model_config_pb2.DataType.Name(spec.data_type), name
    dims = ([-1] if batched else []) + list(spec.dims)
    assert array.ndim == len(dims), (name, array.shape, dims)
    assert all(d in (-1, n) for d, n in zip(dims, array.shape, strict=True)), (name, array.shape, dims)


@pytest.mark.parametrize("key", sorted(HANDOFFS))
def test_handoff_matches_the_consuming_configs(key):
    handoff, _, consumers = HANDOFFS[key]
    tensors = handoff.to_tensors()
    assert len({n for n, _ in tensors}) == len(tensors)
    for model in consumers:
        config = _config(model)
        inputs = {t.name: t for t in config.input}
        for name, array in tensors:
            assert name in inputs, f"{model} does not declare {name}"
            _check(f"{model}:{name}", array, inputs[name], config.max_batch_size > 0)
        missing = {t.name for t in config.input if not t.optional} - {n for n, _ in tensors}
        assert not missing, f"{key} leaves out {model}'s required {missing}"


@pytest.mark.parametrize("key", sorted(k for k, v in HANDOFFS.items() if v[1]))
def test_handoff_matches_the_producing_configs(key):
    handoff, producers, _ = HANDOFFS[key]
    for model in producers:
        config = _config(model)
        outputs = {t.name: t for t in config.output}
        produced = [(n, a) for n, a in handoff.to_tensors() if n in outputs]
        assert produced, f"{model} produces none of {key}"
        for name, array in produced:
            # a stage's response has no batch dim; the batched consumer's inputs add one
            _check(f"{model}:{name}", array[0] if config.max_batch_size == 0 and array.ndim > len(outputs[name].dims)
                   else array, outputs[name], False)


def _equal(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.allclose(np.asarray(a, float), np.asarray(b, float)) and np.shape(a) == np.shape(b)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(x[0] == y[0] and _equal(x[1], y[1]) for x, y in zip(a, b, strict=True))
    return a == pytest.approx(b) if isinstance(a, float) else a == b


@pytest.mark.parametrize("key", sorted(HANDOFFS))
def test_handoff_round_trips(key):
    handoff = HANDOFFS[key][0]
    kw = {"media_names": q3.TALKER_MEDIA_TENSORS.values()} if isinstance(handoff, om.ThinkerToTalker) else {}
    back = type(handoff).from_tensors(dict(handoff.to_tensors()), **kw)
    for f in fields(handoff):
        assert _equal(getattr(back, f.name), getattr(handoff, f.name)), f.name


def test_thinker_to_talker_reads_a_thinker_response():
    thinker_out = {**_thinker_to_talker().thinker_outputs(), "TEXT_DELTA": np.array([b""], np.object_)}
    handoff = om.thinker_to_talker(thinker_out, "Ethan", max_frames=5)
    assert handoff.generated_tokens == 3 and handoff.voice == "Ethan" and handoff.max_frames == 5
    assert [n for n, _ in handoff.to_tensors()] == [*om.TALKER_TENSORS, "VOICE", "MAX_FRAMES"]
    with pytest.raises(KeyError):
        om.thinker_to_talker({om.SEQUENCE: np.arange(3)})


def test_csm_to_talker_needs_text():
    from omni_triton.contracts.speech import SpeechInputError

    with pytest.raises(SpeechInputError, match="TEXT is required"):
        cs.CsmToTalker.from_tensors({cs.SPEAKER: np.array([1], np.int32)})
    assert cs.CsmToTalker.from_tensors(dict(cs.CsmToTalker("hi").to_tensors())) == cs.CsmToTalker("hi")


@pytest.mark.parametrize("generated", [1, 2])
def test_the_omni_bls_hands_the_thinker_outputs_to_its_talker(monkeypatch, generated):
    """``OmniPipelineBase._think``: the thinker's last response becomes the talker's inputs (the
    five talker tensors, VOICE, the prompt's media positions, which the thinker's processor made
    and its last response carries, MAX_FRAMES), and nothing under two generated tokens is spoken."""
    import sys
    from types import SimpleNamespace

    from tests.unit import fake_pb_utils as pb

    sys.modules.setdefault("triton_python_backend_utils", pb)
    from omni_triton.adapters import omni_stages
    from omni_triton.adapters.qwen3_omni import Qwen3OmniPipeline
    from omni_triton.contracts import chat as ch
    from omni_triton.contracts.tensors import utf8_array

    thinker = om.ThinkerToTalker(np.arange(3 + generated, dtype=np.int64), 3, np.ones((2 + generated, H), np.float32),
                                 np.zeros((2 + generated, H), np.float32), np.ones((3, H), np.float32))
    final = {**thinker.thinker_outputs(), **{k: utf8_array(v) if isinstance(v, str) else v
                                             for k, v in ch.text_response("Hi", "stop", 3, generated).items()}}
    final[q3.AUDIO_FEATURE_LENGTHS] = np.array([7], np.int64)  # a multimodal prompt's, from the thinker
    asked = []

    def stream_stage(model, inputs, outputs, *args, **kwargs):
        asked.extend(outputs)
        return iter([final])

    monkeypatch.setattr(omni_stages, "stream_stage", stream_stage)
    bls = object.__new__(Qwen3OmniPipeline)
    bls.stage_flags, bls.sample_rate = None, 24000
    job = omni_stages.OmniJob([(ch.MESSAGES, utf8_array("[]"))], True, "Ethan", 9, media=True)
    run = bls._think(job, SimpleNamespace(cancel_seen=False, cancelled=lambda: False), "t")
    with pytest.raises(StopIteration) as done:
        while True:
            next(run)
    talker_in, counts = done.value.value
    assert counts == (3, generated)
    assert set(q3.TALKER_MEDIA_TENSORS.values()) <= set(asked)  # the BLS asks the thinker for them
    if generated < 2:
        assert talker_in is None
        return
    names = [n for n, _ in talker_in]
    assert names == [*om.TALKER_TENSORS, "VOICE", q3.AUDIO_FEATURE_LENGTHS, "MAX_FRAMES"]
    got = dict(talker_in)
    assert np.array_equal(got[om.SEQUENCE], thinker.sequence) and got[om.PROMPT_LEN].tolist() == [3]
    assert np.array_equal(got[om.THINKER_HIDDEN], thinker.hidden) and got["MAX_FRAMES"].tolist() == [9]

"""What the ``qwen3_omni`` stages send downstream for a PACED answer (one played as it arrives): the
omni BLS passes PACED on to qwen3_omni_talker on both of its paths (speaking while thinking, and after
the thinker), and qwen3_omni_talker passes it on to qwen3_omni_thinker, so their frame / token deadlines come
in low-water groups (docs/scheduling.md, "Chunks that keep the listener fed"). Qwen2.5-Omni's
stages declare no PACED and never send it. No Triton: ``stream_stage`` is replaced by a recorder."""
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tests.unit import fake_pb_utils as pb

sys.modules.setdefault("triton_python_backend_utils", pb)

from omni_triton.adapters import omni_stages, qwen2_5_omni  # noqa: E402
from omni_triton.adapters import qwen3_omni as omni  # noqa: E402
from omni_triton.contracts import chat as ch  # noqa: E402
from omni_triton.contracts import omni_stages as om  # noqa: E402
from omni_triton.contracts.tensors import PACED, utf8_array  # noqa: E402

TEXT = {ch.TEXT_DELTA: utf8_array("Hi"), ch.FINISH_REASON: utf8_array("stop"),
        ch.PROMPT_TOKENS: np.array([3], np.int32), ch.COMPLETION_TOKENS: np.array([1], np.int32)}


@pytest.fixture
def sent(monkeypatch):
    """model -> the input names of each stream_stage call to it (each stream answers one text
    response: no audio, so nothing is decoded)."""
    calls: dict[str, list[set]] = {}

    def fake_stream_stage(model, inputs, outputs, *args, **kwargs):
        calls.setdefault(model, []).append({name for name, _ in inputs})
        yield dict(TEXT)

    monkeypatch.setattr(omni, "stream_stage", fake_stream_stage)
    return calls


def _stream(paced):
    return SimpleNamespace(paced=paced, cancel_seen=False, cancelled=lambda: False)


def _bls(cls):
    bls = object.__new__(cls)
    bls.chunks = {"first_chunk_frames": 5, "chunk_frames": 25, "left_context_frames": 25, "low_water_s": 0.6,
                  "frame_rate_hz": 12.5}
    bls.stage_flags, bls.sample_rate = None, 24000
    return bls


@pytest.mark.parametrize("async_chunk", [True, False], ids=["speak-while-thinking", "after-the-thinker"])
@pytest.mark.parametrize("paced", [True, False])
def test_omni_passes_paced_on_to_its_talker(sent, monkeypatch, async_chunk, paced):
    bls = _bls(omni.Qwen3OmniPipeline)
    job = omni_stages.OmniJob(inputs=[(ch.PROMPT, utf8_array("Hello"))], audio=True, voice="Ethan", max_frames=None,
                        async_chunk=async_chunk, paced=paced)
    if not async_chunk:  # the thinker's finished outputs, as _think returns them
        monkeypatch.setattr(omni.Qwen3OmniPipeline, "_think", lambda self, job, stream, prefix: _talker_in())
    list(bls.generate(job, _stream(paced)))
    (talker_inputs,) = sent["qwen3_omni_talker"]
    assert (PACED in talker_inputs) == paced


def _talker_in():
    return [(om.SEQUENCE, np.zeros(4, np.int64))], (3, 1)
    yield  # a generator, as _think is


@pytest.mark.parametrize("paced", [True, False])
def test_omni_talker_passes_paced_on_to_the_thinker_it_streams(sent, paced):
    talker = object.__new__(omni.Qwen3OmniTalkerStage)
    talker.thinker_model, talker.flags, talker.step_scheduler = "qwen3_omni_thinker", None, None
    talker.talker = SimpleNamespace(stream_while_thinking=lambda steps, *a, **k: iter(list(steps)))
    talker.metrics = SimpleNamespace(count=lambda *a: None)
    job = omni.AsyncTalkerJob([(ch.PROMPT, utf8_array("Hello"))], "Ethan", None)
    list(talker.generate(job, _stream(paced)))
    (thinker_inputs,) = sent["qwen3_omni_thinker"]
    assert (PACED in thinker_inputs) == paced


def test_qwen25_omni_stages_never_send_paced():
    """Their callees declare no PACED (Triton would refuse a request that carried it), so the
    Qwen2.5 subclasses of these stages switch passing it off."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "model_repository"
    for cls, callee in [(qwen2_5_omni.Qwen25OmniPipeline, "qwen2_5_omni_talker"),
                        (qwen2_5_omni.Qwen25OmniTalkerStage, "qwen2_5_omni_thinker"),
                        (omni.Qwen3OmniPipeline, "qwen3_omni_talker"),
                        (omni.Qwen3OmniTalkerStage, "qwen3_omni_thinker")]:
        declares = '"PACED"' in (root / callee / "config.pbtxt").read_text()
        assert cls.pass_paced == declares, (cls.__name__, callee)

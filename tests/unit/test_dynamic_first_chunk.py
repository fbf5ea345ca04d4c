"""The codec talkers' dynamic first chunk (docs/scheduling.md "The first chunk"; vLLM-Omni's dynamic
initial chunk): the size rule, its config, the talker's first response of that size, the load
signal (open streams of the BLS across its instances), and the joined stream against one full
decode for every first-chunk size, with no gap or click at the joins. No Triton."""
from __future__ import annotations

import contextlib
import sys

import numpy as np
import pytest

from omni_triton.stages import chunking
from tests.unit import fake_pb_utils as pb

sys.modules.setdefault("triton_python_backend_utils", pb)


@pytest.mark.parametrize("active, size", [(0, 2), (1, 2), (2, 4), (3, 4), (4, 8), (6, 8), (7, 16), (8, 16), (30, 16)])
def test_the_first_chunk_grows_with_the_open_streams(active, size):
    """vLLM-Omni's rule with capacity 8 (csm's instance count): steps 2, 4, 8, 16 at index
    round(min(active / 8, 1) * 3)."""
    assert chunking.dynamic_initial_chunk_frames(active, 8, 2, 16) == size


def test_steps_and_bounds():
    assert chunking.initial_chunk_steps(2, 16) == [2, 4, 8, 16]
    assert chunking.initial_chunk_steps(2, 25) == [2, 4, 8, 16]  # the largest power below a 25-frame chunk
    assert chunking.initial_chunk_steps(5, 5) == [5]
    assert chunking.dynamic_initial_chunk_frames(3, 0) == 2  # no capacity known: idle
    for lo, hi in [(0, 16), (8, 4)]:
        with pytest.raises(ValueError):
            chunking.initial_chunk_steps(lo, hi)


def test_initial_chunk_config():
    off = chunking.InitialChunk.from_params({}, 25, 8)
    assert off.frames(7, fixed=5) == 5  # neither bound: the fixed first_chunk_frames
    on = chunking.InitialChunk.from_params({"initial_chunk_frames_min": "2", "initial_chunk_frames_max": "16"}, 25, 8)
    assert (on.frames(0, 5), on.frames(7, 5)) == (2, 16)
    for bad in ({"initial_chunk_frames_min": "2"}, {"initial_chunk_frames_min": "2", "initial_chunk_frames_max": "32"},
                {"initial_chunk_frames_min": "0", "initial_chunk_frames_max": "4"}):
        with pytest.raises(ValueError):
            chunking.InitialChunk.from_params(bad, 25, 8)
    assert chunking.instance_count({"model_config": '{"instance_group": [{"count": 8, "kind": "KIND_CPU"}]}'}) == 8
    assert chunking.instance_count({"model_config": "{}"}) == 1


@pytest.mark.parametrize("first", [2, 4, 8, 16])
def test_the_talker_s_first_response_is_the_first_chunk_and_later_chunks_stay_on_group_boundaries(first):
    """csm_talker's FrameGroups(emit_frames=5, first): the first response holds the first chunk's
    frames (ready on its last frame, not on the 5th), later responses 5 each; every chunk boundary
    of the BLS (first + 25 k) falls on a response boundary."""
    groups = chunking.FrameGroups(5, first)
    ends, total = [], 0
    for i in range(80):
        out = groups.push(np.full((1, 4), i, np.int64))
        if out is not None:
            total += len(out)
            ends.append(total)
            if len(ends) == 1:
                assert i + 1 == first  # sent on the frame that completes the first chunk
    assert ends[0] == first and all(b - a == 5 for a, b in zip(ends, ends[1:], strict=False))
    assert {first + 25 * k for k in range(3)} <= set(ends)
    with pytest.raises(ValueError):
        chunking.FrameGroups(5, 0)


def test_the_csm_talker_sends_and_schedules_the_request_s_first_chunk():
    from omni_triton.contracts import csm as cs
    from omni_triton.contracts.codec import CODES
    from omni_triton.runtime.stage_policy import PlaybackPolicy
    from tests.helpers.fake_csm_talker import OpenStream, fake_csm_talker_stage

    stage = fake_csm_talker_stage(12, 5)
    stage.playback = PlaybackPolicy("csm_talker", {"deadline_unit": "frames", "first_chunk_frames": "5"}, CODES)
    handoff = cs.CsmToTalker.from_tensors(dict(cs.CsmToTalker("Hi.", first_chunk_frames=2).to_tensors()))
    assert handoff.first_chunk_frames == 2
    job = ("Hi.", 0, 0, 12, handoff.first_chunk_frames)
    sizes = [len(s[CODES]) for s in stage.generate(job, OpenStream()) if s is not None]
    assert sizes == [2, 5, 5]
    assert stage.playback_deadline(0.0, job).first_chunk_frames == 2
    assert stage.playback_deadline(0.0, job[:4]).first_chunk_frames == 5  # no FIRST_CHUNK_FRAMES: the config's
    with pytest.raises(Exception, match="FIRST_CHUNK_FRAMES"):
        cs.CsmToTalker.from_tensors(dict(cs.CsmToTalker("Hi.", first_chunk_frames=0).to_tensors()))


def test_open_streams_count_every_instance_of_the_model(tmp_path):
    """The load signal: streams open at this BLS model's instances (files shared by its stub
    processes; here two instances in one process) when a request starts."""
    from omni_triton.runtime.instance_balance import OpenStreams

    a, b = OpenStreams(tmp_path, "csm_0"), OpenStreams(tmp_path, "csm_1")
    with a.counted() as before_first:
        assert before_first == 0
        with b.counted() as before_second:
            assert before_second == 1
            assert a.others() == 2
    assert a.others() == 0 and b.others() == 0


@pytest.mark.parametrize("bls, talker", [("csm", "csm_talker"), ("qwen3_omni", "qwen3_omni_talker"),
                                         ("qwen3_tts", "qwen3_tts_talker")])
def test_bls_config_chooses_the_first_chunk_from_load_and_tells_its_talker(bls, talker):
    """csm / qwen3_omni: 2-16 frames by its open streams over its 8 instances; the talker declares
    the FIRST_CHUNK_FRAMES input it groups and schedules by; the emit group still divides the
    later chunks (the first response is the first chunk itself)."""
    from omni_triton.serve.repository import available_models, model_parameters

    models = available_models()
    params = model_parameters(models[bls])
    initial = chunking.InitialChunk.from_params(params, int(params["chunk_frames"]), 8)
    assert (initial.lo, initial.hi) == (2, 16)
    assert 'name: "FIRST_CHUNK_FRAMES" data_type: TYPE_INT32' in (models[talker] / "config.pbtxt").read_text()
    assert int(params["chunk_frames"]) % int(model_parameters(models[talker]).get("emit_frames", "1")) == 0


class _Open:
    """OpenStreams stand-in: ``others`` streams open when a request starts."""

    def __init__(self, others):
        self.n, self.inside = others, []

    @contextlib.contextmanager
    def counted(self):
        self.inside.append(True)
        yield self.n
        self.inside.pop()


@pytest.mark.parametrize("others, first", [(0, 2), (3, 4), (7, 16)])
@pytest.mark.parametrize("family", ["csm", "qwen3_omni", "qwen3_tts"])
def test_the_bls_sends_its_talker_the_first_chunk_it_decodes(monkeypatch, family, others, first):
    """The csm / qwen3_omni / qwen3_tts BLS picks the first chunk from its open streams (8 instances), sends it
    to the talker as FIRST_CHUNK_FRAMES and decodes exactly that many frames first; the request
    counts as open while it runs."""
    from types import SimpleNamespace

    from omni_triton.adapters import csm as csm_adapter
    from omni_triton.adapters import omni_stages, qwen3_tts
    from omni_triton.adapters import qwen3_omni as omni
    from omni_triton.contracts import chat as ch
    from omni_triton.contracts.codec import CODES, FIRST_CHUNK_FRAMES
    from omni_triton.contracts.tensors import utf8_array

    module, cls = {"csm": (csm_adapter, csm_adapter.CsmPipeline), "qwen3_omni": (omni, omni.Qwen3OmniPipeline),
                   "qwen3_tts": (qwen3_tts, qwen3_tts.Qwen3TtsPipeline)}[family]
    bls = object.__new__(cls)
    bls.chunks = {"first_chunk_frames": 5, "chunk_frames": 25, "left_context_frames": 25, "low_water_s": 0.0,
                  "frame_rate_hz": 12.5}
    bls.initial = chunking.InitialChunk(2, 16, 8)
    bls.open_streams = _Open(others)
    bls.stage_flags = bls.talker_flags = None
    bls.sample_rate = 24000
    sent, decoded = {}, []

    def fake_stream_stage(model, inputs, outputs, *args, **kwargs):
        sent.update(dict(inputs))
        assert bls.open_streams.inside  # counted open while the talker streams
        for _ in range(40):
            yield {CODES: np.zeros((1, 4), np.int64)}

    monkeypatch.setattr(module, "stream_stage", fake_stream_stage)
    def decode(self, codes, left, *due):
        decoded.append(len(codes) - left)
        return np.zeros(1)

    monkeypatch.setattr(cls, "_decode", decode)
    stream = SimpleNamespace(paced=False, cancel_seen=False, cancelled=lambda: False)
    if family == "csm":
        job = csm_adapter._CsmJob("Hello.", 0, 40)
    elif family == "qwen3_tts":
        job = dict(task="custom_voice", text="Hello.", voice="Ryan", instructions=None, language=None, prompt=None,
                   max_frames=None, paced=False)
    else:
        job = omni_stages.OmniJob(inputs=[(ch.PROMPT, utf8_array("Hello"))], audio=True, voice="Ethan",
                                  max_frames=None, async_chunk=True, paced=False)
    list(bls.generate(job, stream))
    assert int(sent[FIRST_CHUNK_FRAMES][0]) == first
    assert decoded[0] == first and sum(decoded) == 40
    assert not bls.open_streams.inside  # closed at the end


def test_the_omni_talker_sends_the_first_chunk_first():
    from types import SimpleNamespace

    from omni_triton.adapters import omni_stages
    from omni_triton.contracts.codec import CODES

    talker = object.__new__(omni_stages.OmniTalkerBase)
    talker.emit_frames, talker.step_scheduler = 5, None
    talker.talker = SimpleNamespace(stream=lambda *a, **k: iter([np.zeros((1, 16), np.int64)] * 12))
    talker.metrics = SimpleNamespace(count=lambda *a: None)
    job = omni_stages.TalkerJob(None, "Ethan", None, first_chunk_frames=4)
    out = [len(o[CODES]) for o in talker.generate(job, SimpleNamespace(cancel_seen=False, cancelled=lambda: False))
           if o is not None]
    assert out == [4, 5, 3]


# ------------------------------------------------------------- joined stream vs one full decode

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def codec():
    from omni_triton.checkpoints import csm
    from omni_triton.stages import csm as ct

    torch.set_num_threads(1)
    import tempfile
    from pathlib import Path

    folder = csm.build_tiny_csm(Path(tempfile.mkdtemp()) / "csm-tiny", seed=0)
    talker, decoder = ct.CodecTalker.from_pretrained(folder), ct.CodecDecoder.from_pretrained(folder)
    codes = talker.generate("Hello world, this is a test of the talker.", speaker=0, min_frames=70, max_frames=70)
    return decoder, codes


def _streamed(decoder, codes, first, drop_left=False, duplicate=False):
    sched = chunking.ChunkSchedule(first, 25, 25)
    chunks = []
    for total in range(1, len(codes) + 1):
        chunks += sched.push(total)
    chunks += sched.flush(len(codes))
    pcm = []
    for start, end, left in chunks:
        if drop_left:  # the bug: decode only the new frames, no left context
            start, left = start + left, 0
        out = decoder.decode([codes[start:end]], [left])[0]
        if duplicate and pcm:
            out = np.concatenate([pcm[-1][-1:], out])  # a boundary sample sent twice
        pcm.append(out)
    return pcm


@pytest.mark.parametrize("first", [2, 4, 8, 16])
def test_the_joined_stream_is_the_full_decode_without_a_click_at_the_joins(codec, first):
    """Every first-chunk size 2-16, chunks decoded with 25 frames of left context and joined: the
    same length as one decode of all 70 frames and within 2e-5 of it (the tiny Mimi's measured
    difference is ~1.5e-6 with peak ~0.45: test_codec_tts.py), and at each join the sample step is
    the full decode's step within 4e-5 (no click). Red when the left context is dropped (a step
    of ~0.1 at the joins) or a boundary sample is duplicated (the length)."""
    decoder, codes = codec
    full = decoder.decode([codes], [0])[0]
    pcm = _streamed(decoder, codes, first)
    assert pcm[0].size == first * decoder.samples_per_frame
    joined = np.concatenate(pcm)
    assert joined.shape == full.shape
    np.testing.assert_allclose(joined, full, rtol=0, atol=2e-5)
    joins = np.cumsum([p.size for p in pcm])[:-1]
    np.testing.assert_allclose(joined[joins] - joined[joins - 1], full[joins] - full[joins - 1], rtol=0, atol=4e-5)


def test_the_join_test_sees_a_dropped_left_context_and_a_duplicated_sample(codec):
    """The property above fails for the two join bugs (so it can go red)."""
    decoder, codes = codec
    full = decoder.decode([codes], [0])[0]
    no_left = np.concatenate(_streamed(decoder, codes, 2, drop_left=True))
    assert no_left.shape == full.shape and np.abs(no_left - full).max() > 1e-3
    assert np.concatenate(_streamed(decoder, codes, 2, duplicate=True)).size != full.size

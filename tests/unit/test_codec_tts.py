"""Codec-token TTS stage (tiny random CSM + Mimi), no Triton."""
from __future__ import annotations

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
torch.set_num_threads(1)

from omni_triton.checkpoints import common, csm  # noqa: E402
from omni_triton.contracts import speech  # noqa: E402
from omni_triton.runtime import cancel_flags  # noqa: E402
from omni_triton.stages import chunking  # noqa: E402
from omni_triton.stages import csm as ct  # noqa: E402

TEXT = "Hello world, this is a test of the talker."


@pytest.fixture(scope="session")
def csm_dir(tmp_path_factory):
    return csm.build_tiny_csm(tmp_path_factory.mktemp("csm") / "csm-tiny", seed=0)


@pytest.fixture(scope="session")
def talker(csm_dir):
    return ct.CodecTalker.from_pretrained(csm_dir)


@pytest.fixture(scope="session")
def decoder(csm_dir):
    return ct.CodecDecoder.from_pretrained(csm_dir)


@pytest.fixture(scope="session")
def codes(talker):
    c = talker.generate(TEXT, speaker=0, min_frames=60, max_frames=60)
    assert c.shape == (60, talker.num_codebooks) and c.dtype == np.int64
    return c


def test_builder_idempotent(csm_dir):
    before = {p: p.stat().st_mtime_ns for p in csm_dir.rglob("*") if p.is_file()}
    assert csm.build_tiny_csm(csm_dir, seed=0) == csm_dir
    after = {p: p.stat().st_mtime_ns for p in csm_dir.rglob("*") if p.is_file()}
    assert before == after
    man = common.read_manifest(csm_dir)
    assert man["seed"] == 0 and man["config_hash"] == csm.TinyCsmSpec().config_hash(0)
    assert csm.TinyCsmSpec().config_hash(1) != man["config_hash"]


def test_decoder_config(decoder, talker):
    assert decoder.sampling_rate == 24000
    assert decoder.samples_per_frame == 1920  # 24 kHz / 12.5 Hz, computed from the Mimi config
    assert decoder.num_codebooks == talker.num_codebooks


def test_talker_deterministic_and_in_range(talker, codes):
    again = talker.generate(TEXT, speaker=0, min_frames=60, max_frames=60)
    np.testing.assert_array_equal(codes, again)
    assert codes.min() >= 0 and codes.max() < talker.model.config.codec_config.codebook_size
    other = talker.generate(TEXT, speaker=1, min_frames=10, max_frames=10)
    assert not np.array_equal(other, codes[:10])  # the speaker id is part of the prompt


def test_talker_yields_before_generation_finishes(talker):
    """The hook (called on the generate thread once per frame) blocks after frame 1 until the
    consumer has received a yield: if the generator only yielded at the end, wait() would time out."""
    got_first = threading.Event()
    calls = []
    waited = []

    def hook():
        calls.append(1)
        if len(calls) == 2:
            waited.append(got_first.wait(timeout=20))
        return False

    gen = talker.stream(TEXT, min_frames=20, max_frames=20, should_stop=hook)
    first = next(gen)
    calls_at_first = len(calls)
    got_first.set()
    rest = list(gen)
    assert first.shape[1] == talker.num_codebooks and first.shape[0] >= 1
    assert calls_at_first <= 2 and waited == [True]
    assert first.shape[0] + sum(r.shape[0] for r in rest) == 20


def test_cancellation_stops_within_one_frame(talker, codes):
    calls = []

    def hook():
        calls.append(1)
        return len(calls) > 5  # cancel requested at the 6th frame

    got = list(talker.stream(TEXT, min_frames=60, max_frames=60, should_stop=hook))
    n = sum(g.shape[0] for g in got)
    assert len(calls) == 6  # no frame computed after the hook said stop
    assert n <= 5
    if n:
        np.testing.assert_array_equal(np.concatenate(got), codes[:n])


def test_paced_streams_of_one_talker_interleave_frame_by_frame_with_the_same_frames(talker, codes):
    """Paced (the deadline scheduler's mode): two streams of ONE talker object pulled alternately
    frame by frame give each the frames it gets alone, and a paced stream computes only what is
    pulled (its stop hook, called once per computed frame, runs at most one frame ahead). With the
    per-model lock held by a paced stream, the second stream's first frame never comes (the
    consumer thread would block): the worker below then does not finish and the test fails."""
    other_alone = talker.generate(TEXT, speaker=1, min_frames=12, max_frames=12)
    computed = {"a": 0, "b": 0}

    def hook(name):
        def stop():
            computed[name] += 1
            return False
        return stop

    got: dict = {"a": [], "b": [], "ahead": []}

    def consume():
        a = talker.stream(TEXT, 0, 20, 20, should_stop=hook("a"), paced=True)
        b = talker.stream(TEXT, 1, 12, 12, should_stop=hook("b"), paced=True)
        for _ in range(12):
            got["a"].append(next(a))
            got["b"].append(next(b))
            got["ahead"].append(computed["a"] - sum(len(f) for f in got["a"]))
        got["a"].extend(a)
        got["b"].extend(b)

    worker = threading.Thread(target=consume, daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive(), "two paced streams of one talker did not interleave"
    np.testing.assert_array_equal(np.concatenate(got["a"]), codes[:20])
    np.testing.assert_array_equal(np.concatenate(got["b"]), other_alone)
    assert max(got["ahead"]) <= 1  # generation waits for the consumer (one frame in flight at most)


def test_closing_generator_stops_generation(talker):
    """Closing the generator stops ``generate`` within a frame or two and joins its thread.

    The hook (called once per frame on the generate thread until the consumer closes) holds frame
    3 back until the consumer is about to close, so no frame beyond 3 can start before the close:
    at most the frame in flight at the close is computed (and dropped) after it. If closing did
    not stop generation, the hook would run for all 200 frames."""
    closing = threading.Event()
    calls = []

    def hook():
        calls.append(1)
        if len(calls) >= 3:
            assert closing.wait(timeout=60), "the consumer never closed the generator"
        return False

    gen = talker.stream(TEXT, min_frames=200, max_frames=200, should_stop=hook)
    first = next(gen)
    closing.set()
    gen.close()  # joins the generate thread
    assert first.shape[1] == talker.num_codebooks
    assert not [t for t in threading.enumerate() if t.name == "csm-generate" and t.is_alive()]
    assert len(calls) <= 5, f"{len(calls)} frames generated after a close at frame 3"


def test_batched_padded_decode_equals_one_by_one(decoder, codes):
    """Mimi is causal, so right padding leaves earlier samples unchanged mathematically. Measured
    max |batched - single| = 2.4e-7 (peak ~0.45): float rounding from shape-dependent kernels; the
    same 1.6e-7 shows when batching equal-length items without any padding, so grouping by length
    would not make it bit-exact. Asserted bound 1e-6."""
    items = [codes[:60], codes[:33], codes[5:12], codes[10:11], codes[:0]]
    left = [0, 3, 2, 0, 0]
    batched = decoder.decode(items, left)
    for c, lc, b in zip(items, left, batched, strict=True):
        single = decoder.decode([c], [lc])[0]
        assert b.dtype == np.float32 and b.shape == ((len(c) - lc) * decoder.samples_per_frame,)
        np.testing.assert_allclose(b, single, rtol=0, atol=1e-6)


def test_chunk_schedule_covers_every_frame_once():
    s = chunking.ChunkSchedule(first_chunk_frames=5, chunk_frames=25, left_context_frames=25)
    chunks = []
    for total in range(1, 73):
        chunks += s.push(total)
    chunks += s.flush(72)
    assert chunks == [(0, 5, 0), (0, 30, 5), (5, 55, 25), (30, 72, 25)]
    new = [(start + left, end) for start, end, left in chunks]
    assert new[0][0] == 0 and new[-1][1] == 72
    assert all(a[1] == b[0] for a, b in zip(new, new[1:], strict=False))
    assert chunking.ChunkSchedule(5, 25, 25).flush(3) == [(0, 3, 0)]
    assert chunking.ChunkSchedule(5, 25, 25).flush(0) == []


def test_low_water_schedules_pending_frames_before_the_listener_runs_dry():
    """Low water 0.2 s at 12.5 Hz: the first chunk (5 frames at t=0) plays until 0.4 s. A slow
    talker has 10 frames at t=0.25: 0.15 s of audio left, so frames 5..9 go out early (left
    context 5) instead of waiting for frame 30, and the clock then runs to 0.8 s. Fewer pending
    frames than a first chunk never go early; a talker that keeps ahead gets the fixed chunks.
    Red when the early chunk is dropped (the fixed scheme would return nothing at t=0.25)."""
    now = [0.0]
    s = chunking.ChunkSchedule(5, 25, 25, low_water_s=0.2, clock=lambda: now[0])
    assert s.push(5) == [(0, 5, 0)]
    now[0] = 0.1
    assert s.push(8) == []  # 0.3 s left: not yet low
    now[0] = 0.25
    assert s.push(10) == [(0, 10, 5)]
    now[0] = 0.3
    assert s.push(12) == []  # only 2 pending: not worth a decode
    now[0] = 0.65
    assert s.push(16) == [(0, 16, 10)]  # 0.15 s left of the 0.8 s
    fast = chunking.ChunkSchedule(5, 25, 25, low_water_s=0.2, clock=lambda: 0.0)
    assert [c for t in range(1, 73) for c in fast.push(t)] + fast.flush(72) == \
        [(0, 5, 0), (0, 30, 5), (5, 55, 25), (30, 72, 25)]  # never low: the fixed chunks
    with pytest.raises(ValueError):
        chunking.ChunkSchedule(5, 25, 25, low_water_s=-1)


def test_low_water_stops_once_the_listener_ran_dry():
    """A talker at 8 frames/s (slower than real time, 12.5 needed) runs its listener dry whatever
    the chunks; from then on the fixed chunks come (least decode work), not 5-frame ones. Red
    when low water goes on after the stall (5-frame chunks all along)."""
    now = [0.0]
    sched = chunking.ChunkSchedule(5, 25, 25, low_water_s=0.3, clock=lambda: now[0])
    chunks = []
    for total in range(1, 101):
        now[0] = total / 8.0
        chunks += sched.push(total)
    chunks += sched.flush(100)
    sizes = [end - start - left for start, end, left in chunks]
    # frame 10 comes at 1.25 s, after the first chunk's audio ended (1.025 s): dry, so fixed chunks
    assert sched.ran_dry and sizes[0] == 5 and sizes[-1] == 20
    assert sizes[1:-1] == [25, 25, 25], sizes


def test_early_chunks_decode_to_the_same_audio(decoder, codes):
    """Chunk boundaries moved by low water (a talker at 14 frames/s: faster than real time, not
    5x) decode within the same 2e-5 of one full decode as the fixed scheme (left context is
    kept)."""
    now = [0.0]
    sched = chunking.ChunkSchedule(5, 25, 25, low_water_s=0.3, clock=lambda: now[0])
    chunks = []
    for total in range(1, len(codes) + 1):
        now[0] = total / 14.0
        chunks += sched.push(total)
    chunks += sched.flush(len(codes))
    sizes = [end - start - left for start, end, left in chunks]
    assert sizes[0] == 5 and any(5 <= n < 25 for n in sizes[1:-1]), sizes  # early chunks happened
    streamed = np.concatenate([decoder.decode([c], [lc])[0] for c, lc in chunking.chunk_slices(codes, chunks)])
    np.testing.assert_allclose(streamed, decoder.decode([codes], [0])[0], rtol=0, atol=2e-5)


@pytest.mark.parametrize("first,chunk,left", [(5, 25, 25), (1, 25, 25), (3, 7, 10)])
def test_chunked_decode_matches_full(decoder, codes, first, chunk, left):
    """Chunks decoded with left context, concatenated, vs one decode of all 60 frames.
    Measured max abs diff 1.5e-6 (5/25/25), 1.3e-6 (1/25/25), 5.0e-6 (3/7/10) with peak ~0.45
    (without left context it is 0.35). Left context covers the causal convs' receptive field; the
    rest comes from Mimi's attention window (250 frames) being cut to the context. The tiny model's
    layer scale (0.01) keeps that small; a trained Mimi will differ more. Asserted bound 2e-5."""
    sched = chunking.ChunkSchedule(first, chunk, left)
    chunks = []
    for total in range(0, len(codes) + 1, 4):
        chunks += sched.push(total)
    chunks += sched.flush(len(codes))
    pcm = [decoder.decode([c], [lc])[0] for c, lc in chunking.chunk_slices(codes, chunks)]
    streamed = np.concatenate(pcm)
    full = decoder.decode([codes], [0])[0]
    assert streamed.shape == full.shape
    np.testing.assert_allclose(streamed, full, rtol=0, atol=2e-5)


def test_audio_audible_not_clipped(decoder, codes):
    audio = decoder.decode([codes], [0])[0]
    rms, peak = float(np.sqrt(np.mean(audio ** 2))), float(np.abs(audio).max())
    assert np.isfinite(audio).all()
    assert rms > 1e-3, rms  # measured 0.085
    assert peak < 0.99, peak  # measured 0.45


def test_synthesize_reference(talker, decoder):
    res = ct.synthesize_reference(talker, decoder, TEXT, 0, min_frames=40, max_frames=40)
    assert res.codes.shape == (40, talker.num_codebooks)
    assert res.audio.shape == (40 * decoder.samples_per_frame,) and res.sampling_rate == 24000
    assert len(res.streamed_chunks) == 3  # 5 + 25 + tail 10
    np.testing.assert_allclose(res.streamed_audio, res.audio, rtol=0, atol=2e-5)


def test_parse_tts_request():
    voices = ["0", "1", "2", "3"]
    assert speech.parse_tts_request("hi", None, None, voices, "0", 10) == ("hi", 0)
    assert speech.parse_tts_request("hi", "2", 1.0, voices, "0", 10) == ("hi", 2)
    for text, voice, speed in [("", None, None), ("hi", "9", None), ("hi", None, 1.5), ("x" * 11, None, None)]:
        with pytest.raises(speech.SpeechInputError):
            speech.parse_tts_request(text, voice, speed, voices, "0", 10)


def test_cancel_flags_are_shared_between_instances(tmp_path):
    """Two CancelFlags on one folder (two talker stub processes) see each other's flags; ids of
    any text map to safe file names; a flag raised before the stream starts is kept."""
    bls, talker = cancel_flags.CancelFlags(tmp_path / "f"), cancel_flags.CancelFlags(tmp_path / "f")
    assert not talker.is_cancelled("a") and not talker.is_cancelled(None)
    bls.cancel("a")
    bls.cancel("../../etc/passwd \n id")
    assert talker.is_cancelled("a") and talker.is_cancelled("../../etc/passwd \n id")
    assert all(len(p.name) == 32 for p in (tmp_path / "f").iterdir())
    talker.discard("a")
    talker.discard("never-raised")
    assert not bls.is_cancelled("a")
    flags = cancel_flags.CancelFlags.for_server(2**22 + 12345)  # above pid_max: never a live server's
    assert flags.directory.parent.name == f"omni-triton-run-{2**22 + 12345}"
    flags.directory.rmdir()
    flags.directory.parent.rmdir()


def test_bls_chunk_parameters_and_low_water_only_when_paced():
    """The BLS configs' chunk keywords (schedule_params) turn low water off for a request that is
    not PACED (fixed_if_unpaced): a whole clip keeps the fixed chunks and so its exact bytes.
    Every codec BLS ships a low water and the codec's 12.5 Hz."""
    from omni_triton.serve.repository import available_models, model_parameters

    for name in ("csm", "qwen3_omni", "qwen3_tts"):
        kw = chunking.schedule_params(model_parameters(available_models()[name]))
        assert kw["low_water_s"] > 0 and kw["frame_rate_hz"] == 12.5, name
        assert chunking.fixed_if_unpaced(kw, paced=True) == kw
        assert chunking.fixed_if_unpaced(kw, paced=False) == {**kw, "low_water_s": 0.0}
    with pytest.raises(ValueError):
        chunking.schedule_params({"low_water_ms": "-1"})

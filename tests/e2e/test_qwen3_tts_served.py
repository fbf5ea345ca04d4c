"""End-to-end: Qwen3-TTS on Triton (``qwen3_tts`` BLS -> ``qwen3_tts_talker`` -> ``qwen3_tts_code2wav``,
``qwen3_tts_voice_prompt``), the three stages running in the Qwen3-TTS environment.

Parity reference: the official package's own non-streaming ``generate_custom_voice`` /
``generate_voice_design`` / ``generate_voice_clone`` + decode on the same prepared checkpoint,
greedy, run by ``tests/e2e/qwen3_tts_reference.py`` with ``.venv-qwen3-tts``'s interpreter (the
package needs transformers 4.57.3). Tolerance (docs/qwen3_tts.md, "Parity"): the codec frames are
identical (equal length, and the one-shot decode of the served frames equals the package's audio
bit for bit in-process, tests/unit/test_qwen3_tts.py); streamed audio is decoded in chunks with 25
frames of left context and the 12 Hz decoder looks a little ahead, so samples next to a chunk's end
differ; and a dynamic batch of concurrent chunks changes the codec's first conv by ~2e-6 (batch
of 2 vs 1), which the tiny random decoder (saturating, high-gain convs) amplifies to ~4e-3 at the
output. Bound: max abs difference ``PCM_TOL`` (a leaked voice or a wrong form differs by ~1).
"""
from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import E2E_MODELS
from tritonclient.utils import InferenceServerException

from clients.qwen3_tts_grpc import stream_qwen3_tts, voice_prompt
from omni_triton.contracts.qwen3_tts import qwen3_tts_inputs as inputs
from omni_triton.paths import REPO_ROOT, model_dir
from omni_triton.serve.repository import resolve_models

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    "qwen3_tts" not in set(resolve_models([m.strip() for m in E2E_MODELS.split(",") if m.strip()])),
    reason="qwen3_tts not in OMNI_TRITON_E2E_MODELS")]

PCM_TOL = 0.05
SPF = 1920  # samples per 12 Hz frame at 24 kHz
REF_SR = 16000  # the clip's rate: the stage resamples (the package's librosa call)
REF = (np.sin(np.arange(REF_SR * 2) * 2 * np.pi * 220 / REF_SR) * 0.3
       + np.random.RandomState(0).randn(REF_SR * 2) * 0.05).astype(np.float32)
CASES = {
    "custom_voice": dict(task="custom_voice", text="Hello there, how are you today?", speaker="ryan",
                         instructions="Speak happily", language="English", max_new_tokens=40),
    "voice_design": dict(task="voice_design", text="A designed voice speaks.", instructions="A deep calm voice",
                         max_new_tokens=30),
    "base": dict(task="base", text="Cloned words follow.", ref_text="Some words here.", max_new_tokens=30),
    "vivian": dict(task="custom_voice", text="Hello there, how are you today?", speaker="vivian",
                   max_new_tokens=40),
}


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """case name -> (the package's float32 PCM, its talker codes int64 ``[frames, groups]``); one
    subprocess for all cases."""
    tmp = tmp_path_factory.mktemp("qwen3tts")
    np.save(tmp / "ref.npy", REF)
    reqs = [dict(c, ref_audio_npy=str(tmp / "ref.npy"), ref_sr=REF_SR) for c in CASES.values()]
    (tmp / "in.json").write_text(json.dumps(reqs))
    subprocess.run([str(REPO_ROOT / ".venv-qwen3-tts/bin/python"),
                    str(Path(__file__).with_name("qwen3_tts_reference.py")),
                    str(model_dir("qwen3-tts-tiny")), str(tmp / "in.json"), str(tmp / "out.npz")],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    z = np.load(tmp / "out.npz")
    return {name: (z[f"audio_{i}"], z[f"codes_{i}"]) for i, name in enumerate(CASES)}


@pytest.fixture(scope="module")
def reference(package):
    """case name -> the package's float32 PCM."""
    return {name: audio for name, (audio, _) in package.items()}


def _served(url, case, **extra):
    c = CASES[case]
    kw = dict(task=c["task"], voice=c.get("speaker"), instructions=c.get("instructions"), language=c.get("language"),
              max_frames=c["max_new_tokens"])
    if c["task"] == "base" and "voice_prompt" not in extra:
        kw.update(ref_audio=REF, ref_sample_rate=REF_SR, ref_text=c["ref_text"])
    kw.update(extra)
    return stream_qwen3_tts(url, inputs(c["text"], **kw))


def _assert_parity(got, want):
    assert got.sample_rate == 24000
    assert got.audio.size == want.size and want.size % SPF == 0, (got.audio.size, want.size)
    assert len(got.chunks) >= 2, "streamed in several chunks"
    assert np.abs(got.audio - want).max() <= PCM_TOL


@pytest.mark.parametrize("case", ["custom_voice", "voice_design", "base"])
def test_parity_with_the_package(stack, reference, case):
    """Each form (TASK routes it) streams the package's own generation for the same inputs."""
    _assert_parity(_served(stack.triton_grpc_url, case), reference[case])


def test_voice_prompt_computed_once_equals_per_request_clip(stack, reference):
    """qwen3_tts_voice_prompt's bytes (what the frontend stores at upload) give the same speech as
    the per-request clip, and the form follows from VOICE_PROMPT when TASK is left out."""
    data, seconds = voice_prompt(stack.triton_grpc_url, REF, REF_SR, CASES["base"]["ref_text"])
    assert seconds == pytest.approx(REF.size / REF_SR)
    c = CASES["base"]
    got = stream_qwen3_tts(stack.triton_grpc_url, inputs(c["text"], voice_prompt=data, max_frames=c["max_new_tokens"]))
    _assert_parity(got, reference["base"])


def test_concurrent_voices_stay_isolated(stack, reference):
    """Two requests with different speakers decoding in the same batched steps each equal their
    solo run (vLLM-Omni once leaked one request's voice into another in a batch)."""
    url = stack.triton_grpc_url
    solo = {case: _served(url, case).audio for case in ("custom_voice", "vivian")}
    assert np.abs(solo["custom_voice"] - solo["vivian"]).max() > 10 * PCM_TOL, "the two voices differ"
    steps = stack.metric("omni_qwen3_tts_talker_steps_total")
    rows = stack.metric("omni_qwen3_tts_talker_step_rows_total")
    got, barrier = {}, threading.Barrier(2)

    def run(case):
        barrier.wait()
        got[case] = _served(url, case).audio

    threads = [threading.Thread(target=run, args=(c,)) for c in ("custom_voice", "vivian")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    d_steps = stack.metric("omni_qwen3_tts_talker_steps_total") - steps
    d_rows = stack.metric("omni_qwen3_tts_talker_step_rows_total") - rows
    assert d_rows > d_steps, f"the two requests shared decode steps ({d_rows} rows in {d_steps} steps)"
    for case in ("custom_voice", "vivian"):
        assert got[case].size == solo[case].size
        assert np.abs(got[case] - solo[case]).max() <= PCM_TOL, case
    _assert_parity(_served(url, "vivian"), reference["vivian"])


@pytest.mark.parametrize("kwargs, message", [
    (dict(task="custom_voice", voice="nobody"), "unknown VOICE"),
    (dict(task="voice_design"), "INSTRUCTIONS"),
    (dict(task="singing"), "TASK must be one of"),
    (dict(task="base"), "VOICE_PROMPT or REF_AUDIO"),
    (dict(voice_prompt=b"not an archive"), "voice prompt archive"),
    (dict(task="base", ref_audio=np.zeros(100, np.float32), ref_sample_rate=16000, ref_text="x"), "reference clip"),
    (dict(language="Klingon", voice="ryan"), "unknown LANGUAGE"),
])
def test_bad_input_is_invalid_input(stack, kwargs, message):
    with pytest.raises(InferenceServerException) as err:
        stream_qwen3_tts(stack.triton_grpc_url, inputs("Some text.", max_frames=10, **kwargs))
    assert "invalid input" in err.value.message() and message in err.value.message(), err.value.message()


def test_empty_text_is_invalid_input(stack):
    with pytest.raises(InferenceServerException, match="invalid input"):
        stream_qwen3_tts(stack.triton_grpc_url, inputs("   ", voice="ryan"))


def test_cancel_mid_stream_frees_the_talker(stack):
    """A client that stops after the first chunk cancels the pipeline: the talker row leaves the
    batch (its cancelled counter moves, nothing stays active) and the next request is served."""
    url = stack.triton_grpc_url
    cancelled = stack.metric("omni_qwen3_tts_talker_cancelled_total")
    got = stream_qwen3_tts(url, inputs("A long sentence that goes on and on for a while.", voice="ryan",
                                       max_frames=1500), max_chunks=1)
    assert len(got.chunks) == 1
    stack.wait_until(lambda: stack.metric("omni_qwen3_tts_talker_cancelled_total") > cancelled,
                     "the talker never saw the cancellation", timeout_s=120)
    stack.wait_until(lambda: stack.in_progress("qwen3_tts_talker") == 0, "a talker row stayed active",
                     timeout_s=120)
    assert _served(url, "vivian").audio.size > 0


def _talker_frames(url, max_frames):
    """The raw ``qwen3_tts_talker`` stream: the CODES array of every response, in order."""
    from omni_triton.contracts.tensors import scalar_array, utf8_array

    return _talker_stream(url, [("TEXT", utf8_array("Hello there, how are you today?")),
                                ("TASK", utf8_array("custom_voice")), ("VOICE", utf8_array("ryan")),
                                ("MAX_FRAMES", scalar_array(max_frames, "INT32"))])


def _talker_stream(url, pairs):
    """The CODES array of every ``qwen3_tts_talker`` response to ``pairs`` ((name, array)), in order."""
    import queue
    from functools import partial

    import tritonclient.grpc as grpcclient

    from omni_triton.contracts.tensors import infer_input, wrap_inputs

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("qwen3_tts_talker", wrap_inputs(pairs, partial(infer_input, grpcclient.InferInput)),
                              enable_empty_final_response=True)
    out = []
    while True:
        result, error = got.get(timeout=120)
        assert error is None, error
        codes = result.as_numpy("CODES")
        if codes is not None and codes.size:
            out.append(codes)
        final = result.get_response().parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            break
    client.stop_stream()
    client.close()
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_talker_codes_equal_the_package_s_codes(stack, package, case):
    """The codec codes ``qwen3_tts_talker`` streams for a request's talker inputs (what the
    ``qwen3_tts`` BLS sends it; a clone's VOICE_PROMPT from ``qwen3_tts_voice_prompt``) equal, frame
    for frame and group for group, the codes the package's ``generate_*`` made (greedy: exact)."""
    c = CASES[case]
    url = stack.triton_grpc_url
    prompt = voice_prompt(url, REF, REF_SR, c["ref_text"])[0] if c["task"] == "base" else None
    pairs = inputs(c["text"], task=c["task"], voice=c.get("speaker"), instructions=c.get("instructions"),
                   language=c.get("language"), voice_prompt=prompt, max_frames=c["max_new_tokens"])
    got = np.concatenate(_talker_stream(url, pairs)).astype(np.int64)
    want = package[case][1]
    assert got.shape == want.shape, (got.shape, want.shape)
    diff = np.argwhere(got != want)
    assert diff.size == 0, f"{len(diff)} codes differ, first at [frame, group] {diff[0].tolist()}"


def test_talker_sends_frames_in_groups_and_the_last_short_group(stack):
    """``emit_frames`` (5): full groups, then the stream's last frames as a shorter group;
    the frames are those of a longer run's first ones (greedy), none lost at the end."""
    made = stack.metric("omni_qwen3_tts_talker_frames_total")
    short, longer = _talker_frames(stack.triton_grpc_url, 7), _talker_frames(stack.triton_grpc_url, 14)
    frames_short, frames_long = np.concatenate(short), np.concatenate(longer)
    made = stack.metric("omni_qwen3_tts_talker_frames_total") - made  # frames the talker generated
    assert len(frames_short) + len(frames_long) == made, "frames generated but never sent"
    assert len(frames_short) % 5, f"{len(frames_short)} frames: no short last group to check"
    assert len(frames_long) > len(frames_short)
    for groups in (short, longer):
        assert all(len(c) == 5 for c in groups[:-1]) and 1 <= len(groups[-1]) <= 5, [c.shape for c in groups]
    assert np.array_equal(frames_short, frames_long[:len(frames_short)])


def _decode_call(url, codes, left, due_ms=None):
    """One ``qwen3_tts_code2wav`` request (gRPC): the PCM of the frames after ``left``."""
    from functools import partial

    import tritonclient.grpc as grpcclient

    from omni_triton.contracts.codec import talker_to_code2wav
    from omni_triton.contracts.tensors import infer_input, wrap_inputs

    client = grpcclient.InferenceServerClient(url)
    try:
        due = None if due_ms is None else due_ms / 1000.0
        result = client.infer("qwen3_tts_code2wav", wrap_inputs(talker_to_code2wav(codes, left, due),
                                                                 partial(infer_input, grpcclient.InferInput)))
        return result.as_numpy("AUDIO").reshape(-1)
    finally:
        client.close()


def test_the_decoder_answers_a_first_chunk_before_queued_later_chunks(stack):
    """``qwen3_tts_code2wav`` (``scheduling: "deadline"``): six later chunks of six lengths, not
    due for seconds, reach the decoder first; a 5-frame first chunk (DUE_MS 0) sent while they
    are being decoded is answered after at most the pass that was running, not after all six.
    Under Triton's plain batching (OMNI_TRITON_SCHEDULING=fifo) it is answered last: one
    execute decodes the six, one pass per length, and answers them all at its end. Each chunk's
    audio equals its own decode alone (every pass here has one row)."""
    import time

    url = stack.triton_grpc_url
    frames = np.concatenate(_talker_frames(url, 50) * 2)  # valid codes, 50+ frames (one run ends ~30)
    assert len(frames) >= 50
    later = [(frames[:n], 25) for n in (50, 45, 40, 35, 30, 26)]
    done: dict = {}

    def call(name, codes, left, due_ms):
        pcm = _decode_call(url, codes, left, due_ms)
        done[name] = (time.monotonic(), pcm)

    threads = [threading.Thread(target=call, args=(f"later{i}", c, left, 5000.0)) for i, (c, left) in enumerate(later)]
    for t in threads:
        t.start()
    time.sleep(0.05)  # past the 10 ms batching window: the six are queued or being decoded
    first = threading.Thread(target=call, args=("first", frames[:5], 0, 0.0))
    first.start()
    for t in threads + [first]:
        t.join(timeout=120)
    assert len(done) == 7, sorted(done)
    after = sum(1 for name, (t, _) in done.items() if name != "first" and t > done["first"][0])
    assert after >= 3, f"the first chunk was answered after {6 - after} of the 6 queued later chunks"
    for name, (codes, left) in [("first", (frames[:5], 0))] + [(f"later{i}", x) for i, x in enumerate(later)]:
        alone = _decode_call(url, codes, left)
        assert done[name][1].shape == alone.shape and np.allclose(done[name][1], alone, atol=1e-5), name


def test_a_bad_due_is_invalid_input_and_the_decoder_keeps_serving(stack):
    url = stack.triton_grpc_url
    frames = np.concatenate(_talker_frames(url, 10))
    with pytest.raises(InferenceServerException) as err:
        _decode_call(url, frames[:5], 0, float("nan"))
    assert "DUE_MS" in str(err.value) and "INVALID" in str(err.value.status()).upper()
    assert _decode_call(url, frames[:5], 0, 0.0).size == 5 * SPF

"""Checks of ``omni_triton.stages.qwen3_tts`` that need the official ``qwen-tts`` package, run in
the Qwen3-TTS environment by ``tests/unit/test_qwen3_tts.py`` (``.venv-qwen3-tts/bin/python
tests/unit/qwen3_tts_engine_checks.py CHECKPOINT [CHECK ...]``): each check prints ``ok <name>`` or raises.
No Triton."""
import sys

import numpy as np
import torch

torch.set_num_threads(1)

from omni_triton.stages.chunking import ChunkedDecoder  # noqa: E402
from omni_triton.stages.qwen3_tts.engine import (  # noqa: E402
    Qwen3TtsCodec,
    Qwen3TtsForm,
    TalkerBatch,
    TalkerSeq,
    generate_frames,
)
from omni_triton.stages.qwen3_tts.request import Qwen3TtsRequest  # noqa: E402
from omni_triton.stages.qwen3_tts.scheduler import TalkerScheduler  # noqa: E402
from omni_triton.stages.qwen3_tts.streaming import ContextSchedule  # noqa: E402

ROOT = sys.argv[1]
PCM_TOL = 0.05  # see tests/e2e/test_qwen3_tts_served.py and docs/qwen3_tts.md, "Parity"
forms = {t: Qwen3TtsForm(f"{ROOT}/{t}") for t in ("custom_voice", "voice_design", "base")}
codec = Qwen3TtsCodec(f"{ROOT}/base")
ref = (np.sin(np.arange(32000) * 2 * np.pi * 220 / 16000) * 0.3).astype(np.float32)
prompt = forms["base"].voice_prompt(ref, 16000, "Some words here.", False)
xvec = forms["base"].voice_prompt(ref, 16000, None, True)  # x-vector only: the text is fed step by step
REQS = {
    "custom_voice": Qwen3TtsRequest("custom_voice", "Hello there, how are you?", "English", "ryan", "Speak happily",
                                    None, 30),
    "vivian": Qwen3TtsRequest("custom_voice", "Hello there, how are you?", "English", "vivian", None, None, 30),
    "voice_design": Qwen3TtsRequest("voice_design", "A designed voice.", "Auto", None, "A deep calm voice", None, 25),
    "base": Qwen3TtsRequest("base", "Cloned words.", "Auto", None, None, prompt, 25),
    "base_xvec": Qwen3TtsRequest("base", "Cloned from the speaker embedding alone, read as it goes.", "English",
                                 None, None, xvec, 30),
}


def streamed(form, req, frames):
    ctx = None if req.voice_prompt is None else req.voice_prompt.ref_code
    dec = ChunkedDecoder(ContextSchedule(5, 25, 25, context=0 if ctx is None else len(ctx)),
                         lambda c, left: codec.decode([c], [left])[0])
    if ctx is not None:
        assert dec.push(ctx) == []
    return np.concatenate(dec.push(frames) + dec.flush())


def check_parity():
    """The streaming path's frames decode to exactly the package's own audio; chunked within PCM_TOL."""
    for name, req in REQS.items():
        form = forms[req.task]
        frames = generate_frames(form, req)
        want = form.reference(req)
        ctx = req.voice_prompt.ref_code if req.voice_prompt is not None else None
        one_shot = codec.decode([frames if ctx is None else np.concatenate([ctx, frames])],
                                [0 if ctx is None else len(ctx)])[0]
        assert one_shot.shape == want.shape and np.array_equal(one_shot, want), (name, np.abs(one_shot - want).max())
        got = streamed(form, req, frames)
        assert got.shape == want.shape and np.abs(got - want).max() <= PCM_TOL, (name, np.abs(got - want).max())
    print("ok parity")


def check_batched_equals_solo():
    """Rows joining at different steps, different speakers: each row's frames equal its solo run."""
    form = forms["custom_voice"]
    solo = {n: generate_frames(form, REQS[n]) for n in ("custom_voice", "vivian")}
    assert not np.array_equal(solo["custom_voice"], solo["vivian"])
    out = {"custom_voice": [], "vivian": []}
    batch = TalkerBatch(form)
    batch.add(TalkerSeq(form.prompt(REQS["custom_voice"]), out["custom_voice"].append))
    batch.step()
    batch.step()
    batch.add(TalkerSeq(form.prompt(REQS["vivian"]), out["vivian"].append))
    seen = set()
    while len(batch):
        seen.add(len(batch))
        batch.step()
    assert 2 in seen
    for n in out:
        assert np.array_equal(np.stack(out[n]), solo[n]), n
    print("ok batched_equals_solo")


def check_scheduler_cancel_and_forms():
    """The scheduler runs every form at once; a cancelled row stops, the others finish unchanged."""
    import threading

    frames, ends = {}, {}
    finished = threading.Semaphore(0)
    sched = TalkerScheduler(forms, max_seqs=8)
    for name, req in REQS.items():
        frames[name] = []

        def done(reason, error=None, n=name):
            ends[n] = (reason, error)
            finished.release()

        def should_stop(n=name):
            return n == "vivian" and len(frames["vivian"]) >= 3

        sched.submit(req, frames[name].append, should_stop, done)
    for _ in REQS:
        assert finished.acquire(timeout=300)
    sched.close()
    assert ends["vivian"][0] == "cancelled" and 3 <= len(frames["vivian"]) < 29
    for name in ("custom_voice", "voice_design", "base", "base_xvec"):
        assert ends[name] == ("stop", None), ends[name]
        assert np.array_equal(np.stack(frames[name]), generate_frames(forms[REQS[name].task], REQS[name])), name
    print("ok scheduler_cancel_and_forms")


def check_ragged_decode():
    """A ragged batch (two lengths, one repeated) equals each chunk's own decode within PCM_TOL
    (a batch of 2 vs 1 changes the first conv by ~2e-6, which this random decoder amplifies)."""
    frames = generate_frames(forms["custom_voice"], REQS["custom_voice"])
    chunks, lefts = [frames[:7], frames[3:20], frames[10:17]], [0, 2, 1]
    together = codec.decode(chunks, lefts)
    for c, left, got in zip(chunks, lefts, together, strict=True):
        assert got.shape == codec.decode([c], [left])[0].shape
        assert np.abs(got - codec.decode([c], [left])[0]).max() <= PCM_TOL
    print("ok ragged_decode")


ONLY = set(sys.argv[2:])  # names of checks to run (all when empty)
for check in (check_parity, check_batched_equals_solo, check_scheduler_cancel_and_forms, check_ragged_decode):
    if not ONLY or check.__name__ in ONLY:
        check()

"""Paced Qwen3-Omni stages (the deadline scheduler's mode, docs/scheduling.md "The omni talker"),
no Triton: several streams of ONE thinker and ONE talker object, stepped alternately one
``next()`` at a time the way a ``StepScheduler`` worker steps them, give each request exactly
what it gets alone (greedy), and a paced stream computes only what is pulled.

Each interleaving runs on a helper thread joined with a timeout: a paced stream that took the
per-model lock (the unpaced mode's) would block the second stream's first step forever, and the
test then fails instead of hanging.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
torch.set_num_threads(1)

from omni_triton.checkpoints import qwen3_omni as ckpt  # noqa: E402
from omni_triton.stages import qwen3_omni as qo  # noqa: E402

TALKER = qo.TalkerSettings(max_frames=40, min_frames=20, do_sample=False)
QUESTIONS = [("Tell me a story.", 24), ("What is the capital of France?", 16)]


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
    return ckpt.build_tiny_qwen3_omni(tmp_path_factory.mktemp("omni") / "qwen3-omni-tiny", seed=0)


@pytest.fixture(scope="module")
def stages(omni_dir):
    return qo.OmniThinker.from_pretrained(omni_dir), qo.OmniTalker.from_pretrained(omni_dir)


def _ids(thinker, text):
    return thinker.encode(messages=[{"role": "user", "content": text}])


def _sampling(n):
    return qo.SamplingSettings(max_tokens=n, min_tokens=n)


def _interleave(streams, limit_s=20.0):
    """Step ``streams`` (name -> iterator) round robin, one ``next()`` each, on a helper thread
    (joined with a timeout: a blocked step fails the test); returns name -> list of items."""
    got = {name: [] for name in streams}
    error: list = []

    def consume():
        try:
            live = dict(streams)
            while live:
                for name in list(live):
                    try:
                        got[name].append(next(live[name]))
                    except StopIteration:
                        del live[name]
        except BaseException as e:
            error.append(e)

    worker = threading.Thread(target=consume, daemon=True)
    worker.start()
    worker.join(timeout=limit_s)
    assert not worker.is_alive(), "paced streams of one model did not interleave (a step blocked)"
    if error:
        raise error[0]
    return got


def _text(steps):
    return "".join(s.text for s in steps if isinstance(s, qo.ThinkerStep))


def test_paced_thinker_streams_interleave_token_by_token_with_the_same_output(stages):
    """One ``next()`` of a paced thinker stream is one token (its stop hook, called once per
    computed token on the generate thread, is never more than one token ahead of what was
    pulled), and two interleaved streams equal their solo unpaced runs (text, ids, rows)."""
    thinker, _ = stages
    computed = {"a": 0, "b": 0}

    def counting(name):
        def stop():
            computed[name] += 1
            return False
        return stop

    streams, alone, ahead = {}, {}, []
    for name, (q, n) in zip("ab", QUESTIONS, strict=True):
        ids = _ids(thinker, q)
        alone[name] = list(thinker.stream(ids, _sampling(n), stream_talker_inputs=True))
        streams[name] = thinker.stream(ids, _sampling(n), should_stop=counting(name), stream_talker_inputs=True,
                                       paced=True)

    def watch(name, it):
        for pulled, item in enumerate(it, start=1):
            ahead.append(computed[name] - pulled)
            yield item

    got = _interleave({k: watch(k, v) for k, v in streams.items()})
    for name, (_, n) in zip("ab", QUESTIONS, strict=True):
        steps = [s for s in got[name] if s is not None]
        assert len(got[name]) == n + 1  # one item per token, then the finish
        assert _text(steps) == _text(alone[name]) and steps[-1].finish_reason == alone[name][-1].finish_reason
        for field in ("ids", "embeds", "hidden"):
            want = np.concatenate([getattr(s, field) for s in alone[name] if getattr(s, field) is not None])
            have = np.concatenate([getattr(s, field) for s in steps if getattr(s, field) is not None])
            np.testing.assert_array_equal(have, want)
    assert max(ahead) <= 1, ahead  # generation waits for its consumer


def test_paced_talker_streams_of_finished_answers_interleave_frame_by_frame(stages):
    """The plain ``stream`` path (full ThinkerOutput, the multimodal path): two paced streams of
    one talker pulled alternately give each its solo frames, one frame per ``next()``."""
    thinker, talker = stages
    outs, alone, streams = {}, {}, {}
    for name, (q, n) in zip("ab", QUESTIONS, strict=True):
        outs[name] = list(thinker.stream(_ids(thinker, q), _sampling(n), with_talker_inputs=True))[-1].output
        alone[name] = np.concatenate(list(talker.stream(outs[name], "Ethan" if name == "a" else "Chelsie", TALKER)))
        streams[name] = talker.stream(outs[name], "Ethan" if name == "a" else "Chelsie", TALKER, paced=True)
    got = _interleave(streams)
    for name in "ab":
        frames = [f for f in got[name] if f is not None]
        assert all(len(f) == 1 for f in frames)  # one frame per step
        np.testing.assert_array_equal(np.concatenate(frames), alone[name])


def test_paced_speak_while_thinking_streams_interleave_with_the_same_text_and_codes(stages):
    """Two requests speaking while thinking, each a paced talker stream over a paced thinker
    stream, all four generations on one thinker and one talker object, stepped alternately:
    each request's text and codes equal its solo unpaced run (which equals the reference:
    tests/unit/test_qwen3_omni_async.py). No step waits on a talker thread: a paced talker
    step is taken only when its text entry is there."""
    thinker, talker = stages
    alone, streams = {}, {}
    for name, (q, n) in zip("ab", QUESTIONS, strict=True):
        ids, voice = _ids(thinker, q), "Ethan" if name == "a" else "Aiden"
        items = list(talker.stream_while_thinking(thinker.stream(ids, _sampling(n), stream_talker_inputs=True),
                                                  voice, TALKER))
        alone[name] = (_text(items), np.concatenate([i for i in items if isinstance(i, np.ndarray)]))
        streams[name] = talker.stream_while_thinking(
            thinker.stream(ids, _sampling(n), stream_talker_inputs=True, paced=True), voice, TALKER, paced=True)
    got = _interleave(streams)
    for name in "ab":
        items = [i for i in got[name] if i is not None]
        frames = [i for i in items if isinstance(i, np.ndarray)]
        assert all(len(f) == 1 for f in frames)
        assert _text(items) == alone[name][0]
        np.testing.assert_array_equal(np.concatenate(frames), alone[name][1])
        kinds = ["text" if isinstance(i, qo.ThinkerStep) else "audio" for i in items]
        assert kinds.index("audio") < len(kinds) - 1 - kinds[::-1].index("text")  # spoke while thinking


def test_closing_a_paced_stream_mid_answer_stops_both_generations(stages):
    thinker, talker = stages
    it = talker.stream_while_thinking(
        thinker.stream(_ids(thinker, "Tell me a story."), _sampling(200), stream_talker_inputs=True, paced=True),
        "Ethan", qo.TalkerSettings(max_frames=400, min_frames=400, do_sample=False), paced=True)
    frames = 0
    for item in it:
        if isinstance(item, np.ndarray):
            frames += len(item)
            if frames >= 3:
                break
    it.close()  # joins the talker's and the thinker's generate threads
    assert not [t for t in threading.enumerate() if t.name in ("talker-async", "generate") and t.is_alive()]


def test_paced_thinker_with_the_talker_inputs_at_the_end_equals_unpaced(stages):
    """The full-answer path (TALKER_INPUTS without ASYNC_CHUNK, multimodal prompts): the last
    step's ThinkerOutput of a paced stream (interleaved with another) equals the unpaced one."""
    thinker, _ = stages
    streams, alone = {}, {}
    for name, (q, n) in zip("ab", QUESTIONS, strict=True):
        ids = _ids(thinker, q)
        alone[name] = list(thinker.stream(ids, _sampling(n), with_talker_inputs=True))[-1].output
        streams[name] = thinker.stream(ids, _sampling(n), with_talker_inputs=True, paced=True)
    got = _interleave(streams)
    for name in "ab":
        out = got[name][-1].output
        for field in ("sequence", "embeds", "hidden", "tts_embeds"):
            np.testing.assert_array_equal(getattr(out, field), getattr(alone[name], field))
        assert out.prompt_len == alone[name].prompt_len


def test_a_paced_talker_that_ends_first_leaves_the_rest_of_the_text_to_pass(stages):
    """max_frames below the answer's length: the talker ends while the thinker is mid-answer;
    the thinker's text still passes to its end (as unpaced), only the speech is capped."""
    thinker, talker = stages
    ids, short = _ids(thinker, "Tell me a story."), qo.TalkerSettings(max_frames=10, min_frames=10, do_sample=False)
    alone = list(talker.stream_while_thinking(thinker.stream(ids, _sampling(48), stream_talker_inputs=True),
                                              "Ethan", short))
    got = _interleave({"a": talker.stream_while_thinking(
        thinker.stream(ids, _sampling(48), stream_talker_inputs=True, paced=True), "Ethan", short, paced=True)})["a"]
    steps = [i for i in got if isinstance(i, qo.ThinkerStep)]
    assert steps[-1].completion_tokens == 48 and steps[-1].finish_reason
    assert _text(steps) == _text(alone)
    np.testing.assert_array_equal(np.concatenate([i for i in got if isinstance(i, np.ndarray)]),
                                  np.concatenate([i for i in alone if isinstance(i, np.ndarray)]))

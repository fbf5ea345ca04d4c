"""Qwen3-Omni stages (tiny random checkpoint), no Triton: parity with the reference
``Qwen3OmniMoeForConditionalGeneration.generate(..., return_audio=True)``.

Waveform tolerance: the pipeline decodes 5 / 25 / 25... frame chunks with 25 frames of left
context; the reference decodes all frames at once (``chunked_decode`` with 300-frame chunks). The
code2wav pre-transformer attends over a 72-frame sliding window, so a chunk whose left context is
cut to 25 frames sees less history: measured max |pipeline - reference| 2.7e-5 and 4.0e-5 on
the two prompts below (peak amplitude ~0.37). The codes are identical (a one-shot decode of the
pipeline's codes equals the reference waveform bit for bit). Asserted bound: WAVE_TOL = 2e-4.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
torch.set_num_threads(1)

from omni_triton.checkpoints import qwen3_omni as ckpt  # noqa: E402
from omni_triton.contracts import chat  # noqa: E402
from omni_triton.stages import chunking  # noqa: E402
from omni_triton.stages import csm as ct  # noqa: E402
from omni_triton.stages import qwen3_omni as qo  # noqa: E402

WAVE_TOL = 2e-4
PROMPTS = ["What is the capital of France?", "Tell me a story."]
TALKER = qo.TalkerSettings(max_frames=60, min_frames=20, do_sample=False)


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
    return ckpt.build_tiny_qwen3_omni(tmp_path_factory.mktemp("omni") / "qwen3-omni-tiny", seed=0)


@pytest.fixture(scope="module")
def stages(omni_dir):
    return (qo.OmniThinker.from_pretrained(omni_dir), qo.OmniTalker.from_pretrained(omni_dir),
            qo.OmniCode2Wav.from_pretrained(omni_dir))


@pytest.fixture(scope="module")
def reference(omni_dir):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(omni_dir).eval()


def _chat_ids(thinker, text):
    return thinker.encode(messages=[{"role": "user", "content": text}])


def test_builder_idempotent_and_tokenizer(omni_dir, stages):
    before = {p: p.stat().st_mtime_ns for p in omni_dir.rglob("*") if p.is_file()}
    assert ckpt.build_tiny_qwen3_omni(omni_dir, seed=0) == omni_dir
    assert before == {p: p.stat().st_mtime_ns for p in omni_dir.rglob("*") if p.is_file()}
    thinker = stages[0]
    tok, cfg = thinker.tokenizer, thinker.config
    for word, cid in [("user", cfg.user_token_id), ("assistant", cfg.assistant_token_id),
                      ("system", cfg.system_token_id), (ckpt.IM_START, cfg.im_start_token_id),
                      (ckpt.IM_END, cfg.im_end_token_id), (ckpt.TTS_PAD, cfg.tts_pad_token_id),
                      (ckpt.TTS_BOS, cfg.tts_bos_token_id), (ckpt.TTS_EOS, cfg.tts_eos_token_id)]:
        assert tok.convert_tokens_to_ids(word) == cid, word
    ids = _chat_ids(thinker, "Hi")
    (nl,) = tok("\n", add_special_tokens=False)["input_ids"]
    assert ids[:3] == [cfg.im_start_token_id, cfg.user_token_id, nl]
    assert ids[-3:] == [cfg.im_start_token_id, cfg.assistant_token_id, nl]
    assert thinker.eos_token_id == cfg.im_end_token_id


@pytest.mark.parametrize("prompt", PROMPTS)
def test_pipeline_matches_reference_generate(stages, reference, prompt):
    thinker, talker, decoder = stages
    ids = _chat_ids(thinker, prompt)
    res = qo.run_pipeline(thinker, talker, decoder, ids, qo.SamplingSettings(max_tokens=20), "Ethan", TALKER)
    seq, wav = reference.generate(
        torch.tensor([ids]), speaker="Ethan", return_audio=True, thinker_max_new_tokens=20,
        thinker_eos_token_id=thinker.eos_token_id, talker_do_sample=False,
        talker_max_new_tokens=TALKER.max_frames, talker_min_new_tokens=TALKER.min_frames)
    assert res.text == thinker.tokenizer.decode(seq[0, len(ids):], skip_special_tokens=True)
    assert len(res.text_deltas) > 1  # streamed, not one blob
    wav = wav[0, 0].numpy()
    assert decoder.decode([res.codes])[0].shape == wav.shape
    np.testing.assert_array_equal(decoder.decode([res.codes])[0], wav)  # same codes, same decoder
    np.testing.assert_array_equal(decoder.decode_reference(res.codes), wav)
    assert res.audio.shape == wav.shape
    assert np.abs(res.audio - wav).max() <= WAVE_TOL
    assert len(res.audio_chunks) >= 3
    assert res.audio_chunks[0].size < res.audio_chunks[1].size  # small first chunk: low TTFP
    rms = float(np.sqrt(np.mean(wav ** 2)))
    assert 1e-3 < rms and np.abs(wav).max() < 0.99  # audible, not clipped


def test_text_only_and_voice_change_audio(stages):
    thinker, talker, decoder = stages
    ids = _chat_ids(thinker, PROMPTS[0])
    text_only = qo.run_pipeline(thinker, talker, decoder, ids, qo.SamplingSettings(max_tokens=8), audio=False)
    assert text_only.text and text_only.codes is None and not text_only.audio_chunks
    settings = qo.TalkerSettings(max_frames=10, min_frames=10, do_sample=False)
    a = qo.run_pipeline(thinker, talker, decoder, ids, qo.SamplingSettings(max_tokens=8), "Ethan", settings)
    b = qo.run_pipeline(thinker, talker, decoder, ids, qo.SamplingSettings(max_tokens=8), "chelsie", settings)
    assert a.text == b.text == text_only.text
    assert not np.array_equal(a.codes, b.codes)  # the speaker id is part of the talker's prompt
    with pytest.raises(chat.ChatInputError):
        list(talker.stream(None, "Bob", settings))


def test_batched_padded_decode_equals_one_by_one(stages):
    """Right padding does not reach the kept samples (code2wav is causal up to its trimmed tail).
    Measured max |batched - single| <= 1e-6 (float rounding of shape-dependent kernels)."""
    decoder = stages[2]
    rng = np.random.default_rng(0)
    codes = rng.integers(0, decoder.codebook_size, size=(40, decoder.num_code_groups))
    items, lefts = [codes[:40], codes[:7], codes[3:30], codes[5:6], codes[:0]], [0, 2, 25, 0, 0]
    for c, lc, b in zip(items, lefts, decoder.decode(items, lefts), strict=True):
        single = decoder.decode([c], [lc])[0]
        assert b.shape == single.shape == (decoder.output_samples(len(c), lc) if len(c) else 0,)
        np.testing.assert_allclose(b, single, rtol=0, atol=1e-5)


@pytest.mark.parametrize("first,chunk,left", [(5, 25, 25), (1, 10, 25), (3, 7, 72)])
def test_chunked_decode_tiles_the_one_shot_decode(stages, first, chunk, left):
    """Chunks with left context concatenated have exactly the one-shot decode's length (the
    trimmed tail of each chunk comes from the next one) and differ by < WAVE_TOL; with 72 frames of
    left context (the attention window) by float rounding only."""
    decoder = stages[2]
    codes = np.random.default_rng(1).integers(0, decoder.codebook_size, size=(60, decoder.num_code_groups))
    sched = chunking.ChunkSchedule(first, chunk, left)
    chunks = []
    for total in range(0, 61, 3):
        chunks += sched.push(total)
    chunks += sched.flush(60)
    pcm = np.concatenate([decoder.decode([c], [lc])[0] for c, lc in chunking.chunk_slices(codes, chunks)])
    full = decoder.decode([codes])[0]
    assert pcm.shape == full.shape == (60 * decoder.samples_per_frame - decoder.trailing_loss,)
    assert np.abs(pcm - full).max() <= (1e-5 if left >= 72 else WAVE_TOL)


def test_thinker_streams_and_cancels(stages):
    thinker = stages[0]
    ids = _chat_ids(thinker, PROMPTS[1])
    full = list(thinker.stream(ids, qo.SamplingSettings(max_tokens=30, ignore_eos=True)))
    assert full[-1].finish_reason == "length" and full[-1].completion_tokens == 30
    assert all(s.finish_reason is None for s in full[:-1]) and len(full) > 2
    calls = []

    def stop():
        calls.append(1)
        return len(calls) > 5

    steps = list(thinker.stream(ids, qo.SamplingSettings(max_tokens=30), should_stop=stop))
    assert steps[-1].finish_reason == "abort" and steps[-1].completion_tokens <= 6
    assert steps[-1].output is None


def test_talker_cancel_stops_within_a_frame(stages):
    thinker, talker, _ = stages
    out = [s for s in thinker.stream(_chat_ids(thinker, PROMPTS[0]), qo.SamplingSettings(max_tokens=8),
                                     True)][-1].output
    calls = []

    def stop():
        calls.append(1)
        return len(calls) > 4

    frames = list(talker.stream(out, "Ethan", qo.TalkerSettings(max_frames=200, do_sample=False), stop))
    n = sum(len(f) for f in frames)
    assert n <= 5 and len(calls) == 5


def test_sampling_seed_stop_and_min_tokens(stages):
    thinker = stages[0]
    ids = _chat_ids(thinker, PROMPTS[0])

    def text(**kw):
        return "".join(s.text for s in thinker.stream(ids, qo.SamplingSettings(**kw)))

    a = text(temperature=1.0, seed=7, max_tokens=12)
    assert a == text(temperature=1.0, seed=7, max_tokens=12)
    greedy = text(max_tokens=12)
    assert greedy == text(temperature=0.0, max_tokens=12)
    stop = greedy[3:6]
    steps = list(thinker.stream(ids, qo.SamplingSettings(max_tokens=12, stop=[stop])))
    got = "".join(s.text for s in steps)
    assert steps[-1].finish_reason == "stop" and got == greedy[:greedy.find(stop)]


def test_parse_requests(stages):
    thinker = stages[0]
    s = qo.sampling_settings(json.dumps({"temperature": 0.5, "top_p": 0.9, "max_tokens": 5, "stop": "x", "seed": 1}),
                             32)
    assert (s.temperature, s.top_p, s.max_tokens, s.stop, s.seed) == (0.5, 0.9, 5, ["x"], 1)
    assert qo.sampling_settings(None, 32).greedy and qo.sampling_settings(None, 32).max_tokens == 32
    for bad in ['{"temperature": -1}', '{"max_tokens": 0}', '{"max_tokens": -3}', '{"top_p": 0}', "[1]", "nope",
                '{"stop": [1]}', '{"min_tokens": 9, "max_tokens": 3}', '{"best_of": 2}', '{"max_tokens": 1.5}']:
        with pytest.raises(chat.ChatInputError):
            qo.sampling_settings(bad, 32)
    for bad in ["[]", '[{"role": "robot", "content": "hi"}]', '[{"role": "user", "content": 3}]', "{",
                '[{"role": "user", "content": [{"type": "image_url"}]}]']:
        with pytest.raises(chat.ChatInputError):
            chat.parse_messages(bad)
    two_texts = '[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]'
    assert chat.parse_messages(two_texts) == [{"role": "user", "content": "ab"}]
    assert chat.parse_modalities(None, default=("text", "audio")) == ["text", "audio"]
    assert chat.parse_modalities('["text"]') == ["text"]
    for bad in ['["video"]', "[]", "text"]:
        with pytest.raises(chat.ChatInputError):
            chat.parse_modalities(bad)
    msgs = json.dumps([{"role": "user", "content": "Hello"}])
    ids, s = qo.prepare_thinker_request(thinker, None, msgs, None, 32, 1024, talker_inputs=True)
    assert ids == _chat_ids(thinker, "Hello") and s.max_tokens == 32
    with pytest.raises(chat.ChatInputError, match="max_model_len"):
        qo.prepare_thinker_request(thinker, None, json.dumps([{"role": "user", "content": "word " * 300}]), None, 32,
                                   64)
    with pytest.raises(chat.ChatInputError, match="exceeds"):
        qo.prepare_thinker_request(thinker, None, msgs, '{"max_tokens": 2000}', 32, 1024)
    with pytest.raises(chat.ChatInputError, match="assistant"):
        qo.prepare_thinker_request(thinker, "plain prompt", None, None, 32, 1024, talker_inputs=True)
    with pytest.raises(chat.ChatInputError):
        qo.prepare_thinker_request(thinker, None, None, None, 32, 1024)


def test_closing_streams_early_stops_generation(stages):
    """A consumer that goes away (generator closed) stops the generate thread at its next step."""
    thinker, talker, _ = stages
    ids = _chat_ids(thinker, PROMPTS[0])
    calls = []
    gen = thinker.stream(ids, qo.SamplingSettings(max_tokens=500, ignore_eos=True), True,
                         should_stop=lambda: calls.append(1) or False)
    next(gen)
    gen.close()
    assert len(calls) < 50, len(calls)
    out = [s for s in thinker.stream(ids, qo.SamplingSettings(max_tokens=8), True)][-1].output
    calls.clear()
    gen = talker.stream(out, "Ethan", qo.TalkerSettings(max_frames=500, do_sample=False),
                        lambda: calls.append(1) or False)
    next(gen)
    gen.close()
    assert len(calls) < 50, len(calls)


def test_text_only_talker_conditioning_is_the_embedding_of_the_ids(stages):
    """For text-only input the talker reads only ``hidden_states[0]`` (input embeddings) of every
    fed token: the embedding rows of ``sequence[:-1]``. An engine that returns only token ids (vLLM)
    would need no second forward pass for it; accept-layer states matter only at multimodal
    positions of the user turns (prompt positions: a partial prefill)."""
    thinker = stages[0]
    out = list(thinker.stream(_chat_ids(thinker, PROMPTS[0]), qo.SamplingSettings(max_tokens=6), True))[-1].output
    assert out.embeds.shape == out.hidden.shape == (len(out.sequence) - 1,
                                                    thinker.config.thinker_config.text_config.hidden_size)
    with torch.inference_mode():
        emb = thinker.thinker.get_input_embeddings()(torch.from_numpy(out.sequence[:-1]))
    np.testing.assert_array_equal(out.embeds, emb.numpy())
    assert out.tts_embeds.shape == (3, out.embeds.shape[1])


def test_keep_new_samples_tiles_chunks_with_a_trimmed_tail():
    """Decoder returning n*spf - loss samples: chunk 1 (no context) keeps [0, n1*spf - loss), a chunk
    with context keeps [left*spf - loss, n*spf - loss), so they tile the one-shot output."""
    spf, loss = 10, 3
    full = np.arange(7 * spf - loss, dtype=np.float32)  # "decode" of frames 0..6: sample k is k

    def decode(start, end):  # a causal decoder: the same samples for the same absolute positions
        return full[start * spf: end * spf - loss] if end == 7 else np.arange(start * spf, end * spf - loss,
                                                                              dtype=np.float32)

    a = ct.keep_new_samples(decode(0, 2), 2, 0, spf, loss)
    b = ct.keep_new_samples(decode(0, 5), 5, 2, spf, loss)
    c = ct.keep_new_samples(decode(3, 7), 4, 2, spf, loss)
    np.testing.assert_array_equal(np.concatenate([a, b, c]), full)


def test_validate_chunk():
    from omni_triton.stages.csm import validate_chunk

    c, left = validate_chunk(np.zeros((1, 6, 4), np.int32), np.array([[2]]), 4, 64)
    assert c.shape == (6, 4) and c.dtype == np.int64 and left == 2
    for codes, lc in [(np.zeros((1, 6, 3)), 0), (np.full((1, 6, 4), 64), 0), (np.full((1, 6, 4), -1), 0),
                      (np.zeros((1, 6, 4)), 7), (np.zeros((1, 6, 4)), -1)]:
        with pytest.raises(ValueError):
            validate_chunk(codes, np.array([lc]), 4, 64)

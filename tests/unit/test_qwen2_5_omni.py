"""Qwen2.5-Omni stages (tiny random checkpoint), no Triton: parity with the reference
``Qwen2_5OmniForConditionalGeneration.generate(..., return_audio=True)``.

Parity is bit-exact: text, codec ids and waveform. The pipeline runs the reference's own modules
with the reference's arguments; token2wav decodes the whole utterance (the DiT is not causal, see
``docs/qwen2_5_omni.md``) with its noise drawn after ``torch.manual_seed(seed)``, and the
reference run is seeded with the same seed just before ``generate`` (its greedy thinker and talker
draw no random numbers before the DiT does).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
torch.set_num_threads(1)

from omni_triton.checkpoints import qwen2_5_omni as ckpt  # noqa: E402
from omni_triton.contracts import chat  # noqa: E402
from omni_triton.stages import qwen2_5_omni as q25  # noqa: E402
from omni_triton.stages.qwen3_omni import SamplingSettings  # noqa: E402

TALKER = q25.TalkerSettings(max_frames=60, min_frames=20, do_sample=False)
CASES = [("What is the capital of France?", "Chelsie", 7), ("Tell me a story.", "Ethan", 123)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return ckpt.build_tiny_qwen2_5_omni(tmp_path_factory.mktemp("q25") / ckpt.NAME, seed=0)


@pytest.fixture(scope="module")
def stages(model_dir):
    return (q25.Qwen25Thinker.from_pretrained(model_dir), q25.Qwen25Talker.from_pretrained(model_dir),
            q25.Qwen25Token2Wav.from_pretrained(model_dir))


@pytest.fixture(scope="module")
def reference(model_dir):
    return q25.load_model(model_dir)


def _ids(thinker, text):
    return thinker.encode(messages=[{"role": "user", "content": text}])


def _reference(reference, thinker, talker, ids, voice, seed, max_tokens=16):
    x = torch.tensor([ids])
    torch.manual_seed(seed)
    seq, wav = reference.generate(
        x, attention_mask=torch.ones_like(x), speaker=voice, thinker_max_new_tokens=max_tokens,
        thinker_eos_token_id=thinker.eos_token_id, thinker_do_sample=False, talker_do_sample=False,
        talker_max_new_tokens=TALKER.max_frames, talker_min_new_tokens=TALKER.min_frames,
        talker_eos_token_id=talker.eos_token_ids)
    return seq[0, len(ids):].tolist(), wav.numpy()


def test_builder_reloadable_idempotent_small(model_dir, stages):
    before = {p: p.stat().st_mtime_ns for p in model_dir.rglob("*") if p.is_file()}
    assert ckpt.build_tiny_qwen2_5_omni(model_dir, seed=0) == model_dir
    assert before == {p: p.stat().st_mtime_ns for p in model_dir.rglob("*") if p.is_file()}
    assert sum(p.stat().st_size for p in model_dir.rglob("*") if p.is_file()) < 10e6
    spk = torch.load(model_dir / "spk_dict.pt", weights_only=True)
    assert sorted(spk) == ["Chelsie", "Ethan"] == sorted(ckpt.read_speakers(model_dir))
    thinker = stages[0]
    tok = thinker.tokenizer
    for s in spk.values():  # each voice's text bos is one special token of the thinker's vocabulary
        assert tok.convert_ids_to_tokens(s["bos_token"]).startswith("<|tts_bos_")
    man = json.loads((model_dir / "manifest.json").read_text())
    assert tok.convert_ids_to_tokens(man["thinker_eos_token_id"]) == "<|im_end|>"
    assert thinker.has_assistant_start(_ids(thinker, "hi"))


def test_builder_is_deterministic(tmp_path, model_dir):
    again = ckpt.build_tiny_qwen2_5_omni(tmp_path / "again", seed=0)
    a = (model_dir / "model.safetensors").read_bytes()
    assert a == (again / "model.safetensors").read_bytes()


@pytest.mark.parametrize("prompt,voice,seed", CASES)
def test_pipeline_equals_reference_generate(stages, reference, prompt, voice, seed):
    thinker, talker, token2wav = stages
    ids = _ids(thinker, prompt)
    res = q25.run_pipeline(thinker, talker, token2wav, ids, SamplingSettings(temperature=0, max_tokens=16),
                           voice, TALKER, seed=seed)
    gen, wav = _reference(reference, thinker, talker, ids, voice, seed)
    assert res.text == thinker.tokenizer.decode(gen, skip_special_tokens=True)
    assert res.completion_tokens == len(gen)
    assert res.audio.dtype == np.float32 and len(res.audio) == len(res.codes) * token2wav.samples_per_code
    assert np.abs(wav).max() > 0.05  # audible, not silence
    assert res.audio.shape == wav.shape and np.array_equal(res.audio, wav)  # bit-exact


def test_voices_and_seeds_change_the_audio(stages):
    thinker, talker, token2wav = stages
    codes = np.arange(30, dtype=np.int64) % 64
    a = token2wav.synthesize(codes, "Chelsie", 1)
    assert np.array_equal(a, token2wav.synthesize(codes, "chelsie", 1))  # seeded: reproducible
    assert not np.array_equal(a, token2wav.synthesize(codes, "Chelsie", 2))  # the seed is the noise
    assert not np.array_equal(a, token2wav.synthesize(codes, "Ethan", 1))  # the voice conditions the DiT
    state = torch.random.get_rng_state()
    token2wav.synthesize(codes, "Ethan", 5)
    assert torch.equal(state, torch.random.get_rng_state())  # the process's own RNG is left alone


def test_talker_stops_at_eos_and_when_asked(stages):
    thinker, talker, _ = stages
    ids = _ids(thinker, CASES[0][0])  # its talker emits an EOS id after 50 codes
    out = [s for s in thinker.stream(ids, SamplingSettings(temperature=0, max_tokens=16), True)][-1].output
    free = np.concatenate(list(talker.stream(out, "Chelsie", q25.TalkerSettings(max_frames=200, do_sample=False))))
    assert free.shape[1] == 1 and len(free) < 200 and not set(free[:, 0].tolist()) & set(talker.eos_token_ids)
    calls = []
    stopped = np.concatenate(list(talker.stream(out, "Chelsie", TALKER,
                                                should_stop=lambda: len(calls.append(1) or calls) > 5)))
    assert len(stopped) <= 7 < TALKER.min_frames


def test_text_only_and_errors(stages):
    thinker, talker, token2wav = stages
    res = q25.run_pipeline(thinker, talker, token2wav, _ids(thinker, "Hello"),
                           SamplingSettings(temperature=0, max_tokens=8),
                           audio=False)
    assert res.text and res.codes is None and not res.audio_chunks
    with pytest.raises(chat.ChatInputError, match="unknown voice"):
        token2wav.voice("alloy")
    with pytest.raises(chat.ChatInputError, match="unknown voice"):
        talker.voice("Aiden")
    with pytest.raises(chat.ChatInputError, match="codec ids"):
        token2wav.validate(np.array([0, token2wav.num_embeds + 1]))
    with pytest.raises(chat.ChatInputError, match="takes 1"):
        token2wav.validate(np.zeros(0, np.int64))


def test_talker_inputs_layout_and_pad_after_the_first_thinker_eos(stages):
    """``build_talker_inputs`` on a sequence whose answer has the thinker EOS in the middle (as
    with ``ignore_eos``; a greedy stop at EOS makes the reference's per-row rewrite a no-op): the
    talker's prompt is prompt states + voice bos + the first answer token, its reply part the
    later answer states, then ``tts_text_end`` where the EOS was and ``tts_text_pad`` after it."""
    from omni_triton.stages.qwen3_omni import ThinkerOutput

    _, talker, _ = stages
    eos_id = talker.thinker_eos_token_id
    H = talker.bos_embeds["Chelsie"].shape[-1]
    P, gen = 5, [20, 21, 22, eos_id, 23, 24]
    seq = np.array(list(range(30, 30 + P)) + gen, np.int64)
    rng = np.random.default_rng(0)
    embeds, hidden, tts = (rng.standard_normal(s).astype(np.float32) for s in ((len(seq) - 1, H), (len(seq) - 1, H),
                                                                               (3, H)))
    out = ThinkerOutput(seq, P, embeds, hidden, tts)
    bos = torch.ones((1, 1, H))
    inp = q25.build_talker_inputs(talker.talker, out, 7, bos, eos_id)
    state = hidden + embeds
    assert inp["input_text_ids"][0].tolist() == seq[:P].tolist() + [7, gen[0]]
    assert inp["input_ids"].shape == inp["attention_mask"].shape == (1, P + 2)
    np.testing.assert_array_equal(inp["inputs_embeds"][0].numpy(),
                                  np.concatenate([state[:P], bos[0].numpy(), state[P:P + 1]]))
    reply = inp["thinker_reply_part"][0].numpy()
    assert reply.shape == (len(gen), H)
    np.testing.assert_array_equal(reply[:2], state[P + 1:P + 3])  # answer tokens 1, 2
    np.testing.assert_array_equal(reply[2], tts[1])  # tts_text_end where the EOS was generated
    np.testing.assert_array_equal(reply[3:], np.broadcast_to(tts[2], (len(gen) - 3, H)))  # then pad

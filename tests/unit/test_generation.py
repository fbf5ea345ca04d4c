"""Helpers of the chat / completions router: merging n streams, sampling parameters, usage,
streamed audio framing."""

from __future__ import annotations

import asyncio
import base64
import io

import numpy as np
import pytest
import soundfile as sf

from omni_triton.media.audio import float_to_pcm16
from openai_frontend.engine import GenerationChunk
from openai_frontend.generation import (
    END,
    AudioStreamEncoder,
    ChoiceState,
    merge,
    sampling_parameters,
    usage_of,
)
from openai_frontend.schemas import ChatCompletionRequest

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class Stream:
    """An async iterator of chunks that can fail or hang, and says how it ended."""

    def __init__(self, texts, fail=False, hang=False):
        self.texts, self.fail, self.hang = texts, fail, hang
        self.closed = False

    async def gen(self):
        try:
            for t in self.texts:
                await asyncio.sleep(0)
                yield GenerationChunk(text=t)
            if self.fail:
                raise RuntimeError("stream failed")
            if self.hang:
                await asyncio.Event().wait()
        finally:
            self.closed = True


async def test_merge_yields_every_chunk_and_end_markers():
    a, b = Stream(["a1", "a2"]), Stream(["b1", "b2", "b3"])
    items = [(i, c.text if c is not END else END) async for i, c in merge([a.gen(), b.gen()])]
    assert [t for i, t in items if i == 0] == ["a1", "a2", END]
    assert [t for i, t in items if i == 1] == ["b1", "b2", "b3", END]
    assert a.closed and b.closed


async def test_merge_error_cancels_the_other_streams():
    a, b = Stream(["a1"], fail=True), Stream(["b1"], hang=True)
    with pytest.raises(RuntimeError, match="stream failed"):
        async for _ in merge([a.gen(), b.gen()]):
            pass
    assert b.closed  # the hanging stream was cancelled, not left running


async def test_merge_closed_early_closes_all_streams():
    a, b = Stream(["a1"], hang=True), Stream(["b1"], hang=True)
    m = merge([a.gen(), b.gen()])
    await m.__anext__()
    await m.aclose()
    assert a.closed and b.closed


def test_sampling_parameters_only_given_keys_and_seed_offset():
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    assert sampling_parameters(body, None) == {}
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], temperature=0,
                                 stop=["a", "b"], seed=7, ignore_eos=True, min_tokens=2)
    assert sampling_parameters(body, 5, index=2) == {"temperature": 0.0, "min_tokens": 2, "ignore_eos": True,
                                                     "max_tokens": 5, "stop": ["a", "b"], "seed": 9}


def test_usage_counts_each_prompt_once():
    states = [ChoiceState(prompt_tokens=10, completion_tokens=3), ChoiceState(prompt_tokens=10, completion_tokens=4),
              ChoiceState(prompt_tokens=6, completion_tokens=1)]
    u = usage_of(states, [0, 0, 1])
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (16, 8, 24)
    u = usage_of(states[:2])
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (10, 7, 17)


def test_choice_state_keeps_cumulative_tokens_and_audio():
    s = ChoiceState()
    s.add(GenerationChunk(text="a", prompt_tokens=4, completion_tokens=1))
    s.add(GenerationChunk(audio=np.ones(3, np.float32), sample_rate=16000, completion_tokens=1))
    s.add(GenerationChunk(text="b", finish_reason="stop", completion_tokens=2))
    assert s.full_text == "ab" and s.finish_reason == "stop" and s.completion_tokens == 2
    assert s.samples.tolist() == [1.0, 1.0, 1.0] and s.sample_rate == 16000


def test_audio_stream_encoder_wav_chunks_are_whole_wav_files():
    """vLLM-Omni's convention: every ``wav`` delta is a complete 16-bit WAV (``wave.open`` reads
    it alone, as its benchmark client does)."""
    import wave

    enc = AudioStreamEncoder("wav")
    parts = [np.linspace(-0.5, 0.5, 100, dtype=np.float32), np.zeros(50, np.float32)]
    for p in parts:
        data = base64.b64decode(enc.encode(p, 16000))
        with wave.open(io.BytesIO(data), "rb") as w:
            assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 16000, len(p))
        y, sr = sf.read(io.BytesIO(data), dtype="float32")
        assert sr == 16000 and np.allclose(y, p, atol=1 / 32767)
    pcm = AudioStreamEncoder("pcm16")
    assert base64.b64decode(pcm.encode(parts[0], 16000)) == float_to_pcm16(parts[0])
    with pytest.raises(ValueError):
        AudioStreamEncoder("mp3")

"""Qwen2.5-Omni talker stage: codec ids ``np.int64 [n, 1]`` streamed as the talker generates them.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from omni_triton.checkpoints.common import read_manifest
from omni_triton.contracts.chat import ChatInputError
from omni_triton.stages.qwen3_omni import ThinkerOutput
from omni_triton.stages.qwen3_omni.thinker import _QueueStreamer
from omni_triton.stages.streaming import stopping_criteria, threaded_generate


def build_talker_inputs(talker, out: ThinkerOutput, text_bos_id: int, text_bos_embed: torch.Tensor,
                        thinker_eos_token_id) -> dict:
    """The talker's ``generate`` inputs from the thinker's outputs, as
    ``Qwen2_5OmniForConditionalGeneration.generate`` builds them (transformers 5.19,
    "2. Generate speech tokens from talker module"), batch 1, text-only user turns.

    ``talker``: ``model.talker`` (its codec special ids); ``text_bos_id``: the voice's ``bos_token``
    (``spk_dict.pt``), ``text_bos_embed`` float32 [1, 1, H]: the thinker's embedding of it; ``out.tts_embeds`` rows 1
    and 2 are the thinker's embeddings of ``tts_text_end`` / ``tts_text_pad``.
    Returns ``input_ids`` int64 [1, P+2] (codec mask x P, pad, bos), ``input_text_ids`` int64
    [1, P+2] (prompt, voice bos id, first answer token), ``inputs_embeds`` [1, P+2, H],
    ``thinker_reply_part`` [1, n, H] (answer tokens 1.., then end, pad; rewritten at the first
    thinker EOS as the reference does), ``attention_mask`` int64 [1, P+2].
    Raises :class:`ChatInputError` when the thinker generated fewer than 2 tokens.
    """
    seq = torch.from_numpy(np.asarray(out.sequence, np.int64))[None]
    P = int(out.prompt_len)
    n = seq.shape[1] - P
    if n < 2:
        raise ChatInputError("the thinker generated fewer than 2 tokens: nothing to speak")
    embeds = torch.from_numpy(np.asarray(out.embeds, np.float32))[None]
    hidden = torch.from_numpy(np.asarray(out.hidden, np.float32))[None]
    tts = torch.from_numpy(np.asarray(out.tts_embeds, np.float32))[None]
    eos_embedding, pad_embedding = tts[:, 1:2], tts[:, 2:3]
    input_ids, gen_ids = seq[:, :P], seq[:, P:]
    reply = hidden[:, P:] + embeds[:, P:]
    inputs_embeds = torch.cat([hidden[:, :P] + embeds[:, :P], text_bos_embed, reply[:, :1, :]], dim=1)
    reply = torch.cat([reply[:, 1:, :], eos_embedding, pad_embedding], dim=1)
    if thinker_eos_token_id is not None:
        eos_ids = torch.as_tensor(thinker_eos_token_id).flatten()
        is_eos = (gen_ids.unsqueeze(-1) == eos_ids).any(dim=-1)
        first_eos = torch.where(is_eos, torch.arange(n), n).min(dim=-1).values.clamp(min=1, max=n - 1)
        pos = torch.arange(reply.shape[1]).unsqueeze(0)
        reply = torch.where((pos >= first_eos.unsqueeze(1)).unsqueeze(-1), pad_embedding, reply)
        reply = torch.where((pos == (first_eos - 1).unsqueeze(1)).unsqueeze(-1), eos_embedding, reply)
    return {
        "input_ids": torch.cat([torch.full_like(input_ids, talker.codec_mask_token),
                                torch.full((1, 1), talker.codec_pad_token, dtype=torch.long),
                                torch.full((1, 1), talker.codec_bos_token, dtype=torch.long)], dim=1),
        "input_text_ids": torch.cat([input_ids, torch.full((1, 1), int(text_bos_id), dtype=torch.long), gen_ids[:, :1]],
                                    dim=-1),
        "inputs_embeds": inputs_embeds,
        "thinker_reply_part": reply,
        "attention_mask": torch.ones((1, P + 2), dtype=torch.long),
    }


@dataclass
class TalkerSettings:
    """Talker generation; defaults are the reference ``generate``'s ``talker_*`` arguments, except
    ``do_sample`` which the served config sets (greedy for the parity tests)."""

    max_frames: int = 4096
    min_frames: int = 0
    do_sample: bool = True
    top_k: int = 40
    top_p: float = 0.8
    temperature: float = 0.9
    repetition_penalty: float = 1.05


def talker_generate_kwargs(talker, eos_token_ids: Sequence[int], s: TalkerSettings) -> dict:
    """``talker.generate`` keyword arguments exactly as the reference builds ``talker_kwargs``
    (+ ``suppress_tokens=[codec_bos]``; ``min_new_tokens`` when ``min_frames``)."""
    kw = {"max_new_tokens": int(s.max_frames), "do_sample": bool(s.do_sample), "top_k": int(s.top_k),
          "top_p": float(s.top_p), "temperature": float(s.temperature), "eos_token_id": list(eos_token_ids),
          "pad_token_id": talker.codec_pad_token, "repetition_penalty": float(s.repetition_penalty),
          "suppress_tokens": [talker.codec_bos_token]}
    if s.min_frames:
        kw["min_new_tokens"] = int(s.min_frames)
    return kw


class Qwen25Talker:
    """The talker of a Qwen2.5-Omni checkpoint, streaming codec ids.

    Holds ``model.talker``, the voices of ``spk_dict.pt`` and the thinker's input embedding of each
    voice's ``bos_token`` (the only thinker weights the talker needs, taken at load time), and the
    talker EOS ids (the reference's ``talker_eos_token_id``: codec pad and end). One request at a
    time per object (``talker.rope_deltas`` is per-request state of the module).
    """

    def __init__(self, model, manifest: dict | None = None):
        self.talker = model.talker
        self.manifest = manifest or {}
        self.eos_token_ids = [int(i) for i in self.manifest.get("talker_eos_token_id", [8292, 8294])]
        self.thinker_eos_token_id = self.manifest.get("thinker_eos_token_id")
        emb = model.thinker.get_input_embeddings()
        self.voices = {name: int(p["bos_token"]) for name, p in model.speaker_map.items()}
        with torch.inference_mode():
            self.bos_embeds = {name: emb(torch.tensor([[i]])).float().clone() for name, i in self.voices.items()}
        self.num_code_groups = 1
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, model_dir, device: str = "cpu") -> Qwen25Talker:
        """Loads the whole checkpoint, keeps the talker and the voices' bos embeddings."""
        from omni_triton.stages.qwen2_5_omni.thinker import load_model

        model = load_model(model_dir, audio=True, device=device)
        talker = cls(model, read_manifest(model_dir))
        del model.thinker, model.token2wav
        return talker

    def voice(self, name: str) -> str:
        """The ``spk_dict`` key for ``name`` (case-insensitive). Raises :class:`ChatInputError`."""
        for key in self.voices:
            if key.lower() == str(name).lower():
                return key
        raise ChatInputError(f"unknown voice {name!r}; available: {', '.join(self.voices)}")

    def inputs(self, out: ThinkerOutput, voice: str) -> dict:
        """:func:`build_talker_inputs` for ``voice``. Raises :class:`ChatInputError`."""
        v = self.voice(voice)
        return build_talker_inputs(self.talker, out, self.voices[v], self.bos_embeds[v], self.thinker_eos_token_id)

    def stream(self, out: ThinkerOutput, voice: str, settings: TalkerSettings,
               should_stop: Callable[[], bool] | None = None) -> Iterator[np.ndarray]:
        """Yield int64 [n, 1] codec ids (n >= 1) as they are generated, up to (not including) the
        first talker EOS id. Stops at EOS, ``max_frames``, or when ``should_stop()`` is True
        (checked after every talker step)."""
        inputs = self.inputs(out, voice)
        kw = talker_generate_kwargs(self.talker, self.eos_token_ids, settings)
        user_stop = should_stop or (lambda: False)
        closed = threading.Event()
        q: queue.Queue = queue.Queue()
        done = object()

        def run():
            from transformers import StoppingCriteriaList

            with self._lock:
                stop = stopping_criteria(lambda ids: closed.is_set() or user_stop())
                self.talker.generate(**inputs, streamer=_QueueStreamer(q),
                                     stopping_criteria=StoppingCriteriaList([stop]), **kw)

        eos = set(self.eos_token_ids)
        ended = False
        for items in threaded_generate(run, q, done, closed):
            if not isinstance(items, list) or ended:
                continue
            codes = []
            for t in items:
                if t in eos:
                    ended = True
                    break
                codes.append(t)
            if codes:
                yield np.asarray(codes, np.int64)[:, None]

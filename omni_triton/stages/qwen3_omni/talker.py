"""Qwen3-Omni talker + code predictor stage: codec frames ``np.int64 [T, G]`` streamed as each
forward pass completes one.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from omni_triton.checkpoints.common import read_manifest
from omni_triton.contracts.chat import ChatInputError
from omni_triton.stages.qwen3_omni.inputs import talker_media_kwargs
from omni_triton.stages.qwen3_omni.thinker import ThinkerOutput
from omni_triton.stages.streaming import stopping_criteria, threaded_generate

# ------------------------------------------------------------------------------------ talker


def build_talker_inputs(model_like, out: ThinkerOutput, speaker_id: int, thinker_eos_token_id) -> dict:
    """The talker's ``generate`` inputs from the thinker's outputs, as
    ``Qwen3OmniMoeForConditionalGeneration.generate`` builds them (transformers 5.19,
    ``modeling_qwen3_omni_moe.py`` "2. Prepare talker input"), batch 1, text or multimodal user turns.

    ``model_like`` has ``.config`` (``Qwen3OmniMoeConfig``) and ``.talker``; the reference's own
    ``_get_talker_user_parts`` / ``_get_talker_assistant_parts`` are called on it.
    Returns ``inputs_embeds`` [1, S, Ht], ``trailing_text_hidden`` [1, N, Ht], ``tts_pad_embed``
    [1, 1, Ht], ``talker_input_ids`` int64 [1, S], ``attention_mask`` int64 [1, S], and for
    multimodal prompts ``audio_feature_lengths`` / ``image_grid_thw`` / ``video_grid_thw`` /
    ``video_second_per_grid`` (``out.talker_media``).
    Raises :class:`ChatInputError` when the sequence has no ``<|im_start|>assistant`` or the thinker
    generated fewer than 2 tokens (the reference needs the first generated token's embedding).
    """
    from transformers import Qwen3OmniMoeForConditionalGeneration as Ref

    cfg, talker = model_like.config, model_like.talker
    seq = torch.from_numpy(np.asarray(out.sequence, np.int64))[None]
    input_ids = seq[:, : out.prompt_len]
    thinker_embed = torch.from_numpy(np.asarray(out.embeds, np.float32))[None].to(talker.dtype)
    thinker_hidden = torch.from_numpy(np.asarray(out.hidden, np.float32))[None].to(talker.dtype)
    if seq.shape[1] - out.prompt_len < 2:
        raise ChatInputError("the thinker generated fewer than 2 tokens: nothing to speak")
    tc = cfg.thinker_config
    multimodal_mask = (seq == tc.audio_token_id) | (seq == tc.image_token_id) | (seq == tc.video_token_id)
    attn = input_ids.new_ones(input_ids.shape)
    L = input_ids.shape[1]
    pos = torch.arange(L).unsqueeze(0).expand_as(input_ids)
    im_start_pos = torch.where(input_ids == cfg.im_start_token_id, pos, pos.new_full((), -1))
    prev_im_start = torch.cummax(im_start_pos, dim=-1).values.clamp_min(0)
    role_ids = input_ids.gather(1, (prev_im_start + 1).clamp_max(L - 1))
    user_mask = (role_ids == cfg.user_token_id) & attn.bool()
    user_lengths = user_mask.sum(dim=-1)
    max_user = int(user_lengths.max().item())
    user_idx = torch.where(user_mask, L + pos, pos).argsort(dim=-1)[:, -max_user:] if max_user else pos[:, :0]
    full_user = Ref._get_talker_user_parts(model_like, 0, L, multimodal_mask, thinker_hidden, thinker_embed)
    user_embeds = full_user.gather(1, user_idx.unsqueeze(-1).expand(-1, -1, full_user.shape[-1]))
    user_ids = seq[:, :L].gather(1, user_idx)
    user_attn = (torch.arange(max_user).unsqueeze(0) >= (max_user - user_lengths).unsqueeze(1)).to(attn.dtype)
    starts = torch.nonzero(((input_ids[:, :-1] == cfg.im_start_token_id)
                            & (input_ids[:, 1:] == cfg.assistant_token_id))[0]).flatten()
    if starts.numel() == 0:
        raise ChatInputError("speech needs a chat prompt (<|im_start|>assistant); use MESSAGES")
    assistant_start = int(starts[-1].item())
    # the thinker's input embeddings of tts_bos/eos/pad arrive in out.tts_embeds
    tts = talker.text_projection(torch.from_numpy(np.asarray(out.tts_embeds, np.float32))[None].to(talker.dtype))
    tts_bos, tts_eos, tts_pad = tts.chunk(3, dim=1)
    asst_embeds, asst_ids, trailing = Ref._get_talker_assistant_parts(
        model_like, assistant_start, seq.shape[-1], speaker_id, thinker_embed, tts_pad, tts_bos, tts_eos)
    if thinker_eos_token_id is not None:
        gen_ids = seq[:, L:]
        eos_ids = torch.as_tensor(thinker_eos_token_id).flatten()
        is_eos = (gen_ids.unsqueeze(-1) == eos_ids).any(dim=-1)
        n = gen_ids.shape[1]
        first_eos = torch.where(is_eos, torch.arange(n), n).min(dim=-1).values
        tpos = torch.arange(trailing.shape[1]).unsqueeze(0)
        trailing = torch.where((tpos > first_eos.unsqueeze(1)).unsqueeze(-1), tts_pad.to(trailing.dtype), trailing)
        trailing = torch.where((tpos == first_eos.unsqueeze(1)).unsqueeze(-1), tts_eos.to(trailing.dtype), trailing)
    return {
        "inputs_embeds": torch.cat((user_embeds, asst_embeds), dim=1),
        "trailing_text_hidden": trailing,
        "tts_pad_embed": tts_pad,
        "talker_input_ids": torch.cat((user_ids, asst_ids), dim=1),
        "attention_mask": torch.cat((user_attn, attn.new_ones((1, asst_embeds.shape[1]))), dim=1),
        # multimodal prompts: the grids / audio lengths the reference also gives talker.generate
        # (3D rope positions of the media tokens); none for text
        **talker_media_kwargs(out.talker_media),
    }


@dataclass
class TalkerSettings:
    """Talker generation; defaults are the reference ``generate``'s (``talker_*`` arguments),
    except ``do_sample`` which the served config sets (greedy for parity tests)."""

    max_frames: int = 4096
    min_frames: int = 0
    do_sample: bool = True
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 0.9
    repetition_penalty: float = 1.05


def talker_generate_kwargs(config, s: TalkerSettings) -> dict:
    """``talker.generate`` keyword arguments exactly as the reference builds ``talker_kwargs``."""
    tcfg = config.talker_config
    vocab = tcfg.text_config.vocab_size
    kw = {
        "max_new_tokens": int(s.max_frames), "do_sample": bool(s.do_sample), "top_k": int(s.top_k),
        "top_p": float(s.top_p), "temperature": float(s.temperature), "eos_token_id": tcfg.codec_eos_token_id,
        "repetition_penalty": float(s.repetition_penalty),
        "suppress_tokens": [i for i in range(vocab - 1024, vocab) if i != tcfg.codec_eos_token_id],
        "output_hidden_states": True, "return_dict_in_generate": True,
    }
    if s.min_frames:
        kw["min_new_tokens"] = int(s.min_frames)
    return kw


class OmniTalker:
    """Talker + code predictor of a Qwen3-Omni checkpoint, streaming codec frames.

    Runs ``model.talker.generate`` with :func:`build_talker_inputs` and
    :func:`talker_generate_kwargs` (the reference's own path). A frame's residual codebooks are
    drawn by the code predictor inside the *next* step's ``prepare_inputs_for_generation`` and come
    out of that step's forward as ``hidden_states[1]`` (``residual_codes`` [1, G]); a forward hook
    on the talker queues each one, so a frame streams out one talker step after its codebook 0.
    The reference collects the same tensors from ``talker_result.hidden_states`` afterwards.
    """

    def __init__(self, model, manifest: dict | None = None):
        self.model = model
        self.talker = model.talker
        self.config = model.config
        self.manifest = manifest or {}
        self.num_code_groups = int(self.config.talker_config.num_code_groups)
        self.speaker_ids = {k.lower(): int(v) for k, v in self.config.talker_config.speaker_id.items()}
        self.thinker_eos_token_id = int(self.manifest.get("thinker_eos_token_id", self.config.im_end_token_id))
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, model_dir, device: str = "cpu") -> "OmniTalker":
        """Loads the whole checkpoint, then drops the thinker and code2wav (a real deployment would
        save the talker as its own folder; the tiny one is a few MB)."""
        from transformers import Qwen3OmniMoeForConditionalGeneration

        model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir).to(device).eval()
        del model.thinker, model.code2wav
        return cls(model, read_manifest(model_dir))

    def speaker_id(self, voice: str) -> int:
        try:
            return self.speaker_ids[voice.lower()]
        except KeyError:
            raise ChatInputError(f"unknown voice {voice!r}; available: {', '.join(self.speaker_ids)}") from None

    def stream(self, out: ThinkerOutput, voice: str, settings: TalkerSettings,
               should_stop: Callable[[], bool] | None = None) -> Iterator[np.ndarray]:
        """Yield int64 [n, G] codec frames (n >= 1) as they are generated. Stops at the codec EOS,
        ``max_frames``, or when ``should_stop()`` is True (checked after every talker step)."""
        inputs = build_talker_inputs(self.model, out, self.speaker_id(voice), self.thinker_eos_token_id)
        kw = talker_generate_kwargs(self.config, settings)
        user_stop = should_stop or (lambda: False)
        closed = threading.Event()
        q: queue.Queue = queue.Queue()
        done = object()

        def hook(module, args, output):
            codes = output.hidden_states[1] if output.hidden_states is not None else None
            if codes is not None:
                q.put(codes[0].to(torch.int64).numpy().copy())

        def run():
            from transformers import StoppingCriteriaList

            with self._lock:
                handle = self.talker.register_forward_hook(hook)
                try:
                    stop = stopping_criteria(lambda ids: closed.is_set() or user_stop())
                    self.talker.generate(**inputs, stopping_criteria=StoppingCriteriaList([stop]), **kw)
                finally:
                    handle.remove()

        for items in threaded_generate(run, q, done, closed):
            if isinstance(items, list) and items:
                yield np.stack(items).astype(np.int64)

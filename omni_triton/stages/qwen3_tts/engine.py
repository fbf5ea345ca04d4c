"""Qwen3-TTS talker and codec on the official ``qwen-tts`` package (runs in the Qwen3-TTS
environment): the package's own prompt building, a batched streaming decode loop across
requests, the codec's chunk decode, and the package's non-streaming generation as the reference.

Shapes: codec frames ``np.int64 [T, G]`` (G code groups, frame-major, 12.5 frames/s); audio
``np.float32`` mono PCM in [-1, 1] at 24 kHz, 1920 samples per frame.

How a request becomes frames (:class:`TalkerBatch`):

1. :meth:`Qwen3TtsForm.prompt` calls the package's ``generate_custom_voice`` /
   ``generate_voice_design`` / ``generate_voice_clone`` with the request, and stops it where it hands
   the talker its inputs (``talker.generate`` is intercepted for that one call): the prefill
   embeddings, the trailing text embeddings, the pad embedding and the generation settings come
   from the package's code, not from a re-implementation.
2. :meth:`TalkerBatch.add` prefills the request alone and merges its KV cache into the batch
   (left padding + attention mask); :meth:`TalkerBatch.step` runs one decode step for every
   request in the batch at once: the code predictor (G-1 positions) and the talker layer stack as
   one forward pass each over all rows, each row with its own trailing text, position, token
   history (repetition penalty) and stop rule. A finished or cancelled row leaves the batch.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from omni_triton.stages.qwen3_tts.request import Qwen3TtsRequest, VoicePrompt

LOG = logging.getLogger("omni_triton.qwen3_tts")
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920


class _Captured(Exception):
    def __init__(self, kwargs):
        super().__init__("talker inputs captured")
        self.kwargs = kwargs


@dataclass
class TalkerPrompt:
    """What the package hands its talker for one request: ``embeds`` [1, T, D], ``trailing`` [1, L, D]
    (text still to be read, one per decode step), ``pad`` [1, 1, D] (after the text), and the
    generation settings (eos id, suppressed ids, min new tokens, repetition penalty, cap)."""

    embeds: torch.Tensor
    trailing: torch.Tensor
    pad: torch.Tensor
    eos: int
    suppress: list
    min_new_tokens: int
    repetition_penalty: float
    max_new_tokens: int


class Qwen3TtsForm:
    """One loaded form (``Qwen3TTSModel.from_pretrained``: custom_voice, voice_design or base)."""

    def __init__(self, path: str | Path):
        from qwen_tts import Qwen3TTSModel

        self.path = Path(path)
        self.tts = Qwen3TTSModel.from_pretrained(str(path))
        self.model = self.tts.model.eval()
        self.task = self.model.tts_model_type
        self.talker = self.model.talker
        self.num_groups = self.talker.config.num_code_groups
        self.speakers = {s.lower() for s in (self.model.get_supported_speakers() or [])}
        self.languages = {lang.lower() for lang in self.model.get_supported_languages() if lang != "auto"}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ the package's own calls
    def _call(self, req: Qwen3TtsRequest):
        kw = dict(language=req.language, max_new_tokens=req.max_new_tokens)
        if req.task == "custom_voice":
            return self.tts.generate_custom_voice(req.text, speaker=req.speaker, instruct=req.instructions or None,
                                                  **kw)
        if req.task == "voice_design":
            return self.tts.generate_voice_design(req.text, instruct=req.instructions or "", **kw)
        return self.tts.generate_voice_clone(req.text, voice_clone_prompt=[_prompt_item(req.voice_prompt)], **kw)

    def prompt(self, req: Qwen3TtsRequest) -> TalkerPrompt:
        """The talker inputs the package builds for ``req`` (see the module docstring)."""
        def capture(**kwargs):
            raise _Captured(kwargs)

        with self._lock:
            self.talker.generate = capture
            try:
                self._call(req)
            except _Captured as got:
                k = got.kwargs
            finally:
                del self.talker.generate
        return TalkerPrompt(k["inputs_embeds"], k["trailing_text_hidden"], k["tts_pad_embed"], int(k["eos_token_id"]),
                            list(k["suppress_tokens"]), int(k["min_new_tokens"]), float(k["repetition_penalty"]),
                            int(k["max_new_tokens"]))

    def reference(self, req: Qwen3TtsRequest) -> np.ndarray:
        """The package's non-streaming generation + decode of ``req``: float32 PCM at 24 kHz."""
        with self._lock, torch.no_grad():
            wavs, _ = self._call(req)
        return np.asarray(wavs[0], np.float32)

    def voice_prompt(self, audio: np.ndarray, sample_rate: int, ref_text: str | None,
                     x_vector_only: bool) -> VoicePrompt:
        """The package's ``create_voice_clone_prompt`` (base form; resampling inside the package, librosa)."""
        with self._lock, torch.no_grad():
            item = self.tts.create_voice_clone_prompt(ref_audio=(audio.astype(np.float32), int(sample_rate)),
                                                      ref_text=ref_text, x_vector_only_mode=x_vector_only)[0]
        code = None if item.ref_code is None else item.ref_code.cpu().numpy().astype(np.int64)
        return VoicePrompt(code, item.ref_spk_embedding.float().cpu().numpy(), item.x_vector_only_mode, item.icl_mode,
                           item.ref_text)


def _prompt_item(p: VoicePrompt):
    from qwen_tts import VoiceClonePromptItem

    return VoiceClonePromptItem(ref_code=None if p.ref_code is None else torch.from_numpy(p.ref_code),
                                ref_spk_embedding=torch.from_numpy(p.ref_spk_embedding),
                                x_vector_only_mode=p.x_vector_only_mode, icl_mode=p.icl_mode, ref_text=p.ref_text)


# ---------------------------------------------------------------------------- batched decoding


@dataclass
class TalkerSeq:
    """One request in a :class:`TalkerBatch`: ``emit(frame int64 [G])`` per generated frame,
    ``should_stop()`` polled every step (cancellation), ``done(reason, error=None)`` once at the end
    (reason ``stop`` | ``cancelled`` | ``error``)."""

    prompt: TalkerPrompt
    emit: Callable[[np.ndarray], None]
    should_stop: Callable[[], bool] = lambda: False
    done: Callable[..., None] = lambda reason, error=None: None
    tokens: list = field(default_factory=list)
    length: int = 0  # positions in the KV cache of this row (its own, without padding)
    step: int = 0  # decode steps made (index into the trailing text)
    processors: object = None


def _processors(p: TalkerPrompt):
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinNewTokensLengthLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SuppressTokensLogitsProcessor,
    )

    procs = LogitsProcessorList()
    if p.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(p.repetition_penalty))
    procs.append(MinNewTokensLengthLogitsProcessor(0, p.min_new_tokens, p.eos))
    if p.suppress:
        procs.append(SuppressTokensLogitsProcessor(p.suppress))
    return procs


class TalkerBatch:
    """The requests of one form decoding together: one forward pass per step for all rows.

    Greedy decoding (the checkpoints' generation config; sampling settings are not honoured).
    Not thread-safe: one loop thread owns it (the talker stage's scheduler).
    """

    def __init__(self, form: Qwen3TtsForm, max_seqs: int = 8):
        self.form = form
        self.max_seqs = max_seqs
        self.seqs: list[TalkerSeq] = []
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.mask: torch.Tensor | None = None  # [B, T] long
        self.past_hidden: torch.Tensor | None = None  # [B, 1, D]

    def __len__(self) -> int:
        return len(self.seqs)

    def _pick(self, seq: TalkerSeq, logits: torch.Tensor) -> int:
        ids = torch.tensor([seq.tokens], dtype=torch.long).reshape(1, -1)
        scores = seq.processors(ids, logits.float().reshape(1, -1).clone())
        return int(torch.argmax(scores, dim=-1)[0])

    def _finished(self, seq: TalkerSeq) -> bool:
        return seq.tokens[-1] == seq.prompt.eos or len(seq.tokens) >= seq.prompt.max_new_tokens

    @torch.no_grad()
    def add(self, seq: TalkerSeq) -> bool:
        """Prefill ``seq`` alone and merge it into the batch. Returns False if it ended at once."""
        talker = self.form.talker
        seq.processors = _processors(seq.prompt)
        emb = seq.prompt.embeds
        t = emb.shape[1]
        pos = torch.arange(t).view(1, 1, -1).expand(3, 1, -1)
        out = talker.model(inputs_embeds=emb, attention_mask=torch.ones(1, t, dtype=torch.long), position_ids=pos,
                           use_cache=True)
        hidden = out.last_hidden_state[:, -1:]
        seq.tokens.append(self._pick(seq, talker.codec_head(hidden)[:, -1]))
        seq.length = t
        if self._finished(seq):
            seq.done("stop")
            return False
        cache = out.past_key_values
        keys = [layer.keys for layer in cache.layers]
        values = [layer.values for layer in cache.layers]
        mask = torch.ones(1, t, dtype=torch.long)
        if not self.seqs:
            self.keys, self.values, self.mask, self.past_hidden = keys, values, mask, hidden
        else:
            width = max(self.mask.shape[1], t)

            def join(old: list, new: list) -> list:  # per layer: [B, heads, T, d] left-padded to one width
                return [torch.cat([_left_pad(a, width, 2), _left_pad(b, width, 2)])
                        for a, b in zip(old, new, strict=True)]

            self.keys, self.values = join(self.keys, keys), join(self.values, values)
            self.mask = torch.cat([_left_pad(self.mask, width, 1), _left_pad(mask, width, 1)])
            self.past_hidden = torch.cat([self.past_hidden, hidden])
        self.seqs.append(seq)
        return True

    @torch.no_grad()
    def step(self) -> None:
        """One decode step for every row: emits one frame per row, drops the rows that ended."""
        from transformers.cache_utils import DynamicCache

        if not self.seqs:
            return
        keep = [i for i, s in enumerate(self.seqs) if not s.should_stop()]
        for i, s in enumerate(self.seqs):
            if i not in keep:
                s.done("cancelled")
        self._select(keep)
        if not self.seqs:
            return
        talker, b = self.form.talker, len(self.seqs)
        tok = torch.tensor([[s.tokens[-1]] for s in self.seqs], dtype=torch.long)
        last_id_hidden = talker.get_input_embeddings()(tok)
        pred = talker.code_predictor.generate(
            inputs_embeds=torch.cat((self.past_hidden, last_id_hidden), dim=1), max_new_tokens=self.form.num_groups - 1,
            do_sample=False, output_hidden_states=True, return_dict_in_generate=True).sequences
        frames = torch.cat((tok, pred), dim=-1)
        cp_emb = talker.code_predictor.get_input_embeddings()
        emb = torch.cat([last_id_hidden] + [cp_emb[i](pred[..., i:i + 1]) for i in range(self.form.num_groups - 1)],
                        dim=1).sum(1, keepdim=True)
        text = [s.prompt.trailing[:, s.step] if s.step < s.prompt.trailing.shape[1] else s.prompt.pad[:, 0]
                for s in self.seqs]
        emb = emb + torch.stack(text)  # [B, 1, D]
        cache = DynamicCache()
        for layer, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            cache.update(k, v, layer)
        self.mask = torch.cat([self.mask, torch.ones(b, 1, dtype=torch.long)], dim=1)
        pos = torch.tensor([s.length for s in self.seqs]).view(1, b, 1).expand(3, b, 1)
        width = self.mask.shape[1]
        out = talker.model(inputs_embeds=emb, attention_mask=self.mask, position_ids=pos, past_key_values=cache,
                           use_cache=True, cache_position=torch.tensor([width - 1]))
        self.keys = [layer.keys for layer in out.past_key_values.layers]
        self.values = [layer.values for layer in out.past_key_values.layers]
        self.past_hidden = out.last_hidden_state[:, -1:]
        logits = talker.codec_head(self.past_hidden)[:, -1]
        frames_np = frames.cpu().numpy().astype(np.int64)
        alive = []
        for i, s in enumerate(self.seqs):
            s.emit(frames_np[i])
            s.step += 1
            s.length += 1
            s.tokens.append(self._pick(s, logits[i]))
            if self._finished(s):
                s.done("stop")
            else:
                alive.append(i)
        self._select(alive)

    def clear(self) -> None:
        """Drop every row (after a failed step; their ``done`` is the caller's business)."""
        self.seqs, self.keys, self.values, self.mask, self.past_hidden = [], [], [], None, None

    def _select(self, rows: list[int]) -> None:
        if len(rows) == len(self.seqs):
            return
        self.seqs = [self.seqs[i] for i in rows]
        if not rows:
            self.keys, self.values, self.mask, self.past_hidden = [], [], None, None
            return
        idx = torch.tensor(rows)
        mask = self.mask[idx]
        start = int((mask.sum(0) == 0).long().cumprod(0).sum())  # left columns padding in every row
        self.mask = mask[:, start:]
        self.keys = [k[idx][:, :, start:] for k in self.keys]
        self.values = [v[idx][:, :, start:] for v in self.values]
        self.past_hidden = self.past_hidden[idx]


def _left_pad(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    n = width - x.shape[dim]
    if n <= 0:
        return x
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([torch.zeros(shape, dtype=x.dtype), x], dim=dim)


def generate_frames(form: Qwen3TtsForm, req: Qwen3TtsRequest) -> np.ndarray:
    """All frames of ``req`` through a batch of one (the streaming path, collected): int64 [T, G]."""
    out: list[np.ndarray] = []
    batch = TalkerBatch(form)
    if batch.add(TalkerSeq(form.prompt(req), out.append)):
        while len(batch):
            batch.step()
    return np.stack(out) if out else np.zeros((0, form.num_groups), np.int64)


# ------------------------------------------------------------------------------------- codec


class Qwen3TtsCodec:
    """The 12 Hz codec's decoder (``Qwen3TTSTokenizer`` of a form folder's ``speech_tokenizer/``)."""

    def __init__(self, path: str | Path):
        from qwen_tts import Qwen3TTSTokenizer

        self.tok = Qwen3TTSTokenizer.from_pretrained(str(Path(path) / "speech_tokenizer"))
        self.model = self.tok.model.eval()
        self.num_groups = int(self.model.config.decoder_config.num_quantizers)
        self.codebook_size = int(self.model.config.decoder_config.codebook_size)
        self.samples_per_frame = int(self.model.get_decode_upsample_rate())
        self.sample_rate = int(self.model.get_output_sample_rate())

    @torch.no_grad()
    def decode(self, chunks: list[np.ndarray], lefts: list[int]) -> list[np.ndarray]:
        """Decode a ragged batch: each ``codes`` int64 [T_i, G] -> float32 PCM of its frames after the
        first ``left_i``. Chunks of equal length share one forward pass; lengths are not padded
        together, because the 12 Hz decoder looks a little ahead and padding frames would change
        the last samples of a shorter chunk."""
        out: list[np.ndarray | None] = [None] * len(chunks)
        by_len: dict[int, list[int]] = {}
        for i, c in enumerate(chunks):
            by_len.setdefault(len(c), []).append(i)
        for idx in by_len.values():
            batch = torch.from_numpy(np.stack([np.asarray(chunks[i], np.int64) for i in idx]))
            wavs = self.model.decode(batch).audio_values
            for i, w in zip(idx, wavs, strict=True):
                out[i] = w.float().cpu().numpy()[lefts[i] * self.samples_per_frame:].astype(np.float32)
        return out

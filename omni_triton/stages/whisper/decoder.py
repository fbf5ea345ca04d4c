"""Whisper's decoder side: greedy autoregressive decoding with a KV cache, requests of different
lengths decoding together in one forward pass per step (continuous batching: a request joins the
running batch after its own prefill and leaves it when it ends; :class:`DecoderScheduler`).

How rows of different lengths share a step: each row's self-attention keys/values are
left-padded to the longest row, an attention mask hides the padding, and each row's next token
gets its own position id (Whisper's learned positions); the cross-attention keys/values (computed
once at prefill from the encoder states: always the 1500 positions of the 30 s window) are stacked.
Padded positions get exactly zero attention weight, so a row's logits are those of decoding it
alone up to float rounding of the batched matmuls (the parity tests compare the tokens).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from numpy.typing import NDArray

LOG = logging.getLogger("omni_triton.whisper")


@dataclass(frozen=True)
class DecodeRequest:
    """One segment to decode.

    Attributes:
        encoder_hidden: float32 [source_positions, d_model]: the encoder's last hidden state.
        language: ISO-639-1 code, or None: detected (argmax over the language tokens).
        task: ``transcribe`` or ``translate``.
        prompt: OpenAI ``prompt`` (Whisper ``prompt_ids``), or None.
        max_new_tokens: most tokens to generate (``<|endoftext|>`` included), >= 1.
    """

    encoder_hidden: NDArray[np.float32]
    language: str | None = None
    task: str = "transcribe"
    prompt: str | None = None
    max_new_tokens: int = 24


class WhisperDecoding:
    """The decoder half of a ``WhisperForConditionalGeneration`` with its tokenizer and generation
    config: decoder prompts, language detection, prefill and the batched step.

    Attributes:
        eot: ``<|endoftext|>`` id (the stop token).
        languages: ISO-639-1 codes of the model's language tokens (generation config ``lang_to_id``).
        default_max_new_tokens: the generation config's ``max_new_tokens``.
    """

    def __init__(self, model, tokenizer):
        self.model = model
        self.decoder = model.get_decoder()
        self.proj_out = model.proj_out
        self.tok = tokenizer
        gc = model.generation_config
        self.gc = gc
        self.eot = int(gc.eos_token_id if not isinstance(gc.eos_token_id, list) else gc.eos_token_id[0])
        self.sot = int(gc.decoder_start_token_id)
        self.lang_to_id = {k.strip("<|>"): int(v) for k, v in gc.lang_to_id.items()}
        self.languages = list(self.lang_to_id)
        self.task_to_id = {k: int(v) for k, v in gc.task_to_id.items()}
        self.no_timestamps = int(gc.no_timestamps_token_id)
        vocab = int(model.config.vocab_size)
        self.suppress = torch.zeros(vocab, dtype=torch.bool)
        self.suppress[list(gc.suppress_tokens or [])] = True
        self.begin_suppress = self.suppress.clone()
        self.begin_suppress[list(gc.begin_suppress_tokens or [])] = True
        self.max_target_positions = int(model.config.max_target_positions)
        self.default_max_new_tokens = int(gc.max_new_tokens or 24)
        self.layers = len(self.decoder.layers)

    @classmethod
    def from_pretrained(cls, path: Path) -> WhisperDecoding:
        """Load the model (eval mode) and its ``WhisperTokenizer`` from ``path``."""
        from transformers import WhisperForConditionalGeneration, WhisperTokenizer

        model = WhisperForConditionalGeneration.from_pretrained(path).eval()
        return cls(model, WhisperTokenizer.from_pretrained(path))

    def prompt_ids(self, prompt: str | None) -> list[int]:
        """``<|startofprev|> prompt tokens`` as ``WhisperTokenizer.get_prompt_ids`` makes them, cut
        to their last ``max_target_positions // 2 - 1`` tokens (Whisper keeps at most half its
        context for the prompt); [] without a prompt."""
        if not prompt:
            return []
        ids = [int(i) for i in self.tok.get_prompt_ids(prompt, return_tensors="np")]
        keep = self.max_target_positions // 2 - 1
        return ids if len(ids) <= keep else ids[:1] + ids[1:][-(keep - 1):]

    def init_tokens(self, language: str, task: str, prompt: str | None = None) -> list[int]:
        """The decoder prompt of ``generate(language=, task=, prompt_ids=)`` without timestamps:
        ``[prompt ids] <|startoftranscript|> <|language|> <|task|> <|notimestamps|>``.

        Raises:
            KeyError: unknown language or task (the stages validate them before).
        """
        return [*self.prompt_ids(prompt), self.sot, self.lang_to_id[language], self.task_to_id[task],
                self.no_timestamps]

    def _encoder_states(self, hidden: NDArray[np.float32]) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float32))[None]

    @torch.inference_mode()
    def detect_language(self, encoder_hidden: NDArray[np.float32]) -> str:
        """The language ``generate`` detects: argmax of the logits after ``<|startoftranscript|>``
        over the language tokens."""
        out = self.decoder(input_ids=torch.tensor([[self.sot]]),
                           encoder_hidden_states=self._encoder_states(encoder_hidden), use_cache=False)
        logits = self.proj_out(out.last_hidden_state[:, -1])[0]
        ids = torch.tensor(list(self.lang_to_id.values()))
        best = int(ids[int(torch.argmax(logits[ids]))])
        return next(code for code, i in self.lang_to_id.items() if i == best)

    def pick(self, logits: torch.Tensor, first: list[bool]) -> list[int]:
        """Greedy tokens of ``logits`` float32 [B, vocab]: ``suppress_tokens`` masked, and
        ``begin_suppress_tokens`` too for the rows whose ``first`` is True (their first token)."""
        masks = torch.stack([self.begin_suppress if f else self.suppress for f in first])
        return torch.argmax(logits.masked_fill(masks, float("-inf")), dim=-1).tolist()

    @torch.inference_mode()
    def prefill(self, req: DecodeRequest) -> Row:
        """Run ``req``'s decoder prompt alone; returns its :class:`Row` holding its KV cache and
        its first token (not yet counted as emitted).

        Raises:
            ValueError: the decoder prompt leaves no room for a token (``max_target_positions``).
        """
        language = req.language or self.detect_language(req.encoder_hidden)
        init = self.init_tokens(language, req.task, req.prompt)
        room = self.max_target_positions - len(init)
        if room < 1:
            raise ValueError(f"the decoder prompt is {len(init)} tokens; the model has {self.max_target_positions}")
        enc = self._encoder_states(req.encoder_hidden)
        out = self.decoder(input_ids=torch.tensor([init]), encoder_hidden_states=enc, use_cache=True)
        cache = out.past_key_values
        token = self.pick(self.proj_out(out.last_hidden_state[:, -1]), [True])[0]
        kv = [(cache.self_attention_cache.layers[i].keys, cache.self_attention_cache.layers[i].values,
               cache.cross_attention_cache.layers[i].keys, cache.cross_attention_cache.layers[i].values)
              for i in range(self.layers)]
        return Row(language=language, init=init, kv=kv, encoder=enc, next_token=token,
                   max_new_tokens=max(1, min(req.max_new_tokens, room)))

    def text(self, tokens: list[int]) -> str:
        """The transcript of generated ``tokens`` (special tokens skipped, no clean-up: each
        prefix's text is a prefix of the whole text)."""
        return self.tok.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)


@dataclass(eq=False)
class Row:
    """One request's decoding state: its decoder prompt ``init``, the tokens emitted so far, the
    next token (picked, not yet emitted), and, until it joins a :class:`DecoderBatch`, its own
    KV cache ``kv`` (per layer: self keys, self values [1, H, L, D], cross keys, cross values
    [1, H, S, D])."""

    language: str
    init: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] | None
    encoder: torch.Tensor
    next_token: int
    max_new_tokens: int
    tokens: list[int] = field(default_factory=list)
    payload: object = None

    @property
    def length(self) -> int:
        """Tokens in this row's KV cache (its prompt and every emitted token but the last)."""
        return len(self.init) + max(len(self.tokens) - 1, 0)


class DecoderBatch:
    """The rows decoding together: their KV caches left-padded to one length, stacked.

    ``add(row)`` joins a prefilled row; ``step()`` feeds every row its last emitted token and
    picks each row's next token in one forward pass; ``remove(rows)`` drops rows (ended or
    cancelled). Not thread-safe: one loop thread owns it (:class:`DecoderScheduler`)."""

    def __init__(self, decoding: WhisperDecoding):
        self.d = decoding
        self.rows: list[Row] = []
        self.kv: list[list[torch.Tensor]] = []  # per layer [self k, self v, cross k, cross v], batch-stacked
        self.valid: torch.Tensor = torch.zeros(0, 0, dtype=torch.bool)  # [B, L]: real (not padding) positions
        self.encoder: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.rows)

    @staticmethod
    def _left_pad(t: torch.Tensor, length: int) -> torch.Tensor:
        pad = length - t.shape[-2]
        return t if pad == 0 else torch.nn.functional.pad(t, (0, 0, pad, 0))

    def add(self, row: Row) -> None:
        """Join ``row`` (prefilled: its ``kv`` is moved into the batch). Its cache length is the
        prompt plus every emitted token but the last, which the next :meth:`step` feeds."""
        kv, row.kv = row.kv, None
        assert kv is not None
        row_valid = torch.ones(1, kv[0][0].shape[-2], dtype=torch.bool)
        if not self.rows:
            self.kv = [list(layer) for layer in kv]
            self.valid, self.encoder = row_valid, row.encoder
        else:
            length = max(self.valid.shape[1], row_valid.shape[1])
            for mine, theirs in zip(self.kv, kv, strict=True):
                mine[0] = torch.cat([self._left_pad(mine[0], length), self._left_pad(theirs[0], length)])
                mine[1] = torch.cat([self._left_pad(mine[1], length), self._left_pad(theirs[1], length)])
                mine[2] = torch.cat([mine[2], theirs[2]])
                mine[3] = torch.cat([mine[3], theirs[3]])
            pad = torch.nn.functional.pad
            self.valid = torch.cat([pad(self.valid, (length - self.valid.shape[1], 0)),
                                    pad(row_valid, (length - row_valid.shape[1], 0))])
            self.encoder = torch.cat([self.encoder, row.encoder])
        self.rows.append(row)

    def remove(self, gone: list[Row]) -> None:
        """Drop ``gone`` rows, and the padding columns no row needs any more."""
        if not gone:
            return
        keep = [i for i, r in enumerate(self.rows) if r not in gone]
        self.rows = [self.rows[i] for i in keep]
        if not self.rows:
            self.kv, self.valid, self.encoder = [], torch.zeros(0, 0, dtype=torch.bool), None
            return
        idx = torch.tensor(keep)
        self.valid = self.valid[idx]
        start = int(torch.nonzero(self.valid.any(dim=0))[0])  # leading columns that are padding in every row
        self.valid = self.valid[:, start:]
        self.kv = [[layer[0][idx][:, :, start:], layer[1][idx][:, :, start:], layer[2][idx], layer[3][idx]]
                   for layer in self.kv]
        assert self.encoder is not None
        self.encoder = self.encoder[idx]

    @torch.inference_mode()
    def step(self) -> list[int]:
        """One forward pass for every row: feeds each row's last emitted token, returns each
        row's next token (in row order)."""
        from transformers import EncoderDecoderCache

        b = len(self.rows)
        ids = torch.tensor([[r.tokens[-1]] for r in self.rows])
        positions = torch.tensor([[r.length] for r in self.rows])
        mask = torch.cat([self.valid, torch.ones(b, 1, dtype=torch.bool)], dim=1).long()
        cache = EncoderDecoderCache([tuple(layer) for layer in self.kv])
        out = self.d.decoder(input_ids=ids, attention_mask=mask, encoder_hidden_states=self.encoder,
                             past_key_values=cache, position_ids=positions, use_cache=True)
        for i, layer in enumerate(self.kv):
            layer[0] = cache.self_attention_cache.layers[i].keys
            layer[1] = cache.self_attention_cache.layers[i].values
        self.valid = mask.bool()
        logits = self.d.proj_out(out.last_hidden_state[:, -1])
        return self.d.pick(logits, [False] * b)


@dataclass(eq=False)
class _Job:
    req: DecodeRequest
    emit: Callable[[int, str], None]
    should_stop: Callable[[], bool]
    done: Callable[[str, BaseException | None], None]
    text: str = ""
    compute_ms: float = 0.0  # this request's prefill + its share of every batched step it was in


class DecoderScheduler:
    """One loop thread owning a :class:`DecoderBatch`: admits queued requests (prefill, alone)
    up to ``max_seqs`` rows, then steps all rows together, emitting each row's token as it is
    picked (the Qwen3-TTS talker's ``TalkerScheduler`` pattern).

    Args:
        decoding: the loaded :class:`WhisperDecoding`.
        max_seqs: rows decoding at once; more wait in the queue (FIFO).
        on_step: called with the number of rows after every batched step (metrics, tests).
    """

    def __init__(self, decoding: WhisperDecoding, max_seqs: int = 8, on_step: Callable[[int], None] | None = None):
        self.d = decoding
        self.max_seqs = max(1, max_seqs)
        self.batch = DecoderBatch(decoding)
        self.on_step = on_step
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="whisper-decoder", daemon=True)
        self._thread.start()

    def submit(self, req: DecodeRequest, emit: Callable[[int, str, float], None], should_stop: Callable[[], bool],
               done: Callable[[str, BaseException | None], None]) -> None:
        """Queue ``req``: ``emit(token, text_delta, compute_ms)`` per generated token
        (``<|endoftext|>`` is not emitted; ``text_delta``: the transcript's new text, possibly "";
        ``compute_ms``: the request's compute so far: its prefill plus an equal share of each
        batched step), then ``done(reason, error)`` exactly once (``stop`` | ``cancelled`` |
        ``error``), all on the loop thread."""
        self._queue.put(_Job(req, emit, should_stop, done))

    def _admit(self, block: bool) -> None:
        while len(self.batch) < self.max_seqs:
            try:
                job = self._queue.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                return
            block = False
            if job.should_stop():
                job.done("cancelled", None)
                continue
            start = time.perf_counter()
            try:
                row = self.d.prefill(job.req)
            except Exception as exc:
                LOG.exception("whisper decoder: prefill failed")
                job.done("error", exc)
                continue
            job.compute_ms += (time.perf_counter() - start) * 1000.0
            row.payload = job
            if self._emit(row, row.next_token):
                self.batch.add(row)

    def _emit(self, row: Row, token: int) -> bool:
        """Emit ``token`` for ``row``; False when the row has ended (done called)."""
        job: _Job = row.payload  # type: ignore[assignment]
        if job.should_stop():
            job.done("cancelled", None)
            return False
        if token == self.d.eot:
            job.done("stop", None)
            return False
        row.tokens.append(token)
        text = self.d.text(row.tokens)
        delta = text[len(job.text):] if text.startswith(job.text) else ""
        job.text = text if text.startswith(job.text) else job.text
        try:
            job.emit(token, delta, job.compute_ms)
        except Exception as exc:
            job.done("error", exc)
            return False
        if len(row.tokens) >= row.max_new_tokens:
            job.done("stop", None)
            return False
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._admit(block=len(self.batch) == 0)
            if not len(self.batch):
                continue
            rows = list(self.batch.rows)
            start = time.perf_counter()
            try:
                tokens = self.batch.step()
            except Exception as exc:
                LOG.exception("whisper decoder: batched step failed")
                self.batch.remove(rows)
                for row in rows:
                    row.payload.done("error", exc)  # type: ignore[attr-defined]
                continue
            share = (time.perf_counter() - start) * 1000.0 / len(rows)
            for row in rows:
                row.payload.compute_ms += share  # type: ignore[attr-defined]
            if self.on_step is not None:
                self.on_step(len(rows))
            self.batch.remove([row for row, token in zip(rows, tokens, strict=True) if not self._emit(row, token)])

    def close(self) -> None:
        """Stop the loop thread (rows still decoding are left unanswered: the model is unloading)."""
        self._stop.set()
        self._thread.join(timeout=5)

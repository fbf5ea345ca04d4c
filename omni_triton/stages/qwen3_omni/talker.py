"""Qwen3-Omni talker + code predictor stage: codec frames ``np.int64 [T, G]`` streamed as each
forward pass completes one.
"""
from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from omni_triton.checkpoints.common import read_manifest
from omni_triton.contracts.chat import ChatInputError
from omni_triton.stages.qwen3_omni.inputs import talker_media_kwargs
from omni_triton.stages.qwen3_omni.thinker import ThinkerOutput, ThinkerStep
from omni_triton.stages.streaming import (
    PARKED,
    Gate,
    GenerationCancelled,
    ThreadHook,
    ThreadPrepare,
    stopping_criteria,
    threaded_generate,
)

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


def give_talker_the_audio_config(model) -> None:
    """Let the talker compute rope positions for prompts with audio *and* an image or video.

    transformers 5.19's talker reuses the thinker's ``get_rope_index``, which reads
    ``self.config.audio_config.n_window`` to count an audio clip's tokens once the prompt also
    has an image/video grid; the talker's config has no ``audio_config``, so the reference's own
    ``generate(..., return_audio=True)`` fails there with ``AttributeError`` (audio alone, or
    images alone, take other branches). The clip lengths are the thinker's audio encoder's, so
    the talker is given the thinker's ``audio_config`` (``model``: a
    ``Qwen3OmniMoeForConditionalGeneration``; a no-op when the talker has one).
    """
    talker_config = model.talker.config
    if getattr(talker_config, "audio_config", None) is None:
        talker_config.audio_config = model.config.thinker_config.audio_config


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
        # per generate thread: paced streams of one talker run their generates side by side
        self._frames_hook = ThreadHook(self.talker)
        self._prepare = ThreadPrepare(self.talker)

    @classmethod
    def from_pretrained(cls, model_dir, device: str = "cpu") -> OmniTalker:
        """Loads the whole checkpoint, then drops the thinker and code2wav (a real deployment would
        save the talker as its own folder; the tiny one is a few MB)."""
        from transformers import Qwen3OmniMoeForConditionalGeneration

        model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir).to(device).eval()
        give_talker_the_audio_config(model)
        del model.thinker, model.code2wav
        return cls(model, read_manifest(model_dir))

    def speaker_id(self, voice: str) -> int:
        try:
            return self.speaker_ids[voice.lower()]
        except KeyError:
            raise ChatInputError(f"unknown voice {voice!r}; available: {', '.join(self.speaker_ids)}") from None

    def stream(self, out: ThinkerOutput, voice: str, settings: TalkerSettings,
               should_stop: Callable[[], bool] | None = None, paced: bool = False) -> Iterator[np.ndarray | None]:
        """Yield int64 [n, G] codec frames (n >= 1) as they are generated. Stops at the codec EOS,
        ``max_frames``, or when ``should_stop()`` is True (checked after every talker step).

        ``paced`` (the deadline scheduler's mode): one talker step per ``next()`` (a [1, G] frame,
        or ``None`` for the prefill-only / last step), the generate thread parked in between, no
        per-model lock: paced streams of one talker interleave frame by frame (same frames)."""
        inputs = build_talker_inputs(self.model, out, self.speaker_id(voice), self.thinker_eos_token_id)
        user_stop = should_stop or (lambda: False)
        if paced:
            feed = TextFeed()
            feed.finish(inputs["trailing_text_hidden"])
            run = _TalkerRun(self, inputs, feed, settings, paced=True)
            try:
                while not run.finished and not user_stop():
                    yield run.step()
            finally:
                run.close()
            return
        kw = talker_generate_kwargs(self.config, settings)
        closed = threading.Event()
        q: queue.Queue = queue.Queue()
        done = object()

        def hook(module, args, output):
            codes = output.hidden_states[1] if output.hidden_states is not None else None
            if codes is not None:
                q.put(codes[0].to(torch.int64).numpy().copy())

        def run():
            from transformers import StoppingCriteriaList

            with self._lock, self._frames_hook.active(hook):
                stop = stopping_criteria(lambda ids: closed.is_set() or user_stop())
                self.talker.generate(**inputs, stopping_criteria=StoppingCriteriaList([stop]), **kw)

        for items in threaded_generate(run, q, done, closed):
            if isinstance(items, list) and items:
                yield np.stack(items).astype(np.int64)

    # -------------------------------------------------------------- speak while thinking

    def stream_while_thinking(self, steps: Iterable[ThinkerStep], voice: str, settings: TalkerSettings,
                              should_stop: Callable[[], bool] | None = None,
                              feed: TextFeed | None = None,
                              paced: bool = False) -> Iterator[ThinkerStep | np.ndarray | None]:
        """Speak while the thinker generates (vLLM-Omni's ``async_chunk``): pass each
        :class:`ThinkerStep` of ``steps`` (a thinker stream with ``stream_talker_inputs``: ids and
        per-token rows as increments) through, interleaved with int64 [n, G] codec frames.

        The talker starts as soon as its prompt is complete (it needs the thinker's row of the
        first generated token: after the thinker's second token, as the reference) and then
        consumes one text embedding per frame as the thinker produces them (:class:`TextFeed`),
        waiting while it is ahead; when the thinker stops, the feed becomes the reference's
        ``trailing_text_hidden`` (ending with ``tts_eos``) and the talker runs to its end. Frames
        made while this generator waits for the next thinker step come out with that step. The
        values equal :meth:`stream` on the finished thinker output (the reference), up to the
        rounding condition of :data:`PROJECTION_MIN_ROWS`.

        ``steps`` is read on the calling thread (in Triton: the stub's one thread that reads BLS
        streams). ``should_stop()`` (cancellation) is polled after every thinker step and frame
        batch; the talker then stops after its current frame, ``steps`` is closed (a thinker
        generator stops its generate) and nothing more is yielded.
        ``feed``: pass one to watch it (tests).

        ``paced`` (the deadline scheduler's mode): one unit of work per ``next()`` and no talker
        thread running meanwhile: one talker step (a [1, G] frame, or ``None`` for a step without
        one) when the text entry it reads is there, else one thinker step read from ``steps``
        (blocking until the thinker sends it) and passed through. No per-model lock, so the paced
        streams of one talker interleave. Text therefore passes at the talker's pace (one
        thinker step per frame while the thinker is ahead), and the values are the unpaced ones.

        Raises:
            ChatInputError: unknown voice, or a sequence without ``<|im_start|>assistant``.
        """
        if paced:
            yield from self._paced_while_thinking(steps, voice, settings, should_stop, feed)
            return
        speaker = self.speaker_id(voice)
        user_stop = should_stop or (lambda: False)
        feed = feed if feed is not None else TextFeed()
        acc = _Accumulated()
        run: _TalkerRun | None = None
        asst, fed, finish = None, 0, None
        steps = iter(steps)
        try:
            for step in steps:
                acc.add(step)
                yield step
                finish = step.finish_reason or finish
                if step.finish_reason:
                    break
                if run is None and acc.prompt_len and acc.generated >= 2 and acc.tts_embeds is not None:
                    asst = _assistant_start(self.config, np.asarray(acc.ids[:acc.prompt_len]), acc.prompt_len)
                    if asst is None:
                        raise ChatInputError("speech needs a chat prompt (<|im_start|>assistant); use MESSAGES")
                    if acc.n_rows >= asst + 4:
                        run = _TalkerRun(self, self._prefill(acc.output(), speaker, asst), feed, settings)
                if run is not None and not run.finished:
                    fed = self._feed_entries(acc, asst, fed, feed)
                    yield from run.ready()
                if user_stop():
                    break
            if finish in (None, "abort") or user_stop():
                return
            out = acc.output()
            if len(out.sequence) - out.prompt_len < 2:
                return  # nothing to speak (the reference needs two generated tokens)
            with torch.inference_mode():
                full = build_talker_inputs(self.model, out, speaker, self.thinker_eos_token_id)
            feed.finish(full["trailing_text_hidden"])
            if run is None:  # the thinker ended before the talker's prompt was complete
                run = _TalkerRun(self, full, feed, settings)
            yield from run.ready()
            yield from run.rest(user_stop)
        finally:
            feed.close()
            if run is not None:
                run.close()
            close = getattr(steps, "close", None)
            if close is not None:  # stopped early: the thinker's stream stops too (joins its thread)
                close()

    def _paced_while_thinking(self, steps, voice, settings, should_stop, feed) -> Iterator:
        speaker = self.speaker_id(voice)
        user_stop = should_stop or (lambda: False)
        feed = feed if feed is not None else TextFeed()
        acc = _Accumulated()
        run: _TalkerRun | None = None
        asst, fed, thinking = None, 0, True
        steps = iter(steps)
        try:
            while not user_stop():
                if run is not None and run.can_step():
                    yield run.step()  # one talker step: its text entry is there
                    continue
                if not thinking:
                    return  # the thinker is done and so is the talker (or there is nothing to speak)
                # (a talker that ended first, e.g. at max_frames, leaves the rest of the text to pass)
                step = next(steps, None)
                if step is None:  # the thinker's stream ended without a finish reason
                    return
                acc.add(step)
                if step.finish_reason:
                    thinking = False
                    out = acc.output()
                    if step.finish_reason != "abort" and len(out.sequence) - out.prompt_len >= 2:
                        with torch.inference_mode():
                            full = build_talker_inputs(self.model, out, speaker, self.thinker_eos_token_id)
                        feed.finish(full["trailing_text_hidden"])
                        if run is None:  # the thinker ended before the talker's prompt was complete
                            run = _TalkerRun(self, full, feed, settings, paced=True)
                    elif run is not None:
                        run.close()
                        run = None
                else:
                    if run is None and acc.prompt_len and acc.generated >= 2 and acc.tts_embeds is not None:
                        asst = _assistant_start(self.config, np.asarray(acc.ids[:acc.prompt_len]), acc.prompt_len)
                        if asst is None:
                            raise ChatInputError("speech needs a chat prompt (<|im_start|>assistant); use MESSAGES")
                        if acc.n_rows >= asst + 4:
                            run = _TalkerRun(self, self._prefill(acc.output(), speaker, asst), feed, settings,
                                             paced=True)
                    if run is not None and not run.finished:
                        fed = self._feed_entries(acc, asst, fed, feed)
                yield step
        finally:
            feed.close()
            if run is not None:
                run.close()
            close = getattr(steps, "close", None)
            if close is not None:
                close()

    def _prefill(self, out: ThinkerOutput, speaker: int, asst: int) -> dict:
        """The talker's prompt from a partial thinker output (it has the first generated token's
        row): :func:`build_talker_inputs` with the rows after that one replaced by zero rows
        (``tts_pad`` ids) so the assistant segment is projected in one call of
        :data:`PROJECTION_MIN_ROWS` rows; ``trailing_text_hidden`` empty (the feed has it)."""
        n_rows = asst + 4
        pad = max(asst + PROJECTION_MIN_ROWS - n_rows, 0)
        zeros = np.zeros((pad, out.embeds.shape[1]), np.float32)
        seq = np.concatenate((out.sequence[:n_rows + 1], np.full(pad, self.config.tts_pad_token_id, np.int64)))
        padded = ThinkerOutput(seq, out.prompt_len, np.concatenate((out.embeds[:n_rows], zeros)),
                               np.concatenate((out.hidden[:n_rows], zeros)), out.tts_embeds)
        with torch.inference_mode():
            inputs = build_talker_inputs(self.model, padded, speaker, None)
        inputs["trailing_text_hidden"] = inputs["trailing_text_hidden"][:, :0]
        return inputs

    def _feed_entries(self, acc: _Accumulated, asst: int, fed: int, feed: TextFeed) -> int:
        """Give ``feed`` the trailing entries whose rows have arrived: entry ``k`` is the projected
        row ``asst + 4 + k`` (generated token ``k + 1``), or ``tts_eos`` / ``tts_pad`` at / after the
        first thinker EOS among the generated ids (the reference's masking). Returns the count."""
        hi = acc.n_rows - (asst + 4)  # entries whose row is there
        if hi <= fed:
            return fed
        n = hi - fed
        with torch.inference_mode():
            return self._feed_rows(acc, fed, hi, n, feed)

    def _feed_rows(self, acc: _Accumulated, fed: int, hi: int, n: int, feed: TextFeed) -> int:
        entries = _project_rows(self.talker, acc.tail(max(n, PROJECTION_MIN_ROWS)), n)
        gen = np.asarray(acc.ids[acc.prompt_len:])
        eos = np.nonzero(gen == self.thinker_eos_token_id)[0]
        if len(eos):
            tts = self.talker.text_projection(torch.from_numpy(acc.tts_embeds)[None].to(self.talker.dtype))
            _, tts_eos, tts_pad = tts.chunk(3, dim=1)
            k = torch.arange(fed, hi).view(1, -1, 1)
            entries = torch.where(k > int(eos[0]), tts_pad.to(entries.dtype), entries)
            entries = torch.where(k == int(eos[0]), tts_eos.to(entries.dtype), entries)
        feed.extend(entries)
        return hi


# ------------------------------------------------------------------- speak while thinking

#: Rows per ``text_projection`` call when projecting the streamed thinker rows. On this CPU
#: stack (torch 2.13 CPU GEMM) a row's result is the same for every call of >= 8 rows, but calls
#: of 1..7 rows take another kernel and round differently (~1e-6); the reference projects the
#: whole assistant segment at once (n + 2 rows for n generated tokens), so projecting windows of
#: at least 8 rows keeps the talker's conditioning bit-identical to the reference's whenever the
#: answer has >= 6 tokens (shorter answers: differences of ~1e-6 in the conditioning).
#: ``tests/unit/test_qwen3_omni_async.py`` checks this property of the stack.
PROJECTION_MIN_ROWS = 8


class TextFeed:
    """``trailing_text_hidden`` while the thinker is still generating: the talker's decode step
    ``k`` reads entry ``k`` (one text embedding per codec frame) and waits here while the thinker
    is behind.

    Entries are torch tensors ``[1, n, Ht]`` (talker hidden size). :meth:`finish` replaces them
    with the reference's whole tensor once the thinker has stopped (it ends with ``tts_eos``; the
    talker reads ``tts_pad`` past its end, as in the reference). Thread-safe: the consumer thread
    extends, the talker's generate thread waits.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._entries: torch.Tensor | None = None
        self._final = False
        self._closed = False
        self._hungry = False
        self.started = False  #: the talker's generate has been started on this feed

    def __len__(self) -> int:
        with self._cond:
            return 0 if self._entries is None else int(self._entries.shape[1])

    def extend(self, entries: torch.Tensor) -> None:
        """Append entries ``[1, m, Ht]`` (ignored after :meth:`finish` / :meth:`close`)."""
        with self._cond:
            if self._final or self._closed or entries.shape[1] == 0:
                return
            self._entries = entries if self._entries is None else torch.cat((self._entries, entries), dim=1)
            self._hungry = False
            self._cond.notify_all()

    def finish(self, trailing: torch.Tensor) -> None:
        """The thinker stopped: ``trailing`` ``[1, N, Ht]`` is the whole tensor (the reference's)."""
        with self._cond:
            self._entries, self._final, self._hungry = trailing, True, False
            self._cond.notify_all()

    def close(self) -> None:
        """No more entries will come (cancelled, or the talker ended): wake every waiter."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def entries(self) -> torch.Tensor | None:
        """The entries so far (``[1, n, Ht]``) or None."""
        with self._cond:
            return self._entries

    def has(self, step: int) -> bool:
        """Whether :meth:`wait` for ``step`` would return at once."""
        with self._cond:
            return self._final or self._closed or (self._entries is not None and step < self._entries.shape[1])

    def wait(self, step: int) -> torch.Tensor | None:
        """Block until entry ``step`` exists, the feed is final or closed; return the entries
        (the talker reads entry ``step``, or ``tts_pad`` when ``step`` is past the end)."""
        with self._cond:
            while not (self._final or self._closed
                       or (self._entries is not None and step < self._entries.shape[1])):
                self._hungry = True
                self._cond.notify_all()
                self._cond.wait()
            return self._entries

    def wait_hungry(self, timeout: float | None = None) -> bool:
        """Block until the talker waits for an entry that is not there (or the feed is final or
        closed): a test hook that makes the thinker never be ahead of the talker. Returns whether
        that happened within ``timeout`` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: self._hungry or self._final or self._closed, timeout)


class _Accumulated:
    """The thinker's streamed :class:`ThinkerStep` increments (ids, rows) joined up."""

    def __init__(self):
        self.ids: list[int] = []
        self.embeds: list[np.ndarray] = []
        self.hidden: list[np.ndarray] = []
        self.prompt_len: int | None = None
        self.tts_embeds: np.ndarray | None = None
        self.n_rows = 0

    def add(self, step: ThinkerStep) -> None:
        if step.prompt_len is not None:
            self.prompt_len = int(step.prompt_len)
        if step.tts_embeds is not None:
            self.tts_embeds = np.asarray(step.tts_embeds, np.float32)
        if step.ids is not None:
            self.ids.extend(int(i) for i in np.asarray(step.ids).reshape(-1))
        if step.embeds is not None and len(step.embeds):
            self.embeds.append(np.asarray(step.embeds, np.float32))
            self.hidden.append(np.asarray(step.hidden, np.float32))
            self.n_rows += len(self.embeds[-1])

    @property
    def generated(self) -> int:
        return len(self.ids) - int(self.prompt_len or 0)

    def tail(self, k: int) -> np.ndarray:
        """The last ``min(k, n_rows)`` embedding rows, float32 [<=k, H]."""
        parts, n = [], 0
        for chunk in reversed(self.embeds):
            if n >= k:
                break
            parts.append(chunk)
            n += len(chunk)
        return np.concatenate(parts[::-1])[-k:] if parts else np.zeros((0, 0), np.float32)

    def output(self) -> ThinkerOutput:
        if len(self.embeds) > 1:
            self.embeds, self.hidden = [np.concatenate(self.embeds)], [np.concatenate(self.hidden)]
        h = self.tts_embeds.shape[1] if self.tts_embeds is not None else 0
        empty = np.zeros((0, h), np.float32)
        return ThinkerOutput(np.asarray(self.ids, np.int64), int(self.prompt_len or 0),
                             self.embeds[0] if self.embeds else empty, self.hidden[0] if self.hidden else empty,
                             self.tts_embeds if self.tts_embeds is not None else np.zeros((3, h), np.float32))


def _assistant_start(cfg, ids: np.ndarray, prompt_len: int) -> int | None:
    a, b = cfg.im_start_token_id, cfg.assistant_token_id
    p = ids[:prompt_len]
    hits = np.nonzero((p[:-1] == a) & (p[1:] == b))[0]
    return int(hits[-1]) if len(hits) else None


def _project_rows(talker, window: np.ndarray, n: int) -> torch.Tensor:
    """``talker.text_projection`` of the last ``n`` rows of ``window`` (float32 [R, H], the rows
    before them as padding) in one call of at least :data:`PROJECTION_MIN_ROWS` rows (zero rows in
    front when ``window`` is shorter); returns ``[1, n, Ht]``."""
    if len(window) < PROJECTION_MIN_ROWS:
        window = np.concatenate((np.zeros((PROJECTION_MIN_ROWS - len(window), window.shape[1]), np.float32), window))
    x = torch.from_numpy(np.ascontiguousarray(window, np.float32))[None].to(talker.dtype)
    return talker.text_projection(x)[:, -n:]


class _TalkerRun:
    """The talker's ``generate`` on its own thread, fed by a :class:`TextFeed`: its
    ``prepare_inputs_for_generation`` (where the reference reads ``trailing_text_hidden[:, step]``)
    gets the feed's entries, waiting while the thinker is behind. Frames int64 [G] queue as a
    forward hook sees them (as :meth:`OmniTalker.stream`).

    ``paced``: no per-model lock; the thread starts at the first :meth:`step` and parks after each
    frame (:class:`~omni_triton.stages.streaming.Gate`; Qwen's ``rope_deltas`` and the RNG state
    are kept per run), so each :meth:`step` computes one talker step; the consumer calls it only
    when :meth:`can_step` (the entry that step reads is in the feed), so the thread never waits
    on the feed while it holds the CPU."""

    def __init__(self, owner: OmniTalker, inputs: dict, feed: TextFeed, settings: TalkerSettings,
                 paced: bool = False):
        self.q: queue.Queue = queue.Queue()
        self.done = object()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.finished = False
        self.frames = 0  # frames taken by step() (paced): the next step reads entry `frames`
        self.feed = feed
        talker = owner.talker
        kw = talker_generate_kwargs(owner.config, settings)
        self.gate = Gate(self.q, self.stop, [(talker, "rope_deltas")]) if paced else None

        def hook(module, args, output):
            codes = output.hidden_states[1] if output.hidden_states is not None else None
            if codes is not None:
                self.q.put(codes[0].to(torch.int64).numpy().copy())
                if self.gate is not None:
                    self.gate.park()

        def prepare(kwargs):
            if "generation_step" in kwargs and not self.stop.is_set():
                entries = feed.wait(int(kwargs["generation_step"]))
                kwargs["trailing_text_hidden"] = entries if entries is not None else inputs["tts_pad_embed"][:, :0]
            return kwargs

        def target():
            from transformers import StoppingCriteriaList

            try:
                torch.set_num_threads(1)
                with contextlib.nullcontext() if paced else owner._lock, torch.inference_mode(), \
                        owner._frames_hook.active(hook), owner._prepare.active(prepare):
                    stop = stopping_criteria(lambda ids: self.stop.is_set())
                    talker.generate(**inputs, stopping_criteria=StoppingCriteriaList([stop]), **kw)
            except GenerationCancelled:
                pass
            except BaseException as e:  # re-raised on the consumer thread
                self.error = e
            finally:
                feed.close()
                self.q.put(self.done)

        feed.started = True
        self.thread = threading.Thread(target=target, name="talker-async", daemon=True)
        if not paced:
            self.thread.start()

    def can_step(self) -> bool:
        """Paced: whether the next :meth:`step` finds its text entry (or the feed is final)."""
        return not self.finished and self.feed.has(self.frames)

    def step(self) -> np.ndarray | None:
        """Paced: run the talker to its next frame (int64 [1, G]) or its end (None)."""
        if self.finished:
            return None
        if self.thread.ident is None:
            self.thread.start()
        else:
            self.gate.release()
        items = []
        while True:
            item = self.q.get()
            if item is PARKED:
                break
            if self._take(item) is None:
                break
            items.append(item)
        self.frames += len(items)
        return np.stack(items).astype(np.int64) if items else None

    def _take(self, item) -> np.ndarray | None:
        if item is self.done:
            self.finished = True
            if self.error is not None:
                raise self.error
            return None
        return item

    def ready(self) -> Iterator[np.ndarray]:
        """The frames queued so far, as one int64 [n, G] array (nothing when none); no waiting."""
        items = []
        while not self.finished:
            try:
                item = self._take(self.q.get_nowait())
            except queue.Empty:
                break
            if item is not None:
                items.append(item)
        if items:
            yield np.stack(items).astype(np.int64)

    def rest(self, should_stop: Callable[[], bool]) -> Iterator[np.ndarray]:
        """Frames until the talker ends (int64 [n, G] batches); stops it when ``should_stop()``."""
        while not self.finished:
            if should_stop():
                self.stop.set()
            item = self._take(self.q.get())
            items = [] if item is None else [item]
            while not self.finished:
                try:
                    item = self._take(self.q.get_nowait())
                except queue.Empty:
                    break
                if item is not None:
                    items.append(item)
            if items and not self.stop.is_set():
                yield np.stack(items).astype(np.int64)

    def close(self) -> None:
        self.stop.set()
        if self.thread.ident is not None:
            self.thread.join()

"""Qwen3-Omni thinker stage: text deltas plus the per-token embeddings / accept-layer hidden states
the talker is conditioned on (:class:`ThinkerOutput`).
"""
from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from omni_triton.checkpoints.common import read_manifest
from omni_triton.contracts.chat import ChatInputError, parse_messages
from omni_triton.stages.qwen3_omni.request import SamplingSettings, sampling_settings
from omni_triton.stages.streaming import Gate, ThreadHook, stopping_criteria, threaded_generate

# ----------------------------------------------------------------------------------- thinker


@dataclass
class ThinkerOutput:
    """What the talker needs from the thinker (see the module docstring for shapes)."""

    sequence: np.ndarray  # int64 [L]
    prompt_len: int
    embeds: np.ndarray  # float32 [L-1, H]
    hidden: np.ndarray  # float32 [L-1, H]
    tts_embeds: np.ndarray  # float32 [3, H]: tts_bos, tts_eos, tts_pad
    #: multimodal requests: what the reference also passes to ``talker.generate`` for the rope
    #: positions of the media tokens (``MultimodalInputs.talker_arrays``): audio_feature_lengths
    #: int64 [A], image_grid_thw / video_grid_thw int64 [n, 3], video_second_per_grid float32 [V]
    talker_media: dict | None = None


@dataclass
class ThinkerStep:
    """One streamed thinker event: ``text`` since the last step, cumulative ``completion_tokens``;
    the last step has ``finish_reason`` (stop/length/abort) and, when asked for, ``output``."""

    text: str
    completion_tokens: int
    finish_reason: str | None = None
    output: ThinkerOutput | None = None
    # Streamed talker conditioning (``stream(..., stream_talker_inputs=True)``): what this step
    # appended to ``ThinkerOutput``'s arrays, so that the concatenations over all steps equal the
    # last step's ``output``. ``ids`` int64 [k] (the first step: prompt ids + generated ones),
    # ``embeds`` / ``hidden`` float32 [m, H] (rows of the tokens fed since the last step); the first
    # step also has ``prompt_len`` and ``tts_embeds`` float32 [3, H]. None when not streaming.
    ids: np.ndarray | None = None
    embeds: np.ndarray | None = None
    hidden: np.ndarray | None = None
    prompt_len: int | None = None
    tts_embeds: np.ndarray | None = None


class _QueueStreamer:
    """transformers streamer: skips the prompt, queues each new token id (int); with a ``gate``
    (paced) the generate thread then parks until its consumer asks for the next token."""

    def __init__(self, q: queue.Queue, gate: Gate | None = None):
        self.q, self._prompt_seen, self.gate = q, False, gate

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        for t in value.reshape(-1).tolist():
            self.q.put(int(t))
        if self.gate is not None:
            self.gate.park()

    def end(self) -> None:
        pass


def _cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` cut before the earliest stop string (excluded, as vLLM does) and whether one was found."""
    found = [text.find(s) for s in stops if s in text]
    return (text[: min(found)], True) if found else (text, False)


class ChatTokenizer:
    """The checkpoint's tokenizer and the ChatML ids the pipeline needs; no weights. Used by the
    thinker and by the ``qwen3_omni`` BLS model (which validates requests before calling the stages)."""

    def __init__(self, tokenizer, im_start_token_id: int, assistant_token_id: int):
        self.tokenizer = tokenizer
        self.im_start_token_id, self.assistant_token_id = int(im_start_token_id), int(assistant_token_id)

    @classmethod
    def from_pretrained(cls, model_dir) -> ChatTokenizer:
        from transformers import AutoTokenizer

        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        return cls(AutoTokenizer.from_pretrained(model_dir), cfg["im_start_token_id"], cfg["assistant_token_id"])

    def encode(self, prompt: str | None = None, messages: list[dict] | None = None) -> list[int]:
        """Token ids of a raw prompt, or of messages through the chat template (generation prompt)."""
        if (prompt is None) == (messages is None):
            raise ChatInputError("exactly one of PROMPT and MESSAGES must be given")
        if messages is not None:
            ids = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            return [int(i) for i in ids]
        if not prompt:
            raise ChatInputError("PROMPT is empty")
        return [int(i) for i in self.tokenizer(prompt, add_special_tokens=False)["input_ids"]]

    def encode_multimodal(self, messages: list[dict], processor, media) -> list[int]:
        """Token ids of messages with media placeholders (``placeholder_messages``): the chat
        template's text with each placeholder expanded to its encoder's token count
        (:meth:`OmniProcessor.expand_prompt`), tokenized as the reference processor does.

        Raises:
            ChatInputError: the placeholders do not match ``media``.
        """
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        text = processor.expand_prompt(text, media)
        return [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def has_assistant_start(self, ids: Sequence[int]) -> bool:
        """Whether ``ids`` contain ``<|im_start|>assistant`` (the talker's prompt needs it)."""
        a, b = self.im_start_token_id, self.assistant_token_id
        return any(x == a and y == b for x, y in zip(ids, ids[1:], strict=False))


class OmniThinker:
    """The thinker of a Qwen3-Omni checkpoint (text-only inputs), streaming text as it generates.

    Runs ``model.thinker.generate`` with the arguments the reference
    ``Qwen3OmniMoeForConditionalGeneration.generate`` uses (``max_new_tokens``,
    ``eos_token_id=thinker_eos_token_id``, and with audio ``output_hidden_states=True``,
    ``return_dict_in_generate=True``), plus a streamer and a stopping criterion for cancellation.
    transformers with KV cache, one request at a time per object.
    """

    def __init__(self, model, tokenizer, manifest: dict | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.thinker = model.thinker
        self.config = model.config
        self.manifest = manifest or {}
        self.eos_token_id = int(self.manifest.get("thinker_eos_token_id", self.config.im_end_token_id))
        self.chat = ChatTokenizer(tokenizer, self.config.im_start_token_id, self.config.assistant_token_id)
        self._lock = threading.Lock()
        self._rows_hook = ThreadHook(self.thinker)  # per generate thread (paced streams share the model)

    @classmethod
    def from_pretrained(cls, model_dir, device: str = "cpu") -> OmniThinker:
        """Loads the thinker weights only (``enable_audio_output=False`` skips talker/code2wav)."""
        from transformers import AutoConfig, AutoTokenizer, Qwen3OmniMoeForConditionalGeneration
        from transformers.utils import logging as hf_logging

        cfg = AutoConfig.from_pretrained(model_dir)
        cfg.enable_audio_output = False
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the skipped talker/code2wav weights are "UNEXPECTED" keys
        try:
            model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, config=cfg).to(device).eval()
        finally:
            hf_logging.set_verbosity(level)
        return cls(model, AutoTokenizer.from_pretrained(model_dir), read_manifest(model_dir))

    def encode(self, prompt: str | None = None, messages: list[dict] | None = None) -> list[int]:
        """See :meth:`ChatTokenizer.encode`."""
        return self.chat.encode(prompt, messages)

    def has_assistant_start(self, ids: Sequence[int]) -> bool:
        """See :meth:`ChatTokenizer.has_assistant_start`."""
        return self.chat.has_assistant_start(ids)

    def tts_embeds(self) -> np.ndarray:
        """float32 [3, H]: thinker input embeddings of tts_bos, tts_eos, tts_pad (the reference
        projects these with the talker's ``text_projection``)."""
        ids = torch.tensor([[self.config.tts_bos_token_id, self.config.tts_eos_token_id, self.config.tts_pad_token_id]])
        with torch.inference_mode():
            return self.thinker.get_input_embeddings()(ids)[0].float().numpy()

    def generate_kwargs(self, sampling: SamplingSettings) -> dict:
        """Arguments of ``thinker.generate`` for ``sampling`` (the reference passes
        ``max_new_tokens`` and ``eos_token_id``; greedy uses the checkpoint's greedy default)."""
        kw: dict = {"max_new_tokens": int(sampling.max_tokens),
                    "eos_token_id": None if sampling.ignore_eos else self.eos_token_id}
        if sampling.min_tokens:
            kw["min_new_tokens"] = int(sampling.min_tokens)
        if sampling.greedy:
            kw["do_sample"] = False
        else:
            kw.update(do_sample=True, temperature=float(sampling.temperature), top_p=float(sampling.top_p),
                      top_k=int(sampling.top_k) if sampling.top_k > 0 else None)
        return kw

    def stream(self, prompt_ids: Sequence[int], sampling: SamplingSettings, with_talker_inputs: bool = False,
               should_stop: Callable[[], bool] | None = None,
               stream_talker_inputs: bool = False, media=None, paced: bool = False) -> Iterator[ThinkerStep | None]:
        """Generate; yield a :class:`ThinkerStep` per batch of new tokens, then a last one with
        ``finish_reason`` (and ``output`` when ``with_talker_inputs``; None when cancelled).

        ``stream_talker_inputs`` (speak while thinking; implies ``with_talker_inputs``): every step
        also carries the ids and the per-token embedding / accept-layer rows produced since the
        last one (:class:`ThinkerStep` ``ids``/``embeds``/``hidden``), taken by a forward hook on
        the thinker from each generate step's ``hidden_states`` (the tensors the reference
        concatenates afterwards), and a step is yielded for every new token even when its text
        delta is empty (held back).

        ``media`` (:class:`~omni_triton.stages.qwen3_omni.inputs.MultimodalInputs`, for prompts
        from :meth:`ChatTokenizer.encode_multimodal`) goes to ``thinker.generate`` as the
        reference passes it (``input_features``, ``feature_attention_mask``, ``pixel_values``,
        ``image_grid_thw``, ``pixel_values_videos``, ``video_grid_thw``, ``video_second_per_grid``):
        the thinker's own audio and vision towers encode it.

        Text deltas: the decode of all generated ids (special tokens skipped) minus what was sent,
        holding back a trailing U+FFFD (an incomplete UTF-8 sequence) and, with ``stop`` strings,
        the last ``max(len(stop)) - 1`` characters until they cannot start a stop string. The
        concatenated deltas equal ``tokenizer.decode(generated, skip_special_tokens=True)`` (cut
        before the first stop string, which is not included, as in vLLM).

        ``paced`` (the deadline scheduler's mode): one token per ``next()``: the generate thread
        stops after each token until the next ``next()`` (:class:`~omni_triton.stages.streaming.Gate`),
        without the per-model lock, so paced streams of one thinker interleave token by token
        (greedy: the same tokens; seeded sampling: each stream keeps its own RNG state). A token
        with nothing to report (its text held back, and no talker rows streamed) yields ``None``;
        the last item (``finish_reason``) adds no token.
        """
        user_stop = should_stop or (lambda: False)
        generated: list[int] = []
        stop_hit: list[bool] = []
        cancelled, closed = threading.Event(), threading.Event()
        n_prompt = len(prompt_ids)

        def text_of(ids):
            return self.tokenizer.decode(ids, skip_special_tokens=True)

        def stop_now(ids: torch.Tensor) -> bool:  # on the generate thread, after every token
            if closed.is_set() or user_stop():
                cancelled.set()
                return True
            if sampling.stop and _cut_at_stop(text_of(ids[0, n_prompt:].tolist()), sampling.stop)[1]:
                stop_hit.append(True)
                return True
            return False

        with_talker_inputs = with_talker_inputs or stream_talker_inputs
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        kw = self.generate_kwargs(sampling)
        if media is not None and not media.empty:
            kw.update(media.thinker_kwargs())
        if with_talker_inputs:
            kw.update(output_hidden_states=True, return_dict_in_generate=True)
        q: queue.Queue = queue.Queue()
        done = object()
        layer = int(self.config.talker_config.accept_hidden_layer)
        gate = Gate(q, closed, [(self.thinker, "rope_deltas")]) if paced else None

        def rows_hook(module, args, output):  # on the generate thread, once per forward (step)
            hs = output.hidden_states
            q.put(_Rows(hs[0][0].float().numpy().copy(), hs[layer][0].float().numpy().copy()))

        def run():
            from transformers import StoppingCriteriaList

            with contextlib.nullcontext() if paced else self._lock, \
                    self._rows_hook.active(rows_hook if stream_talker_inputs else None):
                if sampling.seed is not None:
                    torch.manual_seed(int(sampling.seed))
                return self.thinker.generate(
                    input_ids=input_ids, attention_mask=torch.ones_like(input_ids), streamer=_QueueStreamer(q, gate),
                    stopping_criteria=StoppingCriteriaList([stopping_criteria(stop_now)]), **kw)

        pending = _PendingRows(prompt_ids, self.tts_embeds() if stream_talker_inputs else None)
        sent = ""
        hold = max((len(s) for s in sampling.stop), default=1) - 1
        result = None
        it = threaded_generate(run, q, done, closed, gate=gate)
        for items in it:
            if not isinstance(items, list):
                result = items
                break
            new_ids = [i for i in items if not isinstance(i, _Rows)]
            generated.extend(new_ids)
            if stream_talker_inputs:
                pending.add(new_ids, [r for r in items if isinstance(r, _Rows)])
            if cancelled.is_set():
                continue
            text, cut = _cut_at_stop(text_of(generated), sampling.stop)
            upto = len(text) if cut else len(text) - hold
            while upto > len(sent) and text[upto - 1] == "\ufffd":
                upto -= 1
            if upto > len(sent) or (stream_talker_inputs and pending.has_new()):
                delta = text[len(sent):upto] if upto > len(sent) else ""
                yield pending.fill(ThinkerStep(delta, len(generated)))
                sent = sent + delta
            elif paced:
                yield None  # a token computed, nothing to send yet: one token per step
        for rest in it:  # exhaust (joins the thread)
            if isinstance(rest, list):
                new_ids = [i for i in rest if not isinstance(i, _Rows)]
                generated.extend(new_ids)
                if stream_talker_inputs:
                    pending.add(new_ids, [r for r in rest if isinstance(r, _Rows)])
            else:
                result = rest
        if cancelled.is_set():
            yield ThinkerStep("", len(generated), "abort")
            return
        text, cut = _cut_at_stop(text_of(generated), sampling.stop)
        reason = "length"
        if cut or stop_hit:
            reason = "stop"
        elif not sampling.ignore_eos and generated and generated[-1] == self.eos_token_id:
            reason = "stop"
        output = None
        if with_talker_inputs and result is not None:
            hs = result.hidden_states
            output = ThinkerOutput(
                sequence=result.sequences[0].numpy().astype(np.int64),
                prompt_len=len(prompt_ids),
                embeds=torch.cat([h[0] for h in hs], dim=1)[0].float().numpy(),
                hidden=torch.cat([h[layer] for h in hs], dim=1)[0].float().numpy(),
                tts_embeds=self.tts_embeds(),
                talker_media=None if media is None or media.empty else media.talker_arrays(),
            )
        last = ThinkerStep(text[len(sent):] if text.startswith(sent) else "", len(generated), reason, output)
        yield pending.fill(last) if stream_talker_inputs else last


class _Rows:
    """One thinker forward's rows (float32 [m, H] input embeddings and accept-layer states)."""

    __slots__ = ("embeds", "hidden")

    def __init__(self, embeds: np.ndarray, hidden: np.ndarray):
        self.embeds, self.hidden = embeds, hidden


class _PendingRows:
    """Ids and rows produced since the last streamed :class:`ThinkerStep` (the first step also
    carries the prompt ids, ``prompt_len`` and the tts embeddings)."""

    def __init__(self, prompt_ids: Sequence[int], tts_embeds: np.ndarray | None):
        self.ids: list[int] = [int(i) for i in prompt_ids]
        self.rows: list[_Rows] = []
        self.first = True
        self.prompt_len, self.tts_embeds = len(self.ids), tts_embeds

    def add(self, ids: list[int], rows: list[_Rows]) -> None:
        self.ids.extend(int(i) for i in ids)
        self.rows.extend(rows)

    def has_new(self) -> bool:
        return bool(self.ids or self.rows)

    def fill(self, step: ThinkerStep) -> ThinkerStep:
        step.ids = np.asarray(self.ids, np.int64)
        if self.rows:
            step.embeds = np.concatenate([r.embeds for r in self.rows]).astype(np.float32)
            step.hidden = np.concatenate([r.hidden for r in self.rows]).astype(np.float32)
        if self.first:
            step.prompt_len, step.tts_embeds = self.prompt_len, self.tts_embeds
            self.first = False
        self.ids, self.rows = [], []
        return step


def prepare_thinker_request(thinker: OmniThinker | ChatTokenizer, prompt: str | None, messages: str | None,
                            sampling: str | None,
                            default_max_tokens: int, max_model_len: int, talker_inputs: bool = False
                            ) -> tuple[list[int], SamplingSettings]:
    """Validate one text-only chat-contract request for the thinker; returns ``(prompt_ids, sampling)``
    (:func:`prepare_multimodal_request` without media)."""
    ids, s, _ = prepare_multimodal_request(thinker, prompt, messages, sampling, default_max_tokens, max_model_len,
                                           talker_inputs)
    return ids, s


def prepare_multimodal_request(thinker: OmniThinker | ChatTokenizer, prompt: str | None, messages: str | None,
                               sampling: str | None, default_max_tokens: int, max_model_len: int,
                               talker_inputs: bool = False, processor=None, media=None):
    """Validate one chat-contract request for the thinker; returns ``(prompt_ids, sampling, media)``.

    With a ``processor`` (:class:`~omni_triton.stages.qwen3_omni.inputs.OmniProcessor`),
    MESSAGES may hold ``input_audio`` / ``image_url`` / ``video_url`` parts (decoded and processed
    here) or their placeholders, whose tensors are ``media``
    (:class:`~omni_triton.stages.qwen3_omni.inputs.MultimodalInputs`; see
    :func:`~omni_triton.stages.qwen3_omni.inputs.prepare_media`); the returned ``media`` is what
    the thinker must get (None: text only). Without a processor, media parts are refused.

    ``max_tokens`` defaults to ``min(default_max_tokens, max_model_len - prompt_len)``; a prompt of
    ``max_model_len`` tokens or more, or ``prompt + max_tokens > max_model_len``, is an
    :class:`ChatInputError` (as vLLM's OpenAI server refuses it). With ``talker_inputs`` the prompt
    must contain ``<|im_start|>assistant`` (the talker's prompt is built from that turn on).
    """
    if (prompt is None) == (messages is None):
        raise ChatInputError("exactly one of PROMPT and MESSAGES must be given")
    resolved = None
    if messages is not None and processor is not None:
        from omni_triton.stages.qwen3_omni.inputs import MEDIA_ACCEPT, prepare_media

        chat = thinker.chat if hasattr(thinker, "chat") else thinker
        parsed, resolved = prepare_media(parse_messages(messages, accept=MEDIA_ACCEPT), processor, media)
        ids = chat.encode(messages=parsed) if resolved is None else chat.encode_multimodal(parsed, processor, resolved)
    elif media is not None and not media.empty:
        raise ChatInputError("media tensors need MESSAGES with media parts")
    else:
        ids = thinker.encode(prompt=prompt) if messages is None else thinker.encode(messages=parse_messages(messages))
    if len(ids) >= max_model_len:
        raise ChatInputError(f"the prompt has {len(ids)} tokens; this model's context is max_model_len={max_model_len}")
    s = sampling_settings(sampling, min(default_max_tokens, max_model_len - len(ids)))
    if len(ids) + s.max_tokens > max_model_len:
        raise ChatInputError(
            f"prompt ({len(ids)} tokens) + max_tokens ({s.max_tokens}) exceeds max_model_len={max_model_len}")
    if talker_inputs and not thinker.has_assistant_start(ids):
        raise ChatInputError("audio output needs a chat prompt ending in <|im_start|>assistant (send MESSAGES)")
    return ids, s, resolved

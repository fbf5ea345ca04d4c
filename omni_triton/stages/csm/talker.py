"""CSM talker: backbone (codebook 0) + depth decoder (codebooks 1..K-1), streaming codec frames
``np.int64 [T, K]`` as they are generated.
"""
from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from omni_triton.checkpoints.common import read_manifest
from omni_triton.stages.streaming import threaded_generate

# --------------------------------------------------------------------------------------- talker


class GenerationCancelled(Exception):
    """Raised inside ``generate`` (from the streamer) to stop a cancelled generation."""


class _MinFramesLogitsProcessor:
    """Suppress the codebook-0 EOS id until ``min_frames`` frames exist.

    Why not ``generate(min_new_tokens=...)``: transformers' MinNewTokensLengthLogitsProcessor
    counts ``input_ids.shape[-1]``, which for CSM's ``[batch, frames, num_codebooks]`` ids is the
    codebook count, not the frame count. Here frames = ``shape[1]`` once ids are 3-D, 0 before.
    """

    def __init__(self, min_frames: int, eos_id: int):
        self.min_frames, self.eos_id = int(min_frames), int(eos_id)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        frames = input_ids.shape[1] if input_ids.ndim == 3 else 0
        if frames < self.min_frames:
            scores = scores.clone()
            scores[:, self.eos_id] = -float("inf")
        return scores


class _FrameStreamer:
    """transformers streamer (``put``/``end``) that hands each generated frame to a queue.

    ``generate`` first ``put``s the prompt (skipped), then ``put``s one ``[batch, num_codebooks]``
    frame per step. ``put`` checks the cancellation hook after every frame (before queueing it) and
    raises :class:`GenerationCancelled`, which aborts ``generate`` before the next frame is computed:
    at most the one frame in flight when cancellation was requested is computed, and it is dropped.

    ``gate`` (paced streams): after queueing a frame, ``put`` waits for one release of the gate
    (the consumer asking for the next frame) before ``generate`` computes another; ``closed``
    set while waiting aborts generation (:class:`GenerationCancelled`).
    """

    def __init__(self, q: queue.Queue, should_stop: Callable[[], bool],
                 gate: threading.Semaphore | None = None, closed: threading.Event | None = None):
        self.q, self.should_stop, self._prompt_seen = q, should_stop, False
        self.gate, self.closed = gate, closed

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        if self.should_stop():  # frame computed after a cancel request: dropped
            raise GenerationCancelled()
        self.q.put(value[0].numpy().astype(np.int64, copy=True))
        if self.gate is not None:
            while not self.gate.acquire(timeout=0.05):
                if self.closed is not None and self.closed.is_set():
                    raise GenerationCancelled()

    def end(self) -> None:
        pass


def _restore_depth_decoder_generation_config(model, model_dir: Path) -> None:
    """Apply the ``depth_decoder_*`` keys of ``generation_config.json`` to the depth decoder.

    ``CsmForConditionalGeneration.save_pretrained`` stores the depth decoder's generation config as
    ``depth_decoder_*`` keys and its ``from_pretrained`` copies them back, but in transformers 5.19
    ``GenerationConfig.from_pretrained`` drops unknown keys, so they never arrive (the depth decoder
    then neither decodes greedily nor suppresses the codebook special ids, and Mimi indexes out of
    range). This re-reads them from the file, which stays the single source of truth.
    """
    p = Path(model_dir) / "generation_config.json"
    if not p.is_file():
        return
    raw = json.loads(p.read_text())
    attrs = {k[len("depth_decoder_"):]: v for k, v in raw.items() if k.startswith("depth_decoder_")}
    attrs.pop("_from_model_config", None)
    attrs.pop("transformers_version", None)
    model.depth_decoder.generation_config.update(**attrs)


class CodecTalker:
    """CSM backbone + depth decoder, streaming codec frames as they are generated.

    Uses transformers' own CSM generation path (``CsmForConditionalGeneration.generate`` with a
    ``streamer``); generation runs on a helper thread and :meth:`stream` yields from a queue.
    Cancellation goes through the streamer because CSM's ``generate`` drops every custom
    ``StoppingCriteria`` except max length (see ``CsmGenerationMixin._get_stopping_criteria``).
    """

    def __init__(self, model, processor, manifest: dict | None = None):
        self.model, self.processor = model, processor
        self.manifest = manifest or {}
        cfg = model.config
        self.num_codebooks = int(cfg.num_codebooks)
        self.codebook_eos_id = int(cfg.codebook_eos_token_id)
        spec = self.manifest.get("spec", {})
        self.default_min_frames = int(spec.get("default_min_frames", 0))
        self.default_max_frames = int(spec.get("default_max_frames", model.generation_config.max_new_tokens or 250))
        self.num_speakers = int(self.manifest.get("num_speakers", 1))
        self._lock = threading.Lock()  # one generate at a time per model object

    @classmethod
    def from_pretrained(cls, model_dir, device: str = "cpu") -> CodecTalker:
        from transformers import CsmForConditionalGeneration, CsmProcessor

        model_dir = Path(model_dir)
        model = CsmForConditionalGeneration.from_pretrained(model_dir).to(device).eval()
        _restore_depth_decoder_generation_config(model, model_dir)
        processor = CsmProcessor.from_pretrained(model_dir)
        return cls(model, processor, read_manifest(model_dir))

    def prompt_ids(self, text: str, speaker: int = 0) -> dict:
        """csm-1b prompt: ``<|begin_of_text|>[speaker]text<|end_of_text|>`` -> input_ids/attention_mask
        (``torch.int64 [1, L]``)."""
        enc = self.processor(text=f"[{int(speaker)}]{text}", add_special_tokens=True, return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    def stream(
        self,
        text: str,
        speaker: int = 0,
        min_frames: int | None = None,
        max_frames: int | None = None,
        should_stop: Callable[[], bool] | None = None,
        paced: bool = False,
    ) -> Iterator[np.ndarray]:
        """Yield ``np.int64 [n_new, num_codebooks]`` frames (n_new >= 1) while generation runs.

        Greedy (deterministic). Stops at ``max_frames`` frames, at CSM's EOS frame (codebooks
        0..K-2 all ``codebook_eos_token_id``; suppressed before ``min_frames`` and never yielded)
        or when ``should_stop()`` returns True (checked after every frame; no frame generated after
        a True is yielded). Closing the generator early also stops generation.

        ``paced``: generate only on demand, one frame per ``next()`` (the generate thread waits
        after each frame until the consumer asks for the next), and without the per-model lock,
        so several paced streams of one talker interleave frame by frame in the order their
        consumer pulls them (``omni_triton.runtime.scheduling``: earliest playback deadline
        first). Frames are the same as unpaced (each ``generate`` call has its own cache). Unpaced
        (default): generations of one talker run one after another, each ahead of its consumer.
        """
        min_frames = self.default_min_frames if min_frames is None else int(min_frames)
        max_frames = self.default_max_frames if max_frames is None else int(max_frames)
        if max_frames <= 0:
            return
        closed = threading.Event()  # consumer went away (generator closed)
        cancelled = threading.Event()
        user_stop = should_stop or (lambda: False)

        def stop() -> bool:  # called by the streamer on the generate thread, once per frame
            if closed.is_set() or user_stop():
                cancelled.set()
                return True
            return False

        q: queue.Queue = queue.Queue()
        done = object()
        inputs = self.prompt_ids(text, speaker)
        gate = threading.Semaphore(0) if paced else None

        def run():
            from transformers import LogitsProcessorList

            with contextlib.nullcontext() if paced else self._lock:
                try:
                    self.model.generate(
                        **inputs, max_new_tokens=max_frames, do_sample=False,
                        logits_processor=LogitsProcessorList(
                            [_MinFramesLogitsProcessor(min_frames, self.codebook_eos_id)]),
                        streamer=_FrameStreamer(q, stop, gate, closed),
                    )
                except GenerationCancelled:
                    pass

        for items in threaded_generate(run, q, done, closed, name="csm-generate"):
            if not isinstance(items, list):
                break  # generate's return value: the stream ended
            frames = []
            for it in items:
                if (it[:-1] == self.codebook_eos_id).all():  # CSM EOS frame: end, not audio
                    break
                frames.append(it)
            if cancelled.is_set():
                break
            if frames:
                yield np.stack(frames).astype(np.int64)
            if len(frames) < len(items):
                break  # the EOS frame: the rest is not audio
            if gate is not None:
                gate.release()  # the consumer asked for more: compute the next frame

    def generate(self, text: str, speaker: int = 0, min_frames=None, max_frames=None) -> np.ndarray:
        """All frames at once: ``np.int64 [T, num_codebooks]``."""
        chunks = list(self.stream(text, speaker, min_frames, max_frames))
        return np.concatenate(chunks) if chunks else np.zeros((0, self.num_codebooks), np.int64)

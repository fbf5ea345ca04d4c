"""CMU PocketSphinx speech recognition (the ``pocketsphinx`` family): real US-English ASR from the
acoustic model, dictionary and language model shipped inside the ``pocketsphinx`` wheel (5.1.1,
``pocketsphinx/model/en-us``), no download. It takes 16 kHz mono int16 PCM.

Streaming: the segment is cut at its pauses (``omni_triton.media.vad.speech_segments``: WebRTC's
VAD, the frontend's segmentation) and each piece is decoded as one pocketsphinx utterance, so a
request yields one text delta per utterance; audio in which the VAD finds no speech yields no
text (decoded whole, digital silence came back as "dog" once CMN ran per utterance). Only
``pocketsphinx.Decoder`` is imported: the package's live-audio helpers need
``sounddevice``, which is not installed (docs/asr.md).
"""
from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from numpy.typing import NDArray

#: Hz of the en-us acoustic model (the Decoder's ``samprate``)
SAMPLE_RATE = 16000


def pcm16(audio: NDArray[np.float32]) -> bytes:
    """float32 [-1, 1] -> little-endian int16 PCM bytes (clipped)."""
    return (np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


#: the Decoder of a worker process (``processes`` > 0): one per process, loaded by its initializer
_WORKER_DECODER = None


def _load_worker_decoder() -> None:
    global _WORKER_DECODER
    from pocketsphinx import Decoder

    _WORKER_DECODER = Decoder(loglevel="FATAL")


def _decode_utterance(decoder, pcm: bytes) -> str:
    """One utterance (int16 LE PCM at 16 kHz) fed whole: its words, single-spaced ("" for none)."""
    decoder.start_utt()
    decoder.process_raw(pcm, False, True)
    decoder.end_utt()
    hyp = decoder.hyp()
    return " ".join((hyp.hypstr if hyp is not None else "").split())


def _decode_in_worker(pcm: bytes) -> str:
    return _decode_utterance(_WORKER_DECODER, pcm)


class SphinxRecognizer:
    """``pocketsphinx.Decoder`` objects, one per concurrent request (a Decoder is not thread-safe),
    each loaded once with the wheel's en-us model (~0.25 s, ~30 MiB each).

    pocketsphinx holds the GIL while it decodes (measured: two 5 s utterances on two threads of one
    process 3.7 s, one after the other 3.0 s), so with ``processes`` > 0 the Decoders live in that
    many spawned worker processes (children of the stub: serve's supervisor ends them with it) and
    the calling threads only wait on them; with 0 they are decoded on the calling threads (tests).

    Args:
        decoders: how many requests may decode at once (the stage's ``workers``).
        max_segment_s: the longest utterance the VAD cut makes, seconds (>= 1).
        processes: worker processes to decode in (0: in this process).
    """

    def __init__(self, decoders: int = 2, max_segment_s: float = 30.0, processes: int = 0):
        self.max_segment_s = max(1.0, float(max_segment_s))
        self._free: queue.Queue = queue.Queue()
        self._pool: ProcessPoolExecutor | None = None
        if processes > 0:
            self._pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_load_worker_decoder)
            # load every worker now (not on the first requests): one call per process at once
            list(self._pool.map(_decode_in_worker, [b"\0\0" * 160] * processes))
            return
        from pocketsphinx import Decoder

        for _ in range(max(1, decoders)):
            self._free.put(Decoder(loglevel="FATAL"))

    def close(self) -> None:
        """End the worker processes (a stage's ``finalize``)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _decode(self, pcm: bytes) -> str:
        if self._pool is not None:
            return self._pool.submit(_decode_in_worker, pcm).result()
        decoder = self._free.get()
        try:
            return _decode_utterance(decoder, pcm)
        finally:
            self._free.put(decoder)

    def utterances(self, audio: NDArray[np.float32]) -> list[tuple[int, int]]:
        """``[(start, end), ...]`` sample spans decoded as one utterance each (module docstring)."""
        from omni_triton.media.vad import speech_segments

        samples = np.asarray(audio, dtype=np.float32).reshape(-1)
        spans = speech_segments(samples, SAMPLE_RATE, max_segment_s=self.max_segment_s)
        return spans

    def transcribe(self, audio: NDArray[np.float32],
                   should_stop: Callable[[], bool] = lambda: False) -> Iterator[str]:
        """Text deltas of ``audio`` (float32 [T] in [-1, 1] at 16 kHz): one per utterance that
        recognised words, joined by single spaces (the first without a leading space); nothing
        after ``should_stop()`` turns True (polled before each utterance).

        Each utterance is fed whole (``process_raw(..., full_utt=True)``): cepstral mean
        normalisation then runs over that utterance alone. Fed in pieces (live CMN), the estimate
        carried over from whatever the pooled Decoder heard before, so one clip came back as
        "the capital of france this paris" once and "... is paris" the next time."""
        samples = np.asarray(audio, dtype=np.float32).reshape(-1)
        said = False
        for start, end in self.utterances(samples):
            if should_stop():
                return
            text = self._decode(pcm16(samples[start:end]))
            if text:
                yield (" " if said else "") + text
                said = True

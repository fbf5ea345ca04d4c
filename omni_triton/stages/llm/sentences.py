"""The text side of ``llm_tts``: streamed text -> speakable sentences -> a TTS callable.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

# --------------------------------------------------------------------------- llm_tts: text -> sentences

# Words whose trailing period does not end a sentence.
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e",
                  "no", "fig", "approx", "inc", "ltd", "co", "u.s", "a.m", "p.m"}
# A sentence end: terminal punctuation, optional closing quotes/brackets, then whitespace; or a
# line break (list items, paragraphs).
_BOUNDARY = re.compile(r"(?<=[.!?\u2026])(?P<close>[\"'\u201d\u2019)\]]*)\s+|\n+")
_MARKDOWN = re.compile(r"[*_`#>|~]+")


def speakable(text: str) -> str | None:
    """Text for the TTS voice: markdown markers removed, whitespace collapsed; ``None`` when
    nothing speakable (no letter or digit) is left, e.g. ``"..."`` (Piper rejects such input)."""
    cleaned = " ".join(_MARKDOWN.sub(" ", text).split())
    return cleaned if any(ch.isalnum() for ch in cleaned) else None


@dataclass
class SentenceSegmenter:
    """Cut streamed text into sentences as soon as each one is complete.

    A sentence ends at ``.``, ``!``, ``?`` or ``…`` (plus closing quotes/brackets) followed by
    whitespace, or at a line break; a period after a known abbreviation (``Dr.``, ``e.g.``) or a
    single letter (``J. Smith``) does not end one. A boundary is only accepted once the whitespace after it arrived, so ``3.14``
    split across deltas is never cut. Text longer than ``max_chars`` without a boundary is cut at
    its last space, so speech starts even for run-on text.

    Args:
        min_chars: a piece shorter than this is joined with the next one (avoids tiny TTS calls).
        max_chars: cut run-on text at this length.
    """

    min_chars: int = 12
    max_chars: int = 300
    _buffer: str = field(default="", init=False)

    def push(self, delta: str) -> list[str]:
        """Add streamed text; returns the sentences completed by it (stripped, in order)."""
        self._buffer += delta
        out = []
        start = 0
        for m in _BOUNDARY.finditer(self._buffer):
            piece = self._buffer[start:m.start() + len(m.group("close") or "")].strip()
            line_break = "\n" in m.group(0)
            if not line_break and not self._is_end(piece):
                continue  # a period that does not end a sentence
            if not line_break and len(piece) < self.min_chars:
                continue  # too short: join with what follows
            if piece:
                out.append(piece)
            start = m.end()
        self._buffer = self._buffer[start:]
        while len(self._buffer) > self.max_chars:
            cut = self._buffer.rfind(" ", 0, self.max_chars)
            cut = cut if cut > 0 else self.max_chars
            out.append(self._buffer[:cut].strip())
            self._buffer = self._buffer[cut:].lstrip()
        return [s for s in out if s]

    def flush(self) -> list[str]:
        """The rest of the text (the stream ended); resets the segmenter."""
        rest, self._buffer = self._buffer.strip(), ""
        return [rest] if rest else []

    @staticmethod
    def _is_end(piece: str) -> bool:
        if not piece.endswith("."):
            return True
        words = piece.split()
        last = words[-1].rstrip(".").lower() if words else ""
        if last in _ABBREVIATIONS:
            return False
        if len(last) == 1 and last.isalpha():
            return False  # an initial: "J. Smith"
        return True


class SentenceSpeaker:
    """Speak a streamed answer sentence by sentence while the text keeps streaming (``llm_tts``).

    Text deltas go in through :meth:`push_text` (on the caller's thread, which keeps reading the
    LLM); each completed sentence (:class:`SentenceSegmenter`, then :func:`speakable`) is queued
    and synthesised in order on one worker thread, and every PCM chunk the synthesiser yields is
    handed to ``on_audio`` as soon as it exists. So audio of sentence 1 is produced while the LLM
    generates sentence 2 (vLLM-Omni streams thinker text and talker audio the same way).

    Args:
        synthesize: ``sentence -> iterable of float32 PCM arrays [T]`` (e.g. a ``piper_tts`` BLS
            call); it is always iterated to its end.
        on_audio: receives each non-empty PCM chunk, in order.
        segmenter: how text is cut (default :class:`SentenceSegmenter()`).
    """

    _END = object()

    def __init__(self, synthesize: Callable[[str], Any], on_audio: Callable[[Any], None],
                 segmenter: SentenceSegmenter | None = None):
        import queue

        self._synthesize, self._on_audio = synthesize, on_audio
        self._segmenter = segmenter or SentenceSegmenter()
        self._queue: "queue.Queue" = queue.Queue()
        self._cancelled = threading.Event()
        self._error: BaseException | None = None
        self.sentences: list[str] = []
        self._thread = threading.Thread(target=self._work, name="sentence-speaker", daemon=True)
        self._thread.start()

    def push_text(self, delta: str) -> None:
        """Add streamed text; complete sentences are queued for speech."""
        for sentence in self._segmenter.push(delta):
            self._queue_sentence(sentence)

    def _queue_sentence(self, sentence: str) -> None:
        text = speakable(sentence)
        if text is not None and not self._cancelled.is_set():
            self.sentences.append(text)
            self._queue.put(text)

    def finish(self, timeout: float | None = None) -> None:
        """The text ended: speak the rest, wait until every sentence is spoken.

        Raises:
            the synthesiser's exception, if one failed.
        """
        for sentence in self._segmenter.flush():
            self._queue_sentence(sentence)
        self._queue.put(self._END)
        self._thread.join(timeout)
        if self._error is not None:
            raise self._error

    def cancel(self, wait: bool = True) -> None:
        """Stop after the sentence being spoken (its synthesis is drained, nothing more starts,
        no more audio is handed out). With ``wait`` return only once the worker ended, so the
        caller may close its stream without a late ``on_audio`` behind it."""
        self._cancelled.set()
        self._queue.put(self._END)
        if wait:
            self._thread.join()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is self._END or self._cancelled.is_set():
                return
            try:
                for pcm in self._synthesize(item):
                    if len(pcm) and not self._cancelled.is_set():
                        self._on_audio(pcm)
            except BaseException as exc:  # reported by finish()
                self._error = exc
                self._cancelled.set()
                return

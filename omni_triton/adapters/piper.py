"""``TritonPythonModel`` of the ``piper`` family (contract: ``omni_triton.contracts.speech``;
OpenAI name ``piper_tts``): TEXT -> one AUDIO response per segment (the first phrase, the rest of the
first sentence, then one per sentence: ``omni_triton.stages.piper.segment_phonemes``). Stub-only imports; the logic
lives in ``omni_triton.stages.piper``."""
from __future__ import annotations

from omni_triton.adapters.api_inputs import request_text
from omni_triton.adapters.stream import DecoupledStage
from omni_triton.adapters.triton_io import optional_input, optional_str_input
from omni_triton.contracts import speech as sp
from omni_triton.contracts.tensors import scalar_array


class PiperStage(DecoupledStage):
    """``piper``: TEXT (+ VOICE, SPEED) -> one AUDIO/SAMPLE_RATE response per segment (config
    ``first_chunk_words``: words of the first segment at most, default
    :data:`~omni_triton.stages.piper.FIRST_CHUNK_WORDS`; ``"0"``: whole sentences)."""

    stage = "piper"
    input_error = sp.SpeechInputError
    workers = 2
    metric_specs = dict(
        requests=("omni_tts_requests_total", "Speech requests received", "counter"),
        cancelled=("omni_tts_cancelled_total", "Speech requests stopped by cancellation", "counter"),
        seconds=("omni_tts_audio_seconds_total", "Seconds of audio synthesised", "counter"),
    )

    def setup(self, args, params):
        from omni_triton.paths import model_dir
        from omni_triton.stages.piper import PiperSpeaker, discover_voices

        self.read_params(params)
        voices = discover_voices(model_dir("piper-voices"))
        if not voices:
            raise RuntimeError(f"no Piper voices under {model_dir('piper-voices')}; run `omni-triton prepare`")
        self.speaker = PiperSpeaker(voices, shrink_above=self.shrink_above, first_chunk_words=self.first_chunk_words)

    def read_params(self, params):
        """Parameters read without loading voices (``setup`` calls it first).

        Raises:
            ValueError: ``first_chunk_words`` is not an integer >= 0 (a load error).
        """
        from omni_triton.stages.piper.speaker import FIRST_CHUNK_WORDS, SHRINK_ABOVE_IDS

        self.max_input_chars = sp.max_input_chars(params, "4096")
        self.shrink_above = float(params.get("arena_shrink_above_ids", SHRINK_ABOVE_IDS))
        self.first_chunk_words = int(params.get("first_chunk_words", FIRST_CHUNK_WORDS))
        if self.first_chunk_words < 0:
            raise ValueError(f"first_chunk_words must be >= 0, got {self.first_chunk_words}")

    def parse(self, request):
        speed = optional_input(request, sp.SPEED)
        text = request_text(request, sp.TEXT, self.max_input_chars) or ""
        return (text, optional_str_input(request, sp.VOICE) or None, 1.0 if speed is None else float(speed))

    def generate(self, job, stream):
        text, voice, speed = job
        for sentence in self.speaker.synthesize(text, voice=voice, speed=speed, is_cancelled=stream.cancelled):
            self.metrics.count("seconds", sentence.audio.size / sentence.sample_rate)
            yield {sp.AUDIO: sentence.audio, sp.SAMPLE_RATE: scalar_array(sentence.sample_rate, "INT32")}

"""``TritonPythonModel`` of the ``pocketsphinx`` family (contract: ``omni_triton.contracts.asr``;
docs/asr.md): AUDIO (16 kHz) -> one TEXT_DELTA response per recognised utterance, requests taken
concurrently on ``workers`` threads and decoded in ``processes`` worker processes, one
``pocketsphinx.Decoder`` each (pocketsphinx holds the GIL while decoding). Stub-only imports; the logic
lives in ``omni_triton.stages.pocketsphinx``."""
from __future__ import annotations

from omni_triton.adapters.asr_inputs import AsrParams
from omni_triton.adapters.stream import DecoupledStage
from omni_triton.contracts import asr
from omni_triton.contracts.tensors import utf8_array


class PocketsphinxStage(AsrParams, DecoupledStage):
    """``pocketsphinx``: the ASR contract on CMU Sphinx's US-English model. LANGUAGE may only be
    ``en`` (config ``languages``), TASK ``translate`` is refused (``supports_translation`` false),
    PROMPT is accepted and ignored (pocketsphinx has no prompt). Audio without recognised words
    gets one empty TEXT_DELTA."""

    stage = "pocketsphinx"
    input_error = asr.ASRInputError
    workers = 2
    metric_specs = dict(
        requests=("omni_asr_requests_total", "Speech recognition requests received", "counter"),
        invalid=("omni_asr_invalid_total", "Speech recognition requests refused (bad input)", "counter"),
        cancelled=("omni_asr_cancelled_total", "Speech recognition requests stopped by cancellation", "counter"),
        seconds=("omni_asr_audio_seconds_total", "Seconds of audio transcribed", "counter"),
    )

    def setup(self, args, params):
        from omni_triton.stages.pocketsphinx import SphinxRecognizer

        self.read_asr_params(params)
        self.recognizer = SphinxRecognizer(int(params.get("workers", self.workers)), self.max_audio_s,
                                           processes=int(params.get("processes", "2")))

    def parse(self, request):
        return self.parse_asr(request)

    def generate(self, job: asr.ASRRequest, stream):
        self.metrics.count("seconds", job.audio.size / asr.SAMPLE_RATE)
        sent = False
        for delta in self.recognizer.transcribe(job.audio, stream.cancelled):
            sent = True
            yield {asr.TEXT_DELTA: utf8_array(delta)}
        if not sent and not stream.cancel_seen:
            yield {asr.TEXT_DELTA: utf8_array("")}

    def finalize(self):
        self.recognizer.close()
        super().finalize()

"""``TritonPythonModel`` classes of the speech pipelines (contract: ``omni_triton.contracts.speech``):
``piper``, and the codec TTS ``csm`` (BLS) -> ``csm_talker`` -> ``csm_code2wav``.
Stub-only imports; the logic lives in ``omni_triton.stages`` (``piper``, ``csm``)."""
from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np

from omni_triton.adapters.batched import BatchedStage, set_torch_threads
from omni_triton.adapters.bls import call_stage, stream_stage
from omni_triton.adapters.stream import DecoupledStage, Final
from omni_triton.adapters.triton_io import optional_input, optional_str_input, required_array


def request_text(request, name: str, max_input_chars: int) -> str | None:
    """A speech text input, refused (``SpeechInputError``) over the model's ``max_input_chars``."""
    return optional_str_input(request, name, max_input_chars, sp.SpeechInputError, "max_input_chars")
from omni_triton.contracts import speech as sp
from omni_triton.contracts.tensors import scalar_array, utf8_array
from omni_triton.stages.chunking import FrameGroups


class PiperStage(DecoupledStage):
    """``piper``: TEXT (+ VOICE, SPEED) -> one AUDIO/SAMPLE_RATE response per sentence."""

    stage = "piper"
    input_error = sp.SpeechInputError
    workers = 2
    metric_specs = dict(
        requests=("omni_tts_requests_total", "Speech requests received", "counter"),
        cancelled=("omni_tts_cancelled_total", "Speech requests stopped by cancellation", "counter"),
        active=("omni_tts_active_requests", "Speech requests being synthesised now", "gauge"),
        seconds=("omni_tts_audio_seconds_total", "Seconds of audio synthesised", "counter"),
    )

    def setup(self, args, params):
        from omni_triton.paths import model_dir
        from omni_triton.stages.piper import PiperSpeaker, discover_voices

        self.read_params(params)
        voices = discover_voices(model_dir("piper-voices"))
        if not voices:
            raise RuntimeError(f"no Piper voices under {model_dir('piper-voices')}; run `omni-triton prepare`")
        self.speaker = PiperSpeaker(voices)

    def read_params(self, params):
        """Parameters read without loading voices (``setup`` calls it first)."""
        self.max_input_chars = sp.max_input_chars(params, "4096")

    def parse(self, request):
        speed = optional_input(request, sp.SPEED)
        text = request_text(request, sp.TEXT, self.max_input_chars) or ""
        return (text, optional_str_input(request, sp.VOICE) or None, 1.0 if speed is None else float(speed))

    def generate(self, job, stream):
        text, voice, speed = job
        for sentence in self.speaker.synthesize(text, voice=voice, speed=speed, is_cancelled=stream.cancelled):
            self.metrics.count("seconds", sentence.audio.size / sentence.sample_rate)
            yield {sp.AUDIO: sentence.audio, sp.SAMPLE_RATE: scalar_array(sentence.sample_rate, "INT32")}


class CsmTalkerStage(DecoupledStage):
    """``csm_talker`` (CSM): TEXT (+ SPEAKER, MIN/MAX_FRAMES, REQUEST_ID) -> CODES responses of
    ``emit_frames`` frames; one request at a time per instance, inside ``execute``."""

    stage = "csm_talker"
    input_error = sp.SpeechInputError
    cancel_flags = True
    per_instance_metrics = True
    metric_specs = dict(
        frames=("omni_tts_talker_frames_total", "Codec frames generated", "counter"),
        requests=("omni_tts_talker_requests_total", "Talker requests started", "counter"),
        cancelled=("omni_tts_talker_cancelled_total", "Talker requests cancelled", "counter"),
        active=("omni_tts_talker_active", "Talker requests being generated (per instance)", "gauge"),
    )

    def setup(self, args, params):
        from omni_triton.checkpoints.csm import checkpoint_dir
        from omni_triton.stages.csm import CodecTalker

        set_torch_threads()
        self.talker = CodecTalker.from_pretrained(checkpoint_dir(params.get("model_name", "csm-tiny")))
        self.emit_frames = max(1, int(params.get("emit_frames", "1")))
        self.default_min = int(params.get("default_min_frames", self.talker.default_min_frames))
        self.default_max = int(params.get("default_max_frames", self.talker.default_max_frames))

    def parse(self, request):
        text = optional_str_input(request, sp.TEXT)
        if not text:
            raise sp.SpeechInputError("csm_talker: TEXT is required")
        speaker, lo, hi = (optional_input(request, n) for n in (sp.SPEAKER, sp.MIN_FRAMES, sp.MAX_FRAMES))
        return (text, 0 if speaker is None else int(speaker), self.default_min if lo is None else int(lo),
                self.default_max if hi is None else int(hi))

    def generate(self, job, stream):
        text, speaker, min_frames, max_frames = job
        groups = FrameGroups(self.emit_frames)
        # Under the deadline scheduler (config `scheduling: deadline`) the talker computes a frame
        # only when the scheduler steps this request, so open requests interleave frame by frame.
        for frames in self.talker.stream(text, speaker=speaker, min_frames=min_frames, max_frames=max_frames,
                                         should_stop=stream.cancelled, paced=self.step_scheduler is not None):
            self.metrics.count("frames", len(frames))
            codes = groups.push(frames)
            # held for the group: under the scheduler still one frame per step
            yield None if codes is None else {sp.CODES: codes}
        rest = groups.flush()
        if rest is not None and not stream.cancel_seen:
            yield Final({sp.CODES: rest})


class CsmCode2WavStage(BatchedStage):
    """A codec decoder (``csm_code2wav``: Mimi; ``qwen3_omni_code2wav``: Qwen3-Omni code2wav), ragged
    dynamic batches: CODES [1, T_i, K] + LEFT_CONTEXT [1, 1] -> AUDIO [1, samples] of the new
    frames, one forward pass per batch."""

    def setup(self, args, params):
        set_torch_threads()
        self.decoder = self.load(params)
        self.num_codebooks = int(getattr(self.decoder, "num_codebooks", None) or self.decoder.num_code_groups)

    def load(self, params):
        from omni_triton.checkpoints.csm import checkpoint_dir
        from omni_triton.stages.csm import CodecDecoder

        return CodecDecoder.from_pretrained(checkpoint_dir(params.get("model_name", "csm-tiny")))

    def parse(self, request):
        from omni_triton.stages.csm import validate_chunk

        return validate_chunk(required_array(request, sp.CODES), required_array(request, sp.LEFT_CONTEXT),
                              self.num_codebooks, self.decoder.codebook_size)

    def run(self, items):
        return self.decoder.decode([c for c, _ in items], [left for _, left in items])

    def outputs(self, pcm):
        return {sp.AUDIO: pcm[None, :]}


@dataclass
class _CsmJob:
    text: str
    speaker: int
    max_frames: int
    paced: bool = False  # PACED: passed on to the talker (its scheduler paces the frames)


class CsmPipeline(DecoupledStage):
    """``csm`` BLS: validate, stream ``csm_talker``'s frames, decode them chunk by chunk with left
    context on ``csm_code2wav``, stream PCM. Without MAX_FRAMES the talker's cap follows the
    input length (:class:`~omni_triton.contracts.speech.FrameBudget`), so long text is not cut
    at a fixed length."""

    stage = "csm"
    input_error = sp.SpeechInputError
    reads_bls_streams = True
    per_instance_metrics = True  # several instances (stub processes)
    talker, code2wav = "csm_talker", "csm_code2wav"

    def setup(self, args, params):
        from omni_triton.runtime.cancel_flags import CancelFlags
        from omni_triton.stages.chunking import schedule_params

        self.chunks = schedule_params(params)  # ChunkSchedule keywords, validated (low water included)
        self.voices = [v.strip() for v in params.get("voices", "0").split(",") if v.strip()]
        self.default_voice = params.get("default_voice", self.voices[0])
        self.sample_rate = int(params.get("sample_rate", "24000"))
        self.max_input_chars = sp.max_input_chars(params, "2000")
        self.budget = sp.FrameBudget(float(params.get("max_frames_per_char", "2.5")),
                                     int(params.get("min_max_frames", "100")))
        self.talker_flags = CancelFlags.for_server()

    def parse(self, request):
        text, speaker = sp.parse_tts_request(
            request_text(request, sp.TEXT, self.max_input_chars), optional_str_input(request, sp.VOICE),
            optional_input(request, sp.SPEED), self.voices, self.default_voice, self.max_input_chars)
        max_frames = optional_input(request, sp.MAX_FRAMES)
        return _CsmJob(text, speaker, self.budget.for_text(text) if max_frames is None else int(max_frames),
                       self.paced(request))

    def _decode(self, codes, left):
        return call_stage(self.code2wav, sp.code2wav_inputs(codes, left), [sp.AUDIO])[sp.AUDIO].reshape(-1).astype(np.float32)

    def generate(self, job, stream):
        from omni_triton.stages.chunking import ChunkedDecoder, ChunkSchedule, fixed_if_unpaced

        chunked = ChunkedDecoder(ChunkSchedule(**fixed_if_unpaced(self.chunks, job.paced)), self._decode)
        rate = scalar_array(self.sample_rate, "INT32")
        inputs = [(sp.TEXT, utf8_array(job.text)), (sp.SPEAKER, scalar_array(job.speaker, "INT32")),
                  (sp.MAX_FRAMES, scalar_array(job.max_frames, "INT32"))]
        if job.paced:
            inputs.append((sp.PACED, scalar_array(True, "BOOL")))
        for out in stream_stage(self.talker, inputs, [sp.CODES], stream.cancelled, self.talker_flags,
                                f"tts-{uuid.uuid4().hex}", parent=stream):
            codes = out.get(sp.CODES)
            if stream.cancel_seen:
                break
            for pcm in chunked.push(codes if codes is not None else np.zeros((0, 0), np.int64)):
                yield {sp.AUDIO: pcm, sp.SAMPLE_RATE: rate}
        if not stream.cancel_seen and not stream.cancelled():
            for pcm in chunked.flush():
                yield {sp.AUDIO: pcm, sp.SAMPLE_RATE: rate}

"""``TritonPythonModel`` classes of the ``csm`` family (contract: ``omni_triton.contracts.speech``,
OpenAI name ``tts``): ``csm`` (BLS) -> ``csm_talker`` (codec frames) -> ``csm_code2wav`` (PCM, chunked
with left context). Stub-only imports; the logic lives in ``omni_triton.stages.csm``."""
from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np

from omni_triton.adapters.api_inputs import request_text
from omni_triton.adapters.batched import set_torch_threads
from omni_triton.adapters.bls import call_stage, stream_stage
from omni_triton.adapters.codec import CodecDecoderStage, first_chunk_of_new_stream, open_stream_counts
from omni_triton.adapters.stream import DecoupledStage, Final
from omni_triton.adapters.triton_io import optional_input, optional_str_input, present_arrays
from omni_triton.contracts import codec as cd
from omni_triton.contracts import csm as cs
from omni_triton.contracts import speech as sp
from omni_triton.contracts.tensors import scalar_array
from omni_triton.stages.chunking import FrameGroups


class CsmTalkerStage(DecoupledStage):
    """``csm_talker`` (CSM): TEXT (+ SPEAKER, MIN/MAX_FRAMES, REQUEST_ID) -> CODES responses of
    ``emit_frames`` frames; one request at a time per instance, inside ``execute``."""

    stage = "csm_talker"
    frames_output = cd.CODES  # deadline_unit frames
    input_error = sp.SpeechInputError
    cancel_flags = True
    per_instance_metrics = True
    metric_specs = dict(
        frames=("omni_tts_talker_frames_total", "Codec frames generated", "counter"),
        requests=("omni_tts_talker_requests_total", "Talker requests started", "counter"),
        cancelled=("omni_tts_talker_cancelled_total", "Talker requests cancelled", "counter"),
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
        handoff = cs.CsmToTalker.from_tensors(present_arrays(request, cs.TALKER_INPUT_NAMES))
        lo, hi = handoff.min_frames, handoff.max_frames
        return (handoff.text, handoff.speaker, self.default_min if lo is None else lo,
                self.default_max if hi is None else hi, handoff.first_chunk_frames)

    def playback_deadline(self, arrival, job=None, paced=False):
        """The config's frame deadline, with this request's FIRST_CHUNK_FRAMES (the BLS's dynamic
        first chunk) as its first chunk when sent."""
        first = job[4] if job is not None and len(job) > 4 else None
        return self.playback.deadline(arrival, paced, first_chunk_frames=first)

    def generate(self, job, stream):
        text, speaker, min_frames, max_frames, *rest = job
        # the first response is the consumer's first chunk (FIRST_CHUNK_FRAMES), then emit_frames
        groups = FrameGroups(self.emit_frames, rest[0] if rest else None)
        # Under the deadline scheduler (config `scheduling: deadline`) the talker computes a frame
        # only when the scheduler steps this request, so open requests interleave frame by frame.
        for frames in self.talker.stream(text, speaker=speaker, min_frames=min_frames, max_frames=max_frames,
                                         should_stop=stream.cancelled, paced=self.step_scheduler is not None):
            self.metrics.count("frames", len(frames))
            codes = groups.push(frames)
            # held for the group: under the scheduler still one frame per step
            yield None if codes is None else {cd.CODES: codes}
        rest = groups.flush()
        if rest is not None and not stream.cancel_seen:
            yield Final({cd.CODES: rest})


class CsmCode2WavStage(CodecDecoderStage):
    """``csm_code2wav``: CSM's Mimi codec decoder (see :class:`CodecDecoderStage`)."""

    def load(self, params):
        from omni_triton.checkpoints.csm import checkpoint_dir
        from omni_triton.stages.csm import CodecDecoder

        return CodecDecoder.from_pretrained(checkpoint_dir(params.get("model_name", "csm-tiny")))


@dataclass
class _CsmJob:
    text: str
    speaker: int
    max_frames: int
    paced: bool = False  # PACED: passed on to the talker (its scheduler paces the frames)


class CsmPipeline(DecoupledStage):
    """``csm`` BLS: validate, stream ``csm_talker``'s frames, decode them chunk by chunk with left
    context on ``csm_code2wav``, stream PCM. Without MAX_FRAMES the talker's cap follows the
    input length (:class:`~omni_triton.contracts.csm.FrameBudget`), so long text is not cut
    at a fixed length."""

    stage = "csm"
    input_error = sp.SpeechInputError
    reads_bls_streams = True
    per_instance_metrics = True  # several instances (stub processes)
    talker, code2wav = "csm_talker", "csm_code2wav"

    def setup(self, args, params):
        from omni_triton.runtime.cancel_flags import CancelFlags
        from omni_triton.stages.chunking import InitialChunk, instance_count, schedule_params

        self.chunks = schedule_params(params)  # ChunkSchedule keywords, validated (low water included)
        self.initial = InitialChunk.from_params(params, self.chunks["chunk_frames"], instance_count(args))
        self.open_streams = open_stream_counts(args)
        self.voices = [v.strip() for v in params.get("voices", "0").split(",") if v.strip()]
        self.default_voice = params.get("default_voice", self.voices[0])
        self.sample_rate = int(params.get("sample_rate", "24000"))
        self.max_input_chars = sp.max_input_chars(params, "2000")
        self.budget = cs.FrameBudget(float(params.get("max_frames_per_char", "2.5")),
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
        out = call_stage(self.code2wav, cd.talker_to_code2wav(codes, left), [sp.AUDIO])
        return out[sp.AUDIO].reshape(-1).astype(np.float32)

    def generate(self, job, stream):
        with first_chunk_of_new_stream(self) as first:
            yield from self._generate(job, stream, first)

    def _generate(self, job, stream, first: int):
        from omni_triton.stages.chunking import ChunkedDecoder, ChunkSchedule, fixed_if_unpaced

        kw = {**fixed_if_unpaced(self.chunks, job.paced), "first_chunk_frames": first}
        chunked = ChunkedDecoder(ChunkSchedule(**kw), self._decode)
        rate = scalar_array(self.sample_rate, "INT32")
        inputs = cs.CsmToTalker(job.text, job.speaker, job.max_frames, paced=job.paced,
                                first_chunk_frames=first).to_tensors()
        for out in stream_stage(self.talker, inputs, [cd.CODES], stream.cancelled, self.talker_flags,
                                f"tts-{uuid.uuid4().hex}", parent=stream):
            codes = out.get(cd.CODES)
            if stream.cancel_seen:
                break
            for pcm in chunked.push(codes if codes is not None else np.zeros((0, 0), np.int64)):
                yield {sp.AUDIO: pcm, sp.SAMPLE_RATE: rate}
        if not stream.cancel_seen and not stream.cancelled():
            for pcm in chunked.flush():
                yield {sp.AUDIO: pcm, sp.SAMPLE_RATE: rate}

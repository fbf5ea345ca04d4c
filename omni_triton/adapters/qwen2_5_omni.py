"""``TritonPythonModel`` classes of the Qwen2.5-Omni pipeline (contracts:
``omni_triton.contracts.qwen2_5_omni``): ``qwen2_5_omni`` (BLS) -> ``qwen2_5_omni_thinker`` (text
deltas + the talker's inputs) -> ``qwen2_5_omni_talker`` (codec ids) -> ``qwen2_5_omni_token2wav``
(DiT + BigVGAN, whole utterance). The thinker, talker and BLS are the shared omni bases
(``omni_triton.adapters.omni_stages``: request parsing, hand-off, response layout) on the Qwen2.5-Omni
stages of ``omni_triton.stages.qwen2_5_omni``: text only, no speaking while thinking, no scheduling,
one token2wav call per utterance. Stub-only imports."""
from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass

import numpy as np

from omni_triton.adapters.api_inputs import read_chat_request
from omni_triton.adapters.batched import BatchedStage, set_torch_threads
from omni_triton.adapters.bls import call_stage, stream_stage
from omni_triton.adapters.omni_stages import OmniJob, OmniPipelineBase, OmniTalkerBase, OmniThinkerBase
from omni_triton.adapters.triton_io import optional_str_input, required_array
from omni_triton.contracts import chat as ch
from omni_triton.contracts import codec as cd
from omni_triton.contracts import qwen2_5_omni as q25
from omni_triton.contracts import speech as sp
from omni_triton.contracts.tensors import scalar_int


def _checkpoint(params):
    from omni_triton.checkpoints.qwen2_5_omni import NAME, checkpoint_dir

    return checkpoint_dir(params.get("model_name", NAME))


def _metrics(stage: str, counted: str, what: str) -> dict:
    """``metric_specs`` of a decoupled stage: ``<stage>_<counted>_total`` and the request counters
    (requests in progress: the base's ``omni_stage_requests_running``)."""
    return {counted: (f"{stage}_{counted}_total", f"{what} generated", "counter"),
            "requests": (f"{stage}_requests_total", f"{stage} requests started", "counter"),
            "cancelled": (f"{stage}_cancelled_total", f"{stage} requests cancelled", "counter")}


class Qwen25OmniThinkerStage(OmniThinkerBase):
    """``qwen2_5_omni_thinker``: as ``qwen3_omni_thinker`` (same tensors), on the Qwen2.5-Omni thinker."""

    stage = "qwen2_5_omni_thinker"
    metric_specs = _metrics("qwen25_omni_thinker", "tokens", "Tokens")

    def setup(self, args, params):
        from omni_triton.stages.qwen2_5_omni import Qwen25Thinker

        set_torch_threads()
        self.thinker = Qwen25Thinker.from_pretrained(_checkpoint(params))
        self.processor = None  # text only: OmniThinkerBase.parse refuses media parts without one
        self.default_max_tokens = int(params.get("default_max_tokens", "32"))
        self.max_model_len = int(params.get("max_model_len", "1024"))


class Qwen25OmniTalkerStage(OmniTalkerBase):
    """``qwen2_5_omni_talker``: the thinker's outputs (+ VOICE, MIN/MAX_FRAMES, REQUEST_ID) -> CODES
    [n, 1] responses as the talker generates them; one request at a time per instance."""

    stage = "qwen2_5_omni_talker"
    pass_paced = False  # qwen2_5_omni_thinker has no PACED (unscheduled)
    metric_specs = _metrics("qwen25_omni_talker", "frames", "Codec tokens")

    def setup(self, args, params):
        from omni_triton.stages.qwen2_5_omni import Qwen25Talker, TalkerSettings

        set_torch_threads()
        self.talker = Qwen25Talker.from_pretrained(_checkpoint(params))
        self.default_voice = params.get("default_voice", "Chelsie")
        self.settings = TalkerSettings(
            max_frames=int(params.get("default_max_frames", "4096")),
            min_frames=int(params.get("default_min_frames", "0")),
            do_sample=params.get("do_sample", "true").lower() == "true",
            repetition_penalty=float(params.get("repetition_penalty", "1.05")))


class Qwen25OmniToken2WavStage(BatchedStage):
    """``qwen2_5_omni_token2wav``: CODES [1, T] + VOICE + SEED -> AUDIO [1, 480 T]; each item of a
    dynamic batch is its own whole-utterance DiT solve (as the reference decodes per sample: the
    noise and the non-causal DiT make a padded batch differ)."""

    def setup(self, args, params):
        from omni_triton.stages.qwen2_5_omni import Qwen25Token2Wav

        set_torch_threads()
        self.token2wav = Qwen25Token2Wav.from_pretrained(
            _checkpoint(params), num_steps=int(params.get("num_steps", "10")),
            guidance_scale=float(params.get("guidance_scale", "0.5")))

    def parse(self, request):
        codes = self.token2wav.validate(required_array(request, cd.CODES))
        voice = self.token2wav.voice(optional_str_input(request, ch.VOICE) or "")
        return codes, voice, scalar_int(required_array(request, q25.SEED), q25.SEED, ch.ChatInputError)

    def run(self, items):
        return [self.token2wav.synthesize(*item) for item in items]

    def outputs(self, pcm):
        return {sp.AUDIO: pcm[None, :]}


@dataclass
class _Qwen25Job(OmniJob):
    seed: int = 0  #: the DiT's noise seed


class Qwen25OmniPipeline(OmniPipelineBase):
    """``qwen2_5_omni`` BLS: request validation and response layout of the omni bases; thinker text deltas
    streamed as they come; with audio the talker's codes are collected and decoded once on
    ``qwen2_5_omni_token2wav`` (DiT noise seed: the request's ``seed``, else a random one), and the
    PCM is sent as one AUDIO response (``docs/qwen2_5_omni.md``: why not chunked)."""

    stage = "qwen2_5_omni"
    pass_paced = False  # qwen2_5_omni_talker has no PACED (unscheduled)
    thinker, talker, token2wav = "qwen2_5_omni_thinker", "qwen2_5_omni_talker", "qwen2_5_omni_token2wav"

    def setup(self, args, params):
        # torch-free (tests/unit/test_bls_imports.py): qwen2_5_omni_thinker tokenizes and validates
        # each request; text only (media_accept), so media parts are refused here
        from omni_triton.runtime.cancel_flags import CancelFlags

        self.voices = [v.strip() for v in params.get("voices", "Chelsie").split(",") if v.strip()]
        self.default_voice = params.get("default_voice", self.voices[0])
        self.sample_rate = int(params.get("sample_rate", "24000"))
        self.stage_flags = CancelFlags.for_server()

    def parse(self, request):
        job = super().parse(request)
        raw = read_chat_request(request)[2]
        seed = ch.parse_sampling(raw).get("seed") if raw else None
        return _Qwen25Job(**vars(job), seed=secrets.randbits(63) if seed is None else int(seed))

    def generate(self, job, stream):
        talker_in, counts = yield from self._think(job, stream, "qwen25-thinker")
        if talker_in is None:
            return
        codes = []
        for out in stream_stage(self.talker, talker_in, [cd.CODES], stream.cancelled, self.stage_flags,
                                f"qwen25-talker-{uuid.uuid4().hex}", parent=stream):
            c = out.get(cd.CODES)
            if c is not None and c.size and not stream.cancel_seen:
                codes.append(c.reshape(-1))
        if not codes or stream.cancel_seen or stream.cancelled():
            return
        handoff = q25.TalkerToToken2Wav(np.concatenate(codes), job.voice, job.seed)
        pcm = call_stage(self.token2wav, handoff.to_tensors(), [sp.AUDIO])[sp.AUDIO]
        yield self._response(counts=counts, audio=pcm.reshape(-1))

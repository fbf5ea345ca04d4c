"""``TritonPythonModel`` classes of the Stable Audio Open text-to-audio pipeline (contract:
``omni_triton.contracts.stable_audio``): ``stable_audio`` (BLS, decoupled) ->
``stable_audio_text_encoder`` (batched) -> ``stable_audio_denoiser`` (decoupled + dynamic
batching) -> ``stable_audio_vae_decoder`` (batched). Stub-only imports; the logic lives in
``omni_triton.stages.stable_audio``.

Why a BLS orchestrator and a decoupled denoiser (as ``wan_t2v``): the denoiser streams one STEP
response per finished step (progress), and an ensemble would feed every one of those responses
into the VAE decoder; the BLS forwards the STEP responses to its client, keeps the last (latents)
one for the decoder, and turns its own client's cancellation into the denoiser's (the
REQUEST_ID cancel flag on 2.51, iterator ``cancel()`` on 2.57+), which stops the pipeline call at
its next step boundary.
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

import numpy as np

from omni_triton.adapters.batched import BatchedStage
from omni_triton.adapters.batched_stream import BatchedDecoupledStage
from omni_triton.adapters.bls import StageError, call_stage, stream_stage
from omni_triton.adapters.diffusion_stages import DiffusionDenoiser, DiffusionPipelineStage
from omni_triton.adapters.stream import DecoupledStage, Final
from omni_triton.adapters.triton_io import input_array, optional_str_input, scalar_input
from omni_triton.contracts import stable_audio as ac
from omni_triton.contracts.tensors import INVALID_INPUT_PREFIX, MAX_DIFFUSION_PROMPT_CHARS, scalar_array, utf8_array

LOGGER = logging.getLogger("omni_triton.audio_generate")


def _limits(params) -> ac.AudioLimits:
    return ac.AudioLimits(float(params.get("max_seconds", 47.55)), float(params.get("min_seconds", 0.0)),
                          float(params.get("max_seconds_value", 512.0)), int(params.get("max_steps", 200)))


class StableAudioStage(DiffusionPipelineStage):
    """The Stable Audio family hooks: the audio contract, its checkpoint, :class:`AudioLimits`
    from the config ``parameters``."""

    contract = ac
    input_error = ac.AudioGenerateInputError

    def load_pipeline(self, params):
        from omni_triton.checkpoints.stable_audio import checkpoint_dir
        from omni_triton.stages import stable_audio

        return stable_audio, stable_audio.load_pipeline(checkpoint_dir(params["model_name"]))

    def stage_limits(self, params):
        """The config's limits (absent ones: the checkpoint's), refused (the load fails) when they
        exceed the checkpoint's."""
        have = self.d.limits(self.pipe)
        limits = _limits({"max_seconds": have.max_seconds, "min_seconds": have.min_value,
                          "max_seconds_value": have.max_value, **params})
        self.d.check_config_limits(self.pipe, limits.max_seconds, limits.min_value, limits.max_value)
        return limits


def _prompts(request, error) -> tuple[str, str | None]:
    prompt = optional_str_input(request, ac.PROMPT, MAX_DIFFUSION_PROMPT_CHARS, error)
    if prompt is None:
        raise error(f"missing input {ac.PROMPT}")
    if not prompt.strip():
        raise error("PROMPT is empty")
    return prompt, optional_str_input(request, ac.NEGATIVE_PROMPT, MAX_DIFFUSION_PROMPT_CHARS, error)


class StableAudioTextEncoder(StableAudioStage, BatchedStage):
    """T5: PROMPT (+ NEGATIVE_PROMPT) -> PROMPT_EMBEDS [1, L, D] + ATTENTION_MASK [1, L] and the
    negative prompt's (``[1, 0, D]`` / ``[1, 0]`` when absent). Logic:
    ``stable_audio.encode_prompts`` (one text at a time, as ``__call__`` encodes)."""

    def setup(self, args, params):
        self.setup_pipeline(params)

    def parse(self, request):
        """PROMPT and NEGATIVE_PROMPT; a text with more tokens than the tokenizer keeps is refused
        (diffusers would cut it with a warning)."""
        prompt, negative = _prompts(request, self.input_error)
        for name, text in ((ac.PROMPT, prompt), (ac.NEGATIVE_PROMPT, negative)):
            if text is not None:
                try:
                    self.d.check_prompt_tokens(self.pipe, text, name)
                except ac.AudioGenerateInputError as exc:
                    # 2.51 hands a BLS caller this stage's INVALID_ARG as INTERNAL: the prefix is
                    # how the stable_audio BLS (StageError.invalid) still answers INVALID_ARG
                    raise ac.AudioGenerateInputError(f"{INVALID_INPUT_PREFIX}{exc}") from None
        return prompt, negative

    def run(self, items):
        texts, negative = [], []
        for prompt, neg in items:
            texts += [prompt] + ([neg] if neg is not None else [])
            negative += [False] + ([True] if neg is not None else [])
        enc = iter(self.d.encode_prompts(self.pipe, texts, negative))
        out = []
        for _prompt, neg in items:
            pos = next(enc)
            out.append((pos, next(enc) if neg is not None else None))
        return out

    def outputs(self, result):
        (emb, mask), neg = result
        if neg is None:
            neg = (np.zeros((0, emb.shape[1]), np.float32), np.zeros((0,), np.int64))
        return {ac.PROMPT_EMBEDS: emb[None], ac.ATTENTION_MASK: mask[None],
                ac.NEGATIVE_PROMPT_EMBEDS: neg[0][None], ac.NEGATIVE_ATTENTION_MASK: neg[1][None]}


def parse_request_scalars(request, limits: ac.AudioLimits) -> dict:
    """AUDIO_START_S, AUDIO_END_S, NUM_INFERENCE_STEPS, GUIDANCE_SCALE, SEED of a request, checked
    (raises :class:`AudioGenerateInputError`)."""
    start, end = scalar_input(request, ac.AUDIO_START_S, float), scalar_input(request, ac.AUDIO_END_S, float)
    steps, scale = scalar_input(request, ac.NUM_INFERENCE_STEPS, int), scalar_input(request, ac.GUIDANCE_SCALE, float)
    limits.check(start, end, steps, scale)
    return dict(audio_start_s=start, audio_end_s=end, steps=steps, guidance_scale=scale,
                seed=scalar_input(request, ac.SEED, int))


class StableAudioDenoiser(StableAudioStage, DiffusionDenoiser, BatchedDecoupledStage):
    """``stable_audio_denoiser`` (decoupled, dynamically batched): the Stable Audio loop for a
    batch of compatible requests, one STEP/TOTAL_STEPS response per finished step to each
    request, then LATENTS/NUM_STEPS/DENOISE_SECONDS with FINAL. A cancelled request (Triton's
    flag or the REQUEST_ID cancel flag) gets its FINAL at once (no latents); when every request of
    a pipeline call is cancelled, the call stops at the next step boundary. Logic:
    ``stable_audio.denoise``."""

    stage = "stable_audio_denoiser"
    input_error = ac.AudioGenerateInputError
    cancel_flags = True
    metric_specs = dict(
        steps=("omni_audio_generate_denoise_steps_total", "Denoising steps run (one per pipeline call step)",
               "counter"),
        requests=("omni_audio_generate_denoise_requests_total", "Clips denoised (requests started)", "counter"),
        cancelled=("omni_audio_generate_denoise_cancelled_total", "Denoiser requests cancelled", "counter"),
        interrupted=("omni_audio_generate_denoise_interrupted_total",
                     "Pipeline calls stopped at a step boundary (every request cancelled)", "counter"))

    def setup(self, args, params):
        self.name = args["model_name"]
        super().setup(args, params)

    def parse(self, request):
        """One request -> a ``stable_audio.AudioDenoiseItem``.

        Raises:
            AudioGenerateInputError: a bad input (any ``ValueError`` of the checks: INVALID_ARG).
        """
        try:
            return self._parse(request)
        except ac.AudioGenerateInputError:
            raise
        except ValueError as exc:
            raise ac.AudioGenerateInputError(str(exc)) from exc

    def _parse(self, request):
        scalars = parse_request_scalars(request, self.limits)
        emb, mask = input_array(request, ac.PROMPT_EMBEDS), input_array(request, ac.ATTENTION_MASK)
        neg = input_array(request, ac.NEGATIVE_PROMPT_EMBEDS, required=False)
        neg_mask = input_array(request, ac.NEGATIVE_ATTENTION_MASK, required=False)
        if emb.ndim != 2 or mask.shape != emb.shape[:1]:
            raise ac.AudioGenerateInputError(f"PROMPT_EMBEDS {list(emb.shape)} / ATTENTION_MASK {list(mask.shape)}: "
                                             "must be [L, D] / [L]")
        item = self.d.AudioDenoiseItem(emb, mask, **scalars)
        if neg is not None and neg.shape[0] > 0:
            if neg.shape != emb.shape or neg_mask is None or neg_mask.shape != mask.shape:
                raise ac.AudioGenerateInputError("NEGATIVE_PROMPT_EMBEDS / NEGATIVE_ATTENTION_MASK must match the "
                                                 "prompt's shapes")
            item.negative_prompt_embeds, item.negative_attention_mask = neg, neg_mask
        return item

    def run_batch(self, items, streams):
        last = [time.monotonic(), None]  # when the previous step ended, and for which call

        def on_step(indices, step, total):
            self.metrics.count("steps")
            now = time.monotonic()
            if last[1] is indices:
                self.telemetry.observe("omni_diffusion_step_seconds", now - last[0])
            self.telemetry.count("omni_diffusion_steps_total", 1)
            last[:] = [now, indices]
            live = 0
            for i in indices:
                s = streams[i]
                if s.final_sent:
                    continue
                if s.cancelled():
                    s.close()  # released at once; the call goes on for its other requests
                    continue
                live += 1
                s.send({ac.STEP: np.array([[step]], np.int32), ac.TOTAL_STEPS: np.array([[total]], np.int32)})
            if live == 0 and step < total:
                self.metrics.count("interrupted")
                LOGGER.info("%s: every request cancelled, stopping at step %d/%d", self.stage, step, total)
                return True
            return False

        results = self.d.denoise(self.pipe, items, on_step)
        for stream, r in zip(streams, results, strict=False):
            if stream.final_sent or r.interrupted or r.latents is None or stream.cancelled():
                continue  # the base sends its FINAL
            stream.send(self.final_outputs(r.latents, r.steps, r.seconds), final=True)


class StableAudioVaeDecoder(StableAudioStage, BatchedStage):
    """AutoencoderOobleck: LATENTS [C, T] + AUDIO_START_S / AUDIO_END_S -> AUDIO float32
    [channels, samples] + SAMPLE_RATE. Logic: ``stable_audio.vae_decode``."""

    def setup(self, args, params):
        self.setup_pipeline(params)
        self.sample_rate = int(self.pipe.vae.config.sampling_rate)

    def parse(self, request):
        latents = input_array(request, ac.LATENTS)
        channels = self.pipe.vae.config.decoder_input_channels
        if latents.ndim != 2 or latents.shape[0] != channels:
            raise ac.AudioGenerateInputError(f"LATENTS must be [{channels}, T], got {list(latents.shape)}")
        start, end = scalar_input(request, ac.AUDIO_START_S, float), scalar_input(request, ac.AUDIO_END_S, float)
        self.limits.check(start, end)
        return latents, (start, end)

    def run(self, items):
        return self.d.vae_decode(self.pipe, [lat for lat, _ in items], [span for _, span in items])

    def outputs(self, audio):
        return {ac.AUDIO: audio[None], ac.SAMPLE_RATE: np.array([[self.sample_rate]], np.int32)}


@dataclass
class AudioJob:
    """One ``stable_audio`` request: ``prompt``, ``negative`` prompt (None when absent), the
    checked ``scalars`` of :func:`parse_request_scalars`."""

    prompt: str
    negative: str | None
    scalars: dict


class StableAudioPipeline(DecoupledStage):
    """``stable_audio`` BLS: text encoder -> denoiser (STEP responses forwarded as progress; the
    client's cancel becomes the denoiser's) -> VAE decoder -> one final AUDIO response."""

    stage = "stable_audio"
    input_error = ac.AudioGenerateInputError
    reads_bls_streams = True  # one request per instance at a time (omni_triton/adapters/bls.py, "One thread")
    per_instance_metrics = True  # several instances (stub processes)
    text_encoder, denoiser = "stable_audio_text_encoder", "stable_audio_denoiser"
    vae_decoder = "stable_audio_vae_decoder"
    metric_specs = dict(
        requests=("omni_audio_generate_requests_total", "Text-to-audio requests received", "counter"),
        invalid=("omni_audio_generate_invalid_total", "Text-to-audio requests refused as invalid", "counter"),
        cancelled=("omni_audio_generate_cancelled_total", "Text-to-audio requests cancelled by their client",
                   "counter"),
    )

    def setup(self, args, params):
        from omni_triton.runtime.cancel_flags import CancelFlags

        self.limits = _limits(params)
        self.denoiser_flags = CancelFlags.for_server()

    def parse(self, request):
        prompt, negative = _prompts(request, self.input_error)
        return AudioJob(prompt, negative, parse_request_scalars(request, self.limits))

    def generate(self, job, stream):
        s = job.scalars
        text_in = [(ac.PROMPT, utf8_array(job.prompt)[None])]
        if job.negative is not None and s["guidance_scale"] > 1.0:
            text_in.append((ac.NEGATIVE_PROMPT, utf8_array(job.negative)[None]))
        try:  # the text encoder refuses a prompt longer than its tokenizer keeps: INVALID_ARG here too
            emb = call_stage(self.text_encoder, text_in, [ac.PROMPT_EMBEDS, ac.ATTENTION_MASK,
                                                          ac.NEGATIVE_PROMPT_EMBEDS, ac.NEGATIVE_ATTENTION_MASK])
        except StageError as exc:
            if exc.invalid:
                raise ac.AudioGenerateInputError(str(exc)) from exc
            raise
        inputs = [(ac.PROMPT_EMBEDS, emb[ac.PROMPT_EMBEDS]), (ac.ATTENTION_MASK, emb[ac.ATTENTION_MASK])]
        if emb[ac.NEGATIVE_PROMPT_EMBEDS].shape[1] > 0:
            inputs += [(ac.NEGATIVE_PROMPT_EMBEDS, emb[ac.NEGATIVE_PROMPT_EMBEDS]),
                       (ac.NEGATIVE_ATTENTION_MASK, emb[ac.NEGATIVE_ATTENTION_MASK])]
        span = [(ac.AUDIO_START_S, scalar_array(s["audio_start_s"], "FP64")[None]),
                (ac.AUDIO_END_S, scalar_array(s["audio_end_s"], "FP64")[None])]
        inputs += span + [(ac.NUM_INFERENCE_STEPS, scalar_array(s["steps"], "INT32")[None]),
                          (ac.GUIDANCE_SCALE, scalar_array(s["guidance_scale"], "FP32")[None]),
                          (ac.SEED, scalar_array(s["seed"], "INT64")[None])]
        final = None
        for out in stream_stage(self.denoiser, inputs, [ac.STEP, ac.TOTAL_STEPS, ac.LATENTS, ac.NUM_STEPS,
                                                        ac.DENOISE_SECONDS],
                                stream.cancelled, self.denoiser_flags, f"audio-{uuid.uuid4().hex}", batched=True,
                                parent=stream):
            if stream.cancel_seen:
                break
            if ac.LATENTS in out:
                final = out
            elif ac.STEP in out:
                yield {ac.STEP: out[ac.STEP].reshape(1), ac.TOTAL_STEPS: out[ac.TOTAL_STEPS].reshape(1)}
        if final is None or stream.cancel_seen or stream.cancelled():
            return
        dec = call_stage(self.vae_decoder, [(ac.LATENTS, final[ac.LATENTS])] + span, [ac.AUDIO, ac.SAMPLE_RATE])
        yield Final({ac.AUDIO: dec[ac.AUDIO][0], ac.SAMPLE_RATE: dec[ac.SAMPLE_RATE].reshape(1),
                     ac.NUM_STEPS: final[ac.NUM_STEPS].reshape(1),
                     ac.DENOISE_SECONDS: final[ac.DENOISE_SECONDS].reshape(1)})

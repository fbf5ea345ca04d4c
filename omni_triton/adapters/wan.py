"""``TritonPythonModel`` classes of the Wan2.2 video pipeline (contract:
``omni_triton.contracts.wan``): ``wan_t2v`` (BLS, decoupled) -> ``wan_t2v_text_encoder``
(batched) -> ``wan_t2v_denoiser`` (decoupled + dynamic batching) -> ``wan_t2v_vae_decoder``
(batched); ``wan_i2v`` (BLS) adds ``wan_i2v_vae_encoder`` (batched) and runs ``wan_i2v_denoiser``
(the same denoiser class on the image-to-video pipeline), reusing the T2V text encoder and VAE
decoder. Stub-only imports; the logic lives in ``omni_triton.stages.wan``.

Why a BLS orchestrator and a decoupled denoiser: the denoiser streams one STEP response per
finished step (progress), and an ensemble would feed every one of those responses into the VAE
decoder; the BLS forwards the STEP responses to its client, keeps the last (latents) one for the
decoder, and turns its own client's cancellation into the denoiser's (the REQUEST_ID cancel flag
on 2.51, iterator ``cancel()`` on 2.57+), which stops the pipeline call at its next step boundary.
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

import numpy as np

from omni_triton.adapters.batched_stream import BatchedDecoupledStage
from omni_triton.adapters.bls import call_stage, stream_stage
from omni_triton.adapters.diffusion_stages import (
    DiffusionDenoiser,
    DiffusionPipelineStage,
    DiffusionTextEncoder,
    DiffusionVaeDecoder,
    DiffusionVaeEncoder,
)
from omni_triton.adapters.stream import DecoupledStage, Final
from omni_triton.adapters.triton_io import input_array, optional_str_input, scalar_input
from omni_triton.contracts import wan as vc
from omni_triton.contracts.tensors import MAX_DIFFUSION_PROMPT_CHARS, scalar_array, utf8_array

LOGGER = logging.getLogger("omni_triton.video")


def _limits(params) -> vc.VideoLimits:
    return vc.VideoLimits(int(params.get("size_multiple", 16)), int(params.get("max_size", 1280)),
                          int(params.get("frame_multiple", 4)), int(params.get("max_frames", 81)),
                          int(params.get("max_steps", 50)))


class WanStage(DiffusionPipelineStage):
    """The Wan family hooks: the video contract, its checkpoint, :class:`VideoLimits` from the
    config ``parameters``."""

    contract = vc
    input_error = vc.VideoInputError

    def load_pipeline(self, params):
        from omni_triton.checkpoints.wan import checkpoint_dir
        from omni_triton.stages import wan

        return wan, wan.load_pipeline(checkpoint_dir(params["model_name"]))

    def stage_limits(self, params):
        return _limits(params)


class WanTextEncoder(WanStage, DiffusionTextEncoder):
    """UMT5: PROMPT (+ NEGATIVE_PROMPT) -> PROMPT_EMBEDS [1, L, D], NEGATIVE_PROMPT_EMBEDS
    [1, L', D] (float32; L' = 0 when NEGATIVE_PROMPT is absent; an empty one is encoded). Logic:
    ``wan.encode_prompts`` (one prompt at a time)."""

    def encode(self, texts, conditions):
        return self.d.encode_prompts(self.pipe, texts)


def parse_request_scalars(request, limits: vc.VideoLimits) -> dict:
    """HEIGHT, WIDTH, NUM_FRAMES, NUM_INFERENCE_STEPS, GUIDANCE_SCALE(_2), BOUNDARY_RATIO,
    FLOW_SHIFT, SEED of a request, checked (raises :class:`VideoInputError`)."""
    height, width = scalar_input(request, vc.HEIGHT, int), scalar_input(request, vc.WIDTH, int)
    frames, steps = scalar_input(request, vc.NUM_FRAMES, int), scalar_input(request, vc.NUM_INFERENCE_STEPS, int)
    limits.check(height, width, frames, steps)
    g2 = scalar_input(request, vc.GUIDANCE_SCALE_2, float, required=False)
    ratio = scalar_input(request, vc.BOUNDARY_RATIO, float, required=False)
    shift = scalar_input(request, vc.FLOW_SHIFT, float, required=False)
    scales = dict(guidance_scale=scalar_input(request, vc.GUIDANCE_SCALE, float),
                  guidance_scale_2=g2 if g2 is not None and g2 >= 0 else None,
                  boundary_ratio=ratio if ratio is not None and ratio >= 0 else None,
                  flow_shift=shift if shift is not None and shift > 0 else None)
    vc.check_scales(**scales)
    return dict(height=height, width=width, num_frames=frames, steps=steps,
                seed=scalar_input(request, vc.SEED, int), **scales)


class WanDenoiser(WanStage, DiffusionDenoiser, BatchedDecoupledStage):
    """``wan_t2v_denoiser`` (decoupled, dynamically batched): the Wan loop for a batch of
    compatible requests, one STEP/TOTAL_STEPS response per finished step to each request, then
    LATENTS/NUM_STEPS/DENOISE_SECONDS with FINAL. A cancelled request (Triton's flag or the
    REQUEST_ID cancel flag) gets its FINAL at once (no latents); when every request of a
    pipeline call is cancelled, the call stops at the next step boundary (``pipe._interrupt``).
    Counters: steps run, requests, cancelled, interrupted calls; the ``omni_stage_*`` and
    ``omni_diffusion_*`` metrics. Logic: ``wan.denoise``."""

    stage = "wan_t2v_denoiser"
    input_error = vc.VideoInputError
    cancel_flags = True
    metric_specs = dict(
        steps=("omni_video_denoise_steps_total", "Denoising steps run (one per pipeline call step)", "counter"),
        requests=("omni_video_denoise_requests_total", "Videos denoised (requests started)", "counter"),
        cancelled=("omni_video_denoise_cancelled_total", "Denoiser requests cancelled", "counter"),
        interrupted=("omni_video_denoise_interrupted_total",
                     "Pipeline calls stopped at a step boundary (every request cancelled)", "counter"))

    def setup(self, args, params):
        self.name = args["model_name"]
        super().setup(args, params)

    def parse(self, request):
        """One request -> a ``wan.VideoDenoiseItem``.

        Raises:
            VideoInputError: a bad input (any ``ValueError`` of the checks: INVALID_ARG).
        """
        try:
            return self._parse(request)
        except vc.VideoInputError:
            raise
        except ValueError as exc:
            raise vc.VideoInputError(str(exc)) from exc

    def _parse(self, request):
        scalars = parse_request_scalars(request, self.limits)
        item = self.d.VideoDenoiseItem(**self.embeds(request), **scalars)
        if item.cfg and (item.negative_prompt_embeds is None or item.negative_prompt_embeds.shape[0] == 0):
            raise vc.VideoInputError("guidance_scale > 1 needs NEGATIVE_PROMPT_EMBEDS")
        return item

    def run_batch(self, items, streams):
        last = [time.monotonic(), None]  # when the previous step ended, and for which call

        def on_step(indices, step, total):
            self.metrics.count("steps")
            now = time.monotonic()
            if last[1] is indices:  # a step time within one pipeline call (its first includes set-up)
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
                s.send({vc.STEP: np.array([[step]], np.int32), vc.TOTAL_STEPS: np.array([[total]], np.int32)})
            if live == 0 and step < total:
                self.metrics.count("interrupted")
                LOGGER.info("%s: every request cancelled, stopping at step %d/%d", self.stage, step, total)
                return True
            return False

        results = self.d.denoise(self.pipe, items, on_step)
        for stream, r in zip(streams, results, strict=False):
            if stream.final_sent or r.interrupted or stream.cancelled():
                continue  # the base sends its FINAL
            stream.send(self.final_outputs(r.latents, r.steps, r.seconds), final=True)


class WanVaeDecoder(WanStage, DiffusionVaeDecoder):
    """AutoencoderKLWan: LATENTS [z, f, h, w] -> VIDEO uint8 [F, H, W, 3]. Logic: ``wan.vae_decode``."""

    output = vc.VIDEO

    def parse(self, request):
        latents = input_array(request, vc.LATENTS)
        if latents.ndim != 4 or latents.shape[0] != self.pipe.vae.config.z_dim:
            raise vc.VideoInputError(
                f"LATENTS must be [{self.pipe.vae.config.z_dim}, f, h, w], got {list(latents.shape)}")
        return latents

    def run(self, items):
        return self.d.vae_decode(self.pipe, items)


@dataclass
class VideoJob:
    """One ``wan_t2v``/``wan_i2v`` request: ``prompt``, ``negative`` prompt ("" when absent), the
    checked ``scalars`` of :func:`parse_request_scalars`, and for image-to-video the reference
    ``image`` (uint8 [HEIGHT, WIDTH, 3])."""

    prompt: str
    negative: str
    scalars: dict
    image: np.ndarray | None = None


class WanT2VPipeline(DecoupledStage):
    """``wan_t2v`` BLS: text encoder -> denoiser (STEP responses forwarded as progress; the
    client's cancel becomes the denoiser's) -> VAE decoder -> one final VIDEO response."""

    stage = "wan_t2v"
    input_error = vc.VideoInputError
    reads_bls_streams = True  # one request per instance at a time (omni_triton/adapters/bls.py, "One thread")
    per_instance_metrics = True  # several instances (stub processes)
    text_encoder, denoiser, vae_decoder = "wan_t2v_text_encoder", "wan_t2v_denoiser", "wan_t2v_vae_decoder"
    metric_specs = dict(
        requests=("omni_video_requests_total", "Video requests received", "counter"),
        invalid=("omni_video_invalid_total", "Video requests refused as invalid", "counter"),
        cancelled=("omni_video_cancelled_total", "Video requests cancelled by their client", "counter"),
    )

    def setup(self, args, params):
        from omni_triton.runtime.cancel_flags import CancelFlags

        self.limits = _limits(params)
        self.denoiser_flags = CancelFlags.for_server()

    def parse(self, request):
        prompt = optional_str_input(request, vc.PROMPT, MAX_DIFFUSION_PROMPT_CHARS, vc.VideoInputError) or ""
        if not prompt.strip():
            raise vc.VideoInputError("PROMPT is empty")
        negative = optional_str_input(request, vc.NEGATIVE_PROMPT, MAX_DIFFUSION_PROMPT_CHARS,
                                      vc.VideoInputError) or ""
        return VideoJob(prompt, negative, parse_request_scalars(request, self.limits))

    def condition_inputs(self, job) -> list:
        """Extra denoiser inputs of one parsed request (none for text-to-video)."""
        return []

    def generate(self, job, stream):
        prompt, negative, s = job.prompt, job.negative, job.scalars
        cfg = s["guidance_scale"] > 1.0
        text_in = [(vc.PROMPT, utf8_array(prompt)[None])]
        if cfg:
            text_in.append((vc.NEGATIVE_PROMPT, utf8_array(negative)[None]))
        emb = call_stage(self.text_encoder, text_in, [vc.PROMPT_EMBEDS, vc.NEGATIVE_PROMPT_EMBEDS])
        inputs = [(vc.PROMPT_EMBEDS, emb[vc.PROMPT_EMBEDS])]
        if cfg:
            inputs.append((vc.NEGATIVE_PROMPT_EMBEDS, emb[vc.NEGATIVE_PROMPT_EMBEDS]))
        inputs += [(name, scalar_array(s[key], dtype)[None]) for name, key, dtype in (
            (vc.HEIGHT, "height", "INT32"), (vc.WIDTH, "width", "INT32"), (vc.NUM_FRAMES, "num_frames", "INT32"),
            (vc.NUM_INFERENCE_STEPS, "steps", "INT32"), (vc.GUIDANCE_SCALE, "guidance_scale", "FP32"),
            (vc.SEED, "seed", "INT64"))]
        for name, key in ((vc.GUIDANCE_SCALE_2, "guidance_scale_2"), (vc.BOUNDARY_RATIO, "boundary_ratio"),
                          (vc.FLOW_SHIFT, "flow_shift")):
            if s[key] is not None:
                inputs.append((name, scalar_array(s[key], "FP32")[None]))
        inputs += self.condition_inputs(job)
        final = None
        for out in stream_stage(self.denoiser, inputs, [vc.STEP, vc.TOTAL_STEPS, vc.LATENTS, vc.NUM_STEPS,
                                                        vc.DENOISE_SECONDS],
                                stream.cancelled, self.denoiser_flags, f"video-{uuid.uuid4().hex}", batched=True,
                                parent=stream):
            if stream.cancel_seen:
                break
            if vc.LATENTS in out:
                final = out
            elif vc.STEP in out:
                yield {vc.STEP: out[vc.STEP].reshape(1), vc.TOTAL_STEPS: out[vc.TOTAL_STEPS].reshape(1)}
        if final is None or stream.cancel_seen or stream.cancelled():
            return
        video = call_stage(self.vae_decoder, [(vc.LATENTS, final[vc.LATENTS])], [vc.VIDEO])[vc.VIDEO]
        yield Final({vc.VIDEO: video[0], vc.NUM_STEPS: final[vc.NUM_STEPS].reshape(1),
                     vc.DENOISE_SECONDS: final[vc.DENOISE_SECONDS].reshape(1)})


# --------------------------------------------------------------------------- image-to-video
class WanVaeEncoder(WanStage, DiffusionVaeEncoder):
    """``wan_i2v_vae_encoder``: INPUT_IMAGE uint8 [H, W, 3] + NUM_FRAMES -> CONDITION_LATENTS
    float32 [z, (F - 1) / 4 + 1, H / 8, W / 8] (the VAE posterior mode of the reference frame
    followed by F - 1 black frames). Logic: ``wan.vae_encode_condition``."""

    def parse(self, request):
        image = input_array(request, vc.INPUT_IMAGE)
        frames = scalar_input(request, vc.NUM_FRAMES, int)
        if image.ndim != 3:
            raise vc.VideoInputError(f"INPUT_IMAGE must be uint8 [H, W, 3], got {list(image.shape)}")
        self.limits.check(image.shape[0], image.shape[1], frames)
        vc.check_input_image(image, image.shape[0], image.shape[1])
        return image, frames

    def run(self, items):
        return [self.d.vae_encode_condition(self.pipe, [image], frames)[0] for image, frames in items]

    def outputs(self, latents):
        return {vc.CONDITION_LATENTS: latents[None]}


class WanI2VDenoiser(WanDenoiser):
    """``wan_i2v_denoiser``: :class:`WanDenoiser` (same batching, STEP progress and step-boundary
    cancel) on a ``WanImageToVideoPipeline``, each request with its CONDITION_LATENTS."""

    stage = "wan_i2v_denoiser"

    def _parse(self, request):
        item = super()._parse(request)
        item.condition = input_array(request, vc.CONDITION_LATENTS)
        want = [(item.num_frames - 1) // 4 + 1, item.height // 8, item.width // 8]
        if item.condition.ndim != 4 or list(item.condition.shape[1:]) != want:
            raise vc.VideoInputError(f"CONDITION_LATENTS must be [z, {want[0]}, {want[1]}, {want[2]}], got "
                                     f"{list(item.condition.shape)}")
        return item


class WanI2VPipeline(WanT2VPipeline):
    """``wan_i2v`` BLS: the ``wan_t2v`` flow plus the reference image: INPUT_IMAGE (uint8
    [HEIGHT, WIDTH, 3]) -> ``wan_i2v_vae_encoder`` -> CONDITION_LATENTS into ``wan_i2v_denoiser``;
    the text encoder and VAE decoder are the T2V stages (same weights)."""

    stage = "wan_i2v"
    vae_encoder, denoiser = "wan_i2v_vae_encoder", "wan_i2v_denoiser"

    def parse(self, request):
        job = super().parse(request)
        job.image = input_array(request, vc.INPUT_IMAGE)
        vc.check_input_image(job.image, job.scalars["height"], job.scalars["width"])
        return job

    def condition_inputs(self, job) -> list:
        image, frames = job.image, job.scalars["num_frames"]
        out = call_stage(self.vae_encoder, [(vc.INPUT_IMAGE, image[None]),
                                            (vc.NUM_FRAMES, scalar_array(frames, "INT32")[None])],
                         [vc.CONDITION_LATENTS])
        return [(vc.CONDITION_LATENTS, out[vc.CONDITION_LATENTS])]

"""``TritonPythonModel`` classes of the Qwen-Image and Qwen-Image-Edit stages (contract:
``omni_triton.contracts.image``), all dynamically batched (:class:`BatchedStage`).

The text-to-image and edit pipelines run the same stage code on different checkpoints (the
config parameter ``model_name``), so each ``model_repository/qwen_image*_<stage>/1/model.py``
only binds one of these classes. Importable only inside the Triton Python stub; the logic they
call lives in ``omni_triton.stages.qwen_image`` and is unit-tested without Triton.
"""
import numpy as np

from omni_triton.adapters.batched import BatchedStage, set_torch_threads
from omni_triton.adapters.triton_io import (
    forward_logs_to_triton, input_array, is_cancelled, log, optional_str_input, scalar_input,
)
from omni_triton.contracts import image as im
from omni_triton.contracts.tensors import MAX_DIFFUSION_PROMPT_CHARS


class _DiffusionStage(BatchedStage):
    def setup(self, args, params):
        from omni_triton.checkpoints.qwen_image import checkpoint_dir
        from omni_triton.stages import qwen_image as diffusion

        set_torch_threads()
        self.d = diffusion
        self.pipe = diffusion.load_pipeline(checkpoint_dir(params["model_name"]))
        self.edit = diffusion.is_edit_pipeline(self.pipe)
        self.limits = im.Limits(diffusion.size_multiple(self.pipe), int(params.get("max_size", 1024)),
                                int(params.get("max_steps", 50)))


class TextEncoder(_DiffusionStage):
    """Text encoder stage (Qwen2.5-VL; edit: with its vision tower): PROMPT (+ NEGATIVE_PROMPT,
    + IMAGE for edits) -> PROMPT_EMBEDS [1, L, D] and NEGATIVE_PROMPT_EMBEDS [1, L', D] (L' = 0:
    no CFG), float32. Logic: ``omni_triton.stages.qwen_image.encode_prompts``."""

    def parse(self, request):
        prompt = optional_str_input(request, im.PROMPT, MAX_DIFFUSION_PROMPT_CHARS, im.ImageInputError)
        if prompt is None:
            raise im.ImageInputError(f"missing input {im.PROMPT}")
        negative = optional_str_input(request, im.NEGATIVE_PROMPT, MAX_DIFFUSION_PROMPT_CHARS,
                                      im.ImageInputError) or ""
        if not prompt.strip():
            raise im.ImageInputError("PROMPT is empty")
        image = None
        if self.edit:
            original = self.d.image_from_array(input_array(request, im.IMAGE))
            self.d.check_condition_image(self.pipe, original)  # per item: see its docstring
            image = self.d.condition_image(self.pipe, original)[0]
        return prompt, negative, image

    def run(self, items):
        # One encode over every prompt and negative prompt of the batch (grouped by length).
        texts, images, slots = [], [], []
        for prompt, negative, image in items:
            slots.append((len(texts), len(texts) + 1 if negative else None))
            texts += [prompt] + ([negative] if negative else [])
            images += [image] + ([image] if negative else [])
        embeds = self.d.encode_prompts(self.pipe, texts, images if self.edit else None)
        dim = embeds[0].shape[1]
        return [(embeds[p], embeds[n] if n is not None else np.zeros((0, dim), np.float32)) for p, n in slots]

    def outputs(self, result):
        return {im.PROMPT_EMBEDS: result[0][None], im.NEGATIVE_PROMPT_EMBEDS: result[1][None]}


class VaeEncoder(_DiffusionStage):
    """VAE encoder stage (edit): condition IMAGE uint8 [H, W, 3] -> normalised IMAGE_LATENTS, and
    CHECKED_IMAGE: the same pixels, once ``check_condition_image`` accepted them (the edit
    ensemble's text encoder reads them, so it runs after this step; see ``im.CHECKED_IMAGE``).
    Logic: ``omni_triton.stages.qwen_image.vae_encode``."""

    def parse(self, request):
        pixels = input_array(request, im.IMAGE)
        image = self.d.image_from_array(pixels)
        self.d.check_condition_image(self.pipe, image)  # per item; the ensemble's first step
        return image, pixels

    def run(self, items):
        latents = self.d.vae_encode(self.pipe, [image for image, _ in items])
        return [(lat, pixels) for lat, (_, pixels) in zip(latents, items)]

    def outputs(self, result):
        latents, pixels = result
        return {im.IMAGE_LATENTS: latents[None], im.CHECKED_IMAGE: np.ascontiguousarray(pixels)[None]}


class Denoiser(_DiffusionStage):
    """Denoiser stage: the diffusers pipeline's own loop (``output_type="latent"``); compatible
    requests share one pipeline call, each with its own seed. Outputs LATENTS (packed, float32),
    NUM_STEPS (int32), DENOISE_SECONDS (float32). When every request of a pipeline call is
    cancelled (its HTTP client left; Triton's ``is_cancelled``), the call stops at the next step
    boundary; a call with one live request runs on for it. Logic: ``omni_triton.stages.qwen_image.denoise``."""

    def setup(self, args, params):
        from omni_triton import kernels

        forward_logs_to_triton("omni_triton.diffusion")  # per-step progress in Triton's log
        super().setup(args, params)
        self.progress_s = float(params.get("progress_log_interval_s", 2.0))
        # attention backend and step cache from config.pbtxt (omni_triton/kernels.py)
        log("info", f"{args['model_name']}: {kernels.apply_from_params(self.pipe, params)}")

    def parse(self, request):
        height, width = scalar_input(request, im.HEIGHT, int), scalar_input(request, im.WIDTH, int)
        steps = scalar_input(request, im.NUM_INFERENCE_STEPS, int)
        self.limits.check(height, width, steps)
        guidance = scalar_input(request, im.GUIDANCE_SCALE, float, required=False)
        true_cfg = scalar_input(request, im.TRUE_CFG_SCALE, float, required=False)
        self.d.check_guidance(true_cfg, guidance)
        item = self.d.DenoiseItem(
            prompt_embeds=input_array(request, im.PROMPT_EMBEDS),
            negative_prompt_embeds=input_array(request, im.NEGATIVE_PROMPT_EMBEDS, required=False),
            height=height, width=width, steps=steps, seed=scalar_input(request, im.SEED, int),
            true_cfg_scale=true_cfg or 1.0,
            guidance_scale=guidance if guidance and guidance > 0 else None,
            # a started batch stops at the next step once all its clients left
            cancelled=lambda: is_cancelled(request))
        if self.edit:
            item.image = self.d.image_from_array(input_array(request, im.IMAGE))
            self.d.check_condition_image(self.pipe, item.image)
            item.image_latents = input_array(request, im.IMAGE_LATENTS)
        return item

    def run(self, items):
        results = self.d.denoise(self.pipe, items, label=self.name, progress_interval_s=self.progress_s)
        calls = {}  # the requests of one pipeline call share its steps and seconds
        for r in results:
            calls.setdefault((id(r.seconds), r.steps), (r.steps, r.seconds))
        for steps, seconds in calls.values():
            if steps:
                self.telemetry.count("omni_diffusion_steps_total", steps)
                self.telemetry.observe("omni_diffusion_step_seconds", seconds / steps)
        return results

    def outputs(self, r):
        return {im.LATENTS: r.latents[None], im.NUM_STEPS: np.array([[r.steps]], np.int32),
                im.DENOISE_SECONDS: np.array([[r.seconds]], np.float32)}


class VaeDecoder(_DiffusionStage):
    """VAE decoder stage: packed LATENTS + HEIGHT/WIDTH -> IMAGE uint8 [H, W, 3].
    Logic: ``omni_triton.stages.qwen_image.vae_decode``."""

    def parse(self, request):
        height, width = scalar_input(request, im.HEIGHT, int), scalar_input(request, im.WIDTH, int)
        self.limits.check(height, width)
        return input_array(request, im.LATENTS), (height, width)

    def run(self, items):
        return self.d.vae_decode(self.pipe, [i[0] for i in items], [i[1] for i in items])

    def outputs(self, image):
        return {im.IMAGE: image[None]}

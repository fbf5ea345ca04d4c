"""``TritonPythonModel`` classes of the Qwen-Image, Qwen-Image-Edit and Qwen-Image-Edit-Plus stages
(contract: ``omni_triton.contracts.qwen_image``), all dynamically batched (:class:`BatchedStage`):
the diffusion roles of ``adapters/diffusion_stages.py`` with the Qwen-Image differences (the
edit's condition image(s), true CFG, packed latents decoded at a HEIGHT x WIDTH).

The text-to-image, edit, multi-image edit and inpaint pipelines run the same stage code on
different checkpoints (the config parameter ``model_name``; a ``QwenImageEditPlusPipeline``
checkpoint makes the stages read the multi-image tensors IMAGES + IMAGE_SIZES, up to the config's
``max_input_images``; ``pipeline`` names another diffusers class to load the folder with:
``QwenImageInpaintPipeline``), so each ``model_repository/qwen_image*_<stage>/1/model.py`` only
binds one of these classes. Importable only inside the Triton Python stub; the logic they call
lives in ``omni_triton.stages.qwen_image`` and is unit-tested without Triton.
"""
from pathlib import Path

import numpy as np

from omni_triton.adapters.batched import BatchedStage
from omni_triton.adapters.diffusion_stages import (
    DiffusionDenoiser,
    DiffusionPipelineStage,
    DiffusionTextEncoder,
    DiffusionVaeDecoder,
    DiffusionVaeEncoder,
)
from omni_triton.adapters.triton_io import forward_logs_to_triton, input_array, is_cancelled, log, scalar_input
from omni_triton.contracts import qwen_image as im
from omni_triton.contracts.lora import check_id, check_scale


class QwenImageStage(DiffusionPipelineStage):
    """The Qwen-Image family hooks: the image contract, its checkpoint (config parameters
    ``model_name`` and the optional ``pipeline`` class), ``self.edit`` (True on a
    ``QwenImageEditPipeline``), ``self.inpaint`` (True on a ``QwenImageInpaintPipeline``) and
    :class:`~omni_triton.contracts.qwen_image.Limits`."""

    contract = im
    input_error = im.ImageInputError

    def load_pipeline(self, params):
        from omni_triton.checkpoints.qwen_image import checkpoint_dir
        from omni_triton.stages import qwen_image

        return qwen_image, qwen_image.load_pipeline(checkpoint_dir(params["model_name"]), params.get("pipeline"))

    def setup_pipeline(self, params):
        super().setup_pipeline(params)
        self.edit = self.d.is_edit_pipeline(self.pipe)
        self.inpaint = self.d.is_inpaint_pipeline(self.pipe)
        #: QwenImageEditPlusPipeline: IMAGES + IMAGE_SIZES (1..max_input_images) instead of IMAGE
        self.multi = self.d.is_multi_image_pipeline(self.pipe)
        self.max_input_images = int(params.get("max_input_images", 1))

    def condition_images(self, request, pixels_name: str = im.IMAGES) -> tuple[list, np.ndarray]:
        """A multi-image request's condition images: (PIL images in order, the ``uint8 [P, 3]``
        pixels as sent), each checked by ``check_condition_image``.

        Raises:
            ImageInputError: a malformed pair (``im.unpack_images``), more than
                ``max_input_images`` images, or an image the pipeline cannot encode.
        """
        pixels = input_array(request, pixels_name)
        arrays = im.unpack_images(pixels, input_array(request, im.IMAGE_SIZES), self.max_input_images)
        images = [self.d.image_from_array(a) for a in arrays]
        for k, image in enumerate(images):
            try:
                self.d.check_condition_image(self.pipe, image)
            except ValueError as exc:
                raise im.ImageInputError(f"image {k + 1}: {exc}") from None
        return images, pixels

    def stage_limits(self, params):
        return im.Limits(self.d.size_multiple(self.pipe), int(params.get("max_size", 1024)),
                         int(params.get("max_steps", 50)))


class QwenImageTextEncoder(QwenImageStage, DiffusionTextEncoder):
    """Text encoder stage (Qwen2.5-VL; edit: with its vision tower): PROMPT (+ NEGATIVE_PROMPT,
    + IMAGE for edits) -> PROMPT_EMBEDS [1, L, D] and NEGATIVE_PROMPT_EMBEDS [1, L', D] (L' = 0:
    no CFG; an empty NEGATIVE_PROMPT is none), float32. Logic: ``omni_triton.stages.qwen_image.encode_prompts``."""

    empty_negative_is_absent = True

    def condition(self, request):
        if not self.edit:
            return None
        if self.multi:  # the VAE encoder checked them (CHECKED_IMAGES)
            images, _ = self.condition_images(request)
            return [self.d.condition_image(self.pipe, image)[0] for image in images]
        original = self.d.image_from_array(input_array(request, im.IMAGE))
        self.d.check_condition_image(self.pipe, original)  # per item: see its docstring
        return self.d.condition_image(self.pipe, original)[0]

    def encode(self, texts, conditions):
        # one call over the batch; the stage groups the texts by token length
        return self.d.encode_prompts(self.pipe, texts, conditions if self.edit else None)


class QwenImageVaeEncoder(QwenImageStage, DiffusionVaeEncoder):
    """VAE encoder stage (edit): condition IMAGE uint8 [H, W, 3] -> normalised IMAGE_LATENTS, and
    CHECKED_IMAGE: the same pixels, once ``check_condition_image`` accepted them (the edit
    ensemble's text encoder reads them, so it runs after this step; see ``im.CHECKED_IMAGE``).
    Logic: ``omni_triton.stages.qwen_image.vae_encode``."""

    def parse(self, request):
        if self.multi:  # per item; the ensemble's first step
            return self.condition_images(request)
        pixels = input_array(request, im.IMAGE)
        image = self.d.image_from_array(pixels)
        self.d.check_condition_image(self.pipe, image)  # per item; the ensemble's first step
        return image, pixels

    def run(self, items):
        if self.multi:  # every image of the batch in one call (image by image inside), regrouped
            latents = iter(self.d.vae_encode(self.pipe, [image for images, _ in items for image in images]))
            return [(self.d.pack_image_latents(self.pipe, [next(latents) for _ in images]), pixels)
                    for images, pixels in items]
        latents = self.d.vae_encode(self.pipe, [image for image, _ in items])
        return [(lat, pixels) for lat, (_, pixels) in zip(latents, items, strict=False)]

    def outputs(self, result):
        latents, pixels = result
        checked = im.CHECKED_IMAGES if self.multi else im.CHECKED_IMAGE
        return {im.IMAGE_LATENTS: latents[None], checked: np.ascontiguousarray(pixels)[None]}


class QwenImageInpaintVaeEncoder(QwenImageStage, DiffusionVaeEncoder):
    """VAE encoder stage (inpaint; the inpaint ensemble's first step): IMAGE uint8 [H, W, 3] +
    MASK uint8 [H, W] (255 = repaint, the image's size) + HEIGHT/WIDTH (the output size the image
    is resized to) + PROMPT -> IMAGE_MOMENTS (the image's VAE posterior parameters, float32
    [2z, 1, H/8, W/8]) and CHECKED_PROMPT (PROMPT once image, mask and size were checked: the
    ensemble's text encoder reads it, so the steps form a chain). Logic:
    ``omni_triton.stages.qwen_image.image_posteriors``."""

    def parse(self, request):
        height, width = scalar_input(request, im.HEIGHT, int), scalar_input(request, im.WIDTH, int)
        self.limits.check(height, width)
        image = self.d.image_from_array(input_array(request, im.IMAGE))
        self.d.check_mask(image, self.d.mask_from_array(input_array(request, im.MASK)))
        return image, (height, width), input_array(request, im.PROMPT)

    def run(self, items):
        moments = self.d.image_posteriors(self.pipe, [i[0] for i in items], [i[1] for i in items])
        return [(m, prompt) for m, (_, _, prompt) in zip(moments, items, strict=True)]

    def outputs(self, result):
        moments, prompt = result
        return {im.IMAGE_MOMENTS: moments[None], im.CHECKED_PROMPT: np.asarray(prompt, dtype=np.object_)[None]}


class QwenImageDenoiser(QwenImageStage, DiffusionDenoiser, BatchedStage):
    """Denoiser stage: the diffusers pipeline's own loop (``output_type="latent"``); compatible
    requests share one pipeline call, each with its own seed. Outputs LATENTS (packed, float32),
    NUM_STEPS (int32), DENOISE_SECONDS (float32). When every request of a pipeline call is
    cancelled (its HTTP client left; Triton's ``is_cancelled``), the call stops at the next step
    boundary; a call with one live request runs on for it. Logic: ``omni_triton.stages.qwen_image.denoise``."""

    def setup(self, args, params):
        forward_logs_to_triton("omni_triton.diffusion")  # per-step progress in Triton's log
        super().setup(args, params)
        self.progress_s = float(params.get("progress_log_interval_s", 2.0))
        # per-request LoRA (docs/lora.md): adapters only from the LoRA directory, LRU within max_loras
        from omni_triton.contracts.lora import lora_dir

        directory = Path(params.get("lora_dir") or lora_dir())
        self.loras = self.d.LoraCache(self.pipe, directory, max_loras=int(params.get("max_loras", 4)))
        try:  # the frontend validates uploads against this list of the transformer's Linear layers
            self.d.write_manifest(self.pipe, directory, args["model_name"])
        except OSError as exc:
            log("warn", f"{args['model_name']}: LoRA manifest not written to {directory}: {exc}")

    def parse(self, request):
        height, width = scalar_input(request, im.HEIGHT, int), scalar_input(request, im.WIDTH, int)
        steps = scalar_input(request, im.NUM_INFERENCE_STEPS, int)
        self.limits.check(height, width, steps)
        guidance = scalar_input(request, im.GUIDANCE_SCALE, float, required=False)
        true_cfg = scalar_input(request, im.TRUE_CFG_SCALE, float, required=False)
        self.d.check_guidance(true_cfg, guidance)
        item = self.d.DenoiseItem(
            **self.embeds(request), height=height, width=width, steps=steps, seed=scalar_input(request, im.SEED, int),
            true_cfg_scale=true_cfg or 1.0,
            guidance_scale=guidance if guidance and guidance > 0 else None,
            # a started batch stops at the next step once all its clients left
            cancelled=lambda: is_cancelled(request))
        lora_id = scalar_input(request, im.LORA_ID, str, required=False)
        if lora_id:
            scale = scalar_input(request, im.LORA_SCALE, float, required=False)
            item.lora = self.d.LoraSpec(check_id(lora_id), check_scale(1.0 if scale is None else scale))
        if self.multi:
            item.image, _ = self.condition_images(request)
            try:
                item.image_latents = self.d.unpack_image_latents(
                    self.pipe, input_array(request, im.IMAGE_LATENTS), [i.size for i in item.image])
            except ValueError as exc:
                raise im.ImageInputError(str(exc)) from None
        elif self.edit:
            item.image = self.d.image_from_array(input_array(request, im.IMAGE))
            self.d.check_condition_image(self.pipe, item.image)
            item.image_latents = input_array(request, im.IMAGE_LATENTS)
        if self.inpaint:
            item.image = self.d.image_from_array(input_array(request, im.IMAGE))
            item.mask = self.d.mask_from_array(input_array(request, im.MASK))
            self.d.check_mask(item.image, item.mask)
            item.strength = scalar_input(request, im.STRENGTH, float)
            im.check_strength(item.strength)
            item.image_moments = input_array(request, im.IMAGE_MOMENTS)
        return item

    def run(self, items):
        # a request whose adapter cannot be loaded gets its LoraLoadError (INVALID_ARG) alone
        results = self.d.denoise(self.pipe, items, label=self.name, progress_interval_s=self.progress_s,
                                 loras=self.loras)
        calls = {}  # the requests of one pipeline call share its steps and seconds
        for r in results:
            if isinstance(r, Exception):
                continue
            calls.setdefault((id(r.seconds), r.steps), (r.steps, r.seconds))
        for steps, seconds in calls.values():
            if steps:
                self.telemetry.count("omni_diffusion_steps_total", steps)
                self.telemetry.observe("omni_diffusion_step_seconds", seconds / steps)
        return results

    def item_compute_ms(self, results):
        """Each request's share of its own pipeline call: the call's seconds / its requests
        (requests of one call share the ``seconds`` object), in ms; calls of other step counts or
        shapes in the same batch are not charged to it."""
        sizes: dict[tuple[int, int], int] = {}
        done = [r for r in results if not isinstance(r, Exception)]
        for r in done:
            key = (id(r.seconds), r.steps)
            sizes[key] = sizes.get(key, 0) + 1
        return [0.0 if isinstance(r, Exception) else r.seconds * 1000.0 / sizes[(id(r.seconds), r.steps)]
                for r in results]

    def outputs(self, r):
        return self.final_outputs(r.latents, r.steps, r.seconds)


class QwenImageVaeDecoder(QwenImageStage, DiffusionVaeDecoder):
    """VAE decoder stage: packed LATENTS + HEIGHT/WIDTH -> IMAGE uint8 [H, W, 3].
    Logic: ``omni_triton.stages.qwen_image.vae_decode``."""

    output = im.IMAGE

    def parse(self, request):
        height, width = scalar_input(request, im.HEIGHT, int), scalar_input(request, im.WIDTH, int)
        self.limits.check(height, width)
        return input_array(request, im.LATENTS), (height, width)

    def run(self, items):
        return self.d.vae_decode(self.pipe, [i[0] for i in items], [i[1] for i in items])

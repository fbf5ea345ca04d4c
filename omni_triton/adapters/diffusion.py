"""Triton ``TritonPythonModel`` classes of the Qwen-Image and Qwen-Image-Edit stages.

The text-to-image and edit pipelines run the same stage code on different checkpoints (the
config parameter ``model_name``), so each ``model_repository/qwen_image*_<stage>/1/model.py``
only binds one of these classes. Importable only inside the Triton Python stub
(``triton_python_backend_utils``); the logic they call lives in ``omni_triton.stages.diffusion``
and is unit-tested without Triton. Contracts: docs/image_contracts.md.
"""
import numpy as np
import triton_python_backend_utils as pb_utils

from omni_triton.triton_io import (batched_execute, forward_logs_to_triton, input_array, model_parameters,
                                  scalar_input)


class TextEncoder:
    """Text encoder stage (Qwen2.5-VL; edit: with its vision tower): PROMPT (+ NEGATIVE_PROMPT,
    + IMAGE for edits) -> PROMPT_EMBEDS [1, L, D] and NEGATIVE_PROMPT_EMBEDS [1, L', D] (L' = 0:
    no CFG), float32. Logic: ``omni_triton.stages.diffusion.encode_prompts``."""

    def initialize(self, args):
        import torch

        from omni_triton.stages import diffusion

        torch.set_num_threads(1)
        self.d = diffusion
        self.name = args["model_name"]
        self.pipe = diffusion.load_pipeline(diffusion.checkpoint_dir(model_parameters(args)["model_name"]))
        self.edit = diffusion.is_edit_pipeline(self.pipe)

    def execute(self, requests):
        def parse(request):
            prompt = scalar_input(request, "PROMPT", str)
            negative = scalar_input(request, "NEGATIVE_PROMPT", str, required=False) or ""
            if not prompt.strip():
                raise ValueError("PROMPT is empty")
            image = None
            if self.edit:
                original = self.d.image_from_array(input_array(request, "IMAGE"))
                self.d.check_condition_image(self.pipe, original)  # per item: see its docstring
                image = self.d.condition_image(self.pipe, original)[0]
            return prompt, negative, image

        def run(items):
            # One encode over every prompt and negative prompt of the batch (grouped by length).
            texts, images, slots = [], [], []
            for prompt, negative, image in items:
                slots.append((len(texts), len(texts) + 1 if negative else None))
                texts += [prompt] + ([negative] if negative else [])
                images += [image] + ([image] if negative else [])
            embeds = self.d.encode_prompts(self.pipe, texts, images if self.edit else None)
            dim = embeds[0].shape[1]
            return [(embeds[p], embeds[n] if n is not None else np.zeros((0, dim), np.float32))
                    for p, n in slots]

        def outputs(result):
            return [pb_utils.Tensor("PROMPT_EMBEDS", result[0][None]),
                    pb_utils.Tensor("NEGATIVE_PROMPT_EMBEDS", result[1][None])]

        return batched_execute(requests, self.name, parse, run, outputs)


class Denoiser:
    """Denoiser stage: the diffusers pipeline's own loop (``output_type="latent"``); compatible
    requests share one pipeline call, each with its own seed. Outputs LATENTS (packed, float32),
    NUM_STEPS (int32), DENOISE_SECONDS (float32). Logic: ``omni_triton.stages.diffusion.denoise``."""

    def initialize(self, args):
        import torch

        from omni_triton.stages import diffusion

        torch.set_num_threads(1)
        forward_logs_to_triton("omni_triton.diffusion")  # per-step progress in Triton's log
        params = model_parameters(args)
        self.d = diffusion
        self.name = args["model_name"]
        self.pipe = diffusion.load_pipeline(diffusion.checkpoint_dir(params["model_name"]))
        self.edit = diffusion.is_edit_pipeline(self.pipe)
        self.limits = diffusion.Limits(diffusion.size_multiple(self.pipe), int(params.get("max_size", 1024)),
                                       int(params.get("max_steps", 50)))
        self.progress_s = float(params.get("progress_log_interval_s", 2.0))

    def execute(self, requests):
        def parse(request):
            height, width = scalar_input(request, "HEIGHT", int), scalar_input(request, "WIDTH", int)
            steps = scalar_input(request, "NUM_INFERENCE_STEPS", int)
            self.limits.check(height, width, steps)
            guidance = scalar_input(request, "GUIDANCE_SCALE", float, required=False)
            true_cfg = scalar_input(request, "TRUE_CFG_SCALE", float, required=False)
            self.d.check_guidance(true_cfg, guidance)
            item = self.d.DenoiseItem(
                prompt_embeds=input_array(request, "PROMPT_EMBEDS"),
                negative_prompt_embeds=input_array(request, "NEGATIVE_PROMPT_EMBEDS", required=False),
                height=height, width=width, steps=steps, seed=scalar_input(request, "SEED", int),
                true_cfg_scale=true_cfg or 1.0,
                guidance_scale=guidance if guidance and guidance > 0 else None)
            if self.edit:
                item.image = self.d.image_from_array(input_array(request, "IMAGE"))
                self.d.check_condition_image(self.pipe, item.image)
                item.image_latents = input_array(request, "IMAGE_LATENTS")
            return item

        def run(items):
            return self.d.denoise(self.pipe, items, label=self.name, progress_interval_s=self.progress_s)

        def outputs(r):
            return [pb_utils.Tensor("LATENTS", r.latents[None]),
                    pb_utils.Tensor("NUM_STEPS", np.array([[r.steps]], np.int32)),
                    pb_utils.Tensor("DENOISE_SECONDS", np.array([[r.seconds]], np.float32))]

        return batched_execute(requests, self.name, parse, run, outputs)


class VaeDecoder:
    """VAE decoder stage: packed LATENTS + HEIGHT/WIDTH -> IMAGE uint8 [H, W, 3].
    Logic: ``omni_triton.stages.diffusion.vae_decode``."""

    def initialize(self, args):
        import torch

        from omni_triton.stages import diffusion

        torch.set_num_threads(1)
        params = model_parameters(args)
        self.d = diffusion
        self.name = args["model_name"]
        self.pipe = diffusion.load_pipeline(diffusion.checkpoint_dir(params["model_name"]))
        self.limits = diffusion.Limits(diffusion.size_multiple(self.pipe), int(params.get("max_size", 1024)))

    def execute(self, requests):
        def parse(request):
            height, width = scalar_input(request, "HEIGHT", int), scalar_input(request, "WIDTH", int)
            self.limits.check(height, width)
            return input_array(request, "LATENTS"), (height, width)

        def run(items):
            return self.d.vae_decode(self.pipe, [i[0] for i in items], [i[1] for i in items])

        def outputs(image):
            return [pb_utils.Tensor("IMAGE", image[None])]

        return batched_execute(requests, self.name, parse, run, outputs)

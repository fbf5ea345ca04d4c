"""Triton adapter: Qwen-Image denoiser (the diffusers pipeline's loop, output_type="latent").
Dynamic batching; compatible requests share one pipeline call, each with its own seed.
Logic in omni_triton.stages.diffusion.denoise."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_triton.triton_io import (batched_execute, forward_logs_to_triton, input_array, model_parameters,
                                  scalar_input)


class TritonPythonModel:
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
            item = self.d.DenoiseItem(
                prompt_embeds=input_array(request, "PROMPT_EMBEDS"),
                negative_prompt_embeds=input_array(request, "NEGATIVE_PROMPT_EMBEDS", required=False),
                height=height, width=width, steps=steps, seed=scalar_input(request, "SEED", int),
                true_cfg_scale=scalar_input(request, "TRUE_CFG_SCALE", float, required=False) or 1.0,
                guidance_scale=guidance if guidance and guidance > 0 else None)
            if self.edit:
                item.image = self.d.image_from_array(input_array(request, "IMAGE"))
                item.image_latents = input_array(request, "IMAGE_LATENTS")
            return item

        def run(items):
            return self.d.denoise(self.pipe, items, label=self.name, progress_interval_s=self.progress_s)

        def outputs(r):
            return [pb_utils.Tensor("LATENTS", r.latents[None]),
                    pb_utils.Tensor("NUM_STEPS", np.array([[r.steps]], np.int32)),
                    pb_utils.Tensor("DENOISE_SECONDS", np.array([[r.seconds]], np.float32))]

        return batched_execute(requests, self.name, parse, run, outputs)

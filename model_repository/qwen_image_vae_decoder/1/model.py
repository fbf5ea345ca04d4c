"""Triton adapter: Qwen-Image VAE decoder, packed latents -> uint8 RGB image.
Dynamic batching; logic in omni_triton.stages.diffusion.vae_decode."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

import triton_python_backend_utils as pb_utils

from omni_triton.triton_io import batched_execute, input_array, model_parameters, scalar_input


class TritonPythonModel:
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

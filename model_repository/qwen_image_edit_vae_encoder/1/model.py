"""Triton adapter: Qwen-Image-Edit VAE encoder, condition image -> normalised image latents.
Dynamic batching; logic in omni_triton.stages.diffusion.vae_encode."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

import triton_python_backend_utils as pb_utils

from omni_triton.triton_io import batched_execute, input_array, model_parameters


class TritonPythonModel:
    def initialize(self, args):
        import torch

        from omni_triton.stages import diffusion

        torch.set_num_threads(1)
        self.d = diffusion
        self.name = args["model_name"]
        self.pipe = diffusion.load_pipeline(diffusion.checkpoint_dir(model_parameters(args)["model_name"]))

    def execute(self, requests):
        def parse(request):
            return self.d.image_from_array(input_array(request, "IMAGE"))

        def run(images):
            return self.d.vae_encode(self.pipe, images)

        def outputs(latents):
            return [pb_utils.Tensor("IMAGE_LATENTS", latents[None])]

        return batched_execute(requests, self.name, parse, run, outputs)

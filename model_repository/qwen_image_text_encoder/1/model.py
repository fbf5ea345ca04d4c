"""Triton adapter: Qwen-Image text encoder (Qwen2.5-VL) -> prompt (+ negative) embeddings.
Dynamic batching; logic in omni_triton.stages.diffusion.encode_prompts (edit: also the image)."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_triton.triton_io import batched_execute, input_array, model_parameters, scalar_input


class TritonPythonModel:
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
                image = self.d.condition_image(self.pipe, self.d.image_from_array(input_array(request, "IMAGE")))[0]
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

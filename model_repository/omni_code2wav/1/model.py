"""Triton adapter for the Qwen3-Omni code2wav (dynamic batching, ragged CODES).
Logic: omni_triton.stages.qwen3_omni.OmniCode2Wav."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

import logging

import triton_python_backend_utils as pb_utils

from omni_triton.triton_io import model_parameters

LOGGER = logging.getLogger("omni_code2wav")


class TritonPythonModel:
    def initialize(self, args):
        import torch

        from omni_triton.stages.qwen3_omni import OmniCode2Wav
        from omni_triton.checkpoints.qwen3_omni import checkpoint_dir

        torch.set_num_threads(1)
        p = model_parameters(args)
        self.decoder = OmniCode2Wav.from_pretrained(checkpoint_dir(p.get("model_name", "qwen3-omni-tiny")))

    def execute(self, requests):
        from omni_triton.stages.codec_tts import validate_chunk

        # Each request of the dynamic batch: CODES [1, T_i, G], LEFT_CONTEXT [1, 1].
        responses = [None] * len(requests)
        codes, lefts, idx = [], [], []
        for i, request in enumerate(requests):
            try:
                c, left = validate_chunk(
                    pb_utils.get_input_tensor_by_name(request, "CODES").as_numpy(),
                    pb_utils.get_input_tensor_by_name(request, "LEFT_CONTEXT").as_numpy(),
                    self.decoder.num_code_groups, self.decoder.codebook_size)
                codes.append(c)
                lefts.append(left)
                idx.append(i)
            except ValueError as exc:
                responses[i] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"omni_code2wav: {exc}", pb_utils.TritonError.INVALID_ARG))
        if idx:
            try:
                audio = self.decoder.decode(codes, lefts)  # one forward pass, right-padded
                for i, pcm in zip(idx, audio):
                    responses[i] = pb_utils.InferenceResponse([pb_utils.Tensor("AUDIO", pcm[None, :])])
            except Exception as exc:
                LOGGER.exception("omni_code2wav failed")
                for i in idx:
                    responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"omni_code2wav failed: {exc}"))
        return responses

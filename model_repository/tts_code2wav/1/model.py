"""Triton adapter for the Mimi codec decoder (dynamic batching, ragged CODES).
Logic lives in omni_triton.stages.codec_tts.CodecDecoder."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding


import logging

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_triton.triton_io import model_parameters


LOGGER = logging.getLogger("tts_code2wav")


class TritonPythonModel:
    def initialize(self, args):
        import torch

        from omni_triton.stages.codec_tts import CodecDecoder
        from omni_triton.checkpoints.csm import checkpoint_dir

        torch.set_num_threads(1)
        params = model_parameters(args)
        path = checkpoint_dir(params.get("model_name", "csm-tiny"))
        self.decoder = CodecDecoder.from_pretrained(path)
        LOGGER.info("tts_code2wav ready: %s, %d samples/frame", path, self.decoder.samples_per_frame)

    def execute(self, requests):
        # Each request of the dynamic batch: CODES [1, T_i, K], LEFT_CONTEXT [1, 1].
        responses = [None] * len(requests)
        codes, lefts, idx = [], [], []
        for i, request in enumerate(requests):
            try:
                c = pb_utils.get_input_tensor_by_name(request, "CODES").as_numpy()
                c = c.reshape(-1, c.shape[-1]).astype(np.int64, copy=False)
                left = int(pb_utils.get_input_tensor_by_name(request, "LEFT_CONTEXT").as_numpy().reshape(-1)[0])
                if c.shape[1] != self.decoder.num_codebooks:
                    raise ValueError(f"CODES has {c.shape[1]} codebooks, the codec expects {self.decoder.num_codebooks}")
                if c.size and (c.min() < 0 or c.max() >= self.decoder.codebook_size):
                    raise ValueError(f"CODES must lie in [0, {self.decoder.codebook_size})")
                if not 0 <= left <= c.shape[0]:
                    raise ValueError(f"LEFT_CONTEXT={left} outside [0, {c.shape[0]}]")
                codes.append(c)
                lefts.append(left)
                idx.append(i)
            except Exception as exc:
                responses[i] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"tts_code2wav: {exc}", pb_utils.TritonError.INVALID_ARG))
        if idx:
            try:
                audio = self.decoder.decode(codes, lefts)  # one forward pass, right-padded
                for i, pcm in zip(idx, audio):
                    responses[i] = pb_utils.InferenceResponse([pb_utils.Tensor("AUDIO", pcm[None, :])])
            except Exception as exc:
                LOGGER.exception("tts_code2wav failed")
                for i in idx:
                    responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tts_code2wav failed: {exc}"))
        return responses

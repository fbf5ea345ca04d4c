"""Triton adapter for the CSM talker (decoupled). Logic lives in omni_triton.stages.codec_tts.

Each instance generates one request at a time inside ``execute`` (the config runs several
instances, so Triton's scheduler spreads concurrent requests over them and queues the rest).
"""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

import logging

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_triton.triton_io import is_cancelled, StageMetrics, model_parameters, optional_input, optional_str_input, send, send_error, send_failure, send_final

LOGGER = logging.getLogger("tts_talker")


class TritonPythonModel:
    def initialize(self, args):
        import torch

        from omni_triton.runtime.cancel_flags import CancelFlags
        from omni_triton.stages.codec_tts import CodecTalker
        from omni_triton.checkpoints.csm import checkpoint_dir

        torch.set_num_threads(1)
        params = model_parameters(args)
        path = checkpoint_dir(params.get("model_name", "csm-tiny"))
        self.talker = CodecTalker.from_pretrained(path)
        self.emit_frames = max(1, int(params.get("emit_frames", "1")))
        self.default_min = int(params.get("default_min_frames", self.talker.default_min_frames))
        self.default_max = int(params.get("default_max_frames", self.talker.default_max_frames))
        self.flags = CancelFlags.for_server()
        self.metrics = StageMetrics(
            {"model": args["model_name"], "instance": args["model_instance_name"]},
            frames=("omni_tts_talker_frames_total", "Codec frames generated", "counter"),
            requests=("omni_tts_talker_requests_total", "Talker requests started", "counter"),
            cancelled=("omni_tts_talker_cancelled_total", "Talker requests cancelled", "counter"),
            active=("omni_tts_talker_active", "Talker requests being generated (per instance)", "gauge"),
        )
        LOGGER.info("tts_talker ready: %s (%d codebooks)", path, self.talker.num_codebooks)

    def execute(self, requests):
        for request in requests:
            self._run(request)
        return None

    def _run(self, request):
        sender = request.get_response_sender()
        request_id = None
        try:
            self.metrics.active.set(1)
            self.metrics.requests.increment(1)
            text = optional_str_input(request, "TEXT")
            if not text:
                send_error(sender, "tts_talker: TEXT is required", pb_utils.TritonError.INVALID_ARG)
                return
            speaker = optional_input(request, "SPEAKER")
            max_frames = optional_input(request, "MAX_FRAMES")
            min_frames = optional_input(request, "MIN_FRAMES")
            request_id = optional_str_input(request, "REQUEST_ID")
            cancelled = lambda: is_cancelled(request) or self.flags.is_cancelled(request_id)  # noqa: E731
            pending = []
            for frames in self.talker.stream(
                text,
                speaker=0 if speaker is None else int(speaker),
                min_frames=self.default_min if min_frames is None else int(min_frames),
                max_frames=self.default_max if max_frames is None else int(max_frames),
                should_stop=cancelled,
            ):
                self.metrics.frames.increment(len(frames))
                pending.append(frames)
                if sum(len(f) for f in pending) >= self.emit_frames:
                    send(sender, pb_utils.InferenceResponse([pb_utils.Tensor("CODES", np.concatenate(pending))]))
                    pending = []
            if cancelled():
                self.metrics.cancelled.increment(1)
                send_final(sender)
            elif pending:
                send(sender, pb_utils.InferenceResponse([pb_utils.Tensor("CODES", np.concatenate(pending))]),
                     flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                send_final(sender)
        except Exception as exc:  # a stage reports failures as error responses, never raises
            send_failure(sender, "tts_talker", exc)
        finally:
            self.flags.discard(request_id)
            self.metrics.active.set(0)

"""Triton adapter for the Qwen3-Omni talker + code predictor (decoupled).
Logic: omni_triton.stages.qwen3_omni.OmniTalker."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_triton.triton_io import (  # noqa: I001
    StageMetrics, is_cancelled, model_parameters, optional_input, optional_str_input, send, send_error, send_failure,
    send_final,
)


def _array(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        import torch

        from omni_triton.runtime.cancel_flags import CancelFlags
        from omni_triton.stages.qwen3_omni import OmniTalker, TalkerSettings
        from omni_triton.checkpoints.qwen3_omni import checkpoint_dir

        torch.set_num_threads(1)
        p = model_parameters(args)
        self.talker = OmniTalker.from_pretrained(checkpoint_dir(p.get("model_name", "qwen3-omni-tiny")))
        self.default_voice = p.get("default_voice", "Ethan")
        self.settings = TalkerSettings(
            max_frames=int(p.get("default_max_frames", "4096")), min_frames=int(p.get("default_min_frames", "0")),
            do_sample=p.get("do_sample", "true").lower() == "true",
            repetition_penalty=float(p.get("repetition_penalty", "1.05")))
        self.flags = CancelFlags.for_server()
        self.metrics = StageMetrics(
            {"model": args["model_name"], "instance": args["model_instance_name"]},
            frames=("omni_talker_frames_total", "Codec frames generated", "counter"),
            requests=("omni_talker_requests_total", "Talker requests started", "counter"),
            cancelled=("omni_talker_cancelled_total", "Talker requests cancelled", "counter"),
            active=("omni_talker_active", "Talker requests being generated (per instance)", "gauge"),
        )

    def execute(self, requests):
        for request in requests:  # one at a time: the instance generates inside execute
            self._run(request)
        return None

    def _run(self, request):
        from dataclasses import replace

        from omni_triton.contracts.chat import ChatInputError
        from omni_triton.stages.qwen3_omni import ThinkerOutput

        sender = request.get_response_sender()
        request_id = optional_str_input(request, "REQUEST_ID")
        try:
            self.metrics.active.set(1)
            self.metrics.requests.increment(1)
            out = ThinkerOutput(
                sequence=_array(request, "SEQUENCE").reshape(-1).astype(np.int64),
                prompt_len=int(_array(request, "PROMPT_LEN").reshape(-1)[0]),
                embeds=_array(request, "THINKER_EMBEDS").astype(np.float32),
                hidden=_array(request, "THINKER_HIDDEN").astype(np.float32),
                tts_embeds=_array(request, "TTS_EMBEDS").astype(np.float32))
            settings = self.settings
            max_frames, min_frames = optional_input(request, "MAX_FRAMES"), optional_input(request, "MIN_FRAMES")
            if max_frames is not None:
                settings = replace(settings, max_frames=int(max_frames))
            if min_frames is not None:
                settings = replace(settings, min_frames=int(min_frames))
            voice = optional_str_input(request, "VOICE") or self.default_voice
            stop = lambda: is_cancelled(request) or self.flags.is_cancelled(request_id)  # noqa: E731
            for frames in self.talker.stream(out, voice, settings, stop):
                self.metrics.frames.increment(len(frames))
                send(sender, pb_utils.InferenceResponse([pb_utils.Tensor("CODES", frames)]))
            if stop():
                self.metrics.cancelled.increment(1)
            send_final(sender)
        except ChatInputError as exc:
            send_error(sender, f"omni_talker: {exc}", pb_utils.TritonError.INVALID_ARG)
        except Exception as exc:  # a stage reports failures as error responses, never raises
            send_failure(sender, "omni_talker", exc)
        finally:
            self.flags.discard(request_id)
            self.metrics.active.set(0)

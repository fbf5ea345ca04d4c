"""Triton adapter for the Qwen3-Omni thinker (decoupled). Logic: omni_triton.stages.qwen3_omni."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_triton.triton_io import model_parameters, optional_input, optional_str_input, send, send_error, send_failure

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _str(name, value):
    return pb_utils.Tensor(name, np.array([value.encode("utf-8")], dtype=np.object_))


def _i32(name, value):
    return pb_utils.Tensor(name, np.array([int(value)], dtype=np.int32))


class TritonPythonModel:
    def initialize(self, args):
        import torch

        from omni_triton.stages.codec_tts import CancelFlags
        from omni_triton.stages.qwen3_omni import OmniThinker, checkpoint_dir

        torch.set_num_threads(1)
        p = model_parameters(args)
        self.thinker = OmniThinker.from_pretrained(checkpoint_dir(p.get("model_name", "qwen3-omni-tiny")))
        self.default_max_tokens = int(p.get("default_max_tokens", "32"))
        self.max_model_len = int(p.get("max_model_len", "1024"))
        self.flags = CancelFlags.for_server()

    def execute(self, requests):
        for request in requests:  # one at a time: the instance generates inside execute
            self._run(request)
        return None

    def _run(self, request):
        from omni_triton.stages.qwen3_omni import OmniInputError, prepare_thinker_request

        sender = request.get_response_sender()
        request_id = optional_str_input(request, "REQUEST_ID")
        try:
            talker_inputs = bool(optional_input(request, "TALKER_INPUTS") or False)
            ids, sampling = prepare_thinker_request(
                self.thinker, optional_str_input(request, "PROMPT"), optional_str_input(request, "MESSAGES"),
                optional_str_input(request, "SAMPLING_PARAMETERS"), self.default_max_tokens, self.max_model_len,
                talker_inputs)
            stop = lambda: request.is_cancelled() or self.flags.is_cancelled(request_id)  # noqa: E731
            for step in self.thinker.stream(ids, sampling, talker_inputs, stop):
                tensors = [_str("TEXT_DELTA", step.text), _str("FINISH_REASON", step.finish_reason or ""),
                           _i32("PROMPT_TOKENS", len(ids)), _i32("COMPLETION_TOKENS", step.completion_tokens)]
                out = step.output
                if out is not None:
                    tensors += [pb_utils.Tensor("SEQUENCE", out.sequence), _i32("PROMPT_LEN", out.prompt_len),
                                pb_utils.Tensor("THINKER_EMBEDS", out.embeds),
                                pb_utils.Tensor("THINKER_HIDDEN", out.hidden),
                                pb_utils.Tensor("TTS_EMBEDS", out.tts_embeds)]
                send(sender, pb_utils.InferenceResponse(tensors), flags=FINAL if step.finish_reason else 0)
        except OmniInputError as exc:
            send_error(sender, f"omni_thinker: {exc}", pb_utils.TritonError.INVALID_ARG)
        except Exception as exc:  # a stage reports failures as error responses, never raises
            send_failure(sender, "omni_thinker", exc)
        finally:
            self.flags.discard(request_id)

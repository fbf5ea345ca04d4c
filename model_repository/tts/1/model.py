"""Triton BLS adapter for the codec-token TTS pipeline (decoupled): tts_talker -> tts_code2wav.
Chunking and validation live in omni_triton.stages.codec_tts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding


import logging
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_triton.runtime.cancel_flags import CancelFlags
from omni_triton.stages.chunking import ChunkSchedule
from omni_triton.contracts.speech import SpeechInputError, parse_tts_request
from omni_triton.triton_io import is_cancelled, model_parameters, optional_input, optional_str_input, send, send_error, send_failure, send_final

LOGGER = logging.getLogger("tts")
TALKER, CODE2WAV = "tts_talker", "tts_code2wav"


def _bytes_tensor(name, value):
    return pb_utils.Tensor(name, np.array([value.encode("utf-8")], dtype=np.object_))


def _raise_if_error(response, who):
    if response.has_error():
        raise RuntimeError(f"{who}: {response.error().message()}")


class TritonPythonModel:
    def initialize(self, args):
        p = model_parameters(args)
        self.first_chunk = int(p.get("first_chunk_frames", "5"))
        self.chunk = int(p.get("chunk_frames", "25"))
        self.left_context = int(p.get("left_context_frames", "25"))
        self.voices = [v.strip() for v in p.get("voices", "0").split(",") if v.strip()]
        self.default_voice = p.get("default_voice", self.voices[0])
        self.sample_rate = int(p.get("sample_rate", "24000"))
        self.max_input_chars = int(p.get("max_input_chars", "2000"))
        ChunkSchedule(self.first_chunk, self.chunk, self.left_context)  # validates the parameters
        self.pool = ThreadPoolExecutor(max_workers=int(p.get("workers", "8")))
        self.cancel_flags = CancelFlags.for_server()

    def execute(self, requests):
        for request in requests:
            self.pool.submit(self._run, request)
        return None

    def _decode(self, codes, left):
        req = pb_utils.InferenceRequest(
            model_name=CODE2WAV,
            requested_output_names=["AUDIO"],
            inputs=[
                pb_utils.Tensor("CODES", np.ascontiguousarray(codes[None], dtype=np.int64)),
                pb_utils.Tensor("LEFT_CONTEXT", np.array([[left]], dtype=np.int32)),
            ],
        )
        resp = req.exec()
        _raise_if_error(resp, CODE2WAV)
        return pb_utils.get_output_tensor_by_name(resp, "AUDIO").as_numpy().reshape(-1).astype(np.float32)

    def _cancel_talker(self, talker_id):
        # 2.51's BLS response iterator has no cancel(): raise the talker's shared cancel flag.
        self.cancel_flags.cancel(talker_id)

    def _run(self, request):
        sender = request.get_response_sender()
        talker_id, stream, finished = None, None, False
        try:
            text, speaker = parse_tts_request(
                optional_str_input(request, "TEXT"),
                optional_str_input(request, "VOICE"), optional_input(request, "SPEED"),
                self.voices, self.default_voice, self.max_input_chars,
            )
            inputs = [
                _bytes_tensor("TEXT", text),
                pb_utils.Tensor("SPEAKER", np.array([speaker], dtype=np.int32)),
            ]
            max_frames = optional_input(request, "MAX_FRAMES")
            if max_frames is not None:
                inputs.append(pb_utils.Tensor("MAX_FRAMES", np.array([int(max_frames)], dtype=np.int32)))
            talker_id = f"tts-{uuid.uuid4().hex}"
            inputs.append(_bytes_tensor("REQUEST_ID", talker_id))
            stream = pb_utils.InferenceRequest(
                model_name=TALKER, requested_output_names=["CODES"], inputs=inputs,
            ).exec(decoupled=True)  # 2.51: a plain iterator of responses, no cancel()

            sched = ChunkSchedule(self.first_chunk, self.chunk, self.left_context)
            frames, total, cancelled = [], 0, False
            sr = pb_utils.Tensor("SAMPLE_RATE", np.array([self.sample_rate], dtype=np.int32))

            def emit(chunks):
                codes = np.concatenate(frames)
                for start, end, left in chunks:
                    pcm = self._decode(codes[start:end], left)
                    send(sender, pb_utils.InferenceResponse([pb_utils.Tensor("AUDIO", pcm), sr]))

            for resp in stream:
                if cancelled:
                    continue  # drain the talker stream up to its FINAL
                _raise_if_error(resp, TALKER)
                out = pb_utils.get_output_tensor_by_name(resp, "CODES")
                if out is not None and out.as_numpy().size:
                    new = out.as_numpy().reshape(-1, out.as_numpy().shape[-1])
                    frames.append(new)
                    total += len(new)
                if is_cancelled(request):
                    cancelled = True
                    self._cancel_talker(talker_id)
                    continue
                emit(sched.push(total))
            finished = True
            if not cancelled and not is_cancelled(request):
                emit(sched.flush(total))
            send_final(sender)
        except SpeechInputError as exc:
            send_error(sender, str(exc), pb_utils.TritonError.INVALID_ARG)
        except Exception as exc:  # a stage reports failures as error responses, never raises
            send_failure(sender, "tts", exc)
            if stream is not None and not finished:  # stop and drain the talker stream
                try:
                    self._cancel_talker(talker_id)
                    for _ in stream:
                        pass
                except Exception:
                    LOGGER.exception("tts could not stop its talker stream")

    def finalize(self):
        self.pool.shutdown(wait=True, cancel_futures=True)

"""Triton BLS adapter for the Qwen3-Omni pipeline (decoupled):
omni_thinker (text deltas, talker inputs) -> omni_talker (codec frames) -> omni_code2wav (PCM chunks).
Request parsing, chunk schedule and the stage logic live in omni_triton.stages (qwen3_omni, codec_tts)."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

import logging
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_triton.runtime.cancel_flags import CancelFlags
from omni_triton.stages.chunking import ChunkSchedule, chunk_slices
from omni_triton.stages.qwen3_omni import ChatTokenizer, prepare_thinker_request
from omni_triton.contracts.chat import ChatInputError, parse_modalities
from omni_triton.checkpoints.qwen3_omni import checkpoint_dir
from omni_triton.triton_io import is_cancelled, model_parameters, optional_input, optional_str_input, send, send_error, send_failure, send_final

LOGGER = logging.getLogger("omni")
THINKER, TALKER, CODE2WAV = "omni_thinker", "omni_talker", "omni_code2wav"
TALKER_TENSORS = ("SEQUENCE", "PROMPT_LEN", "THINKER_EMBEDS", "THINKER_HIDDEN", "TTS_EMBEDS")
TEXT_TENSORS = ("TEXT_DELTA", "FINISH_REASON", "PROMPT_TOKENS", "COMPLETION_TOKENS")


class StageError(Exception):
    """A stage answered with an error response; keeps its Triton error code."""

    def __init__(self, who, error):
        super().__init__(f"{who}: {error.message()}")
        code = getattr(error, "code", None)
        self.code = code() if callable(code) else None


def _str(name, value):
    return pb_utils.Tensor(name, np.array([value.encode("utf-8")], dtype=np.object_))


def _out(resp, name):
    t = pb_utils.get_output_tensor_by_name(resp, name)
    return None if t is None else t.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        p = model_parameters(args)
        self.first_chunk = int(p.get("first_chunk_frames", "5"))
        self.chunk = int(p.get("chunk_frames", "25"))
        self.left_context = int(p.get("left_context_frames", "25"))
        ChunkSchedule(self.first_chunk, self.chunk, self.left_context)  # validates the parameters
        self.voices = [v.strip() for v in p.get("voices", "Ethan").split(",") if v.strip()]
        self.default_voice = p.get("default_voice", self.voices[0])
        self.sample_rate = int(p.get("sample_rate", "24000"))
        self.pool = ThreadPoolExecutor(max_workers=int(p.get("workers", "8")))
        self.flags = CancelFlags.for_server()
        # Validation happens here too, not only in omni_thinker: on 2.51 an error response that
        # reaches a BLS model through InferenceRequest.exec(decoupled=True) arrives with code
        # INTERNAL whatever the stage sent, so the thinker's INVALID_ARG would become a 500.
        self.chat = ChatTokenizer.from_pretrained(checkpoint_dir(p.get("model_name", "qwen3-omni-tiny")))
        self.default_max_tokens = int(p.get("default_max_tokens", "32"))
        self.max_model_len = int(p.get("max_model_len", "1024"))

    def execute(self, requests):
        for request in requests:
            self.pool.submit(self._run, request)
        return None

    def _response(self, text="", finish="", prompt_tokens=0, completion_tokens=0, audio=None):
        return pb_utils.InferenceResponse([
            _str("TEXT_DELTA", text), _str("FINISH_REASON", finish),
            pb_utils.Tensor("PROMPT_TOKENS", np.array([prompt_tokens], np.int32)),
            pb_utils.Tensor("COMPLETION_TOKENS", np.array([completion_tokens], np.int32)),
            pb_utils.Tensor("AUDIO", np.zeros(0, np.float32) if audio is None else audio.astype(np.float32)),
            pb_utils.Tensor("SAMPLE_RATE", np.array([self.sample_rate], np.int32)),
        ])

    def _stream(self, request, model, inputs, outputs, stream_id):
        """Iterate a decoupled stage's responses; on cancellation of ``request`` raise the stage's
        cancel flag (2.51's BLS iterator has no cancel()) and drain the stream to its FINAL.
        Yields responses; an error response raises StageError after the stream is drained."""
        stream = pb_utils.InferenceRequest(model_name=model, requested_output_names=list(outputs),
                                           inputs=inputs).exec(decoupled=True)
        error, cancelled = None, False
        try:
            for resp in stream:
                if error is not None or cancelled:
                    continue  # drain to the FINAL
                if resp.has_error():
                    error = StageError(model, resp.error())
                    continue
                yield resp
                if is_cancelled(request):
                    cancelled = True
                    self.flags.cancel(stream_id)
        except GeneratorExit:  # the caller stopped early (its own failure): stop and drain
            self.flags.cancel(stream_id)
            for _ in stream:
                pass
            raise
        if error is not None:
            raise error

    def _decode(self, codes, left):
        resp = pb_utils.InferenceRequest(
            model_name=CODE2WAV, requested_output_names=["AUDIO"],
            inputs=[pb_utils.Tensor("CODES", np.ascontiguousarray(codes[None], dtype=np.int64)),
                    pb_utils.Tensor("LEFT_CONTEXT", np.array([[left]], dtype=np.int32))]).exec()
        if resp.has_error():
            raise StageError(CODE2WAV, resp.error())
        return _out(resp, "AUDIO").reshape(-1)

    def _run(self, request):
        sender = request.get_response_sender()
        try:
            modalities = parse_modalities(optional_str_input(request, "MODALITIES"), default=("text", "audio"))
            voice = (optional_str_input(request, "VOICE") or self.default_voice).strip()
            match = [v for v in self.voices if v.lower() == voice.lower()]
            if not match:
                raise ChatInputError(f"unknown voice {voice!r}; available: {', '.join(self.voices)}")
            audio = "audio" in modalities
            prepare_thinker_request(
                self.chat, optional_str_input(request, "PROMPT"), optional_str_input(request, "MESSAGES"),
                optional_str_input(request, "SAMPLING_PARAMETERS"), self.default_max_tokens, self.max_model_len, audio)
            max_frames = optional_input(request, "MAX_AUDIO_FRAMES")
            if max_frames is not None and int(max_frames) < 1:
                raise ChatInputError(f"MAX_AUDIO_FRAMES must be >= 1, got {int(max_frames)}")
            thinker_id = f"omni-thinker-{uuid.uuid4().hex}"
            inputs = [_str(n, v) for n in ("PROMPT", "MESSAGES", "SAMPLING_PARAMETERS")
                      if (v := optional_str_input(request, n)) is not None]
            inputs += [pb_utils.Tensor("TALKER_INPUTS", np.array([audio], dtype=bool)), _str("REQUEST_ID", thinker_id)]
            talker_in, counts, finish = None, (0, 0), ""
            for resp in self._stream(request, THINKER, inputs, TEXT_TENSORS + (TALKER_TENSORS if audio else ()),
                                     thinker_id):
                text = _out(resp, "TEXT_DELTA").reshape(-1)[0].decode("utf-8")
                finish = _out(resp, "FINISH_REASON").reshape(-1)[0].decode("utf-8")
                counts = (int(_out(resp, "PROMPT_TOKENS")[0]), int(_out(resp, "COMPLETION_TOKENS")[0]))
                send(sender, self._response(text, finish, *counts))
                if audio and _out(resp, "SEQUENCE") is not None:
                    talker_in = [pb_utils.Tensor(n, _out(resp, n)) for n in TALKER_TENSORS]
            if is_cancelled(request) or finish == "abort" or talker_in is None:
                send_final(sender)
                return
            seq_len, prompt_len = len(talker_in[0].as_numpy()), int(talker_in[1].as_numpy()[0])
            if seq_len - prompt_len < 2:  # the reference needs the first generated token's embedding
                send_final(sender)
                return
            talker_id = f"omni-talker-{uuid.uuid4().hex}"
            sched = ChunkSchedule(self.first_chunk, self.chunk, self.left_context)
            frames, total = [], 0

            def emit(chunks):
                codes = np.concatenate(frames)
                for c, left in chunk_slices(codes, chunks):
                    send(sender, self._response("", "", *counts, audio=self._decode(c, left)))

            talker_in += [_str("VOICE", match[0]), _str("REQUEST_ID", talker_id)]
            if max_frames is not None:
                talker_in.append(pb_utils.Tensor("MAX_FRAMES", np.array([int(max_frames)], np.int32)))
            for resp in self._stream(request, TALKER, talker_in, ["CODES"], talker_id):
                new = _out(resp, "CODES")
                if new is not None and new.size:
                    frames.append(new.reshape(-1, new.shape[-1]))
                    total += len(frames[-1])
                    if not is_cancelled(request):
                        emit(sched.push(total))
            if frames and not is_cancelled(request):
                emit(sched.flush(total))
            send_final(sender)
        except ChatInputError as exc:
            send_error(sender, f"omni: {exc}", pb_utils.TritonError.INVALID_ARG)
        except StageError as exc:
            if exc.code == pb_utils.TritonError.INVALID_ARG:
                send_error(sender, str(exc), pb_utils.TritonError.INVALID_ARG)
            else:
                send_failure(sender, "omni", exc)
        except Exception as exc:  # a stage reports failures as error responses, never raises
            send_failure(sender, "omni", exc)

    def finalize(self):
        self.pool.shutdown(wait=True, cancel_futures=True)

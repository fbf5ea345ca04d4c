"""Triton BLS adapter for spoken answers (decoupled): llm -> sentences -> piper_tts.
Segmentation, validation and the sentence speaker live in omni_triton.stages.llm."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

import logging
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_triton.runtime.cancel_flags import CancelFlags
from omni_triton.paths import model_dir
from omni_triton.contracts.chat import ChatInputError, parse_modalities
from omni_triton.stages.llm import SentenceSegmenter, SentenceSpeaker, build_generation_job
from omni_triton.triton_io import StageMetrics, is_cancelled, model_parameters, optional_str_input, send, send_error, send_failure

LOGGER = logging.getLogger("llm_tts")
LLM, TTS = "llm", "piper_tts"
_TEXT_OUTPUTS = ["TEXT_DELTA", "FINISH_REASON", "PROMPT_TOKENS", "COMPLETION_TOKENS"]
_EMPTY_AUDIO = np.zeros(0, dtype=np.float32)


def _bytes(name, text):
    return pb_utils.Tensor(name, np.array([text.encode("utf-8")], dtype=np.object_))


def _first_str(resp, name):
    return pb_utils.get_output_tensor_by_name(resp, name).as_numpy().reshape(-1)[0].decode("utf-8")


def _first_int(resp, name):
    return int(pb_utils.get_output_tensor_by_name(resp, name).as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        p = model_parameters(args)
        self.voices = [v.strip() for v in p.get("voices", "joe").split(",") if v.strip()]
        self.default_voice = p.get("default_voice", self.voices[0])
        self.sample_rate = int(p.get("sample_rate", "22050"))
        self.min_chars = int(p.get("min_sentence_chars", "12"))
        self.max_chars = int(p.get("max_sentence_chars", "300"))
        self.pool = ThreadPoolExecutor(max_workers=int(p.get("workers", "16")))
        self.flags = CancelFlags.for_server()
        # The llm's tokenizer, to reject bad input with INVALID_ARG before calling the llm: 2.51
        # turns a BLS response's error code into INTERNAL, so the llm's INVALID_ARG would be lost.
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir(p.get("tokenizer", "smollm2")))
        self.max_model_len = int(p.get("max_model_len", "2048"))
        self.metrics = StageMetrics(
            {"model": args["model_name"]},
            requests=("omni_llm_tts_requests_total", "Spoken-answer requests received", "counter"),
            invalid=("omni_llm_tts_invalid_requests_total", "Requests rejected as invalid input", "counter"),
            cancelled=("omni_llm_tts_cancelled_total", "Requests cancelled by the client", "counter"),
            sentences=("omni_llm_tts_sentences_total", "Sentences sent to the TTS stage", "counter"),
            seconds=("omni_llm_tts_audio_seconds_total", "Seconds of audio streamed", "counter"),
        )

    def execute(self, requests):
        for request in requests:
            self.pool.submit(self._run, request)
        return None

    def _response(self, text, finish, counts, audio=_EMPTY_AUDIO):
        return pb_utils.InferenceResponse(output_tensors=[
            _bytes("TEXT_DELTA", text), _bytes("FINISH_REASON", finish),
            pb_utils.Tensor("PROMPT_TOKENS", np.array([counts[0]], dtype=np.int32)),
            pb_utils.Tensor("COMPLETION_TOKENS", np.array([counts[1]], dtype=np.int32)),
            pb_utils.Tensor("AUDIO", np.ascontiguousarray(audio, dtype=np.float32)),
            pb_utils.Tensor("SAMPLE_RATE", np.array([self.sample_rate], dtype=np.int32)),
        ])

    def _synthesize(self, voice):
        def run(sentence):
            stream = pb_utils.InferenceRequest(
                model_name=TTS, requested_output_names=["AUDIO"],
                inputs=[_bytes("TEXT", sentence), _bytes("VOICE", voice)],
            ).exec(decoupled=True)
            error = None
            for resp in stream:  # always drained to its FINAL
                if resp.has_error():
                    error = error or resp.error().message()
                    continue
                out = pb_utils.get_output_tensor_by_name(resp, "AUDIO")
                if error is None and out is not None and out.as_numpy().size:
                    yield out.as_numpy().reshape(-1)
            if error is not None:
                raise RuntimeError(f"{TTS}: {error}")
        return run

    def _run(self, request):
        sender = request.get_response_sender()
        llm_id = f"llm_tts-{uuid.uuid4().hex}"
        stream, speaker, closed = None, None, False
        counts = [0, 0]
        self.metrics.requests.increment(1)
        try:
            modalities = parse_modalities(optional_str_input(request, "MODALITIES"))
            voice = optional_str_input(request, "VOICE") or self.default_voice
            if voice not in self.voices:
                raise ChatInputError(f"unknown voice {voice!r}; voices: {', '.join(self.voices)}")
            text_inputs = {n: optional_str_input(request, n) for n in ("PROMPT", "MESSAGES", "SAMPLING_PARAMETERS")}
            build_generation_job(llm_id, self.tokenizer, text_inputs["PROMPT"], text_inputs["MESSAGES"],
                                 text_inputs["SAMPLING_PARAMETERS"], self.max_model_len, 1,
                                 check_with_vllm=False)  # validation only; the llm tokenizes again
            inputs = [_bytes("REQUEST_ID", llm_id)]
            inputs += [_bytes(name, value) for name, value in text_inputs.items() if value is not None]
            stream = pb_utils.InferenceRequest(
                model_name=LLM, requested_output_names=_TEXT_OUTPUTS, inputs=inputs,
            ).exec(decoupled=True)  # 2.51: a plain iterator, no cancel(): cancel through the flag
            if "audio" in modalities:
                def on_audio(pcm):
                    self.metrics.seconds.increment(pcm.size / self.sample_rate)
                    send(sender, self._response("", "", tuple(counts), pcm))

                speaker = SentenceSpeaker(
                    self._synthesize(voice), on_audio,
                    SentenceSegmenter(min_chars=self.min_chars, max_chars=self.max_chars),
                )
            cancelled, finish = False, ""
            for resp in stream:
                if closed or cancelled:
                    continue  # drain the llm stream up to its FINAL
                if resp.has_error():  # e.g. INVALID_ARG from the llm: same code to our client
                    err = resp.error()
                    send_error(sender, err.message(), err.code())
                    closed = True
                    continue
                text = _first_str(resp, "TEXT_DELTA")
                finish = _first_str(resp, "FINISH_REASON") or finish
                counts[:] = [_first_int(resp, "PROMPT_TOKENS"), _first_int(resp, "COMPLETION_TOKENS")]
                if is_cancelled(request):
                    cancelled = True
                    self.metrics.cancelled.increment(1)
                    self.flags.cancel(llm_id)  # the llm aborts the request in its engine
                    if speaker is not None:
                        speaker.cancel()
                    continue
                if text:
                    send(sender, self._response(text, "", tuple(counts)))
                if speaker is not None:
                    speaker.push_text(text)
            if closed:
                if speaker is not None:
                    speaker.cancel()
                return
            if speaker is not None and not cancelled:
                speaker.finish()
                self.metrics.sentences.increment(len(speaker.sentences))
            closed = True
            send(sender, self._response("", finish or ("abort" if cancelled else "stop"), tuple(counts)),
                 flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except ChatInputError as exc:
            self.metrics.invalid.increment(1)
            send_error(sender, str(exc), pb_utils.TritonError.INVALID_ARG)
        except Exception as exc:  # a stage reports failures as error responses, never raises
            if speaker is not None:
                speaker.cancel()
            if not closed:
                send_failure(sender, "llm_tts", exc)
            if stream is not None:  # stop and drain the llm stream
                try:
                    self.flags.cancel(llm_id)
                    for _ in stream:
                        pass
                except Exception:
                    LOGGER.exception("llm_tts could not stop its llm stream")
        finally:
            self.flags.discard(llm_id)

    def finalize(self):
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.metrics = None  # metric families go before the stub's shared memory does

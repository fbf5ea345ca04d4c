"""Triton adapter for the Piper TTS stage (decoupled). Logic lives in omni_triton.stages.piper_tts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_triton.paths import model_dir
from omni_triton.stages.piper_tts import PiperSpeaker, discover_voices
from omni_triton.contracts.speech import SpeechInputError
from omni_triton.triton_io import StageMetrics, is_cancelled, model_parameters, optional_input, optional_str_input, send, send_error, send_failure, send_final

LOGGER = logging.getLogger("piper_tts")


class TritonPythonModel:
    def initialize(self, args):
        params = model_parameters(args)
        voices = discover_voices(model_dir("piper-voices"))
        if not voices:
            raise RuntimeError(
                f"no Piper voices under {model_dir('piper-voices')}; run `omni-triton prepare`"
            )
        self.speaker = PiperSpeaker(voices)
        self.pool = ThreadPoolExecutor(max_workers=int(params.get("workers", "2")))
        self.metrics = StageMetrics(
            {"model": args["model_name"]},
            requests=("omni_tts_requests_total", "Speech requests received", "counter"),
            cancelled=("omni_tts_cancelled_total", "Speech requests stopped by cancellation", "counter"),
            active=("omni_tts_active_requests", "Speech requests being synthesised now", "gauge"),
            seconds=("omni_tts_audio_seconds_total", "Seconds of audio synthesised", "counter"),
        )
        self._active = 0
        self._active_lock = threading.Lock()
        LOGGER.info("piper_tts ready with voices %s", self.speaker.voice_ids)

    def execute(self, requests):
        for request in requests:
            self.pool.submit(self._run, request)
        return None

    def _run(self, request):
        sender = request.get_response_sender()
        try:
            self._add_active(1)
            self.metrics.requests.increment(1)
            text = optional_str_input(request, "TEXT") or ""  # required by config.pbtxt
            voice = optional_str_input(request, "VOICE")
            speed = optional_input(request, "SPEED")
            speed = 1.0 if speed is None else float(speed)
            for sentence in self.speaker.synthesize(
                text, voice=voice or None, speed=speed, is_cancelled=lambda: is_cancelled(request)
            ):
                self.metrics.seconds.increment(sentence.audio.size / sentence.sample_rate)
                send(sender, pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("AUDIO", sentence.audio),
                    pb_utils.Tensor("SAMPLE_RATE", np.array([sentence.sample_rate], np.int32)),
                ]))
            if is_cancelled(request):
                self.metrics.cancelled.increment(1)
            send_final(sender)
        except SpeechInputError as exc:
            send_error(sender, str(exc), pb_utils.TritonError.INVALID_ARG)
        except Exception as exc:  # a stage reports failures as error responses, never raises
            send_failure(sender, "piper_tts", exc)
        finally:
            self._add_active(-1)

    def _add_active(self, delta):
        # Triton gauges are set, not incremented; keep the count here.
        with self._active_lock:
            self._active += delta
            self.metrics.active.set(self._active)

    def finalize(self):
        self.pool.shutdown(wait=True, cancel_futures=True)

"""Triton adapter for the Piper TTS stage (decoupled). Logic lives in omni_triton.stages.piper_tts."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding

import json
import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_triton.paths import model_dir
from omni_triton.stages.piper_tts import PiperSpeaker, SpeechInputError, discover_voices
from omni_triton.triton_io import optional_input, send_error, send_final

LOGGER = logging.getLogger("piper_tts")


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        voices = discover_voices(model_dir("piper-voices"))
        if not voices:
            raise RuntimeError(
                f"no Piper voices under {model_dir('piper-voices')}; run `omni-triton prepare`"
            )
        self.speaker = PiperSpeaker(voices)
        self.pool = ThreadPoolExecutor(max_workers=int(params.get("workers", "2")))
        labels = {"model": args["model_name"]}
        self.m_requests = pb_utils.MetricFamily(
            name="omni_tts_requests_total", description="Speech requests received",
            kind=pb_utils.MetricFamily.COUNTER).Metric(labels=labels)
        self.m_cancelled = pb_utils.MetricFamily(
            name="omni_tts_cancelled_total", description="Speech requests stopped by cancellation",
            kind=pb_utils.MetricFamily.COUNTER).Metric(labels=labels)
        self.m_active = pb_utils.MetricFamily(
            name="omni_tts_active_requests", description="Speech requests being synthesised now",
            kind=pb_utils.MetricFamily.GAUGE).Metric(labels=labels)
        self.m_seconds = pb_utils.MetricFamily(
            name="omni_tts_audio_seconds_total", description="Seconds of audio synthesised",
            kind=pb_utils.MetricFamily.COUNTER).Metric(labels=labels)
        LOGGER.info("piper_tts ready with voices %s", self.speaker.voice_ids)

    def execute(self, requests):
        for request in requests:
            self.pool.submit(self._run, request)
        return None

    def _run(self, request):
        sender = request.get_response_sender()
        self.m_requests.increment(1)
        self.m_active.increment(1)
        try:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)[0]
            text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
            voice = optional_input(request, "VOICE")
            voice = voice.decode("utf-8") if isinstance(voice, bytes) else voice
            speed = optional_input(request, "SPEED")
            speed = 1.0 if speed is None else float(speed)
            for sentence in self.speaker.synthesize(
                text, voice=voice or None, speed=speed, is_cancelled=request.is_cancelled
            ):
                self.m_seconds.increment(sentence.audio.size / sentence.sample_rate)
                sender.send(
                    pb_utils.InferenceResponse(
                        output_tensors=[
                            pb_utils.Tensor("AUDIO", sentence.audio),
                            pb_utils.Tensor("SAMPLE_RATE", np.array([sentence.sample_rate], np.int32)),
                        ]
                    )
                )
            if request.is_cancelled():
                self.m_cancelled.increment(1)
            send_final(sender)
        except SpeechInputError as exc:
            send_error(sender, str(exc), pb_utils.TritonError.INVALID_ARG)
        except Exception as exc:  # a stage reports failures as error responses, never raises
            LOGGER.exception("piper_tts failed")
            send_error(sender, f"piper_tts failed: {exc}")
        finally:
            self.m_active.increment(-1)

    def finalize(self):
        self.pool.shutdown(wait=True, cancel_futures=True)

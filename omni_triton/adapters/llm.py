"""``TritonPythonModel`` classes of the chat pipelines (contract: ``omni_triton.contracts.llm``):
``llm`` (vLLM AsyncLLM on its own event-loop thread) and ``llm_tts`` (BLS: llm -> sentences ->
piper). Stub-only imports; logic in ``omni_triton.stages.llm`` and ``omni_triton.runtime``."""
from __future__ import annotations

import gc
import logging
import os
import time
import uuid
from dataclasses import dataclass

from omni_triton.adapters.api_inputs import chat_request_pairs, read_chat_request
from omni_triton.adapters.bls import stream_stage
from omni_triton.adapters.stream import DecoupledStage, Final
from omni_triton.adapters.triton_io import log, optional_str_input
from omni_triton.contracts import chat as ch
from omni_triton.contracts import speech as sp
from omni_triton.contracts.tensors import audio_outputs, utf8_array

LOGGER = logging.getLogger("llm")


class LlmStage(DecoupledStage):
    """``llm``: chat inputs (+ REQUEST_ID) -> text deltas from vLLM's AsyncLLM. The engine runs
    on its own loop thread; its callbacks send through the base's :class:`ResponseStream`."""

    stage = "llm"
    input_error = ch.ChatInputError
    cancel_flags = True
    metric_specs = dict(
        requests=("omni_llm_requests_total", "LLM requests started in the engine", "counter"),
        invalid=("omni_llm_invalid_requests_total", "LLM requests rejected as invalid input", "counter"),
        aborted=("omni_llm_aborted_total", "LLM requests aborted in the engine (cancelled)", "counter"),
        prompt_tokens=("omni_llm_prompt_tokens_total", "Prompt tokens processed", "counter"),
        generation_tokens=("omni_llm_generation_tokens_total", "Tokens generated", "counter"),
    )

    def setup(self, args, params):
        from omni_triton.paths import cache_dir
        from omni_triton.runtime.reaper import ChildReaper
        from omni_triton.stages.llm import parse_engine_config

        config = parse_engine_config(params, cache_dir() / "models")
        os.environ.update(config.env)  # before vLLM is imported
        os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_dir() / "vllm"))
        import torch
        from transformers import AutoTokenizer

        from omni_triton.runtime.vllm_runner import AsyncEngineRunner

        torch.set_num_threads(1)
        self.config = config
        model_path = config.engine_args["model"]
        if not os.path.isdir(model_path):
            raise RuntimeError(f"{model_path} does not exist; run `omni-triton prepare --models llm`")
        self.tokenizer = AutoTokenizer.from_pretrained(config.engine_args.get("tokenizer", model_path))
        self.reaper = ChildReaper()
        try:
            self.runner = AsyncEngineRunner(config.engine_args)
        except BaseException:
            self.reaper.reap(timeout=1.0)  # a half-started engine leaves no process behind
            raise
        self.reaper.snapshot()
        import atexit

        atexit.register(self.reaper.reap)
        # If tritonserver dies, the EngineCore would outlive it: reap it and leave.
        self.reaper.watch(os.getppid(), on_gone=lambda: os._exit(0))
        # If the engine dies (EngineCore killed, OOM), leave too: serve reloads the model with a
        # new engine. The 2 s let the in-flight requests' error responses go out first.
        self.runner.watch_engine(self._engine_died)
        log("info", f"llm ready: {model_path} (engine processes {self.reaper.snapshot()})")

    def _engine_died(self) -> None:
        log("error", "llm: the vLLM engine died; exiting the stub so the model is reloaded")
        time.sleep(2.0)
        self.reaper.reap(timeout=1.0)
        os._exit(1)

    def parse(self, request):
        from omni_triton.stages.llm import build_generation_job

        return build_generation_job(f"llm-{uuid.uuid4().hex}", self.tokenizer, *read_chat_request(request),
                                    self.config.max_model_len, self.config.default_max_tokens)

    def dispatch(self, job, stream):
        self.metrics.count("prompt_tokens", len(job.prompt_ids))

        def on_delta(delta):  # on the engine's loop thread
            self.metrics.count("generation_tokens", delta.new_tokens)
            if delta.final and delta.finish_reason == "abort":
                self.metrics.count("aborted")
            stream.send(ch.text_response(delta.text, delta.finish_reason or "", delta.prompt_tokens,
                                         delta.completion_tokens), final=delta.final)

        def done(future):
            exc = future.exception() if not future.cancelled() else RuntimeError("cancelled")
            self.finish(job, stream, exc if not stream.final_sent else None)

        self.runner.submit(job, on_delta, stream.cancelled).add_done_callback(done)

    def finalize(self):
        start = time.monotonic()
        try:
            clean = self.runner.shutdown(timeout=1.0, reaper=self.reaper)
        except Exception:
            LOGGER.exception("llm: engine shutdown failed")
            clean = False
        reaped = self.reaper.reap(timeout=0.5)  # whatever is left
        log("info", f"llm finalized in {time.monotonic() - start:.1f} s (engine shutdown "
                    f"{'clean' if clean else 'timed out'}; reaped {reaped})")
        # Drop the metric families now: destroyed later, at interpreter exit (the engine's threads
        # and closures keep this object alive until then), they segfault the 2.51 stub
        # (Metric::Clear after its shared memory is gone).
        self.metrics = None
        self.telemetry.close()
        gc.collect()


@dataclass
class _SpokenJob:
    inputs: list
    audio: bool
    voice: str


class LlmTtsPipeline(DecoupledStage):
    """``llm_tts`` BLS: the llm's text deltas streamed as they come; with audio, each completed
    sentence is spoken by ``piper`` as soon as it is complete (the llm keeps generating)."""

    stage = "llm_tts"
    input_error = ch.ChatInputError
    reads_bls_streams = True
    per_instance_metrics = True  # several instances (stub processes)
    llm, tts = "llm", "piper"
    metric_specs = dict(
        received=("omni_llm_tts_requests_total", "Spoken-answer requests received", "counter"),
        invalid=("omni_llm_tts_invalid_requests_total", "Requests rejected as invalid input", "counter"),
        cancelled=("omni_llm_tts_cancelled_total", "Requests cancelled by the client", "counter"),
        sentences=("omni_llm_tts_sentences_total", "Sentences sent to the TTS stage", "counter"),
        seconds=("omni_llm_tts_audio_seconds_total", "Seconds of audio streamed", "counter"),
    )

    def setup(self, args, params):
        # torch-free (tests/unit/test_bls_imports.py): no tokenizer here (transformers imports
        # torch: 311 MB a stub); the llm stage tokenizes and validates each request, and its
        # "invalid input: ..." reaches this model as a StageError with invalid set: INVALID_ARG here too
        from omni_triton.runtime.cancel_flags import CancelFlags

        self.voices = [v.strip() for v in params.get("voices", "joe").split(",") if v.strip()]
        self.default_voice = params.get("default_voice", self.voices[0])
        self.sample_rate = int(params.get("sample_rate", "22050"))
        self.min_chars = int(params.get("min_sentence_chars", "12"))
        self.max_chars = int(params.get("max_sentence_chars", "300"))
        self.stage_flags = CancelFlags.for_server()

    def parse(self, request):
        """The request -> a :class:`_SpokenJob` (the chat inputs unchanged: ``llm`` validates and
        tokenizes them).

        Raises:
            ChatInputError: bad MODALITIES / VOICE, both or neither of PROMPT and MESSAGES,
                MESSAGES that ``chat.parse_messages`` refuses, an input over its cap.
        """
        self.metrics.count("received")  # every request, the invalid ones included
        modalities = ch.parse_modalities(optional_str_input(request, ch.MODALITIES))
        voice = ch.match_voice(optional_str_input(request, ch.VOICE), self.voices, self.default_voice)
        prompt, messages, sampling = text_inputs = read_chat_request(request)
        if (prompt is None) == (messages is None):
            raise ch.ChatInputError("send exactly one of PROMPT and MESSAGES")
        if messages is not None:
            ch.parse_messages(messages)  # its structure (as the llm checks it), before the llm is called
        ch.parse_sampling(sampling)
        return _SpokenJob(chat_request_pairs(text_inputs), "audio" in modalities, voice)

    def _response(self, text, finish, counts, audio=None):
        return {**ch.text_response(text, finish, *counts), **audio_outputs(audio, self.sample_rate)}

    def _synthesize(self, voice, stream):
        def run(sentence):
            inputs = [(sp.TEXT, utf8_array(sentence)), (sp.VOICE, utf8_array(voice))]
            for out in stream_stage(self.tts, inputs, [sp.AUDIO], stream.cancelled, parent=stream):
                pcm = out.get(sp.AUDIO)
                if pcm is not None and pcm.size:
                    yield pcm.reshape(-1)
        return run

    def generate(self, job, stream):
        """Text deltas as the llm streams them; with audio, each completed sentence is spoken
        (piper) before the next deltas are read, all on this one thread (the llm keeps
        generating meanwhile; see :class:`~omni_triton.stages.llm.SentenceSpeaker`)."""
        from omni_triton.stages.llm import SentenceSegmenter, SentenceSpeaker

        counts, finish = [0, 0], ""
        speaker = SentenceSpeaker(self._synthesize(job.voice, stream),
                                  SentenceSegmenter(min_chars=self.min_chars, max_chars=self.max_chars)) \
            if job.audio else None

        def audio(chunks):
            for pcm in chunks:
                self.metrics.count("seconds", pcm.size / self.sample_rate)
                yield self._response("", "", tuple(counts), pcm)

        for out in stream_stage(self.llm, job.inputs, ch.TEXT_OUTPUTS, stream.cancelled, self.stage_flags,
                                f"llm_tts-{uuid.uuid4().hex}", parent=stream):
            response = ch.TextResponse.from_tensors(out)
            text = response.text
            finish = response.finish_reason or finish
            counts[:] = response.counts
            if stream.cancel_seen:
                break
            if text:
                yield self._response(text, "", tuple(counts))
            if speaker is not None:
                yield from audio(speaker.push_text(text))
                if stream.cancel_seen:
                    break  # cancelled while a sentence was spoken
        if stream.cancel_seen or stream.cancelled():
            finish = "abort"
        elif speaker is not None:
            yield from audio(speaker.finish())
            self.metrics.count("sentences", len(speaker.sentences))
        yield Final(self._response("", finish or "stop", tuple(counts)))

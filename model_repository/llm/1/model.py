"""Triton adapter for the ``llm`` stage (decoupled): vLLM AsyncLLM on its own event-loop thread.
Validation, chat templating, the engine runner and the child reaper live in omni_triton.stages.llm."""
import locale

locale.setlocale(locale.LC_CTYPE, "")  # the stub starts with an ASCII text encoding (vLLM/inductor)

import atexit
import gc
import logging
import os
import threading
import time
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_triton.paths import cache_dir
from omni_triton.triton_io import is_cancelled, StageMetrics, model_parameters, optional_str_input, send, send_error, send_failure

LOGGER = logging.getLogger("llm")


def _bytes(name, text):
    return pb_utils.Tensor(name, np.array([text.encode("utf-8")], dtype=np.object_))


def _response(delta):
    return pb_utils.InferenceResponse(output_tensors=[
        _bytes("TEXT_DELTA", delta.text),
        _bytes("FINISH_REASON", delta.finish_reason or ""),
        pb_utils.Tensor("PROMPT_TOKENS", np.array([delta.prompt_tokens], dtype=np.int32)),
        pb_utils.Tensor("COMPLETION_TOKENS", np.array([delta.completion_tokens], dtype=np.int32)),
    ])


class TritonPythonModel:
    def initialize(self, args):
        from omni_triton.runtime.reaper import ChildReaper
        from omni_triton.stages.llm import parse_engine_config

        config = parse_engine_config(model_parameters(args), cache_dir() / "models")
        os.environ.update(config.env)  # before vLLM is imported
        os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_dir() / "vllm"))
        import torch
        from transformers import AutoTokenizer

        from omni_triton.runtime.cancel_flags import CancelFlags
        from omni_triton.runtime.vllm_runner import AsyncEngineRunner

        torch.set_num_threads(1)
        self.config = config
        model_path = config.engine_args["model"]
        if not os.path.isdir(model_path):
            raise RuntimeError(f"{model_path} does not exist; run `omni-triton prepare --models llm`")
        self.tokenizer = AutoTokenizer.from_pretrained(config.engine_args.get("tokenizer", model_path))
        self.flags = CancelFlags.for_server()
        self.metrics = StageMetrics(
            {"model": args["model_name"]},
            requests=("omni_llm_requests_total", "LLM requests started in the engine", "counter"),
            invalid=("omni_llm_invalid_requests_total", "LLM requests rejected as invalid input", "counter"),
            aborted=("omni_llm_aborted_total", "LLM requests aborted in the engine (cancelled)", "counter"),
            prompt_tokens=("omni_llm_prompt_tokens_total", "Prompt tokens processed", "counter"),
            generation_tokens=("omni_llm_generation_tokens_total", "Tokens generated", "counter"),
            active=("omni_llm_active_requests", "LLM requests being generated now", "gauge"),
        )
        self.reaper = ChildReaper()
        try:
            self.runner = AsyncEngineRunner(config.engine_args)
        except BaseException:
            self.reaper.reap(timeout=1.0)  # a half-started engine leaves no process behind
            raise
        self.reaper.snapshot()
        atexit.register(self.reaper.reap)
        # If tritonserver dies, the EngineCore would outlive it: reap it and leave.
        self.reaper.watch(os.getppid(), on_gone=lambda: os._exit(0))
        self._lock = threading.Lock()
        self._active = 0
        pb_utils.Logger.log_info(f"llm ready: {model_path} (engine processes {self.reaper.snapshot()})")

    def execute(self, requests):
        from omni_triton.contracts.chat import ChatInputError
        from omni_triton.stages.llm import build_generation_job

        for request in requests:
            sender = request.get_response_sender()
            try:
                caller_id = optional_str_input(request, "REQUEST_ID")
                job = build_generation_job(
                    f"llm-{uuid.uuid4().hex}", self.tokenizer,
                    optional_str_input(request, "PROMPT"), optional_str_input(request, "MESSAGES"),
                    optional_str_input(request, "SAMPLING_PARAMETERS"),
                    self.config.max_model_len, self.config.default_max_tokens,
                )
            except ChatInputError as exc:
                self.metrics.invalid.increment(1)
                send_error(sender, str(exc), pb_utils.TritonError.INVALID_ARG)
                continue
            except Exception as exc:  # a stage reports failures as error responses, never raises
                send_failure(sender, "llm", exc)
                continue
            self._start(request, sender, job, caller_id)
        return None

    def _start(self, request, sender, job, caller_id):
        state = {"final": False}
        self.metrics.requests.increment(1)
        self.metrics.prompt_tokens.increment(len(job.prompt_ids))
        self._add_active(1)

        def on_delta(delta):  # on the engine's loop thread
            self.metrics.generation_tokens.increment(delta.new_tokens)
            flags = 0
            if delta.final:
                state["final"] = True
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                if delta.finish_reason == "abort":
                    self.metrics.aborted.increment(1)
            send(sender, _response(delta), flags=flags)

        def is_cancelled():
            return is_cancelled(request) or self.flags.is_cancelled(caller_id)

        def done(future):
            self.flags.discard(caller_id)
            self._add_active(-1)
            exc = future.exception() if not future.cancelled() else RuntimeError("cancelled")
            if exc is not None and not state["final"]:
                send_failure(sender, "llm", exc)

        self.runner.submit(job, on_delta, is_cancelled).add_done_callback(done)

    def _add_active(self, delta):
        # Triton gauges are set, not incremented; keep the count here.
        with self._lock:
            self._active += delta
            self.metrics.active.set(self._active)

    def finalize(self):
        start = time.monotonic()
        try:
            clean = self.runner.shutdown(timeout=1.0, reaper=self.reaper)
        except Exception:
            LOGGER.exception("llm: engine shutdown failed")
            clean = False
        reaped = self.reaper.reap(timeout=0.5)  # whatever is left
        pb_utils.Logger.log_info(f"llm finalized in {time.monotonic() - start:.1f} s (engine shutdown "
                                 f"{'clean' if clean else 'timed out'}; reaped {reaped})")
        # Drop the metric families now: destroyed later, at interpreter exit (the engine's threads
        # and closures keep this object alive until then), they segfault the 2.51 stub
        # (Metric::Clear after its shared memory is gone).
        self.metrics = None
        gc.collect()

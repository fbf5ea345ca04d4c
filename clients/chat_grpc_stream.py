"""Stream a chat answer straight from a Triton chat model (``llm``, ``llm_tts``) over gRPC.

Usage::

    python -m clients.chat_grpc_stream --url 127.0.0.1:8001 --model llm \
        --message "What is the capital of France?"
    python -m clients.chat_grpc_stream --model llm_tts --modalities text,audio --out answer.wav \
        --message "What is the capital of France?"
    python -m clients.chat_grpc_stream --model llm --concurrency 8 --max-tokens 128 --ignore-eos

Prints the text as it streams (or, with ``--concurrency N``, N parallel streams' aggregate
completion tokens per second). Tensor contract: ``docs/chat_contracts.md``. This is a quick probe;
the full benchmark (TTFT, ITL, TPOT through the frontend and vLLM's own server) is
``clients/bench_chat.py``.
"""
from __future__ import annotations

import argparse
import json
import queue
import threading
import time
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from omni_triton.contracts import chat
from omni_triton.contracts.tensors import infer_input, wrap_inputs


@dataclass
class ChatStreamResult:
    """What one streamed chat request returned.

    Attributes:
        deltas: TEXT_DELTA of every response, in arrival order (may hold empty strings).
        arrival_s: seconds from sending the request to each response.
        finish_reason: FINISH_REASON of the last response (``stop``, ``length``, ``abort``).
        prompt_tokens, completion_tokens: the last response's counts.
        audio_chunks: non-empty AUDIO outputs (float32 PCM in [-1, 1]) in arrival order.
        sample_rate: Hz (speech models only).
        error: the error message if the stream ended with an error response.
        error_status: its gRPC status (e.g. ``StatusCode.INVALID_ARGUMENT``).
        kinds: ``"text"``/``"audio"`` per response with content, in arrival order.
    """

    deltas: list[str] = field(default_factory=list)
    arrival_s: list[float] = field(default_factory=list)
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    audio_chunks: list[np.ndarray] = field(default_factory=list)
    sample_rate: int = 0
    error: str | None = None
    error_status: str | None = None
    kinds: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.deltas)

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.audio_chunks) if self.audio_chunks else np.zeros(0, np.float32)


def build_chat_inputs(messages: list[dict] | None = None, prompt: str | None = None,
                      sampling: dict | None = None, modalities: list[str] | None = None,
                      voice: str | None = None, raw: dict[str, str] | None = None) -> list:
    """``tritonclient.grpc.InferInput`` list of the chat contract
    (``omni_triton.contracts.chat.chat_inputs``): MESSAGES (JSON) or PROMPT, SAMPLING_PARAMETERS
    (JSON, when non-empty), MODALITIES (JSON), VOICE; ``raw`` adds BYTES inputs verbatim (for
    bad-input tests)."""
    pairs = chat.chat_inputs(messages=messages, prompt=prompt, sampling=sampling, modalities=modalities,
                             voice=voice, raw=raw)
    return wrap_inputs(pairs, partial(infer_input, grpcclient.InferInput))


def stream_chat(url: str, model: str, inputs: list, timeout_s: float = 300.0,
                cancel_after: int | None = None, speech: bool = False,
                grpc_error_status: bool = False) -> ChatStreamResult:
    """Send one request on a gRPC stream and collect every response up to the FINAL flag.

    Args:
        cancel_after: after this many responses with text, stop the stream with
            ``stop_stream(cancel_requests=True)`` (the model sees ``request.is_cancelled()``) and
            return what arrived.
        speech: also request AUDIO and SAMPLE_RATE (``llm_tts``).
        grpc_error_status: open the stream with the header ``triton_grpc_error: true``, so an
            error response ends the stream with its gRPC status (``INVALID_ARG`` ->
            ``StatusCode.INVALID_ARGUMENT`` in ``error_status``) instead of an in-band message
            without a code. Off by default: on tritonserver 2.51 every such error goes through
            the server's cancellation path ("HandleCancellation called even when the context was
            not cancelled"), which crashed the server (SIGSEGV) a few times here.
    """
    names = list(chat.TEXT_OUTPUTS)
    if speech:
        names += list(chat.SPEECH_OUTPUTS)
    responses: queue.Queue = queue.Queue()
    result = ChatStreamResult()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)),
                            headers={"triton_grpc_error": "true"} if grpc_error_status else None)
        start = time.perf_counter()
        client.async_stream_infer(model, inputs, outputs=[grpcclient.InferRequestedOutput(n) for n in names],
                                  enable_empty_final_response=True)
        texts, finished = 0, False
        while True:
            res, err = responses.get(timeout=timeout_s)
            now = time.perf_counter() - start
            if err is not None:
                result.error = err.message() if isinstance(err, InferenceServerException) else str(err)
                result.error_status = err.status() if isinstance(err, InferenceServerException) else None
                finished = True
                break
            final = res.get_response().parameters.get("triton_final_response")
            if res.as_numpy(chat.TEXT_DELTA) is not None:
                delta = res.as_numpy(chat.TEXT_DELTA).reshape(-1)[0].decode("utf-8")
                result.deltas.append(delta)
                result.arrival_s.append(now)
                if delta:
                    result.kinds.append("text")
                    texts += 1
                reason = res.as_numpy(chat.FINISH_REASON).reshape(-1)[0].decode("utf-8")
                result.finish_reason = reason or result.finish_reason
                result.prompt_tokens = int(res.as_numpy(chat.PROMPT_TOKENS).reshape(-1)[0])
                result.completion_tokens = int(res.as_numpy(chat.COMPLETION_TOKENS).reshape(-1)[0])
                if speech and res.as_numpy(chat.AUDIO) is not None and res.as_numpy(chat.AUDIO).size:
                    result.audio_chunks.append(res.as_numpy(chat.AUDIO).reshape(-1).astype(np.float32))
                    result.sample_rate = int(res.as_numpy(chat.SAMPLE_RATE).reshape(-1)[0])
                    result.kinds.append("audio")
            if final is not None and final.bool_param:
                finished = True
                break
            if cancel_after is not None and texts >= cancel_after:
                client.stop_stream(cancel_requests=True)
                break
    finally:
        # Cancel only a request still running: cancelling a gRPC stream whose request already
        # ended can crash tritonserver 2.51 (SIGSEGV after "HandleCancellation called even when the
        # context was not cancelled"; triton-inference-server/server#7368, fixed in 24.12 by #7840).
        client.stop_stream(cancel_requests=not finished)
        client.close()
    return result


def run_concurrent(url: str, model: str, make_inputs, n: int, **kwargs) -> tuple[list[ChatStreamResult], float]:
    """``n`` streams at once (one gRPC client each); returns the results and the wall time (s)."""
    results: list[ChatStreamResult | None] = [None] * n

    def one(i):
        try:
            results[i] = stream_chat(url, model, make_inputs(i), **kwargs)
        except Exception as exc:  # reported as that stream's error, not lost in the thread
            results[i] = ChatStreamResult(error=f"client error: {exc!r}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="127.0.0.1:8001")
    parser.add_argument("--model", default="llm")
    parser.add_argument("--message", default="What is the capital of France?")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--modalities", default=None, help="e.g. text,audio (llm_tts)")
    parser.add_argument("--out", default=None, help="WAV file for the audio (llm_tts)")
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()

    sampling = {"temperature": args.temperature}
    if args.max_tokens:
        sampling["max_tokens"] = args.max_tokens
    if args.ignore_eos:
        sampling["ignore_eos"] = True
    modalities = args.modalities.split(",") if args.modalities else None
    speech = args.model != "llm"

    def make_inputs(_i):
        return build_chat_inputs(messages=[{"role": "user", "content": args.message}],
                                 sampling=sampling, modalities=modalities)

    results, wall = run_concurrent(args.url, args.model, make_inputs, args.concurrency, speech=speech)
    for i, r in enumerate(results):
        if r.error:
            print(f"[{i}] error: {r.error}")
            continue
        ttft = next((t for t, d in zip(r.arrival_s, r.deltas, strict=True) if d), float("nan"))
        print(f"[{i}] {r.text!r} finish={r.finish_reason} prompt={r.prompt_tokens} "
              f"completion={r.completion_tokens} responses={len(r.deltas)} ttft={ttft:.3f}s "
              f"audio={r.audio.size / r.sample_rate if r.sample_rate else 0:.2f}s")
    tokens = sum(r.completion_tokens for r in results)
    print(json.dumps({"concurrency": args.concurrency, "completion_tokens": tokens, "wall_s": round(wall, 3),
                      "tok_per_s": round(tokens / wall, 1),
                      "per_stream_tok_per_s": round(tokens / wall / args.concurrency, 1)}))
    if args.out and results[0].audio.size:
        import soundfile as sf

        sf.write(args.out, results[0].audio, results[0].sample_rate)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

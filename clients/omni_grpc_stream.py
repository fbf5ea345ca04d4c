"""Stream a chat answer (text + speech) straight from a Triton chat-contract model over gRPC.

Usage::

    python -m clients.omni_grpc_stream --model qwen3_omni --text "What is the capital of France?" --out answer.wav

Prints the text as it arrives, then one line per audio chunk (arrival in ms since the request,
samples), TTFT (first non-empty text delta) and TTFP (first audio chunk), and writes the
concatenated PCM as a WAV file. Contract: docs/chat_contracts.md.
"""
from __future__ import annotations

import argparse
import queue
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from clients.chat_grpc_stream import build_chat_inputs
from omni_triton.contracts import chat


@dataclass
class ChatStreamResult:
    """What one streamed chat request returned.

    Attributes:
        text_deltas / text_arrival_s: non-empty TEXT_DELTA values and their arrival (s since send).
        audio_chunks / audio_arrival_s: non-empty AUDIO arrays (float32 PCM) and their arrival.
        finish_reason, prompt_tokens, completion_tokens: from the responses (last non-empty value).
        responses: number of responses received (including the empty final one).
        completed: the FINAL response arrived (False when the client stopped early).
    """

    text_deltas: list[str] = field(default_factory=list)
    text_arrival_s: list[float] = field(default_factory=list)
    audio_chunks: list[np.ndarray] = field(default_factory=list)
    audio_arrival_s: list[float] = field(default_factory=list)
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    sample_rate: int = 0
    responses: int = 0
    completed: bool = False
    total_s: float = 0.0

    @property
    def text(self) -> str:
        return "".join(self.text_deltas)

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.audio_chunks) if self.audio_chunks else np.zeros(0, np.float32)

    @property
    def ttft_s(self) -> float | None:
        return self.text_arrival_s[0] if self.text_arrival_s else None

    @property
    def ttfp_s(self) -> float | None:
        return self.audio_arrival_s[0] if self.audio_arrival_s else None


def stream_chat(url: str, model: str, inputs: list, max_audio_chunks: int | None = None,
                max_text_deltas: int | None = None, stop_after_text: bool = False,
                timeout_s: float = 300.0,
                on_audio: Callable[[int, np.ndarray], None] | None = None) -> ChatStreamResult:
    """Send one request on a gRPC stream and collect text deltas and audio chunks as they come.

    ``max_audio_chunks`` / ``max_text_deltas`` / ``stop_after_text`` (after the response carrying
    FINISH_REASON): stop early and cancel the request
    (``stop_stream(cancel_requests=True)``). ``on_audio(chunk index, float32 PCM)`` runs as each
    audio chunk arrives, while the stream is still open (e.g. to read a stage's metrics). Raises
    ``InferenceServerException`` on an error
    response (in-band: its message, no gRPC status), ``TimeoutError`` after ``timeout_s`` without a
    response.
    """
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    result = ChatStreamResult()
    try:
        # No `triton_grpc_error` header: its error path crashed tritonserver 2.51 (SIGSEGV) on BLS
        # error responses (server#7368). Errors arrive in-band, without their gRPC code; a stage's
        # INVALID_ARG is recognised by omni_triton.contracts.tensors.INVALID_INPUT_PREFIX in the message.
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        start = time.perf_counter()
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            res, err = responses.get(timeout=timeout_s)
            if err is not None:
                raise err
            now = time.perf_counter() - start
            result.responses += 1
            final = res.get_response().parameters.get("triton_final_response")
            text = res.as_numpy(chat.TEXT_DELTA)
            if text is not None and text.size:
                delta = text.reshape(-1)[0].decode("utf-8")
                if delta:
                    result.text_deltas.append(delta)
                    result.text_arrival_s.append(now)
                    if max_text_deltas is not None and len(result.text_deltas) >= max_text_deltas:
                        break
                reason = res.as_numpy(chat.FINISH_REASON).reshape(-1)[0].decode("utf-8")
                result.finish_reason = reason or result.finish_reason
                result.prompt_tokens = int(res.as_numpy(chat.PROMPT_TOKENS).reshape(-1)[0])
                result.completion_tokens = int(res.as_numpy(chat.COMPLETION_TOKENS).reshape(-1)[0])
                if stop_after_text and reason:
                    break
            audio = res.as_numpy(chat.AUDIO)
            if audio is not None and audio.size:
                result.audio_chunks.append(audio.astype(np.float32).reshape(-1))
                result.audio_arrival_s.append(now)
                result.sample_rate = int(res.as_numpy(chat.SAMPLE_RATE).reshape(-1)[0])
                if on_audio is not None:
                    on_audio(len(result.audio_chunks) - 1, result.audio_chunks[-1])
                if max_audio_chunks is not None and len(result.audio_chunks) >= max_audio_chunks:
                    break
            if final is not None and final.bool_param:
                result.completed = True
                break
        result.total_s = time.perf_counter() - start
    except queue.Empty:
        raise TimeoutError(f"no response from {model} for {timeout_s} s") from None
    finally:
        client.stop_stream(cancel_requests=not result.completed)  # else stop_stream waits forever
        client.close()
    return result


def main(argv: list[str] | None = None) -> int:
    import soundfile as sf

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC host:port")
    parser.add_argument("--model", default="qwen3_omni")
    parser.add_argument("--text", default="What is the capital of France?")
    parser.add_argument("--voice")
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--text-only", action="store_true")
    parser.add_argument("--out", default="answer.wav")
    args = parser.parse_args(argv)
    sampling = {"temperature": 0}
    if args.max_tokens:
        sampling["max_tokens"] = args.max_tokens
    inputs = build_chat_inputs([{"role": "user", "content": args.text}], sampling=sampling,
                               modalities=["text"] if args.text_only else ["text", "audio"], voice=args.voice)
    try:
        result = stream_chat(args.url, args.model, inputs)
    except InferenceServerException as exc:
        print(f"error: {exc.message()}")
        return 1
    print(f"text: {result.text!r} (finish_reason={result.finish_reason}, "
          f"{result.prompt_tokens} prompt + {result.completion_tokens} completion tokens)")
    for i, (chunk, t) in enumerate(zip(result.audio_chunks, result.audio_arrival_s, strict=True)):
        print(f"audio chunk {i}: {t * 1000:8.1f} ms  {chunk.size} samples")
    ttfp = f"{result.ttfp_s * 1000:.1f} ms" if result.ttfp_s is not None else "-"
    print(f"TTFT {result.ttft_s * 1000 if result.ttft_s else float('nan'):.1f} ms, TTFP {ttfp}, "
          f"total {result.total_s * 1000:.1f} ms")
    if result.audio_chunks:
        sf.write(args.out, result.audio, result.sample_rate)
        print(f"wrote {args.out}: {result.audio.size / result.sample_rate:.2f} s at {result.sample_rate} Hz")
    return 0


if __name__ == "__main__":
    sys.exit(main())

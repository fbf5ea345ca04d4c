"""Stream speech straight from a Triton TTS model over gRPC (no OpenAI frontend).

Usage::

    python -m clients.tts_grpc_stream --model csm --text "Hello there." --out hello.wav
    python -m clients.tts_grpc_stream --model piper --url 127.0.0.1:8001 --text "Hi." --out hi.wav

Prints one line per audio chunk as it arrives (arrival time in ms since the request, samples),
then writes the concatenated PCM as a WAV file with soundfile.
"""
from __future__ import annotations

import argparse
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from omni_triton.contracts import speech
from omni_triton.contracts.tensors import infer_input, wrap_inputs


@dataclass
class StreamResult:
    """Audio streamed from one request.

    Attributes:
        chunks: float32 mono PCM arrays in [-1, 1], in arrival order (one per response).
        arrival_s: seconds from sending the request to each chunk's arrival.
        sample_rate: Hz, from the model's SAMPLE_RATE output.
    """

    chunks: list[np.ndarray] = field(default_factory=list)
    arrival_s: list[float] = field(default_factory=list)
    sample_rate: int = 0

    @property
    def audio(self) -> np.ndarray:
        """All chunks concatenated, shape ``[num_samples]``, float32."""
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)


def build_inputs(text: str, voice: str | None = None, speed: float | None = None,
                 max_frames: int | None = None) -> list:
    """Triton inputs for the speech contract (docs/speech_contracts.md): TEXT, VOICE?, SPEED?,
    MAX_FRAMES? (codec pipeline ``csm`` only: cap on codec frames, 12.5 frames per second)."""
    return wrap_inputs(speech.speech_inputs(text, voice, speed, max_frames),
                       partial(infer_input, grpcclient.InferInput))


def stream_tts(url: str, model: str, text: str, voice: str | None = None,
               speed: float | None = None, max_frames: int | None = None,
               max_chunks: int | None = None,
               timeout_s: float = 300.0,
               on_chunk: Callable[[int, np.ndarray], None] | None = None) -> StreamResult:
    """Send one request on a gRPC bidirectional stream and collect the audio chunks.

    Args:
        url: Triton gRPC ``host:port``.
        model: a decoupled speech model (``piper`` or ``csm``).
        max_chunks: stop after this many chunks and cancel the request
            (``stop_stream(cancel_requests=True)``); ``None`` reads to the final response.
        on_chunk: called with (chunk index, float32 PCM) as each chunk arrives, while the stream
            is still open (e.g. to read a stage's metrics at the first audio).

    Raises:
        InferenceServerException: the model answered with an error.
        TimeoutError: no response for ``timeout_s`` seconds.
    """
    return stream_speech(url, model, build_inputs(text, voice, speed, max_frames), max_chunks, timeout_s, on_chunk)


def stream_speech(url: str, model: str, inputs: list, max_chunks: int | None = None, timeout_s: float = 300.0,
                  on_chunk: Callable[[int, np.ndarray], None] | None = None) -> StreamResult:
    """Send one request with the ``InferInput`` s ``inputs`` to the decoupled speech model
    ``model`` on a gRPC bidirectional stream and collect its AUDIO chunks (float32 PCM, with
    arrival times in s from the send and the SAMPLE_RATE in Hz); arguments as :func:`stream_tts`.

    Raises:
        InferenceServerException: the model answered with an error.
        TimeoutError: no response for ``timeout_s`` seconds.
    """
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    result = StreamResult()
    completed = False  # the final response arrived: nothing left to cancel
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        start = time.perf_counter()
        client.async_stream_infer(model, inputs,
                                  enable_empty_final_response=True)
        while True:
            res, err = responses.get(timeout=timeout_s)
            if err is not None:
                raise err
            final = res.get_response().parameters.get("triton_final_response")
            audio = res.as_numpy(speech.AUDIO)
            if audio is not None and audio.size:
                result.chunks.append(audio.astype(np.float32).reshape(-1))
                result.arrival_s.append(time.perf_counter() - start)
                result.sample_rate = int(res.as_numpy(speech.SAMPLE_RATE).reshape(-1)[0])
                if on_chunk is not None:
                    on_chunk(len(result.chunks) - 1, result.chunks[-1])
                if max_chunks is not None and len(result.chunks) >= max_chunks:
                    break
            if final is not None and final.bool_param:
                completed = True
                break
    except queue.Empty:
        raise TimeoutError(f"no response from {model} for {timeout_s} s") from None
    finally:
        # Early stop, error or timeout: cancel, or stop_stream would wait for the server forever.
        client.stop_stream(cancel_requests=not completed)
        client.close()
    return result


def main(argv: list[str] | None = None) -> int:
    import soundfile as sf

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC host:port")
    parser.add_argument("--model", default="piper")
    parser.add_argument("--text", default="Hello from Triton. This sentence is streamed as speech.")
    parser.add_argument("--voice")
    parser.add_argument("--speed", type=float)
    parser.add_argument("--max-frames", type=int, help="codec frames cap (model tts only)")
    parser.add_argument("--out", default="speech.wav")
    args = parser.parse_args(argv)
    try:
        result = stream_tts(args.url, args.model, args.text, args.voice, args.speed, args.max_frames)
    except InferenceServerException as exc:
        print(f"error: {exc.message()}")
        return 1
    for i, (chunk, t) in enumerate(zip(result.chunks, result.arrival_s, strict=True)):
        print(f"chunk {i}: {t * 1000:8.1f} ms  {chunk.size} samples")
    sf.write(args.out, result.audio, result.sample_rate)
    print(f"wrote {args.out}: {result.audio.size / max(result.sample_rate, 1):.2f} s at {result.sample_rate} Hz")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

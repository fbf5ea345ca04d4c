"""Qwen3-TTS over Triton gRPC (no OpenAI frontend): stream ``qwen3_tts``, compute a clone prompt
with ``qwen3_tts_voice_prompt``.

Usage::

    python -m clients.qwen3_tts_grpc --url 127.0.0.1:8001 --text "Hello." --voice ryan --out hi.wav
    python -m clients.qwen3_tts_grpc --text "Hello." --instructions "a calm deep voice" --out design.wav
"""
from __future__ import annotations

import argparse
from functools import partial

import numpy as np
import tritonclient.grpc as grpcclient

from clients.tts_grpc_stream import StreamResult, stream_speech
from omni_triton.contracts import qwen3_tts as q
from omni_triton.contracts.tensors import infer_input, wrap_inputs


def stream_qwen3_tts(url: str, pairs: list, max_chunks: int | None = None, timeout_s: float = 300.0,
                     model: str = "qwen3_tts") -> StreamResult:
    """Send one ``qwen3_tts`` request (``pairs`` from :func:`omni_triton.contracts.qwen3_tts.qwen3_tts_inputs`)
    and collect its PCM chunks; ``max_chunks``: stop after that many and cancel the request.

    Raises:
        InferenceServerException: the model answered with an error.
        TimeoutError: no response for ``timeout_s`` seconds.
    """
    return stream_speech(url, model, wrap_inputs(pairs, partial(infer_input, grpcclient.InferInput)), max_chunks,
                         timeout_s)


def voice_prompt(url: str, audio: np.ndarray, sample_rate: int, ref_text: str | None = None,
                 x_vector_only: bool = False) -> tuple[bytes, float]:
    """``qwen3_tts_voice_prompt``: the clone prompt bytes of a clip and its length in seconds."""
    pairs = q.qwen3_tts_inputs("", ref_audio=audio, ref_sample_rate=sample_rate, ref_text=ref_text,
                               x_vector_only=x_vector_only)[1:]
    with grpcclient.InferenceServerClient(url) as client:
        res = client.infer("qwen3_tts_voice_prompt", wrap_inputs(pairs, partial(infer_input, grpcclient.InferInput)))
    return bytes(res.as_numpy(q.VOICE_PROMPT).reshape(-1)[0]), float(res.as_numpy(q.REF_SECONDS).reshape(-1)[0])


def main(argv: list[str] | None = None) -> int:
    import soundfile as sf

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="127.0.0.1:8001")
    p.add_argument("--text", default="Hello from Qwen3-TTS on Triton.")
    p.add_argument("--task")
    p.add_argument("--voice")
    p.add_argument("--instructions")
    p.add_argument("--language")
    p.add_argument("--max-frames", type=int)
    p.add_argument("--out", default="qwen3_tts.wav")
    a = p.parse_args(argv)
    r = stream_qwen3_tts(a.url, q.qwen3_tts_inputs(a.text, a.task, a.voice, a.instructions, a.language,
                                                   max_frames=a.max_frames))
    for i, (chunk, t) in enumerate(zip(r.chunks, r.arrival_s, strict=True)):
        print(f"chunk {i}: {t * 1000:8.1f} ms  {chunk.size} samples")
    sf.write(a.out, r.audio, r.sample_rate)
    print(f"wrote {a.out}: {r.audio.size / max(r.sample_rate, 1):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

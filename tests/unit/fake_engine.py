"""One fast, deterministic fake ``Engine`` (``openai_frontend.engine.protocol``) serving a model
of every kind the frontend knows, and a runner that serves the real app on it.

Models: ``llm`` (chat/completions), ``llm_tts`` (chat that speaks), ``piper_tts`` and
``qwen3_tts`` (speech; qwen3 takes the Qwen3-TTS extras), ``qwen3_tts_voice_prompt`` (clone
prompts), ``qwen_image`` / ``qwen_image_edit`` (images), ``wan_t2v`` / ``wan_i2v`` (videos),
``pocketsphinx`` / ``whisper`` (ASR: ``omni_triton.contracts.asr``; whisper translates) and
``omni`` (a chat model that hears audio: ``input_modalities`` with ``audio``).
Outputs are tiny (a few tokens, 0.1 s of audio, the requested pixels/frames from a seeded RNG),
so a request costs milliseconds: the frontend's own validation, serialization and stores are
what runs. Limits are small (images <= 64 px, videos <= 32 px and 9 frames) to keep generated
valid jobs cheap.

Used by ``tests/unit/test_openapi_fuzz.py`` (schemathesis against a running frontend)::

    python tests/unit/fake_engine.py --port 9100 --storage DIR

serves ``openai_frontend.app.create_app`` on it with real voice and video stores under DIR.
"""
from __future__ import annotations

import argparse
import asyncio
import json

import numpy as np
from engine_stub import EngineStub

from openai_frontend.engine import (
    GeneratedImage,
    GenerationChunk,
    InvalidRequestError,
    ModelInfo,
    ModelNotFoundError,
    VideoEvent,
)

CHAT_INPUTS = frozenset({"PROMPT", "MESSAGES", "SAMPLING_PARAMETERS"})
TEXT_OUTPUTS = frozenset({"TEXT_DELTA", "FINISH_REASON", "PROMPT_TOKENS", "COMPLETION_TOKENS"})
SPEECH_OUT = frozenset({"AUDIO", "SAMPLE_RATE"})
IMAGE_INPUTS = frozenset({"PROMPT", "NEGATIVE_PROMPT", "HEIGHT", "WIDTH", "NUM_INFERENCE_STEPS",
                          "TRUE_CFG_SCALE", "GUIDANCE_SCALE", "SEED"})
VIDEO_INPUTS = frozenset({"PROMPT", "NEGATIVE_PROMPT", "HEIGHT", "WIDTH", "NUM_FRAMES", "NUM_INFERENCE_STEPS",
                          "GUIDANCE_SCALE", "SEED"})
VIDEO_OUTPUTS = frozenset({"STEP", "TOTAL_STEPS", "VIDEO", "NUM_STEPS", "DENOISE_SECONDS"})
VIDEO_PARAMS = {"task": "text-to-video", "size_multiple": "16", "max_size": "32", "frame_multiple": "4",
                "default_frames": "5", "max_frames": "9", "default_fps": "8", "max_fps": "30",
                "default_steps": "2", "max_steps": "4", "default_guidance_scale": "4.0",
                "max_input_image_bytes": "200000", "max_input_image_pixels": "65536"}

MODELS = (
    # the prepared SmolLM2 folder's tokenizer serves /tokenize (400 tokenizer_unavailable without it)
    ModelInfo(name="llm", inputs=CHAT_INPUTS, outputs=TEXT_OUTPUTS, decoupled=True, modalities=("text",),
              max_model_len=2048, assets=("smollm2",)),
    ModelInfo(name="llm_tts", inputs=CHAT_INPUTS | {"MODALITIES", "VOICE"}, outputs=TEXT_OUTPUTS | SPEECH_OUT,
              decoupled=True, modalities=("text", "audio"), speaks_for="llm", voices=("joe",),
              default_voice="joe", sample_rate=22050, max_model_len=2048),
    ModelInfo(name="piper_tts", inputs=frozenset({"TEXT", "VOICE", "SPEED"}), outputs=SPEECH_OUT, decoupled=True,
              voices=("joe",), default_voice="joe", sample_rate=22050, supports_speed=True),
    ModelInfo(name="qwen3_tts", inputs=frozenset({"TEXT", "TASK", "VOICE", "INSTRUCTIONS", "LANGUAGE",
                                                  "VOICE_PROMPT", "REF_AUDIO", "REF_SAMPLE_RATE", "REF_TEXT",
                                                  "X_VECTOR_ONLY"}),
              outputs=SPEECH_OUT, decoupled=True, voices=("vivian", "ryan"), default_voice="vivian",
              sample_rate=24000, voice_aliases=(("echo", "ryan"),)),
    ModelInfo(name="qwen3_tts_voice_prompt", inputs=frozenset({"REF_AUDIO", "REF_SAMPLE_RATE", "REF_TEXT",
                                                               "X_VECTOR_ONLY"}),
              outputs=frozenset({"VOICE_PROMPT", "REF_SECONDS"})),
    ModelInfo(name="qwen_image", inputs=IMAGE_INPUTS, outputs=frozenset({"IMAGE", "NUM_STEPS", "DENOISE_SECONDS"}),
              task="text-to-image", default_size=(32, 32), size_multiple=16, max_size=64, default_steps=2,
              max_steps=4, default_true_cfg_scale=4.0, max_images=2),
    ModelInfo(name="qwen_image_edit", inputs=IMAGE_INPUTS | {"INPUT_IMAGE"},
              outputs=frozenset({"IMAGE", "NUM_STEPS", "DENOISE_SECONDS"}), task="image-edit",
              default_size=(32, 32), size_multiple=16, max_size=64, default_steps=2, max_steps=4, max_images=2,
              max_input_images=1),
    ModelInfo(name="wan_t2v", inputs=VIDEO_INPUTS, outputs=VIDEO_OUTPUTS, decoupled=True, default_size=(32, 32),
              parameters=VIDEO_PARAMS),
    ModelInfo(name="wan_i2v", inputs=VIDEO_INPUTS | {"INPUT_IMAGE"}, outputs=VIDEO_OUTPUTS, decoupled=True,
              default_size=(32, 32), parameters={**VIDEO_PARAMS, "task": "image-to-video"}),
)

ASR_INPUTS = frozenset({"AUDIO", "LANGUAGE", "PROMPT", "TASK"})
ASR_OUTPUTS = frozenset({"TEXT_DELTA", "STAGE_COMPUTE_MS"})
ASR_MODELS = (
    ModelInfo(name="pocketsphinx", inputs=ASR_INPUTS, outputs=ASR_OUTPUTS, decoupled=True, task="transcription",
              sample_rate=16000, max_audio_s=30.0, languages=("en",), supports_translation=False),
    ModelInfo(name="whisper", inputs=ASR_INPUTS, outputs=ASR_OUTPUTS, decoupled=True, task="transcription",
              sample_rate=16000, max_audio_s=30.0, languages=("en", "de", "fr"), supports_translation=True),
    ModelInfo(name="qwen3_omni", inputs=CHAT_INPUTS | {"MODALITIES", "VOICE"}, outputs=TEXT_OUTPUTS | SPEECH_OUT,
              decoupled=True, modalities=("text", "audio"), served_model_name="omni", voices=("Ethan",),
              default_voice="Ethan", sample_rate=24000, max_model_len=4096,
              parameters={"input_modalities": "text,audio,image,video"}),
)
MODELS = MODELS + ASR_MODELS


def fake_transcript(audio: np.ndarray, language: str | None, prompt: str | None, task: str) -> list[str]:
    """What the fake ASR models "hear" in a 16 kHz segment: its length in words, as deltas
    (``"heard 1.50 seconds"``; ``translate``: ``"translated 1.50 seconds"``)."""
    seconds = len(audio) / 16000
    return ["translated" if task == "translate" else "heard", f" {seconds:.2f}", " seconds"]


ANSWER = ["The", " capital", " of", " France", " is", " Paris", "."]
MAX_PROMPT_CHARS = 4000  # the fake's "context": longer input -> INVALID_ARG, as the stage does


def _wire(*texts) -> None:
    """Encode ``texts`` as UTF-8, as the Triton client does for every BYTES tensor and model
    name: a lone surrogate that reached the engine raises ``UnicodeEncodeError`` here too."""
    for text in texts:
        if isinstance(text, str):
            text.encode("utf-8")


def _without_media(messages: list) -> list:
    """``messages`` with the base64 data of ``input_audio`` parts left out (the fake's context
    counts text; the real stages count an audio part's tokens from its length)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = [{"type": "input_audio"} if isinstance(p, dict) and p.get("type") == "input_audio" else p
                       for p in content]
        out.append({**m, "content": content})
    return out


def _noise(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.5, 0.5, n).astype(np.float32)


class FakeEngine(EngineStub):
    """Every model kind, answering at once with tiny deterministic outputs; counts its calls."""

    def __init__(self, models=MODELS):
        self.models = {m.name: m for m in models}
        self.calls = 0

    async def is_live(self):
        return True

    async def list_models(self):
        return list(self.models.values())

    async def get_model(self, name):
        _wire(name)
        if name not in self.models:
            raise ModelNotFoundError(f"The model '{name}' does not exist", param="model")
        return self.models[name]

    async def synthesize(self, model, text, voice=None, speed=None, options=None, paced=False):
        self.calls += 1
        _wire(model, text, voice, *(vars(options).values() if options else ()))
        rate = self.models[model].sample_rate or 22050
        for i in range(2):
            await asyncio.sleep(0)
            yield _noise(i, rate // 20), rate

    async def voice_prompt(self, model, audio, sample_rate, ref_text, x_vector_only):
        self.calls += 1
        _wire(model, ref_text)
        return b"PROMPT" + np.asarray(audio[:16], np.float32).tobytes(), len(audio) / sample_rate

    async def transcribe(self, model, audio, language=None, prompt=None, task="transcribe"):
        self.calls += 1
        _wire(model, language, prompt, task)
        info = self.models[model]
        if language is not None and info.languages and language not in info.languages:
            raise InvalidRequestError(f"LANGUAGE '{language}' is not one of {', '.join(info.languages)}")
        if len(audio) > (info.max_audio_s or 30) * 16000 or not len(audio):
            raise InvalidRequestError(f"AUDIO holds {len(audio)} samples")
        # shorter segments answer later: the serving layer must still stream them in order
        await asyncio.sleep(0.02 / max(len(audio) / 16000, 0.1))
        for delta in fake_transcript(audio, language, prompt, task):
            await asyncio.sleep(0)
            yield delta

    async def generate_images(self, model, job):
        self.calls += 1
        _wire(model, job.prompt, job.negative_prompt)
        await asyncio.sleep(0)
        return [GeneratedImage(np.random.default_rng(job.seed + i).integers(0, 256, (job.height, job.width, 3),
                                                                            dtype=np.uint8),
                               job.seed + i, job.steps, 0.01) for i in range(job.n)]

    async def generate(self, model, request):
        self.calls += 1
        _wire(model, request.prompt, request.voice, json.dumps(request.messages, ensure_ascii=False))
        source = json.dumps(_without_media(request.messages)) if request.messages is not None else request.prompt
        if len(source) > MAX_PROMPT_CHARS:
            raise InvalidRequestError(f"prompt has {len(source)} tokens; the context is {MAX_PROMPT_CHARS}")
        limit = max(1, min(int(request.sampling.get("max_tokens") or len(ANSWER)), len(ANSWER)))
        speaks = self.models[model].can_speak and "audio" in (request.modalities or ())
        for i, tok in enumerate(ANSWER[:limit]):
            await asyncio.sleep(0)
            last = i == limit - 1
            yield GenerationChunk(text=tok, finish_reason=("stop" if limit == len(ANSWER) else "length")
                                  if last else None, prompt_tokens=len(source) // 4, completion_tokens=i + 1)
            if speaks and last:
                yield GenerationChunk(audio=_noise(i, 300), sample_rate=22050, prompt_tokens=len(source) // 4,
                                      completion_tokens=i + 1)

    async def generate_video(self, model, job, request_id=""):
        self.calls += 1
        _wire(model, job.prompt, job.negative_prompt)
        for step in range(1, job.steps + 1):
            await asyncio.sleep(0)
            yield VideoEvent(step=step, total=job.steps)
        frames = np.random.default_rng(job.seed).integers(0, 256, (job.num_frames, job.height, job.width, 3),
                                                          dtype=np.uint8)
        yield VideoEvent(frames=frames, num_steps=job.steps, denoise_seconds=0.01)

    async def stage_statistics(self, models):
        return {}

    async def close(self):
        pass


def fake_app(storage_dir, **settings):
    """The real app (``create_app``) on :class:`FakeEngine`, with voice and video stores in
    ``storage_dir``; ``settings`` override ``openai_frontend.app.Settings`` fields."""
    from pathlib import Path

    from openai_frontend.app import Settings, create_app
    from openai_frontend.video_jobs import JobSettings
    from openai_frontend.voice_store import VoiceSettings

    storage = Path(storage_dir)
    return create_app(FakeEngine(), Settings(
        voices=VoiceSettings(storage_dir=storage / "voices", min_seconds=0.5, max_seconds=5.0,
                             max_upload_bytes=600_000),
        video=JobSettings(storage_dir=storage / "videos"), **settings))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--storage", required=True, help="folder for the voice and video stores")
    args = p.parse_args(argv)
    import uvicorn

    uvicorn.run(fake_app(args.storage), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

"""``EngineStub``: the base of the unit tests' fake engines.

Every method of ``openai_frontend.engine.Engine`` is there, so a fake that subclasses this and
overrides only what its test serves still satisfies the protocol (mypy checks this module and
``fake_engine.py``; ``test_frontend.py`` checks ``isinstance(fake, Engine)`` at run time). The
methods a fake does not override answer as a server without that model would.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

import numpy as np

from openai_frontend.engine import (
    AudioChunk,
    AudioGenerateEvent,
    AudioGenerateJob,
    Engine,
    GeneratedImage,
    GenerationChunk,
    GenerationRequest,
    ImageJob,
    ModelInfo,
    ModelNotFoundError,
    SpeechOptions,
    StageStatistics,
    VideoEvent,
    VideoJob,
)


def _missing(model: str) -> ModelNotFoundError:
    return ModelNotFoundError(f"The model '{model}' does not exist", param="model")


class EngineStub:
    """An engine serving no model: every call on a model raises ``ModelNotFoundError``."""

    async def is_live(self) -> bool:
        return True

    async def list_models(self) -> list[ModelInfo]:
        return []

    async def get_model(self, name: str) -> ModelInfo:
        raise _missing(name)

    async def synthesize(self, model: str, text: str, voice: str | None = None, speed: float | None = None,
                         options: SpeechOptions | None = None, paced: bool = False) -> AsyncGenerator[AudioChunk, None]:
        raise _missing(model)
        yield  # an async generator, as the protocol's callers iterate it

    async def generate_images(self, model: str, job: ImageJob) -> list[GeneratedImage]:
        raise _missing(model)

    async def generate(self, model: str, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        raise _missing(model)
        yield

    async def generate_video(self, model: str, job: VideoJob, request_id: str = "") -> AsyncGenerator[VideoEvent, None]:
        raise _missing(model)
        yield

    async def generate_audio(self, model: str, job: AudioGenerateJob) -> AsyncGenerator[AudioGenerateEvent, None]:
        raise _missing(model)
        yield

    async def transcribe(self, model: str, audio: np.ndarray, language: str | None = None, prompt: str | None = None,
                         task: str = "transcribe") -> AsyncGenerator[str, None]:
        raise _missing(model)
        yield

    async def voice_prompt(self, model: str, audio: np.ndarray, sample_rate: int, ref_text: str | None,
                           x_vector_only: bool) -> tuple[bytes, float]:
        raise _missing(model)

    def abort_inflight(self, models: list[str], dead_stage: str) -> int:
        return 0

    async def stage_statistics(self, models: list[str]) -> dict[str, StageStatistics]:
        return {}

    async def close(self) -> None:
        pass


def _satisfies_the_protocol(engine: EngineStub) -> Engine:
    return engine  # mypy: EngineStub is an Engine

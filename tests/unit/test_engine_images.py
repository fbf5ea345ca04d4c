"""TritonEngine.generate_images: n unary calls in flight at once; the first failure is raised and
cancels the others (gather + cancel, not asyncio.TaskGroup: the GPU image's Python is 3.10)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omni_triton.contracts import image as image_contract
from openai_frontend.engine import ImageJob, InferenceError, TritonEngine


class _Result:
    def as_numpy(self, name: str):
        return np.zeros((1, 4, 4, 3), np.uint8) if name == image_contract.IMAGE else None


def _engine(unary) -> TritonEngine:
    engine = TritonEngine("127.0.0.1:1")
    engine._unary = unary  # the gRPC call; everything around it is the real engine
    return engine


def test_all_images_in_flight_at_once_in_seed_order():
    running, peak = 0, 0

    async def unary(model, inputs, request_id):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return _Result()

    images = asyncio.run(_engine(unary).generate_images("qwen_image", ImageJob("p", 4, 4, 2, seed=7, n=3)))
    assert [im.seed for im in images] == [7, 8, 9] and peak == 3
    assert all(im.pixels.shape == (4, 4, 3) and im.steps == 2 for im in images)


def test_the_first_failure_is_raised_and_cancels_the_others():
    started, cancelled = [], []

    async def unary(model, inputs, request_id):
        i = int(request_id.rsplit("-", 1)[1])
        started.append(i)
        if i == 1:
            await asyncio.sleep(0)
            raise InferenceError("qwen_image: boom")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return _Result()

    async def main():
        with pytest.raises(InferenceError, match="boom"):
            await asyncio.wait_for(_engine(unary).generate_images("qwen_image", ImageJob("p", 4, 4, 2, 7, n=3)), 5)
        # before asyncio.run's own shutdown would cancel leftovers: the others are cancelled already
        assert sorted(started) == [0, 1, 2] and sorted(cancelled) == [0, 2]

    asyncio.run(main())


def test_each_step_compute_is_read_per_image():
    """The ensemble's ``<STEP>_COMPUTE_MS`` outputs become ``GeneratedImage.stage_compute_ms``
    (each image its own: seed 7 took 7 ms in the denoiser, seed 8 8 ms) with the call's wall time."""
    import dataclasses

    from omni_triton.contracts.tensors import step_compute_output
    from openai_frontend.engine.model_info import ModelInfo

    steps = ("qwen_image_text_encoder", "qwen_image_denoiser", "qwen_image_vae_decoder")

    class Timed(_Result):
        def __init__(self, seed):
            self.seed = seed

        def as_numpy(self, name):
            if name == step_compute_output("qwen_image_denoiser"):
                return np.array([[float(self.seed)]], np.float32)
            if name == step_compute_output("qwen_image_text_encoder"):
                return np.array([[1.5]], np.float32)
            return super().as_numpy(name)  # the decoder sent none: absent

    async def unary(model, inputs, request_id):
        return Timed(7 + int(request_id.rsplit("-", 1)[1]))

    engine = _engine(unary)
    fields = {f.name for f in dataclasses.fields(ModelInfo)}
    engine._config_cache["qwen_image"] = ModelInfo(**{k: v for k, v in {
        "name": "qwen_image", "state": "READY", "ensemble_steps": steps}.items() if k in fields})
    images = asyncio.run(engine.generate_images("qwen_image", ImageJob("p", 4, 4, 2, seed=7, n=2)))
    assert [im.stage_compute_ms for im in images] == [
        {"qwen_image_text_encoder": 1.5, "qwen_image_denoiser": 7.0},
        {"qwen_image_text_encoder": 1.5, "qwen_image_denoiser": 8.0}]
    assert all(im.wall_s > 0 for im in images)

"""``/v1/videos`` jobs and ``/v1/videos/sync`` against an in-process fake engine.

The fake implements ``generate_video`` (a step event per step, frames derived from the seed, a
counter of the steps it really ran); the routers, form parsing, job store (SQLite on a tmp
folder), runner, MP4 encoding and errors are the real ones. A "restart" is a second app on the
same storage folder after the first one's lifespan ended mid-job.
"""
from __future__ import annotations

import asyncio
import json
import sqlite3

import httpx
import numpy as np
import pytest

pytest.importorskip("av")

from engine_stub import EngineStub

from omni_triton.media.video import decode_video
from openai_frontend.app import Settings, create_app
from openai_frontend.engine import (
    InvalidRequestError,
    ModelInfo,
    ModelNotFoundError,
    TritonUnavailableError,
    VideoEvent,
)
from openai_frontend.video_jobs import JobSettings

pytestmark = pytest.mark.anyio

PARAMS = {"task": "text-to-video", "size_multiple": "16", "max_size": "64", "frame_multiple": "4",
          "default_frames": "9", "max_frames": "17", "default_fps": "8", "max_fps": "30", "default_steps": "4",
          "max_steps": "20", "default_guidance_scale": "4.0"}
T2V = ModelInfo(name="wan_t2v", inputs=frozenset({"PROMPT", "NEGATIVE_PROMPT", "HEIGHT", "WIDTH", "NUM_FRAMES",
                                                  "NUM_INFERENCE_STEPS", "GUIDANCE_SCALE", "SEED"}),
                outputs=frozenset({"STEP", "TOTAL_STEPS", "VIDEO", "NUM_STEPS", "DENOISE_SECONDS"}),
                decoupled=True, default_size=(32, 32), parameters=PARAMS)


def frames_for(seed, n, h, w):
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


class FakeVideoEngine(EngineStub):
    def __init__(self, step_s=0.01, fail: Exception | None = None):
        self.step_s = step_s
        self.fail = fail
        self.jobs = []
        self.steps_run = 0
        self.cancelled = 0
        self.gate: asyncio.Event | None = None  # when set: every step waits on it

    async def list_models(self):
        return [T2V]

    async def get_model(self, name):
        if name != T2V.name:
            raise ModelNotFoundError(f"The model '{name}' does not exist", param="model")
        return T2V

    async def generate_video(self, model, job, request_id=""):
        self.jobs.append(job)
        if self.fail is not None:
            raise self.fail
        try:
            for step in range(1, job.steps + 1):
                if self.gate is not None:
                    await self.gate.wait()
                await asyncio.sleep(self.step_s)
                self.steps_run += 1
                yield VideoEvent(step=step, total=job.steps)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        except GeneratorExit:
            self.cancelled += 1
            raise
        yield VideoEvent(frames=frames_for(job.seed, job.num_frames, job.height, job.width), num_steps=job.steps,
                         denoise_seconds=0.1)

    async def is_live(self):
        return True

    async def close(self):
        pass


@pytest.fixture
def anyio_backend():
    return "asyncio"


class Server:
    """One app (with its lifespan running) on ``storage``."""

    def __init__(self, engine, storage, **job_settings):
        job_settings.setdefault("sweep_interval_s", 3600)
        self.app = create_app(engine, Settings(video=JobSettings(storage_dir=storage, **job_settings)))
        self.engine = engine

    async def __aenter__(self):
        self._life = self.app.router.lifespan_context(self.app)
        await self._life.__aenter__()
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://test")
        return self.client

    async def __aexit__(self, *exc):
        await self.client.aclose()
        await self._life.__aexit__(None, None, None)


async def wait_status(c, vid, statuses=("completed", "failed"), timeout=20.0):
    seen = []
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        r = await c.get(f"/v1/videos/{vid}")
        assert r.status_code == 200, r.text
        body = r.json()
        seen.append(body["progress"])
        if body["status"] in statuses:
            return body, seen
        assert loop.time() < end, f"job {vid} still {body['status']}"
        await asyncio.sleep(0.01)


async def wait_engine_jobs(engine, n=1, timeout=20.0):
    """Until ``n`` jobs reached the engine (a claimed job is ``in_progress`` in the store a moment
    before its runner task calls the engine: the claim commits in a worker thread)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while len(engine.jobs) < n:
        assert loop.time() < end, f"{len(engine.jobs)} of {n} jobs reached the engine"
        await asyncio.sleep(0.01)


def assert_error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err


async def test_create_poll_download(tmp_path):
    engine = FakeVideoEngine()
    async with Server(engine, tmp_path) as c:
        r = await c.post("/v1/videos", data={"prompt": "a cat", "model": "wan_t2v", "size": "48x32",
                                             "seconds": "1", "fps": "8", "seed": "5", "num_inference_steps": "6"})
        assert r.status_code == 200, r.text
        job = r.json()
        assert job["object"] == "video" and job["status"] == "queued" and job["progress"] == 0
        assert job["size"] == "48x32" and job["seconds"] == "1" and job["model"] == "wan_t2v"
        done, seen = await wait_status(c, job["id"])
        assert done["status"] == "completed" and done["progress"] == 100 and done["completed_at"]
        assert seen == sorted(seen)
        content = await c.get(f"/v1/videos/{job['id']}/content")
        assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"
        video = decode_video(content.content)
        # 1 s at 8 fps = 8 frames in the MP4 (the model made 9 = 4k+1)
        assert engine.jobs[0].num_frames == 9 and video.frames.shape == (8, 32, 48, 3)
        assert video.fps == 8 and video.duration_s == pytest.approx(1.0)
        assert engine.jobs[0].seed == 5 and engine.jobs[0].steps == 6
    # the MP4 is in the storage folder, written whole (no temp left)
    assert sorted(p.name for p in (tmp_path / "videos").iterdir()) == [f"{job['id']}.mp4"]


async def test_progress_rises_with_the_steps(tmp_path):
    engine = FakeVideoEngine()
    engine.gate = asyncio.Event()
    async with Server(engine, tmp_path) as c:
        vid = (await c.post("/v1/videos", data={"prompt": "a cat", "num_inference_steps": "10"})).json()["id"]
        await wait_engine_jobs(engine)  # claimed and running: now at the gate
        seen = []
        for _ in range(5):  # let one step through at a time
            engine.gate.set()
            await asyncio.sleep(0.002)
            engine.gate.clear()
            await asyncio.sleep(0.05)
            seen.append((await c.get(f"/v1/videos/{vid}")).json()["progress"])
        engine.gate.set()
        done, rest = await wait_status(c, vid)
    assert 0 < seen[0] < seen[-1] < 100, seen
    assert seen + rest == sorted(seen + rest) and done["progress"] == 100


async def test_list_limit_after_order(tmp_path):
    engine = FakeVideoEngine()
    async with Server(engine, tmp_path) as c:
        ids = [(await c.post("/v1/videos", data={"prompt": f"p{i}"})).json()["id"] for i in range(5)]
        page = (await c.get("/v1/videos", params={"limit": 2})).json()
        assert page["object"] == "list" and [v["id"] for v in page["data"]] == ids[::-1][:2] and page["has_more"]
        page2 = (await c.get("/v1/videos", params={"limit": 2, "after": page["last_id"]})).json()
        assert [v["id"] for v in page2["data"]] == ids[::-1][2:4]
        asc = (await c.get("/v1/videos", params={"order": "asc", "limit": 10})).json()
        assert [v["id"] for v in asc["data"]] == ids and not asc["has_more"]
        assert_error(await c.get("/v1/videos", params={"after": "video_nope"}), 400, "after")
        assert_error(await c.get("/v1/videos", params={"limit": 0}), 400, "limit")
        assert_error(await c.get("/v1/videos", params={"order": "up"}), 400, "order")


async def test_delete_of_a_running_job_stops_it(tmp_path):
    engine = FakeVideoEngine(step_s=0.02)
    async with Server(engine, tmp_path) as c:
        vid = (await c.post("/v1/videos", data={"prompt": "a cat", "num_inference_steps": "20"})).json()["id"]
        await wait_status(c, vid, ("in_progress",))
        while engine.steps_run < 2:
            await asyncio.sleep(0.01)
        r = await c.delete(f"/v1/videos/{vid}")
        assert r.status_code == 200 and r.json() == {"id": vid, "object": "video.deleted", "deleted": True}
        ran = engine.steps_run
        await asyncio.sleep(0.2)
        assert engine.steps_run == ran < 20 and engine.cancelled == 1
        assert_error(await c.get(f"/v1/videos/{vid}"), 404, code="video_not_found")
        assert_error(await c.delete(f"/v1/videos/{vid}"), 404)
    assert not list((tmp_path / "videos").glob("*")) if (tmp_path / "videos").exists() else True


async def test_bounded_queue_answers_429_with_retry_after(tmp_path):
    engine = FakeVideoEngine()
    engine.gate = asyncio.Event()
    async with Server(engine, tmp_path, max_running=1, max_queued=2, retry_after_s=7) as c:
        first = (await c.post("/v1/videos", data={"prompt": "a"})).json()["id"]
        await wait_status(c, first, ("in_progress",))
        for _ in range(2):
            assert (await c.post("/v1/videos", data={"prompt": "b"})).status_code == 200
        r = await c.post("/v1/videos", data={"prompt": "c"})
        assert_error(r, 429, code="video_queue_full")
        assert r.headers["retry-after"] == "7"
        engine.gate.set()
        await wait_status(c, first)
        assert (await c.post("/v1/videos", data={"prompt": "d"})).status_code in (200, 429)


async def test_a_restart_resumes_the_job_with_its_seed(tmp_path):
    engine = FakeVideoEngine()
    engine.gate = asyncio.Event()
    async with Server(engine, tmp_path) as c:
        vid = (await c.post("/v1/videos", data={"prompt": "a cat"})).json()["id"]
        queued = (await c.post("/v1/videos", data={"prompt": "queued", "seed": "9"})).json()["id"]
        await wait_status(c, vid, ("in_progress",))
        await wait_engine_jobs(engine)
    # the first process is gone mid-job: both jobs are still in the store
    rows = dict(sqlite3.connect(tmp_path / "jobs.sqlite3").execute("SELECT id, status FROM jobs").fetchall())
    assert rows[vid] == "in_progress"
    second = FakeVideoEngine()
    async with Server(second, tmp_path) as c:
        done, _ = await wait_status(c, vid)
        assert done["status"] == "completed"
        assert (await wait_status(c, queued))[0]["status"] == "completed"
        assert (await c.get(f"/v1/videos/{vid}/content")).status_code == 200
    seeds = {j.prompt: j.seed for j in second.jobs}
    assert seeds["a cat"] == engine.jobs[0].seed and seeds["queued"] == 9


async def test_a_job_interrupted_too_often_fails_with_the_reason(tmp_path):
    for _ in range(2):
        engine = FakeVideoEngine()
        engine.gate = asyncio.Event()
        async with Server(engine, tmp_path, max_attempts=2) as c:
            if not (await c.get("/v1/videos")).json()["data"]:
                await c.post("/v1/videos", data={"prompt": "a cat"})
            vid = (await c.get("/v1/videos")).json()["data"][0]["id"]
            await wait_status(c, vid, ("in_progress",))
            await wait_engine_jobs(engine)  # running (not only claimed) when the process goes
    async with Server(FakeVideoEngine(), tmp_path, max_attempts=2) as c:
        body = (await c.get(f"/v1/videos/{vid}")).json()
    assert body["status"] == "failed" and body["error"]["code"] == "interrupted"
    assert "2 times" in body["error"]["message"]


async def test_an_mp4_written_before_the_crash_completes_its_job(tmp_path):
    engine = FakeVideoEngine()
    engine.gate = asyncio.Event()
    async with Server(engine, tmp_path) as c:
        vid = (await c.post("/v1/videos", data={"prompt": "a cat"})).json()["id"]
        await wait_status(c, vid, ("in_progress",))
        await wait_engine_jobs(engine)
    (tmp_path / "videos").mkdir(exist_ok=True)
    (tmp_path / "videos" / f"{vid}.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 finished before the crash")
    second = FakeVideoEngine()
    async with Server(second, tmp_path) as c:
        body = (await c.get(f"/v1/videos/{vid}")).json()
    assert body["status"] == "completed" and body["progress"] == 100 and not second.jobs


async def test_retention_expires_the_output_not_the_job(tmp_path):
    async with Server(FakeVideoEngine(), tmp_path, retention_s=2) as c:
        vid = (await c.post("/v1/videos", data={"prompt": "a cat"})).json()["id"]
        done, _ = await wait_status(c, vid)
        assert done["expires_at"] >= done["completed_at"]
        assert done["status"] == "completed"
        await asyncio.sleep(3.1)  # expires_at is in whole seconds
        body = (await c.get(f"/v1/videos/{vid}")).json()
        assert body["status"] == "expired" and body["error"]["code"] == "video_expired"
        assert_error(await c.get(f"/v1/videos/{vid}/content"), 410, code="video_expired")
    assert not (tmp_path / "videos" / f"{vid}.mp4").exists()


@pytest.mark.parametrize("fail,code", [(InvalidRequestError("bad embeddings"), "invalid_request"),
                                       (TritonUnavailableError("Triton is unavailable"), "generation_failed")])
async def test_engine_failures_fail_the_job_with_the_reason(tmp_path, fail, code):
    engine = FakeVideoEngine(fail=fail)
    async with Server(engine, tmp_path, max_attempts=2) as c:
        vid = (await c.post("/v1/videos", data={"prompt": "a cat"})).json()["id"]
        body, _ = await wait_status(c, vid, timeout=10)
    assert body["status"] == "failed" and body["error"]["code"] == code
    assert len(engine.jobs) == (1 if code == "invalid_request" else 2)  # unavailable: retried once


async def test_sync_returns_the_mp4(tmp_path):
    async with Server(FakeVideoEngine(), tmp_path) as c:
        r = await c.post("/v1/videos/sync", data={"prompt": "a cat", "num_frames": "5", "fps": "10", "size": "32x48"})
        assert r.status_code == 200 and r.headers["content-type"] == "video/mp4"
        video = decode_video(r.content)
        assert video.frames.shape == (5, 48, 32, 3) and video.fps == 10
        assert (await c.get("/v1/videos")).json()["data"] == []  # no job row


async def test_json_body_is_accepted(tmp_path):
    async with Server(FakeVideoEngine(), tmp_path) as c:
        r = await c.post("/v1/videos", content=json.dumps({"prompt": "a cat", "seconds": "1"}),
                         headers={"content-type": "application/json"})
        assert r.status_code == 200 and r.json()["seconds"] == "1"


BAD = [
    ({"size": "40x32"}, 400, "size"),  # not a multiple of 16
    ({"width": "80"}, 400, "width"),  # above max_size
    ({"size": "big"}, 400, "size"),
    ({"num_frames": "8"}, 400, "num_frames"),  # not 4k+1
    ({"num_frames": "21"}, 400, "num_frames"),  # above max_frames
    ({"seconds": "5", "fps": "8"}, 400, "seconds"),  # 40 frames > 17
    ({"seconds": "-1"}, 400, "seconds"),
    ({"seconds": "nan"}, 400, "seconds"),
    ({"num_inference_steps": "21"}, 400, "num_inference_steps"),
    ({"num_inference_steps": "1"}, 400, "num_inference_steps"),
    ({"fps": "120"}, 400, "fps"),
    ({"guidance_scale": "inf"}, 400, "guidance_scale"),
    ({"boundary_ratio": "1.5"}, 400, "boundary_ratio"),
    ({"seed": "-3"}, 400, "seed"),
    ({"model": "nope"}, 404, "model"),
    ({"unknown_field": "1"}, 400, "unknown_field"),
    ({"lora": "x"}, 400, "lora"),
]


@pytest.mark.parametrize("fields,status,param", BAD, ids=[str(b[0]) for b in BAD])
async def test_bad_input_is_an_openai_error(tmp_path, fields, status, param):
    engine = FakeVideoEngine()
    async with Server(engine, tmp_path) as c:
        r = await c.post("/v1/videos", data={"prompt": "a cat", **fields})
        assert_error(r, status, param)
        assert (await c.post("/v1/videos", data={"prompt": "a cat"})).status_code == 200  # still serving
    assert len(engine.jobs) <= 1


async def test_other_bad_requests(tmp_path):
    engine = FakeVideoEngine()
    engine.gate = asyncio.Event()
    async with Server(engine, tmp_path) as c:
        assert_error(await c.post("/v1/videos", data={"model": "wan_t2v"}), 400, "prompt")
        assert_error(await c.post("/v1/videos", data={"prompt": "   "}), 400, "prompt")
        assert_error(await c.post("/v1/videos", content=b"prompt", headers={"content-type": "text/plain"}), 400)
        assert_error(await c.post("/v1/videos", content=b"{", headers={"content-type": "application/json"}), 400)
        r = await c.post("/v1/videos", data={"prompt": "a cat"},
                         files={"input_reference": ("a.png", b"\x89PNG", "image/png")})
        assert_error(r, 400, "input_reference", "unsupported_input_reference")
        assert_error(await c.get("/v1/videos/video_nope"), 404, code="video_not_found")
        assert_error(await c.get("/v1/videos/video_nope/content"), 404)
        vid = (await c.post("/v1/videos", data={"prompt": "a cat"})).json()["id"]
        assert_error(await c.get(f"/v1/videos/{vid}/content"), 409, code="video_not_ready")
        assert_error(await c.get(f"/v1/videos/{vid}/content", params={"variant": "thumbnail"}), 400, "variant")
        engine.gate.set()
        await wait_status(c, vid)


async def test_a_stage_that_stops_answering_fails_the_job_as_stalled(tmp_path):
    """A stage that never answers again (seen once: a denoiser error after which the job stayed
    in_progress): after ``stall_timeout_s`` without an event the stream is cancelled (the
    denoiser stops) and the job fails with code ``stalled``, instead of running forever."""
    engine = FakeVideoEngine(step_s=0.01)
    engine.gate = asyncio.Event()  # every step waits on it: the stream hangs at its first step
    async with Server(engine, tmp_path, stall_timeout_s=0.3) as c:
        vid = (await c.post("/v1/videos", data={"prompt": "a cat", "num_inference_steps": "4"})).json()["id"]
        body, _ = await wait_status(c, vid, timeout=10)
    assert body["status"] == "failed" and body["error"]["code"] == "stalled", body
    assert "no progress" in body["error"]["message"] and engine.cancelled == 1 and engine.steps_run == 0

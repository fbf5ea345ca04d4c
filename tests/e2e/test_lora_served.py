"""End-to-end: per-request LoRA on the served Qwen-Image pipelines (docs/lora.md), through the
official OpenAI SDK (``extra_body={"lora": {...}}``) and the ``/v1/loras`` registry.

Parity reference, in this test process: a fresh diffusers pipeline on the same tiny weights with
``load_lora_weights`` + ``set_adapters`` and the same seed (a request alone in its batches:
bit-exact); requests batched with others within ``IMAGE_ATOL`` (tests/e2e/test_images.py).
Run with only the Qwen-Image models: ``OMNI_TRITON_E2E_MODELS=qwen_image,qwen_image_edit``.
"""
from __future__ import annotations

import base64
import io
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from omni_triton.checkpoints.qwen_image_lora import write_lora
from omni_triton.contracts import lora as cl
from omni_triton.paths import model_dir

pytestmark = pytest.mark.e2e

IMAGE_ATOL = 2
PROMPT = "a red fox in the snow"


def decode(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


@pytest.fixture(scope="module")
def sdk(stack):
    from openai import OpenAI

    return OpenAI(base_url=f"{stack.frontend_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def manifest(stack):
    """The module manifest the served denoiser wrote into the session's LoRA directory."""
    import json

    return json.loads(cl.manifest_file(Path(stack.lora_dir), "qwen_image_denoiser").read_text())["modules"]


@pytest.fixture(scope="module")
def adapters(stack, manifest, tmp_path_factory):
    """Three adapters registered through the API: two uploads (diffusers keys) and a PEFT folder
    by server-side path (lora_alpha = 2 r). ``{name: source file or folder}``."""
    src = tmp_path_factory.mktemp("lora-src")
    out = {"style-a": write_lora(src / "a.safetensors", manifest, seed=1, rank=4),
           "style-b": write_lora(src / "b.safetensors", manifest, seed=2, rank=8),
           "peft-c": write_lora(Path(stack.lora_sources) / "c", manifest, fmt="peft", seed=3, lora_alpha=8)}
    with httpx.Client(base_url=stack.frontend_url, timeout=60) as client:
        for name in ("style-a", "style-b"):
            r = client.post("/v1/loras", data={"name": name},
                            files={"file": (f"{name}.safetensors", out[name].read_bytes())})
            assert r.status_code == 200, r.text
        r = client.post("/v1/loras", json={"name": "peft-c", "path": str(out["peft-c"])})
        assert r.status_code == 200, r.text
    return out


@pytest.fixture(scope="module")
def reference():
    """``reference(kind, prompt, lora=(source, scale) | None, **kwargs)``: diffusers alone."""
    import torch

    from omni_triton.stages.qwen_image import load_pipeline, reference_images

    torch.set_num_threads(1)
    lock = threading.Lock()

    def run(kind: str, prompt: str, lora=None, **kwargs) -> np.ndarray:
        with lock:
            pipe = load_pipeline(model_dir(kind))  # fresh: no adapter of an earlier call
            if lora is not None:
                source, scale = lora
                if source.is_dir():  # PEFT folder: PEFT's own loading
                    import json

                    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict
                    from safetensors.torch import load_file

                    config = json.loads((source / "adapter_config.json").read_text())
                    inject_adapter_in_model(LoraConfig(r=config["r"], lora_alpha=config["lora_alpha"],
                                                       target_modules=config["target_modules"]), pipe.transformer)
                    sd = load_file(str(source / "adapter_model.safetensors"))
                    set_peft_model_state_dict(pipe.transformer, {k.removeprefix("base_model.model."): v
                                                                 for k, v in sd.items()})
                    assert scale == 1.0
                else:
                    pipe.load_lora_weights(str(source), adapter_name="ref")
                    pipe.set_adapters(["ref"], adapter_weights=[scale])
            return reference_images(pipe, prompt, **kwargs)

    return run


def generate(sdk, lora=None, seed=3, size="64x48", steps=2, prompt=PROMPT):
    extra = {"seed": seed, "num_inference_steps": steps}
    if lora is not None:
        extra["lora"] = lora
    r = sdk.images.generate(model="qwen_image", prompt=prompt, size=size, extra_body=extra)
    return decode(r.data[0].b64_json)


def test_registry_lists_the_adapters(stack, adapters):
    data = httpx.get(f"{stack.frontend_url}/v1/loras", timeout=10).json()["data"]
    assert [d["name"] for d in data] == ["style-a", "style-b", "peft-c"]
    assert [d["format"] for d in data] == ["diffusers", "diffusers", "peft"]
    for d in data:
        assert (Path(stack.lora_dir) / f"{d['id']}.safetensors").is_file()


@pytest.mark.parametrize("name,scale", [("style-a", 1.0), ("style-b", 0.6), ("peft-c", 1.0)])
def test_sdk_lora_alone_equals_diffusers(sdk, adapters, reference, name, scale):
    got = generate(sdk, {"name": name, "scale": scale})
    ref = reference("qwen-image-tiny", PROMPT, lora=(adapters[name], scale), height=48, width=64, steps=2, seed=3)
    np.testing.assert_array_equal(got, ref)
    base = reference("qwen-image-tiny", PROMPT, height=48, width=64, steps=2, seed=3)
    assert np.abs(got.astype(int) - base).max() > 0


def test_without_lora_stays_bit_exact(sdk, adapters, reference):
    generate(sdk, {"name": "style-a"})  # an adapter is loaded and was active
    np.testing.assert_array_equal(generate(sdk), reference("qwen-image-tiny", PROMPT, height=48, width=64,
                                                           steps=2, seed=3))


def test_edit_with_lora(sdk, adapters, reference):
    buf = io.BytesIO()
    cond = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8), "RGB")
    cond.save(buf, "PNG")
    r = sdk.images.edit(model="qwen_image_edit", image=("in.png", buf.getvalue(), "image/png"),
                        prompt="make the sky purple", size="32x32",
                        extra_body={"seed": 9, "lora": {"name": "style-b", "scale": 0.8}})
    ref = reference("qwen-image-edit-tiny", "make the sky purple", lora=(adapters["style-b"], 0.8),
                    height=32, width=32, steps=2, seed=9, image=cond)
    np.testing.assert_array_equal(decode(r.data[0].b64_json), ref)


def test_concurrent_mixed_adapters_each_get_their_own(sdk, adapters, reference):
    """Mixed adapters and scales in flight at once: each image is its own adapter's (batched only
    with requests of the same adapter and scale; a request batched with another adapter's would
    be far off its reference)."""
    plans = [None, {"name": "style-a"}, {"name": "style-b"}, {"name": "style-a", "scale": 0.5},
             {"name": "style-a"}, None, {"name": "style-b"}, {"name": "peft-c"}]
    with ThreadPoolExecutor(len(plans)) as pool:
        images = list(pool.map(lambda p: generate(sdk, p, seed=5), plans))
    for plan, got in zip(plans, images, strict=True):
        lora = None if plan is None else (adapters[plan["name"]], plan.get("scale", 1.0))
        ref = reference("qwen-image-tiny", PROMPT, lora=lora, height=48, width=64, steps=2, seed=5)
        assert np.abs(got.astype(int) - ref).max() <= IMAGE_ATOL, plan


def test_errors(stack, sdk, adapters, manifest, tmp_path):
    import openai

    with pytest.raises(openai.NotFoundError) as err:
        generate(sdk, {"name": "nope"})
    assert err.value.body["code"] == "lora_not_found"
    with pytest.raises(openai.BadRequestError) as err:
        generate(sdk, {"name": "style-a", "scale": 50})
    assert err.value.body["param"] == "lora.scale"
    with httpx.Client(base_url=stack.frontend_url, timeout=60) as client:
        r = client.post("/v1/loras", data={"name": "png"}, files={"file": ("x.safetensors", b"\x89PNG\r\n\x1a\n" * 4)})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_lora"
        r = client.post("/v1/loras", json={"name": "outside", "path": "/etc/passwd"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "lora_path_not_allowed"
        bad = write_lora(tmp_path / "bad.safetensors", {"proj_out": [32, 7]}, targets=("proj_out",))
        r = client.post("/v1/loras", data={"name": "bad"}, files={"file": ("bad.safetensors", bad.read_bytes())})
        assert r.status_code == 400 and r.json()["error"]["code"] == "lora_incompatible", r.text


def test_an_adapter_that_fails_in_the_stage_fails_only_its_requests(stack, sdk, adapters, reference):
    """A registered file changed on disk behind the registry's back: the denoiser re-hashes it,
    refuses it (400), and the requests batched beside it still get their images."""
    import openai

    with httpx.Client(base_url=stack.frontend_url, timeout=60) as client:
        data = adapters["style-a"].read_bytes()
        r = client.post("/v1/loras", data={"name": "doomed"},
                        files={"file": ("d.safetensors", data[:-4] + b"\0\0\0\1")})
        assert r.status_code == 200, r.text
        doomed = Path(stack.lora_dir) / f"{r.json()['id']}.safetensors"
    shutil.copyfile(adapters["style-b"], doomed)  # now its content does not match its id

    def one(plan):
        try:
            return generate(sdk, plan, seed=7)
        except openai.BadRequestError as exc:
            return exc

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, [{"name": "doomed"}, None, {"name": "style-a"}]))
    assert isinstance(results[0], openai.BadRequestError) and "does not match its id" in str(results[0])
    ref = reference("qwen-image-tiny", PROMPT, height=48, width=64, steps=2, seed=7)
    assert np.abs(results[1].astype(int) - ref).max() <= IMAGE_ATOL
    ref_a = reference("qwen-image-tiny", PROMPT, lora=(adapters["style-a"], 1.0), height=48, width=64, steps=2,
                      seed=7)
    assert np.abs(results[2].astype(int) - ref_a).max() <= IMAGE_ATOL


def test_delete_then_unknown(stack, sdk, adapters):
    import openai

    with httpx.Client(base_url=stack.frontend_url, timeout=60) as client:
        r = client.post("/v1/loras", data={"name": "temp"},
                        files={"file": ("t.safetensors", adapters["style-b"].read_bytes())})
        assert r.status_code == 200
        generate(sdk, {"name": "temp"})
        assert client.delete("/v1/loras/temp").json()["deleted"] is True
    with pytest.raises(openai.NotFoundError):
        generate(sdk, {"name": "temp"})


def test_triton_grpc_takes_only_an_id(stack, adapters, reference):
    """Straight to Triton: LORA_ID of a registered adapter equals the SDK path; anything that is
    not a 64-hex id (a path) is INVALID_ARG, never a file read."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from clients.image_grpc import generate as grpc_generate

    client = grpcclient.InferenceServerClient(stack.triton_grpc_url)
    lora_id = httpx.get(f"{stack.frontend_url}/v1/loras/style-a", timeout=10).json()["id"]
    pixels, _, _ = grpc_generate(client, "qwen_image", PROMPT, width=64, height=48, steps=2, seed=3,
                                 lora_id=lora_id, lora_scale=0.7)
    ref = reference("qwen-image-tiny", PROMPT, lora=(adapters["style-a"], 0.7), height=48, width=64, steps=2, seed=3)
    np.testing.assert_array_equal(pixels, ref)
    for bad in ("../../../../etc/passwd", "/etc/passwd", "A" * 64):
        with pytest.raises(InferenceServerException, match="LORA_ID must be 64 lowercase hex"):
            grpc_generate(client, "qwen_image", PROMPT, width=64, height=48, steps=2, seed=3, lora_id=bad)

"""LoRA registry and API (docs/lora.md), no Triton: the safetensors/format checks
(``omni_triton.contracts.lora``), the SQLite registry (``openai_frontend.lora_store``) and the
``/v1/loras`` routes plus the image requests' ``lora`` field against a fake engine.

Adapters are tiny random ones written with numpy (``omni_triton.checkpoints.qwen_image_lora``)
for a manifest shaped like the tiny Qwen-Image transformer (no torch needed here).
"""
from __future__ import annotations

import hashlib
import io
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from test_images_frontend import EDIT, SPEECH, T2I, FakeImageEngine, png_bytes

from omni_triton.checkpoints.qwen_image_lora import write_lora
from omni_triton.contracts import lora as cl
from openai_frontend.app import Settings
from openai_frontend.engine import ModelInfo
from openai_frontend.lora_store import (
    DuplicateLoraName,
    LoraNotFound,
    LoraPathRefused,
    LoraQuotaExceeded,
    LoraSettings,
    LoraStore,
)
from tests.helpers.frontend import frontend_client

#: shaped like the tiny Qwen-Image transformer's Linear layers (inner dim 32, 2 blocks)
MANIFEST = {f"transformer_blocks.{b}.attn.{m}": [32, 32] for b in (0, 1)
            for m in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out")}
MANIFEST["proj_out"] = [32, 16]


def header_of(path) -> cl.Header:
    with open(path, "rb") as f:
        return cl.read_header(f, os.path.getsize(path))


@pytest.fixture
def lora_file(tmp_path):
    return write_lora(tmp_path / "src" / "a.safetensors", MANIFEST, seed=1)


@pytest.fixture
def settings(tmp_path):
    d = tmp_path / "loras"
    manifest = cl.manifest_file(d, "qwen_image_denoiser")
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"model": "qwen_image_denoiser", "modules": MANIFEST}))
    return LoraSettings(directory=d, allowed_dirs=(tmp_path / "allowed",), max_upload_bytes=1 << 20, max_loras=3)


@pytest.fixture
def store(settings):
    s = LoraStore(settings)
    yield s
    s.close()


# --------------------------------------------------------------------------- header and format checks
def test_header_of_a_diffusers_lora(lora_file):
    info = cl.inspect(header_of(lora_file))
    assert info.format == cl.FORMAT_DIFFUSERS and info.rank == 4 and not info.needs_rewrite
    assert info.modules["transformer_blocks.0.attn.to_q"] == (4, 32, 32)
    cl.check_against(info.modules, MANIFEST)


@pytest.mark.parametrize("cut", [1, 7, 40, -1, -100])
def test_truncated_or_short_files_are_refused(lora_file, tmp_path, cut):
    data = lora_file.read_bytes()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(data[:cut])
    with pytest.raises(cl.LoraFileError):
        header_of(bad)


@pytest.mark.parametrize("data", [b"PK\x03\x04" + b"\0" * 100, b"\x10\0\0\0\0\0\0\0{not json}......",
                                  b"\x02\0\0\0\0\0\0\0[]", (2**40).to_bytes(8, "little") + b"{}"])
def test_not_safetensors_is_refused(tmp_path, data):
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(data)
    with pytest.raises(cl.LoraFileError, match="safetensors"):
        header_of(bad)


def test_overlapping_offsets_and_trailing_bytes_are_refused(lora_file, tmp_path):
    header = header_of(lora_file)
    first = next(iter(header.tensors))
    entries = dict(header.tensors)
    e = entries[first]
    entries[first] = cl.TensorEntry(e.dtype, e.shape, e.begin + 4, e.end + 4)
    raw = cl.serialized_header(entries, {}, {})
    bad = tmp_path / "overlap.safetensors"
    bad.write_bytes(raw + lora_file.read_bytes()[header.data_start:])
    with pytest.raises(cl.LoraFileError):
        header_of(bad)
    trailing = tmp_path / "trailing.safetensors"
    trailing.write_bytes(lora_file.read_bytes() + b"\0" * 8)
    with pytest.raises(cl.LoraFileError, match="truncated or has trailing"):
        header_of(trailing)


def write(tmp_path, tensors: dict[str, np.ndarray], name="t.safetensors"):
    path = tmp_path / name
    save_file(tensors, str(path))
    return path


@pytest.mark.parametrize("tensors,match,code", [
    ({"lora_unet_x.lora_down.weight": np.zeros((4, 32), np.float32)}, "unsupported LoRA key",
     "unsupported_lora_format"),
    ({"transformer.proj_out.lora_A.weight": np.zeros((4, 32), np.float32),
      "transformer.proj_out.alpha": np.zeros((), np.float32)}, "unsupported LoRA key", "unsupported_lora_format"),
    ({"transformer.proj_out.lora_A.weight": np.zeros((4, 32), np.float32)}, "not both", "invalid_lora"),
    ({"transformer.proj_out.lora_A.weight": np.zeros((4, 32), np.float32),
      "transformer.proj_out.lora_B.weight": np.zeros((16, 8), np.float32)}, "rank mismatch", "invalid_lora"),
    ({"transformer.proj_out.lora_A.weight": np.zeros((4, 32), np.float32),
      "base_model.model.proj_out.lora_B.weight": np.zeros((16, 4), np.float32)}, "mixes", "unsupported_lora_format"),
    ({"transformer.proj_out.lora_A.weight": np.zeros((4, 32), np.int32),
      "transformer.proj_out.lora_B.weight": np.zeros((16, 4), np.int32)}, "dtype", "invalid_lora"),
])
def test_format_errors(tmp_path, tensors, match, code):
    with pytest.raises(cl.LoraFileError, match=match) as err:
        cl.inspect(header_of(write(tmp_path, tensors)))
    assert err.value.code == code


@pytest.mark.parametrize("module,shape,match", [
    ("transformer_blocks.9.attn.to_q", ((4, 32), (32, 4)), "does not have"),
    ("proj_out", ((4, 32), (8, 4)), "32->8"),
])
def test_keys_or_shapes_that_do_not_match_the_model(tmp_path, module, shape, match):
    path = write(tmp_path, {f"transformer.{module}.lora_A.weight": np.zeros(shape[0], np.float32),
                            f"transformer.{module}.lora_B.weight": np.zeros(shape[1], np.float32)})
    info = cl.inspect(header_of(path))
    with pytest.raises(cl.LoraFileError, match=match) as err:
        cl.check_against(info.modules, MANIFEST)
    assert err.value.code == "lora_incompatible"


def test_rank_limit(lora_file):
    with pytest.raises(cl.LoraFileError, match="at most 2"):
        cl.inspect(header_of(lora_file), max_rank=2)


def test_peft_keys_are_renamed_and_alpha_kept_as_diffusers_metadata(tmp_path):
    folder = write_lora(tmp_path / "peft", MANIFEST, fmt="peft", rank=4, lora_alpha=8)
    src = folder / "adapter_model.safetensors"
    header = header_of(src)
    config = json.loads((folder / "adapter_config.json").read_text())
    info = cl.inspect(header, adapter_config=config)
    out = tmp_path / "canonical.safetensors"
    with open(src, "rb") as f, open(out, "wb") as g:
        cl.write_canonical(f, g, header, info)
    before, after = load_file(str(src)), load_file(str(out))
    assert set(after) == {k.replace("base_model.model.", "transformer.") for k in before}
    for k, v in before.items():
        np.testing.assert_array_equal(after[k.replace("base_model.model.", "transformer.")], v)
    meta = json.loads(header_of(out).metadata[cl.DIFFUSERS_METADATA_KEY])
    assert meta["transformer.r"] == 4 and meta["transformer.lora_alpha"] == 8
    # alpha == r: no metadata needed (diffusers' default)
    assert cl.inspect(header, adapter_config={**config, "lora_alpha": 4}).metadata == {}
    with pytest.raises(cl.LoraFileError, match="r=8"):
        cl.inspect(header, adapter_config={**config, "r": 8})


def test_ids_and_scales():
    assert cl.check_id("a" * 64)
    for bad in ("A" * 64, "a" * 63, "../" + "a" * 61, ""):
        with pytest.raises(cl.LoraFileError):
            cl.check_id(bad)
    with pytest.raises(cl.LoraFileError):
        cl.check_scale(float("nan"))
    with pytest.raises(cl.LoraFileError):
        cl.check_scale(9.0)


# --------------------------------------------------------------------------- registry
def test_register_list_get_delete_and_restart(settings, lora_file):
    store = LoraStore(settings)
    with open(lora_file, "rb") as f:
        a = store.register_upload("style-a", f, lora_file.stat().st_size)
    assert a.id == hashlib.sha256(lora_file.read_bytes()).hexdigest()  # diffusers files are kept as they are
    assert cl.adapter_file(settings.directory, a.id).read_bytes() == lora_file.read_bytes()
    with open(lora_file, "rb") as f:  # same bytes, second name: one file
        b = store.register_upload("style-b", f, lora_file.stat().st_size)
    assert b.id == a.id
    with pytest.raises(DuplicateLoraName), open(lora_file, "rb") as f:
        store.register_upload("style-a", f, lora_file.stat().st_size)
    store.close()
    store = LoraStore(settings)  # a restart keeps everything
    assert [x.name for x in store.list_all()] == ["style-a", "style-b"]
    store.delete("style-a")
    assert cl.adapter_file(settings.directory, a.id).exists()  # style-b still uses it
    store.delete("style-b")
    assert not cl.adapter_file(settings.directory, a.id).exists()
    with pytest.raises(LoraNotFound):
        store.get("style-a")
    store.close()


def test_register_by_path_only_under_the_allow_list(settings, store, tmp_path):
    allowed = tmp_path / "allowed"
    inside = write_lora(allowed / "x.safetensors", MANIFEST, seed=2)
    peft = write_lora(allowed / "peft", MANIFEST, fmt="peft", seed=3, lora_alpha=2)
    outside = write_lora(tmp_path / "elsewhere" / "y.safetensors", MANIFEST, seed=4)
    assert store.register_path("x", str(inside)).source == "path"
    got = store.register_path("p", str(peft))
    assert got.format == "peft" and cl.DIFFUSERS_METADATA_KEY in header_of(
        cl.adapter_file(settings.directory, got.id)).metadata
    (allowed / "link.safetensors").symlink_to(outside)
    for path in (str(outside), str(allowed / ".." / "elsewhere" / "y.safetensors"), str(allowed / "link.safetensors"),
                 "/etc/passwd", str(allowed)):
        with pytest.raises((LoraPathRefused, cl.LoraFileError)):
            store.register_path("z", path)
    assert [x.name for x in store.list_all()] == ["x", "p"]


def test_a_model_mismatch_is_refused_at_registration(store, tmp_path):
    path = write(tmp_path, {"transformer.proj_out.lora_A.weight": np.zeros((4, 32), np.float32),
                            "transformer.proj_out.lora_B.weight": np.zeros((8, 4), np.float32)})
    with pytest.raises(cl.LoraFileError) as err, open(path, "rb") as f:
        store.register_upload("bad", f, path.stat().st_size)
    assert err.value.code == "lora_incompatible"
    assert store.list_all() == [] and not list(store.directory.glob("*.safetensors"))


def test_quota(store, tmp_path):
    for i in range(3):
        p = write_lora(tmp_path / f"{i}.safetensors", MANIFEST, seed=10 + i)
        with open(p, "rb") as f:
            store.register_upload(f"n{i}", f, p.stat().st_size)
    with pytest.raises(LoraQuotaExceeded), open(p, "rb") as f:
        store.register_upload("n3", f, p.stat().st_size)


# --------------------------------------------------------------------------- API
LORA_T2I = ModelInfo(**{**T2I.__dict__, "inputs": T2I.inputs | {"LORA_ID", "LORA_SCALE"}})


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def engine():
    return FakeImageEngine((LORA_T2I, EDIT, SPEECH))


def upload(client, name, data, **extra):
    files = {"file": ("a.safetensors", data, "application/octet-stream")}
    return client.post("/v1/loras", data={"name": name, **extra}, files=files)


@pytest.mark.anyio
async def test_api_register_select_and_delete(engine, settings, lora_file):
    async with frontend_client(engine, Settings(loras=settings)) as client:
        r = await upload(client, "style", lora_file.read_bytes())
        assert r.status_code == 200, r.text
        lora = r.json()
        assert lora["object"] == "lora" and lora["name"] == "style" and lora["rank"] == 4
        assert (await client.get("/v1/loras")).json()["data"][0]["id"] == lora["id"]
        assert (await client.get("/v1/loras/style")).json()["id"] == lora["id"]
        r = await client.post("/v1/images/generations",
                              json={"prompt": "a fox", "lora": {"name": "style", "scale": 0.5}})
        assert r.status_code == 200, r.text
        job = engine.jobs[-1][1]
        assert job.lora_id == lora["id"] and job.lora_scale == 0.5
        r = await client.post("/v1/images/generations", json={"prompt": "a fox"})
        assert r.status_code == 200 and engine.jobs[-1][1].lora_id is None
        r = await client.delete("/v1/loras/style")
        assert r.json() == {"object": "lora.deleted", "name": "style", "id": lora["id"], "deleted": True}
        r = await client.post("/v1/images/generations", json={"prompt": "a fox", "lora": {"name": "style"}})
        assert r.status_code == 404 and r.json()["error"]["code"] == "lora_not_found"
        assert r.json()["error"]["param"] == "lora.name"
        assert (await client.get("/v1/loras/style")).status_code == 404


@pytest.mark.anyio
@pytest.mark.parametrize("lora,status,param", [
    ({"name": "style", "scale": 100}, 400, "lora.scale"),
    ({"name": "style", "scale": "1"}, 400, "lora.scale"),
    ({"scale": 1}, 400, "lora.name"),
    ({"name": "style", "path": "/etc/passwd"}, 400, "lora.path"),
    ({"name": "style", "bogus": 1}, 400, "lora.bogus"),
    ("style", 400, "lora"),
])
async def test_api_bad_selection(engine, settings, lora_file, lora, status, param):
    async with frontend_client(engine, Settings(loras=settings)) as client:
        assert (await upload(client, "style", lora_file.read_bytes())).status_code == 200
        r = await client.post("/v1/images/generations", json={"prompt": "a fox", "lora": lora})
        assert r.status_code == status and r.json()["error"]["param"] == param, r.text
        assert not engine.jobs


@pytest.mark.anyio
async def test_api_model_without_lora_inputs_refuses(engine, settings, lora_file):
    async with frontend_client(engine, Settings(loras=settings)) as client:
        await upload(client, "style", lora_file.read_bytes())
        r = await client.post("/v1/images/edits", data={"prompt": "x", "lora[name]": "style"},
                              files={"image": ("i.png", png_bytes(), "image/png")})
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_parameter"


@pytest.mark.anyio
async def test_api_edit_form_takes_the_sdk_bracket_fields(settings, lora_file):
    edit = ModelInfo(**{**EDIT.__dict__, "inputs": EDIT.inputs | {"LORA_ID", "LORA_SCALE"}})
    engine = FakeImageEngine((LORA_T2I, edit, SPEECH))
    async with frontend_client(engine, Settings(loras=settings)) as client:
        lora = (await upload(client, "style", lora_file.read_bytes())).json()
        r = await client.post("/v1/images/edits", data={"prompt": "x", "lora[name]": "style", "lora[scale]": "0.25"},
                              files={"image": ("i.png", png_bytes(), "image/png")})
        assert r.status_code == 200, r.text
        assert engine.jobs[-1][1].lora_id == lora["id"] and engine.jobs[-1][1].lora_scale == 0.25
        r = await client.post("/v1/images/edits", data={"prompt": "x", "lora": json.dumps({"name": "style"})},
                              files={"image": ("i.png", png_bytes(), "image/png")})
        assert r.status_code == 200 and engine.jobs[-1][1].lora_scale == 1.0


@pytest.mark.anyio
async def test_api_registration_errors(engine, settings, lora_file, tmp_path):
    async with frontend_client(engine, Settings(loras=settings)) as client:
        data = lora_file.read_bytes()
        assert (await upload(client, "style", data)).status_code == 200
        r = await upload(client, "style", data)
        assert r.status_code == 409 and r.json()["error"]["code"] == "lora_exists"
        r = await upload(client, "cut", data[:-10])
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_lora"
        r = await upload(client, "png", png_bytes())
        assert r.status_code == 400 and "safetensors" in r.json()["error"]["message"]
        r = await upload(client, "../x", data)  # the name is at fault, not the file (trial of issue 27)
        assert r.status_code == 400 and r.json()["error"]["param"] == "name"
        assert r.json()["error"]["code"] == "invalid_lora_name"
        big = io.BytesIO(b"\0" * ((1 << 20) + 1))
        r = await client.post("/v1/loras", data={"name": "big"}, files={"file": ("b.safetensors", big)})
        assert r.status_code == 413
        r = await client.post("/v1/loras", json={"name": "p", "path": "/etc/passwd"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "lora_path_not_allowed"
        r = await client.post("/v1/load_lora_adapter", json={"lora_name": "p", "lora_path": str(lora_file)})
        assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path"
        assert [x["name"] for x in (await client.get("/v1/loras")).json()["data"]] == ["style"]


@pytest.mark.anyio
async def test_api_vllm_load_and_unload(engine, settings, tmp_path):
    src = write_lora(tmp_path / "allowed" / "v.safetensors", MANIFEST, seed=9)
    async with frontend_client(engine, Settings(loras=settings)) as client:
        r = await client.post("/v1/load_lora_adapter", json={"lora_name": "v", "lora_path": str(src)})
        assert r.status_code == 200 and "added successfully" in r.text
        assert (await client.get("/v1/loras/v")).json()["path"] == str(src)
        r = await client.post("/v1/unload_lora_adapter", json={"lora_name": "v"})
        assert r.status_code == 200 and "removed" in r.text
        r = await client.post("/v1/unload_lora_adapter", json={"lora_name": "v"})
        assert r.status_code == 404


@pytest.mark.anyio
async def test_lora_upload_body_cap_is_its_own(engine, settings, lora_file):
    """The global 16 MiB body cap does not apply to POST /v1/loras; its own bound does."""
    async with frontend_client(engine, Settings(loras=settings, max_body_bytes=1024)) as client:
        assert (await upload(client, "style", lora_file.read_bytes())).status_code == 200
        r = await client.post("/v1/images/generations", content=b"{" + b" " * 2000 + b"}",
                              headers={"content-type": "application/json"})
        assert r.status_code == 413


@pytest.mark.anyio
async def test_disabled(engine):
    async with frontend_client(engine, Settings()) as client:
        assert (await client.get("/v1/loras")).status_code == 404
        r = await client.post("/v1/images/generations", json={"prompt": "x", "lora": {"name": "a"}})
        assert r.status_code == 400 or r.status_code == 404


def test_start_removes_only_stale_upload_temp_files(settings):
    import time as _time

    settings.directory.mkdir(parents=True, exist_ok=True)
    old, young = settings.directory / ".upload-old", settings.directory / ".upload-young"
    old.write_bytes(b"x")
    young.write_bytes(b"y")
    past = _time.time() - 2 * 3600
    os.utime(old, (past, past))
    LoraStore(settings).close()
    assert not old.exists() and young.exists()  # another frontend may be writing the young one


def test_the_test_adapter_cli_reads_the_denoisers_manifest(tmp_path, monkeypatch, capsys):
    """``python -m omni_triton.checkpoints.qwen_image_lora OUT`` (docs/lora.md): an adapter that
    fits the manifest in the LoRA directory, and exit 1 naming the file when it is missing."""
    from safetensors.numpy import load_file

    from omni_triton.checkpoints import qwen_image_lora
    from omni_triton.contracts import lora as cl

    monkeypatch.setenv(cl.ENV, str(tmp_path / "loras"))
    assert qwen_image_lora.main([str(tmp_path / "x.safetensors")]) == 1
    assert "qwen_image_denoiser.json is missing" in capsys.readouterr().out
    manifest = cl.manifest_file(tmp_path / "loras", "qwen_image_denoiser")
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"model": "qwen_image_denoiser",
                                    "modules": {"transformer_blocks.0.attn.to_q": [32, 32]}}))
    assert qwen_image_lora.main([str(tmp_path / "x.safetensors"), "--rank", "2"]) == 0
    tensors = load_file(str(tmp_path / "x.safetensors"))
    assert tensors["transformer.transformer_blocks.0.attn.to_q.lora_A.weight"].shape == (2, 32)

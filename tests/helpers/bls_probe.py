"""What one BLS model's stub imports, outside Triton: ``python -m tests.helpers.bls_probe MODEL``
(from the repository root) loads the adapter class its ``1/model.py`` binds (with
``tests/unit/fake_pb_utils.py`` as ``triton_python_backend_utils``), runs ``initialize`` with the
parameters of its ``config.pbtxt``, then ``parse`` on a small valid request (``REQUESTS``) and
``generate`` up to its first call of another model (``stream_stage`` / ``call_stage``, wherever an
adapter module bound them, replaced by one that stops it), and prints one JSON object:
``{"model", "adapter", "first_call": the model generate called first (None: none), "modules":
[top-level module names in sys.modules]}``. ``tests/unit/test_bls_imports.py`` runs it for every
BLS model.

It runs in its own process because an import is for the life of a process: a test process has
torch already (other tests import it).
"""
from __future__ import annotations

import importlib
import json
import sys
from types import SimpleNamespace

import numpy as np

#: model -> the inputs of one valid request (BYTES as str); a BLS model missing here fails the probe
REQUESTS = {
    "csm": {"TEXT": "Hello there."},
    "llm_tts": {"MESSAGES": '[{"role": "user", "content": "Hi"}]', "MODALITIES": "[\"text\", \"audio\"]"},
    "qwen3_omni": {"MESSAGES": '[{"role": "user", "content": "Hi"}]', "MODALITIES": "[\"text\", \"audio\"]",
                   "ASYNC_CHUNK": False},
    "qwen2_5_omni": {"MESSAGES": '[{"role": "user", "content": "Hi"}]', "MODALITIES": "[\"text\", \"audio\"]"},
    "qwen3_tts": {"TEXT": "Hello there.", "TASK": "custom_voice"},
    "wan_t2v": {"PROMPT": "a cat", "HEIGHT": 16, "WIDTH": 16, "NUM_FRAMES": 5, "NUM_INFERENCE_STEPS": 2,
                "GUIDANCE_SCALE": 1.0, "SEED": 0},
    "wan_i2v": {"PROMPT": "a cat", "HEIGHT": 16, "WIDTH": 16, "NUM_FRAMES": 5, "NUM_INFERENCE_STEPS": 2,
                "GUIDANCE_SCALE": 1.0, "SEED": 0, "INPUT_IMAGE": np.zeros((16, 16, 3), np.uint8)},
    "whisper": {"AUDIO": np.zeros(16000, np.float32), "LANGUAGE": "en"},
    "stable_audio": {"PROMPT": "rain", "AUDIO_START_S": np.array([0.0]), "AUDIO_END_S": np.array([1.0]),
                     "NUM_INFERENCE_STEPS": 2, "GUIDANCE_SCALE": 7.0, "SEED": 0},
}


class _Stop(Exception):
    """Raised by the stand-in of the first call to another model."""


def _array(value) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, str):
        return np.array([value.encode()], dtype=object)
    if isinstance(value, bool):
        return np.array([value], dtype=bool)
    if isinstance(value, int):
        return np.array([value], dtype=np.int32)
    return np.array([value], dtype=np.float32)


def probe(model: str) -> dict:
    """Run the adapter of ``model`` as described in the module docstring; returns the JSON object.

    Raises:
        KeyError: ``model`` has no entry in ``REQUESTS``.
    """
    from tests.unit import fake_pb_utils as pb

    sys.modules.setdefault("triton_python_backend_utils", pb)
    from omni_triton.docs import model_rows
    from omni_triton.serve.repository import available_models, model_parameters

    row = next(r for r in model_rows() if r.name == model)
    module, name = row.adapter.rsplit(".", 1)
    adapter_module = importlib.import_module(module)
    params = model_parameters(available_models()[model])
    stage = getattr(adapter_module, name)()
    stage.initialize({"model_name": model, "model_instance_name": f"{model}_0",
                      "model_config": json.dumps({"parameters": {k: {"string_value": v} for k, v in params.items()}})})
    job = stage.parse(pb.FakeRequest({k: _array(v) for k, v in REQUESTS[model].items()}))

    called = []

    def stop(model_name, *args, **kwargs):
        called.append(model_name)
        raise _Stop

    from omni_triton.adapters import bls

    originals = (bls.stream_stage, bls.call_stage)
    for loaded in [m for n, m in sys.modules.items() if n.startswith("omni_triton.adapters")]:
        for helper in ("stream_stage", "call_stage"):
            if getattr(loaded, helper, None) in originals:
                setattr(loaded, helper, stop)
    stream = SimpleNamespace(cancelled=lambda: False, cancel_seen=False, paced=False)
    try:
        for _ in stage.generate(job, stream):
            pass
    except _Stop:
        pass
    return {"model": model, "adapter": row.adapter, "first_call": called[0] if called else None,
            "modules": sorted({m.split(".")[0] for m in sys.modules})}


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1])))

"""No BLS model imports torch (issue 28 item 3): an orchestrator only reads its inputs, calls
stages and forwards tensors, so each of its stub processes (one per instance: 8 ``qwen3_omni``,
4 ``llm_tts`` ...) stays at the size of a Python + numpy process (~20 MB PSS served) instead of
the 264-318 MB that torch + transformers cost it (their tokenizer / processor now run in the
thinker / llm stage, which has torch anyway).

For every model ``omni_triton.docs`` classifies as BLS (the request's entry point that calls other
models), ``tests/helpers/bls_probe.py`` runs, in a fresh process, the adapter class its
``1/model.py`` binds: ``initialize`` with its config's parameters, ``parse`` of a valid request and
``generate`` up to its first stage call; then torch, transformers (and the other heavy stacks)
must be absent from ``sys.modules``.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from omni_triton.docs import model_rows
from tests.helpers.bls_probe import REQUESTS

ROOT = Path(__file__).resolve().parents[2]
#: what an orchestrator must not import (each costs tens to hundreds of MB in every instance)
FORBIDDEN = ("torch", "transformers", "diffusers", "vllm", "torchaudio", "torchvision")
BLS = sorted(r.name for r in model_rows() if r.kind == "BLS")


def test_every_bls_model_is_probed():
    """A new BLS model needs a request in the probe (else it would escape this test)."""
    assert {"qwen3_omni", "qwen2_5_omni", "llm_tts", "csm", "qwen3_tts", "wan_t2v", "wan_i2v"} <= set(BLS)
    assert set(BLS) == set(REQUESTS), "add the new BLS model's request to tests/helpers/bls_probe.py"


@pytest.mark.parametrize("model", BLS)
def test_bls_stub_imports_no_torch(model):
    run = subprocess.run([sys.executable, "-m", "tests.helpers.bls_probe", model], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    probe = json.loads(run.stdout.strip().splitlines()[-1])
    assert probe["first_call"], f"{model}: generate never reached a stage call, the probe ran too little"
    heavy = [m for m in FORBIDDEN if m in probe["modules"]]
    assert not heavy, f"{model} ({probe['adapter']}) imports {heavy}: move that step into a stage"

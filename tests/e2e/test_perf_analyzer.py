"""End-to-end: a short, bounded perf_analyzer measurement (the glibc-2.38 wheel binary run by
``scripts/perf_runner.sh``'s trixie loader) against the served stack reports throughput and latency:
piper_tts (decoupled, ``--streaming``) and qwen_image_text_encoder (dynamically batched).
The first run builds the runner (about a minute; cached in ``$OMNI_TRITON_CACHE/perf-runner-*``).
No timing is asserted: only that figures were measured and exported.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from omni_triton.perf_data import CONTRACTS, QUICK_OPTIONS, perf_command, read_csv

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "perf_analyzer_configs"


@pytest.fixture(scope="module")
def perf_analyzer() -> str:
    out = subprocess.run(["bash", str(ROOT / "scripts" / "perf_runner.sh")], capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr
    return str(Path(out.stdout.strip()) / "bin" / "perf_analyzer")


@pytest.mark.parametrize("model", ["piper", "qwen_image_text_encoder"])
def test_perf_analyzer_reports_throughput_and_latency(stack, perf_analyzer, tmp_path, model):
    csv_path = tmp_path / f"{model}.csv"
    argv = perf_command(model, CONFIGS / model / "input_data.json", stack.triton_grpc_url,
                        perf_analyzer=perf_analyzer, extra=[*QUICK_OPTIONS, "-f", str(csv_path)],
                        admin_key=stack.admin_key)
    assert ("--streaming" in argv) == CONTRACTS[model].decoupled
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (row,) = read_csv(csv_path)
    assert row["Concurrency"] == 1
    assert row["Inferences/Second"] > 0
    assert 0 < row["p50 latency"] <= row["p99 latency"]
    # every request it sent succeeded (a rejected input would make perf_analyzer fail or count 0)
    assert "Successful request count" in out.stdout

"""perf_analyzer_configs/: every served model (model_repository/ and ensembles/) has an input data
file and a run script; each file is what omni_triton.perf_data generates and fits its model's
contract (every required input, no unknown one, datatype, rank and fixed dims); decoupled models
are measured with --streaming; the CSV export is read as numbers."""
import json
from pathlib import Path

import numpy as np
import pytest

from omni_triton import perf_data
from omni_triton.contracts.tensors import NUMPY_DTYPES

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "perf_analyzer_configs"
SERVED = sorted(p.parent.name for p in [*ROOT.glob("model_repository/*/config.pbtxt"),
                                        *ROOT.glob("ensembles/*/config.pbtxt")])
_PY_TYPES = {"BYTES": str, "BOOL": bool, "FP32": float, "FP64": float, "INT32": int, "INT64": int, "UINT8": int}


def test_every_served_model_has_data_and_a_run_script():
    assert sorted(perf_data.CONTRACTS) == SERVED
    for model in SERVED:
        assert (CONFIGS / model / "input_data.json").is_file(), model
        run = CONFIGS / model / "run.sh"
        assert run.is_file() and run.stat().st_mode & 0o111, model
        assert f" {model} " in run.read_text(), model


@pytest.mark.parametrize("model", SERVED)
def test_committed_data_is_generated(model, tmp_path):
    (path,) = perf_data.write_all(tmp_path, [model])
    assert json.loads((CONFIGS / model / "input_data.json").read_text()) == json.loads(path.read_text()), \
        "stale: python -m omni_triton.perf_data write perf_analyzer_configs"


@pytest.mark.parametrize("model", SERVED)
def test_data_fits_the_contract(model):
    contract = perf_data.CONTRACTS[model]
    (entry,) = json.loads((CONFIGS / model / "input_data.json").read_text())["data"]
    specs = {t.name: t for t in contract.inputs}
    assert set(entry) <= set(specs), set(entry) - set(specs)
    assert {t.name for t in contract.inputs if not t.optional} <= set(entry)
    for name, tensor in entry.items():
        spec, shape, content = specs[name], tensor["shape"], tensor["content"]
        assert len(shape) == len(spec.dims), (name, shape, spec.dims)
        assert all(d == -1 or d == s for d, s in zip(spec.dims, shape, strict=False)), (name, shape, spec.dims)
        assert len(content) == int(np.prod(shape)), name
        assert all(type(v) is _PY_TYPES[spec.datatype] or (spec.datatype == "FP32" and type(v) is int)
                   for v in content), (name, spec.datatype)
        np.asarray(content, dtype=NUMPY_DTYPES[spec.datatype] if spec.datatype != "BYTES" else object)


@pytest.mark.parametrize("model", SERVED)
def test_command_streams_exactly_the_decoupled_models(model):
    argv = perf_data.perf_command(model, Path("d.json"), "h:1", extra=["-f", "x.csv"])
    assert argv[:3] == ["perf_analyzer", "-m", model] and argv[-2:] == ["-f", "x.csv"]
    assert argv[argv.index("-i") + 1] == "grpc" and argv[argv.index("-u") + 1] == "h:1"
    assert ("--streaming" in argv) == perf_data.CONTRACTS[model].decoupled


def test_read_csv(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("Concurrency,Inferences/Second,p50 latency,p99 latency\n1,2.5,100,300\n")
    assert perf_data.read_csv(path) == [{"Concurrency": 1.0, "Inferences/Second": 2.5, "p50 latency": 100.0,
                                         "p99 latency": 300.0}]
    path.write_text("Concurrency,Inferences/Second\n")
    with pytest.raises(ValueError, match="no measurement row"):
        perf_data.read_csv(path)

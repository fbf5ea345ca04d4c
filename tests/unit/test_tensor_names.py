"""Tensor names are spelled only in ``omni_triton/contracts/`` and the ``config.pbtxt`` files
(issue 8): any other Python module of the project (frontend, clients, scripts, stages, adapters,
``model.py`` bindings) takes them from the contracts, so a renamed tensor cannot be missed.
Tests are exempt: they check the wire format with literals on purpose."""
import ast
from pathlib import Path

from omni_triton.contracts import CONTRACTS

ROOT = Path(__file__).resolve().parents[2]
TENSOR_NAMES = {t.name for c in CONTRACTS.values() for t in c.inputs + c.outputs}
#: Project code that may not spell a tensor name (``omni_triton/contracts`` and ``tests`` may).
CHECKED = ("openai_frontend", "clients", "scripts", "omni_triton", "model_repository")


def tensor_name_literals(source: str) -> list[tuple[int, str]]:
    """``(line, name)`` of every string constant in ``source`` that is exactly a tensor name."""
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in TENSOR_NAMES]


def test_the_check_finds_a_literal():
    assert tensor_name_literals('x = result.as_numpy("AUDIO")\n"""AUDIO out"""\n') == [(1, "AUDIO")]


def test_no_tensor_name_literals_outside_contracts():
    contracts = ROOT / "omni_triton" / "contracts"
    found = []
    for top in CHECKED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if contracts in path.parents:
                continue
            found += [f"{path.relative_to(ROOT)}:{line}: {name!r}"
                      for line, name in tensor_name_literals(path.read_text())]
    assert not found, "use the omni_triton.contracts constants instead:\n" + "\n".join(found)


#: The stage bases every family shares: they may use only the generic tensors of
#: ``omni_triton.contracts.tensors``; a family's tensors (CODES, DUE_MS ...) reach them through the
#: hooks the family adapter sets (``frames_output``, ``due_input``), issue 24.
GENERIC_BASES = ("stream.py", "batched.py", "batched_stream.py", "telemetry.py", "triton_io.py", "bls.py")


def contract_imports(source: str) -> set[str]:
    """The ``omni_triton.contracts`` modules ``source`` imports (``from omni_triton.contracts import x``
    counts as ``omni_triton.contracts.x``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("omni_triton.contracts"):
            found |= {node.module} if node.module != "omni_triton.contracts" else \
                {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("omni_triton.contracts")}
    return found


def test_the_generic_stage_bases_import_only_generic_tensors():
    assert contract_imports("from omni_triton.contracts import speech as sp\n") == {"omni_triton.contracts.speech"}
    adapters = ROOT / "omni_triton" / "adapters"
    family = {name: contract_imports((adapters / name).read_text()) - {"omni_triton.contracts.tensors"}
              for name in GENERIC_BASES}
    assert not any(family.values()), f"family contracts in a generic base: {family}"

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

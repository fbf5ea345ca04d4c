"""The test folders have no ``__init__.py``, so pytest imports each test file under its basename:
two files of one name (``tests/unit/test_voices.py`` and ``tests/e2e/test_voices.py``) stop the
whole run at collection ("import file mismatch"), which a run of one folder never shows."""
import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_basename():
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == "conftest.py":  # pytest registers each folder's conftest by its path
            continue
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(TESTS)} and {path.relative_to(TESTS)}")
        seen.setdefault(path.name, path)
    assert not clashes, "rename one of each: " + "; ".join(clashes)


def _marks_e2e(node: ast.AST) -> bool:
    """Whether ``pytestmark``'s value is ``pytest.mark.e2e`` or a list/tuple holding it."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_marks_e2e(elt) for elt in node.elts)
    return ast.unparse(node) == "pytest.mark.e2e"


def test_every_e2e_test_module_carries_the_e2e_marker():
    """``-m "not e2e"`` (a run without tritonserver) must deselect every test that starts or needs
    the real stack: each ``tests/e2e/test_*.py`` sets a module-level ``pytestmark`` with
    ``pytest.mark.e2e`` in it (issue 24: 6 files lacked it and ran in "unit-only" selections)."""
    unmarked = []
    for path in sorted((TESTS / "e2e").rglob("test_*.py")):  # tests/e2e/playground too
        tree = ast.parse(path.read_text(), filename=str(path))
        marks = [stmt.value for stmt in tree.body if isinstance(stmt, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets)]
        if not any(_marks_e2e(value) for value in marks):
            unmarked.append(path.name)
    assert not unmarked, f"add `pytestmark = pytest.mark.e2e` to: {unmarked}"


ROOT = TESTS.parent
HELPERS = TESTS / "helpers"


def _sources(*folders: Path):
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            if HELPERS not in path.parents and path != Path(__file__).resolve():
                yield path, path.read_text()


def test_shared_fixtures_and_parsers_live_in_one_place():
    """The fake Triton gRPC server (tests/helpers/fake_triton.py), the in-process frontend client
    (tests/helpers/frontend.py) and the Prometheus text reader (clients.bench_common.metric_total,
    prometheus_client's parser) each have one home; a copy elsewhere drifts from it (issue 24:
    the gRPC fake x3, the frontend set-up x5, the metrics readers x4)."""
    copies = []
    for path, text in _sources(TESTS, ROOT / "clients"):
        name = path.relative_to(ROOT)
        if "grpc.aio.server(" in text:
            copies.append(f"{name}: starts its own gRPC server (use tests.helpers.fake_triton)")
        if re.search(r"float\([^)]*\.rsplit\([\"'] [\"'], 1\)", text):
            copies.append(f"{name}: reads Prometheus text by hand (use clients.bench_common.metric_total)")
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("test_"):
                body = ast.unparse(node)
                if "create_app(" in body and "ASGITransport(" in body:
                    copies.append(f"{name}: {node.name}() builds a frontend client (use tests.helpers.frontend)")
    assert not copies, "\n".join(copies)

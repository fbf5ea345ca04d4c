"""The test folders have no ``__init__.py``, so pytest imports each test file under its basename:
two files of one name (``tests/unit/test_voices.py`` and ``tests/e2e/test_voices.py``) stop the
whole run at collection ("import file mismatch"), which a run of one folder never shows."""
import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_basename():
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted(TESTS.rglob("*.py")):
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
    for path in sorted((TESTS / "e2e").glob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        marks = [stmt.value for stmt in tree.body if isinstance(stmt, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets)]
        if not any(_marks_e2e(value) for value in marks):
            unmarked.append(path.name)
    assert not unmarked, f"add `pytestmark = pytest.mark.e2e` to: {unmarked}"

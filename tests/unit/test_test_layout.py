"""The test folders have no ``__init__.py``, so pytest imports each test file under its basename:
two files of one name (``tests/unit/test_voices.py`` and ``tests/e2e/test_voices.py``) stop the
whole run at collection ("import file mismatch"), which a run of one folder never shows."""
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

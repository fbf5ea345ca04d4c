"""docs/models.md's table is what the configs say (issue 24 item 6): a config change that is not
followed by ``python -m omni_triton.docs write`` fails here, so the docs' map of the models cannot
drift; the table covers every model folder of both repositories."""
from pathlib import Path

import pytest

from omni_triton import docs

ROOT = Path(__file__).resolve().parents[2]


def test_committed_model_table_is_generated():
    assert docs.MODELS_DOC.read_text() == docs.expected_models_doc(), \
        "stale: python -m omni_triton.docs write"


def test_the_table_covers_every_model_and_reads_kinds():
    rows = {r.name: r for r in docs.model_rows()}
    configs = [*ROOT.glob("model_repository/*/config.pbtxt"), *ROOT.glob("ensembles/*/config.pbtxt")]
    folders = {p.parent.name for p in configs}
    assert set(rows) == folders
    assert {r.kind for r in rows.values()} == {"ensemble", "BLS", "stage"}
    for row in rows.values():
        assert (row.kind == "ensemble") == (row.adapter == "")
        assert (row.kind == "BLS") <= bool(row.calls)


def test_a_config_change_makes_the_table_stale(tmp_path):
    repo = tmp_path / "model_repository"
    for name, count in (("a", 1), ("b", 2)):
        (repo / name).mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\ninstance_group [{{ count: {count} kind: KIND_CPU }}]\n'
            + ('parameters { key: "depends_on" value { string_value: "b" } }\n' if name == "a" else ""))
    doc = tmp_path / "models.md"
    doc.write_text(f"intro\n{docs.BEGIN}\nold\n{docs.END}\nend\n")
    fresh = docs.expected_models_doc(doc, [repo])
    assert "| a | BLS | no | 1 | - | `b` |" in fresh and "| b | stage | no | 2 |" in fresh
    doc.write_text(fresh)
    (repo / "b" / "config.pbtxt").write_text((repo / "b" / "config.pbtxt").read_text().replace("count: 2", "count: 3"))
    assert docs.expected_models_doc(doc, [repo]) != fresh
    with pytest.raises(ValueError, match="markers missing"):
        docs.replace_between_markers("no markers", "x")

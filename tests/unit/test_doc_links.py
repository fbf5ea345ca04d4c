"""The docs do not drift from the tree (issue 24 item 6): every relative link in ``README.md`` and
``docs/**/*.md`` points at a file or folder that exists, and every repository path the reference
docs (``README.md``, ``docs/*.md``; not the dated lab notes under ``docs/notes/``) spell in
backticks or name in prose (``omni_triton/...py``, ``scripts/...``, ``model_repository/<m>``) and
every ``python -m <module>`` they show resolves to a file of this checkout; and every
``doc.md "Section"`` citation (docs and code comments) names a heading or bold lead of that doc.

Placeholders (``<model>``, ``*``, ``{...}``, ``...``) are not paths and are skipped; so are paths
outside the repository (``~/.cache/...``, ``/dev/shm``) and build outputs (``.venv``)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Top-level entries a repository path in the docs starts with.
TOP = ("omni_triton/", "openai_frontend/", "clients/", "scripts/", "tests/", "docs/", "docker/",
       "deploy/", "kernels/", "model_repository/", "ensembles/", "perf_analyzer_configs/", ".ci/")
TOP_FILES = ("README.md", "pyproject.toml")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_BACKTICK = re.compile(r"`([^`\n]+)`")
_TOP = "|".join(re.escape(t) for t in TOP)
_BARE = re.compile(r"(?<![\w/.-])((?:" + _TOP + r")[\w./-]*\.(?:py|sh|md|json|pbtxt|yaml|yml|txt))")
_MODULE = re.compile(r"python3? -m ((?:omni_triton|openai_frontend|clients)(?:\.\w+)*)")
_PLACEHOLDER = re.compile(r"[<>*{}$]|\.\.\.")


def reference_docs() -> list[Path]:
    """README.md and docs/*.md: the docs whose code paths must exist."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def all_docs() -> list[Path]:
    """Every Markdown file whose relative links must resolve (lab notes included)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def broken_links(doc: Path, text: str) -> list[str]:
    """Relative link targets of ``text`` (a Markdown file at ``doc``) that do not exist."""
    out = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s):, mailto:, in-page anchors
        path = target.split("#", 1)[0]
        if not (doc.parent / path).exists():
            out.append(target)
    return out


def _candidate(token: str) -> str | None:
    """The repository path ``token`` names, or None when it names none (a command, a placeholder)."""
    token = token.strip().split()[0] if token.strip() else ""
    token = token.split("::", 1)[0].rstrip(".,;:)")
    token = re.sub(r":\d+(-\d+)?$", "", token)  # file.py:12 line references
    if not (token.startswith(TOP) or token in TOP_FILES) or _PLACEHOLDER.search(token):
        return None
    return token


def missing_paths(text: str) -> list[str]:
    """Repository paths and ``python -m`` modules named in ``text`` that do not exist under ROOT."""
    names = {c for c in map(_candidate, _BACKTICK.findall(text)) if c}
    names |= {c for c in map(_candidate, _BARE.findall(text)) if c}
    out = sorted(n for n in names if not (ROOT / n).exists())
    for module in sorted(set(_MODULE.findall(text))):
        base = ROOT / module.replace(".", "/")
        if not (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
            out.append(f"python -m {module}")
    return out


def test_the_checks_find_a_broken_link_and_a_moved_path(tmp_path):
    doc = tmp_path / "x.md"
    text = ("[ok](README.md) [gone](nowhere.md) [web](https://example.com) [here](#top) "
            "`omni_triton/triton_io.py` `omni_triton/adapters/triton_io.py` `model_repository/<model>/` "
            "see omni_triton/no_such_module.py; `python -m clients.no_such_client`")
    (tmp_path / "README.md").write_text("")
    assert broken_links(doc, text) == ["nowhere.md"]
    assert missing_paths(text) == ["omni_triton/no_such_module.py", "omni_triton/triton_io.py",
                                   "python -m clients.no_such_client"]


def test_every_relative_link_resolves():
    found = {str(d.relative_to(ROOT)): broken_links(d, d.read_text()) for d in all_docs()}
    assert not {k: v for k, v in found.items() if v}


def test_every_code_path_the_docs_name_exists():
    found = {str(d.relative_to(ROOT)): missing_paths(d.read_text()) for d in reference_docs()}
    assert not {k: v for k, v in found.items() if v}


#: Where a citation of a document outside the repository would send a reader nowhere.
CITING = ("omni_triton", "openai_frontend", "clients", "scripts", "model_repository", "ensembles", "docs", "docker")
_OUTSIDE_DOC = re.compile(r"DESIGN(?:\.md)? section \d")


def test_nothing_cites_the_design_brief_outside_the_repository():
    """The design brief (DESIGN.md) is not in the repository: comments cite
    ``docs/architecture.md "Environment facts"`` for its environment facts instead."""
    found = [f"{path.relative_to(ROOT)}:{n}" for top in CITING for path in sorted((ROOT / top).rglob("*"))
             if path.is_file() and path.suffix in (".py", ".md", ".pbtxt", ".sh")
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if _OUTSIDE_DOC.search(line)]
    found += [f"README.md:{n}" for n, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1)
              if _OUTSIDE_DOC.search(line)]
    assert not found


_SECTION_REF = re.compile(r'((?:[\w.-]+/)*[\w.-]+\.md)\)?,? "([^"\n]{3,80})"')
CODE = ("omni_triton", "openai_frontend", "clients", "scripts", "model_repository", "ensembles")


def _sections(doc: Path) -> list[str]:
    """Lower-cased headings and bold paragraph leads (``**Name**``/``- **Name**``) of ``doc``."""
    heads = []
    for line in doc.read_text().splitlines():
        if line.startswith("#"):
            heads.append(line.lstrip("#").strip().lower())
        elif (m := re.match(r"\s*(?:[-\d.]+\s+)?\*\*([^*]+)\*\*", line)):
            heads.append(m.group(1).lower())
    return heads


def missing_sections(where: Path, text: str) -> list[str]:
    """``doc.md "Section"`` references in ``text`` (a file at ``where``) whose doc has no heading
    or bold lead containing that name (case-insensitive). References to docs that cannot be
    found (another project's README) are left to the link check."""
    out = []
    for name, section in _SECTION_REF.findall(text):
        target = next((c for c in (where.parent / name, ROOT / name, ROOT / "docs" / name) if c.is_file()), None)
        if target is not None and not any(section.lower() in h for h in _sections(target)):
            out.append(f'{name} "{section}"')
    return out


def test_the_section_check_finds_a_renamed_section(tmp_path):
    (tmp_path / "a.md").write_text("# A\n## The knobs\n- **Pacing.** text\n")
    text = 'see a.md "The knobs", [a.md](a.md) "pacing" and a.md, "Old name"'
    assert missing_sections(tmp_path / "x.md", text) == ['a.md "Old name"']


def test_every_cited_doc_section_exists():
    files = reference_docs() + [p for top in CODE for p in sorted((ROOT / top).rglob("*"))
                                if p.is_file() and p.suffix in (".py", ".pbtxt", ".sh", ".md")]
    found = {str(f.relative_to(ROOT)): missing_sections(f, f.read_text(errors="replace")) for f in files}
    assert not {k: v for k, v in found.items() if v}


def test_the_readme_is_a_front_door():
    """At most 12 KB, and the two set-up commands come before any example (issue 24 item 6)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 12 * 1024
    first_example = text.index("## Use it")
    assert 0 < text.index("bash scripts/serve.sh\n") < first_example
    assert 0 < text.index("bash scripts/test.sh\n") < first_example

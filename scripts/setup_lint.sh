#!/usr/bin/env bash
# The lint environment (idempotent): ruff, mypy and import-linter, which tests/unit/test_lint.py runs
# over the tree, in $OMNI_TRITON_CACHE/lint-venv. A plain venv of its own, built from
# requirements-lint.lock with --no-deps and rebuilt only when that lock changes: the tools never
# import the project, and mypy reads the project's dependencies through --python-executable .venv/bin/python.
# OMNI_TRITON_SKIP_LINT_ENV=1 skips it (the lint test then skips).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OMNI_TRITON_CACHE="${OMNI_TRITON_CACHE:-$HOME/.cache/omni-triton}"
LINT="${OMNI_TRITON_LINT_VENV:-$OMNI_TRITON_CACHE/lint-venv}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
STAMP="$LINT/.omni-triton-lint-lock.sha256"
if [ "${OMNI_TRITON_SKIP_LINT_ENV:-0}" = "1" ]; then
  echo "setup: skipping the lint venv (OMNI_TRITON_SKIP_LINT_ENV=1)"; exit 0
fi
want="$( (cat "$ROOT/requirements-lint.lock"; "$PYTHON" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
if [ -x "$LINT/bin/ruff" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  echo "setup: reusing $LINT (requirements-lint.lock unchanged)"; exit 0
fi
echo "setup: creating $LINT from requirements-lint.lock (first run: under a minute)"
start=$(date +%s)
rm -rf "$LINT"
"$PYTHON" -m venv "$LINT"
"$LINT/bin/python" -m pip install --quiet --no-deps -r "$ROOT/requirements-lint.lock" \
  2> >(grep -v "^WARNING: Location 'file:" >&2)
"$LINT/bin/ruff" --version > /dev/null && "$LINT/bin/mypy" --version > /dev/null \
  && "$LINT/bin/lint-imports" --help > /dev/null  # the CLIs start
echo "$want" > "$STAMP"
echo "setup: $LINT ready in $(( $(date +%s) - start )) s"

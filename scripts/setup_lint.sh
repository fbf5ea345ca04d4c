#!/usr/bin/env bash
# The lint environment (idempotent): ruff, mypy and import-linter, which tests/unit/test_lint.py runs
# over the tree, in $OMNI_TRITON_CACHE/lint-venv (OMNI_TRITON_LINT_VENV overrides), from
# requirements-lint.lock: the tools never import the project, and mypy reads the project's
# dependencies through --python-executable .venv/bin/python.
# OMNI_TRITON_SKIP_LINT_ENV=1 skips it (the lint test then skips). How: scripts/setup_tool_venv.sh.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/setup_tool_venv.sh" lint requirements-lint.lock LINT ruff mypy lint-imports

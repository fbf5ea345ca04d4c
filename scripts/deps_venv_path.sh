#!/usr/bin/env bash
# Prints the path of the shared dependency venv of this checkout's requirements.lock and Python:
# $OMNI_TRITON_DEPS_VENV, else $OMNI_TRITON_CACHE/venv-<first 12 hex of sha256(lock + sys.version)>.
# One place for the name, read by scripts/setup.sh (which builds it) and scripts/setup_bench.sh
# (which builds the benchmark venv on top of it, from the test command or a benchmark command).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${OMNI_TRITON_CACHE:-$HOME/.cache/omni-triton}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
want="$( (cat "$ROOT/requirements.lock"; "$PYTHON" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
echo "${OMNI_TRITON_DEPS_VENV:-$CACHE/venv-${want:0:12}}"

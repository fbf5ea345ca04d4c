#!/usr/bin/env bash
# Idempotent set-up used by the README's two commands and by .ci/run:
#   1. a virtualenv (cached in $OMNI_TRITON_CACHE/venv, rebuilt only when requirements.lock changes),
#   2. the exact dependency set of requirements.lock, installed with --no-deps (see README "Pins"),
#   3. this checkout installed editable (cheap; re-pointed at whichever clone runs it),
#   4. the embedded default models prepared into $OMNI_TRITON_CACHE/models (skipped when present).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OMNI_TRITON_CACHE="${OMNI_TRITON_CACHE:-$HOME/.cache/omni-triton}"
VENV="${OMNI_TRITON_VENV:-$OMNI_TRITON_CACHE/venv}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
LOCK="$ROOT/requirements.lock"
STAMP="$VENV/.omni-triton-lock.sha256"
want="$( (cat "$LOCK"; "$PYTHON" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"

if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "setup: creating $VENV from requirements.lock (first run: a few minutes)"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade "pip>=24"
  # torch 2.13.0+cpu comes from the wheel on this machine's disk (pip's find-links), the rest from PyPI.
  "$VENV/bin/python" -m pip install --quiet --no-deps -r "$LOCK"
  echo "$want" > "$STAMP"
else
  echo "setup: reusing $VENV (requirements.lock unchanged)"
fi
"$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e "$ROOT"
"$VENV/bin/omni-triton" prepare --models "${OMNI_TRITON_PREPARE_MODELS:-piper_tts,tts}"

#!/usr/bin/env bash
# A test-only tool venv (idempotent), shared by scripts/setup_fuzz.sh and scripts/setup_lint.sh:
#   setup_tool_venv.sh NAME LOCK ENV TOOL...
# builds $OMNI_TRITON_CACHE/NAME-venv (or $OMNI_TRITON_<ENV>_VENV) from LOCK with --no-deps (no
# project code in it: the tools only read files or speak HTTP), rebuilt only when LOCK or the
# Python version changes; each TOOL in its bin/ must then start (`TOOL --help`).
# OMNI_TRITON_SKIP_<ENV>_ENV=1 skips it (the tests that need the tools then skip).
set -euo pipefail
NAME="$1"; LOCK="$2"; ENV="$3"; shift 3
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OMNI_TRITON_CACHE="${OMNI_TRITON_CACHE:-$HOME/.cache/omni-triton}"
venv_var="OMNI_TRITON_${ENV}_VENV"; skip_var="OMNI_TRITON_SKIP_${ENV}_ENV"
VENV="${!venv_var:-$OMNI_TRITON_CACHE/$NAME-venv}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
STAMP="$VENV/.omni-triton-$NAME-lock.sha256"
if [ "${!skip_var:-0}" = "1" ]; then
  echo "setup: skipping the $NAME venv ($skip_var=1)"; exit 0
fi
want="$( (cat "$ROOT/$LOCK"; "$PYTHON" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
if [ -x "$VENV/bin/$1" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  echo "setup: reusing $VENV ($LOCK unchanged)"; exit 0
fi
echo "setup: creating $VENV from $LOCK (first run: under a minute)"
start=$(date +%s)
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --no-deps -r "$ROOT/$LOCK" \
  2> >(grep -v "^WARNING: Location 'file:" >&2)
for tool in "$@"; do
  "$VENV/bin/$tool" --help > /dev/null  # the CLI starts
done
echo "$want" > "$STAMP"
echo "setup: $VENV ready in $(( $(date +%s) - start )) s"

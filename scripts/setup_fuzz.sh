#!/usr/bin/env bash
# The fuzzer environment (idempotent): schemathesis, the schema-driven fuzzer that
# tests/unit/test_openapi_fuzz.py runs against the frontend's /openapi.json, in
# $OMNI_TRITON_CACHE/fuzz-venv (~95 MB). It is a plain venv of its own (no project code, no
# requirements.lock packages: schemathesis only speaks HTTP to a running frontend), built from
# requirements-fuzz.lock with --no-deps and rebuilt only when that lock changes.
# OMNI_TRITON_SKIP_FUZZ_ENV=1 skips it (the fuzz test then skips).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OMNI_TRITON_CACHE="${OMNI_TRITON_CACHE:-$HOME/.cache/omni-triton}"
FUZZ="${OMNI_TRITON_FUZZ_VENV:-$OMNI_TRITON_CACHE/fuzz-venv}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
STAMP="$FUZZ/.omni-triton-fuzz-lock.sha256"
if [ "${OMNI_TRITON_SKIP_FUZZ_ENV:-0}" = "1" ]; then
  echo "setup: skipping the fuzzer venv (OMNI_TRITON_SKIP_FUZZ_ENV=1)"; exit 0
fi
want="$( (cat "$ROOT/requirements-fuzz.lock"; "$PYTHON" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
if [ -x "$FUZZ/bin/schemathesis" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  echo "setup: reusing $FUZZ (requirements-fuzz.lock unchanged)"; exit 0
fi
echo "setup: creating $FUZZ from requirements-fuzz.lock (first run: under a minute)"
start=$(date +%s)
rm -rf "$FUZZ"
"$PYTHON" -m venv "$FUZZ"
"$FUZZ/bin/python" -m pip install --quiet --no-deps -r "$ROOT/requirements-fuzz.lock" \
  2> >(grep -v "^WARNING: Location 'file:" >&2)
"$FUZZ/bin/schemathesis" --version > /dev/null  # the CLI imports cleanly
echo "$want" > "$STAMP"
echo "setup: $FUZZ ready in $(( $(date +%s) - start )) s"

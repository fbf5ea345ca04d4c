#!/usr/bin/env bash
# The fuzzer environment (idempotent): schemathesis, the schema-driven fuzzer that
# tests/unit/test_openapi_fuzz.py runs against the frontend's /openapi.json, in
# $OMNI_TRITON_CACHE/fuzz-venv (~95 MB; OMNI_TRITON_FUZZ_VENV overrides), from requirements-fuzz.lock.
# OMNI_TRITON_SKIP_FUZZ_ENV=1 skips it (the fuzz test then skips). How: scripts/setup_tool_venv.sh.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/setup_tool_venv.sh" fuzz requirements-fuzz.lock FUZZ schemathesis

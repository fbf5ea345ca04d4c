#!/usr/bin/env bash
# The stand-in S3 server (idempotent): moto's moto_server in $OMNI_TRITON_CACHE/s3-venv (~140 MB;
# OMNI_TRITON_S3_VENV overrides), from requirements-s3.lock, for the s3:// cases of
# tests/unit/test_media_store.py. Built only when this checkout can serve s3:// at all (s3fs
# importable in .venv: requirements.lock pins it); else those cases skip and nothing is built.
# OMNI_TRITON_SKIP_S3_ENV=1 skips it too. How: scripts/setup_tool_venv.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! "$ROOT/.venv/bin/python" -c "import s3fs" 2>/dev/null; then
  echo "setup: no s3fs in .venv (s3:// media is not served by this install): no S3 test server"; exit 0
fi
exec bash "$ROOT/scripts/setup_tool_venv.sh" s3 requirements-s3.lock S3 moto_server

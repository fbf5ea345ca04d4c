#!/usr/bin/env bash
# The test job: set up (idempotent), then run unit and end-to-end tests (the e2e tests start a real
# tritonserver and the OpenAI frontend on free ports). Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
bash "$ROOT/scripts/setup_bench.sh"  # vLLM-Omni's bench client (~5 GB: tests/e2e/test_vllm_omni_bench.py), not serving
bash "$ROOT/scripts/setup_fuzz.sh"  # schemathesis, the API fuzzer: tests only, so not in serve.sh's set-up
bash "$ROOT/scripts/setup_lint.sh"  # ruff, mypy, import-linter (tests/unit/test_lint.py): tests only too
bash "$ROOT/scripts/setup_s3.sh"  # moto's S3 server (s3:// media cases of tests/unit/test_media_store.py)
VENV="$ROOT/.venv"
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -p no:cacheprovider "$@" tests

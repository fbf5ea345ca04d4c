#!/usr/bin/env bash
# The main job: set up (idempotent), then serve the embedded default models on tritonserver with
# the OpenAI frontend on http://127.0.0.1:9000/v1. Extra arguments go to `omni-triton serve`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
VENV="$ROOT/.venv"
exec "$VENV/bin/omni-triton" serve --skip-prepare "$@"

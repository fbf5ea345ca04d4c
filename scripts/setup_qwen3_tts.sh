#!/usr/bin/env bash
# The Qwen3-TTS environment (issue 11, idempotent): the official `qwen-tts` package pins
# transformers==4.57.3 (the main lock has 5.x for vLLM), so its Triton models run their stubs in a
# second virtualenv (config.pbtxt EXECUTION_ENV_PATH, docs/qwen3_tts.md):
#   1. $OMNI_TRITON_CACHE/qwen3-tts-<lock hash 12>: requirements-qwen3-tts.lock installed with
#      --no-deps, shared by every checkout with the same lock, rebuilt only when the lock changes;
#   2. this checkout's .venv-qwen3-tts/ on top of it (seconds): the shared site-packages and this
#      checkout (so `omni_triton` imports there, and two clones never run each other's code).
# OMNI_TRITON_SKIP_QWEN3_TTS_ENV=1 skips it (the Qwen3-TTS tests then skip).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OMNI_TRITON_CACHE="${OMNI_TRITON_CACHE:-$HOME/.cache/omni-triton}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
LOCK="$ROOT/requirements-qwen3-tts.lock"
if [ "${OMNI_TRITON_SKIP_QWEN3_TTS_ENV:-0}" = "1" ]; then
  echo "setup: skipping the Qwen3-TTS venv (OMNI_TRITON_SKIP_QWEN3_TTS_ENV=1)"; exit 0
fi
want="$( (cat "$LOCK"; "$PYTHON" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
DEPS="$OMNI_TRITON_CACHE/qwen3-tts-${want:0:12}"
STAMP="$DEPS/.omni-triton-lock.sha256"
if [ ! -x "$DEPS/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "setup: creating $DEPS from requirements-qwen3-tts.lock (first run: about 2 minutes)"
  start=$(date +%s)
  rm -rf "$DEPS"
  "$PYTHON" -m venv "$DEPS"
  "$DEPS/bin/python" -m pip install --quiet --upgrade "pip>=24"
  "$DEPS/bin/python" -m pip install --quiet --no-deps -r "$LOCK" 2> >(grep -v "^WARNING: Location 'file:" >&2)
  site="$("$DEPS/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  rm -f "$site"/torchaudio/lib/*.so  # built for torch 2.11 (see the lock's header)
  "$DEPS/bin/python" -c "import qwen_tts" > /dev/null 2>&1  # the package imports cleanly
  echo "$want" > "$STAMP"
  echo "setup: $DEPS ready in $(( $(date +%s) - start )) s"
else
  echo "setup: reusing $DEPS (requirements-qwen3-tts.lock unchanged)"
fi
touch "$STAMP"
find "$OMNI_TRITON_CACHE" -maxdepth 2 -path "$OMNI_TRITON_CACHE/qwen3-tts-*/.omni-triton-lock.sha256" -mtime +14 \
  -printf '%h\n' 2>/dev/null | grep -vxF "$DEPS" | xargs -r rm -rf || true
VENV="$ROOT/.venv-qwen3-tts"
deps_site="$("$DEPS/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.omni-triton-deps" 2>/dev/null)" != "$deps_site $want" ]; then
  rm -rf "$VENV"
  "$PYTHON" -m venv --without-pip "$VENV"
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "import site; site.addsitedir('$deps_site')" > "$site/omni_triton_deps.pth"
  echo "$ROOT" > "$site/omni_triton_checkout.pth"
  echo "$deps_site $want" > "$VENV/.omni-triton-deps"
fi

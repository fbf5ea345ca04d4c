#!/usr/bin/env bash
# Idempotent set-up used by the README's two commands and by .ci/run; it installs what serving
# needs and nothing else (scripts/test.sh adds the test-only venvs: benchmark client, fuzzer, lint):
#   1. a dependency virtualenv shared by every checkout on this machine with the same lock, cached
#      in $OMNI_TRITON_CACHE/venv-<lock hash> (a changed requirements.lock builds a new one); it holds the exact
#      dependency set of requirements.lock, installed with --no-deps (see docs/running.md "Pins");
#   2. this checkout's own virtualenv, .venv/ (seconds): it sees the shared dependencies through a
#      .pth file and has this checkout installed editable, so two clones never run each other's code;
#   3. the Qwen3-TTS venv (scripts/setup_qwen3_tts.sh, cached like 1): qwen3_tts is served;
#   4. the embedded default models prepared into $OMNI_TRITON_CACHE/models (skipped when present).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OMNI_TRITON_CACHE="${OMNI_TRITON_CACHE:-$HOME/.cache/omni-triton}"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
LOCK="$ROOT/requirements.lock"
want="$( (cat "$LOCK"; "$PYTHON" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"
# One shared venv per lock (its hash in the name): a checkout with another lock builds its own
# beside it instead of deleting the one other checkouts' servers are running from.
DEPS="$(bash "$ROOT/scripts/deps_venv_path.sh")"
STAMP="$DEPS/.omni-triton-lock.sha256"

if [ ! -x "$DEPS/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "setup: creating $DEPS from requirements.lock (first run: a few minutes)"
  rm -rf "$DEPS"  # an interrupted build of this same lock (the stamp is written last)
  "$PYTHON" -m venv "$DEPS"
  "$DEPS/bin/python" -m pip install --quiet --upgrade "pip>=24"
  # torch 2.13.0+cpu comes from the wheel on this machine's disk (pip's find-links), the rest from PyPI.
  # (this machine's pip config names local index folders that lack most packages: drop that noise)
  "$DEPS/bin/python" -m pip install --quiet --no-deps -r "$LOCK" \
    2> >(grep -v "^WARNING: Location 'file:" >&2)
  echo "$want" > "$STAMP"
else
  echo "setup: reusing $DEPS (requirements.lock unchanged)"
fi
touch "$STAMP"  # last use, for pruning
# Shared venvs of other locks unused for 14 days are removed (4-5 GB each).
find "$OMNI_TRITON_CACHE" -maxdepth 2 -path "$OMNI_TRITON_CACHE/venv-*/.omni-triton-lock.sha256" -mtime +14 \
  -printf '%h\n' 2>/dev/null | grep -vxF "$DEPS" | xargs -r rm -rf || true

deps_site="$("$DEPS/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.omni-triton-deps" 2>/dev/null)" != "$deps_site $want" ]; then
  echo "setup: creating $VENV on top of $DEPS"
  rm -rf "$VENV"
  "$PYTHON" -m venv --without-pip "$VENV"
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # addsitedir (not a plain path line) so the shared site-packages' own .pth files are processed too.
  echo "import site; site.addsitedir('$deps_site')" > "$site/omni_triton_deps.pth"
  echo "$deps_site $want" > "$VENV/.omni-triton-deps"
fi
# The project lives in each checkout's .venv only (older set-ups installed it into the shared one).
if "$DEPS/bin/python" -m pip show --quiet omni-triton >/dev/null 2>&1; then
  "$DEPS/bin/python" -m pip uninstall --quiet --yes omni-triton
fi
if ! "$VENV/bin/python" -m pip install --no-deps --no-build-isolation -e "$ROOT" > "$VENV/install.log" 2>&1; then
  cat "$VENV/install.log"; exit 1
fi
bash "$ROOT/scripts/setup_qwen3_tts.sh"  # the Qwen3-TTS environment (second venv, cached)
"$VENV/bin/omni-triton" prepare --models "${OMNI_TRITON_PREPARE_MODELS:-piper_tts,csm,llm_tts,qwen3_omni,qwen_image,qwen_image_edit,qwen_image_edit_plus,qwen_image_inpaint,wan_t2v,wan_i2v,qwen3_tts,qwen2_5_omni,whisper,pocketsphinx,stable_audio}"

#!/usr/bin/env bash
# Build (idempotent, cached) and print the directory of a perf_analyzer / genai-perf runner that
# works on this glibc 2.36 host although the perf-analyzer wheel's binary needs glibc 2.38:
#   1. a Debian trixie file tree made with `debootstrap --foreign` (first stage only: the .debs are
#      fetched from Debian's mirror and unpacked, nothing is configured and no chroot is entered,
#      which is all a loader needs and about a minute instead of several);
#   2. the perf-analyzer wheel's binary, unpacked from PyPI (pip download --platform);
#   3. a `perf_analyzer` wrapper that starts the binary with trixie's own dynamic loader and
#      libraries (ld-linux-x86-64.so.2 --library-path ...): chroot-free, so the binary sees the
#      host's files, network and /dev/shm and needs no root at run time;
#   4. with --genai: a virtualenv holding genai-perf (perf_analyzer_configs/genai-requirements.txt)
#      whose PATH finds the wrapper.
# Usage: scripts/perf_runner.sh [--genai]  -> prints the runner dir; <dir>/bin/perf_analyzer
# (and <dir>/bin/genai-perf with --genai). Cached in $OMNI_TRITON_CACHE/perf-runner-<key>, the
# key being the hash of this file and the genai requirements file.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${OMNI_TRITON_CACHE:-$HOME/.cache/omni-triton}"
PA_VERSION=2.60.0
GENAI_VERSION=0.0.16
SUITE=trixie
MIRROR="${OMNI_TRITON_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
GENAI_REQ="$ROOT/perf_analyzer_configs/genai-requirements.txt"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
key="$(cat "${BASH_SOURCE[0]}" "$GENAI_REQ" | sha256sum | cut -c1-12)"
DIR="$CACHE/perf-runner-$key"
log() { echo "perf_runner: $*" >&2; }

if [ ! -f "$DIR/.base-done" ]; then
  if ! command -v debootstrap >/dev/null; then
    [ "$(id -u)" = 0 ] || { log "debootstrap missing: apt-get install debootstrap"; exit 1; }
    log "installing debootstrap (apt-get)"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap; } > /dev/null
  fi
  log "building $DIR (trixie libraries + perf_analyzer $PA_VERSION)"
  start=$SECONDS
  rm -rf "$DIR"; mkdir -p "$DIR/bin"
  debootstrap --foreign --variant=minbase --include=libssl3t64,zlib1g,libstdc++6,libgcc-s1 \
    "$SUITE" "$DIR/root" "$MIRROR" > "$DIR/debootstrap.log" 2>&1 \
    || { tail -20 "$DIR/debootstrap.log" >&2; exit 1; }
  rm -rf "$DIR/root/var/cache/apt/archives/"*.deb
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_38_x86_64 \
    "perf-analyzer==$PA_VERSION" -d "$DIR/wheel" 2> >(grep -v "^WARNING: Location 'file:" >&2)
  "$PYTHON" -m zipfile -e "$DIR"/wheel/perf_analyzer-*.whl "$DIR/wheel/x"
  install -m 0755 "$DIR/wheel/x/perf_analyzer/bin/perf_analyzer" "$DIR/bin/perf_analyzer.bin"
  rm -rf "$DIR/wheel"
  cat > "$DIR/bin/perf_analyzer" <<WRAP
#!/bin/sh
# perf_analyzer $PA_VERSION run by Debian $SUITE's loader and libraries (host glibc too old).
R="$DIR/root"
exec "\$R/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" \\
  --library-path "\$R/usr/lib/x86_64-linux-gnu:\$R/lib/x86_64-linux-gnu" \\
  "$DIR/bin/perf_analyzer.bin" "\$@"
WRAP
  chmod 0755 "$DIR/bin/perf_analyzer"
  "$DIR/bin/perf_analyzer" --version >/dev/null 2>&1 || "$DIR/bin/perf_analyzer" --help >/dev/null 2>&1 \
    || { log "the built perf_analyzer does not start"; exit 1; }
  echo "$((SECONDS - start))" > "$DIR/.base-seconds"
  touch "$DIR/.base-done"
  log "base built in $((SECONDS - start)) s"
fi

if [ "${1:-}" = "--genai" ] && [ ! -f "$DIR/.genai-done" ]; then
  start=$SECONDS
  log "installing genai-perf into $DIR/venv"
  rm -rf "$DIR/venv"
  "$PYTHON" -m venv "$DIR/venv"
  "$DIR/venv/bin/python" -m pip install --quiet -r "$GENAI_REQ" 2> >(grep -v "^WARNING: Location 'file:" >&2)
  "$DIR/venv/bin/python" -m pip install --quiet --no-deps "genai-perf==$GENAI_VERSION" \
    2> >(grep -v "^WARNING: Location 'file:" >&2)
  # genai-perf calls `perf_analyzer` from PATH: the venv's bin gets the wrapper.
  ln -sf "$DIR/bin/perf_analyzer" "$DIR/venv/bin/perf_analyzer"
  cat > "$DIR/bin/genai-perf" <<WRAP
#!/bin/sh
PATH="$DIR/venv/bin:\$PATH" exec "$DIR/venv/bin/genai-perf" "\$@"
WRAP
  chmod 0755 "$DIR/bin/genai-perf"
  echo "$((SECONDS - start))" > "$DIR/.genai-seconds"
  touch "$DIR/.genai-done"
  log "genai-perf installed in $((SECONDS - start)) s"
fi
echo "$DIR"

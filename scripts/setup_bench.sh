#!/usr/bin/env bash
# The benchmark environment (idempotent): vLLM-Omni's own benchmark client, `vllm-omni bench serve
# --omni`, in $OMNI_TRITON_CACHE/bench-venv, for tests/e2e/test_vllm_omni_bench.py and the
# benchmark commands of docs/benchmarks.md. Built by scripts/test.sh (not by serve.sh: serving never
# needs it) or by hand, `bash scripts/setup_bench.sh`, before those benchmark commands. Built from
# requirements-bench.lock (installed with --no-deps) on top of the main dependency venv
# (scripts/setup.sh builds that first), and rebuilt only when either lock changes. It is ~5 GB (CUDA builds of torch/torchvision: see requirements-bench.lock);
# OMNI_TRITON_SKIP_BENCH_ENV=1 skips it (the benchmark test then skips).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OMNI_TRITON_CACHE="${OMNI_TRITON_CACHE:-$HOME/.cache/omni-triton}"
DEPS="$(bash "$ROOT/scripts/deps_venv_path.sh")"  # the shared venv scripts/setup.sh built
BENCH="${OMNI_TRITON_BENCH_VENV:-$OMNI_TRITON_CACHE/bench-venv}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
STAMP="$BENCH/.omni-triton-bench-lock.sha256"
if [ "${OMNI_TRITON_SKIP_BENCH_ENV:-0}" = "1" ]; then
  echo "setup: skipping the benchmark venv (OMNI_TRITON_SKIP_BENCH_ENV=1)"; exit 0
fi
if [ ! -x "$DEPS/bin/python" ]; then
  echo "setup_bench: $DEPS missing; run bash scripts/setup.sh first" >&2; exit 1
fi
want="$( (cat "$ROOT/requirements-bench.lock" "$ROOT/requirements.lock"; echo "$DEPS"; "$PYTHON" -c 'import sys; print(sys.version)') \
        | sha256sum | cut -d' ' -f1)"  # $DEPS too: its site-packages path is written into this venv
if [ -x "$BENCH/bin/vllm-omni" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  echo "setup: reusing $BENCH (requirements-bench.lock unchanged)"; exit 0
fi
echo "setup: creating $BENCH from requirements-bench.lock (first run: a few minutes, ~5 GB)"
start=$(date +%s)
rm -rf "$BENCH"
"$PYTHON" -m venv --without-pip "$BENCH"
deps_site="$("$DEPS/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
site="$("$BENCH/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# the main venv's packages, after this venv's own (which shadow them: vllm 0.30, CUDA torch)
echo "import site; site.addsitedir('$deps_site')" > "$site/zz_omni_triton_deps.pth"
"$BENCH/bin/python" -m pip install --quiet --no-deps -r "$ROOT/requirements-bench.lock" \
  2> >(grep -v -e "^WARNING: Location 'file:" -e "Not uninstalling" -e "Can't uninstall" -e "No files were found" >&2)
"$BENCH/bin/vllm-omni" bench serve --omni --help > /dev/null  # the client imports cleanly
echo "$want" > "$STAMP"
echo "setup: $BENCH ready in $(( $(date +%s) - start )) s"

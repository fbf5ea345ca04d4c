#!/usr/bin/env bash
# perf_analyzer against one served model over gRPC, with its input_data.json (streaming mode for
# decoupled models). Usage: perf_analyzer_configs/run.sh MODEL [perf_analyzer options ...]
#   TRITON_GRPC_URL (default localhost:8001): Triton's gRPC endpoint.
#   OMNI_TRITON_ADMIN_KEY or OMNI_TRITON_ADMIN_KEY_FILE: the key of Triton's restricted APIs
#   (perf_analyzer reads the model config); `omni-triton serve` writes it to
#   ~/.cache/omni-triton/run/triton-admin-key-<Triton HTTP port> (0600).
# The runner (trixie loader + perf_analyzer binary) is built on first use: scripts/perf_runner.sh.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
model="${1:?usage: $0 MODEL [perf_analyzer options]}"; shift
runner="$(bash "$ROOT/scripts/perf_runner.sh")"
mapfile -t argv < <("$ROOT/.venv/bin/python" -m omni_triton.perf_data command "$model" \
  --data "$HERE/$model/input_data.json" --url "${TRITON_GRPC_URL:-localhost:8001}" \
  --perf-analyzer "$runner/bin/perf_analyzer")
exec "${argv[@]}" "$@"

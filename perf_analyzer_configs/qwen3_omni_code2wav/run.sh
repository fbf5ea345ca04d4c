#!/usr/bin/env bash
# perf_analyzer on qwen3_omni_code2wav (options: see ../run.sh), e.g. --concurrency-range 1:4
exec "$(dirname "${BASH_SOURCE[0]}")/../run.sh" qwen3_omni_code2wav "$@"

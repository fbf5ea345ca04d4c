#!/usr/bin/env bash
# perf_analyzer on whisper_decoder (options: see ../run.sh), e.g. --concurrency-range 1:4
exec "$(dirname "${BASH_SOURCE[0]}")/../run.sh" whisper_decoder "$@"

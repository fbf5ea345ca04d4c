#!/usr/bin/env bash
# perf_analyzer on wan_t2v_text_encoder (options: see ../run.sh), e.g. --concurrency-range 1:4
exec "$(dirname "${BASH_SOURCE[0]}")/../run.sh" wan_t2v_text_encoder "$@"

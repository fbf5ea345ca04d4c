#!/usr/bin/env bash
# perf_analyzer on wan_i2v_vae_encoder (options: see ../run.sh), e.g. --concurrency-range 1:4
exec "$(dirname "${BASH_SOURCE[0]}")/../run.sh" wan_i2v_vae_encoder "$@"

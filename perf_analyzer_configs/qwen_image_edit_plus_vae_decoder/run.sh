#!/usr/bin/env bash
# perf_analyzer on qwen_image_edit_plus_vae_decoder (options: see ../run.sh), e.g. --concurrency-range 1:4
exec "$(dirname "${BASH_SOURCE[0]}")/../run.sh" qwen_image_edit_plus_vae_decoder "$@"

#!/usr/bin/env bash
# perf_analyzer on stable_audio_denoiser (options: see ../run.sh), e.g. --concurrency-range 1:4
exec "$(dirname "${BASH_SOURCE[0]}")/../run.sh" stable_audio_denoiser "$@"

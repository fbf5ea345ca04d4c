#!/usr/bin/env bash
# genai-perf against the OpenAI frontend. Usage:
#   perf_analyzer_configs/genai_perf.sh [chat|completions] [genai-perf profile options ...]
#   FRONTEND_URL (default localhost:9000), MODEL (default llm), TOKENIZER (default the embedded
#   SmolLM2 checkpoint's folder: genai-perf counts tokens with it; no hub download happens).
# chat and completions are the genai-perf endpoint types the frontend serves (its speech and image
# routes have no genai-perf endpoint type). Streaming (SSE) is on: it measures time to first token
# and inter-token latency. The runner (genai-perf + trixie-loader perf_analyzer) is built on first
# use by scripts/perf_runner.sh --genai (several minutes once; cached).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${OMNI_TRITON_CACHE:-$HOME/.cache/omni-triton}"
kind="${1:-chat}"; [ $# -gt 0 ] && shift
runner="$(bash "$ROOT/scripts/perf_runner.sh" --genai)"
exec "$runner/bin/genai-perf" profile -m "${MODEL:-llm}" --endpoint-type "$kind" --streaming \
  -u "${FRONTEND_URL:-localhost:9000}" --tokenizer "${TOKENIZER:-$CACHE/models/smollm2}" \
  --synthetic-input-tokens-mean 32 --output-tokens-mean 16 --extra-inputs max_tokens:16 \
  --num-dataset-entries 20 --request-count 10 --warmup-request-count 1 --concurrency 1 \
  --artifact-dir "${ARTIFACT_DIR:-$ROOT/artifacts/genai-perf}" "$@"

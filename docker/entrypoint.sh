#!/usr/bin/env bash
# GPU container entrypoint: download the profile's checkpoints into $OMNI_TRITON_CACHE/models
# (skipped when present; needs HF_TOKEN for gated repositories), then serve.
# `entrypoint.sh download`: download only, then exit (the Kubernetes job that fills the shared
# model cache, deploy/k8s/models-job.yaml).
set -euo pipefail
cd /opt/omni-triton
python3 -m omni_triton.deploy checkpoints | while read -r folder repo; do
  case "$repo" in */*) ;; *) continue ;; esac  # entries that are not hub repositories
  if [ ! -e "$OMNI_TRITON_CACHE/models/$folder/.complete" ]; then
    huggingface-cli download "$repo" --local-dir "$OMNI_TRITON_CACHE/models/$folder"
    touch "$OMNI_TRITON_CACHE/models/$folder/.complete"
  fi
done
if [ "${1:-}" = download ]; then exit 0; fi
# Triton's HTTP/gRPC stay on the container's loopback (the frontend beside them is the way in);
# its metrics listen for Prometheus. A Triton-only pod adds --triton-host 0.0.0.0 (deploy/k8s).
# Its admin APIs need OMNI_TRITON_ADMIN_KEY(_FILE) or a random per-start key (omni_triton/triton_admin.py).
exec omni-triton serve --host 0.0.0.0 --triton-metrics-host 0.0.0.0 "$@"

#!/usr/bin/env bash
# Validate deploy/k8s/ without a cluster: kubernetes-validate (PyPI; it ships the Kubernetes
# OpenAPI schemas, so it runs offline once installed) checks every manifest against the schema of
# the Kubernetes release below, in --strict mode (unknown fields are errors). Installed once into a
# small tools venv cached in $OMNI_TRITON_CACHE/k8s-tools-<key> (not the shared venv).
#   scripts/lint_k8s.sh            install if needed, then validate; exits non-zero on a failure
#   scripts/lint_k8s.sh --install  install only; prints the tool's path
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${OMNI_TRITON_CACHE:-$HOME/.cache/omni-triton}"
VALIDATOR=kubernetes-validate==1.37.0
K8S_VERSION="${K8S_VERSION:-1.31.0}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
TOOLS="$CACHE/k8s-tools-$(echo "$VALIDATOR" | sha256sum | cut -c1-12)"
if [ ! -x "$TOOLS/bin/kubernetes-validate" ]; then
  rm -rf "$TOOLS.tmp"
  "$PYTHON" -m venv "$TOOLS.tmp"
  "$TOOLS.tmp/bin/python" -m pip install --quiet --retries 1 --timeout 20 "$VALIDATOR" 2> >(grep -v "^WARNING: Location 'file:" >&2)
  rm -rf "$TOOLS" && mv "$TOOLS.tmp" "$TOOLS"
  # a venv moved after creation keeps its old path in the entry script's shebang: rewrite it
  sed -i "1s|^#!.*|#!$TOOLS/bin/python|" "$TOOLS/bin/kubernetes-validate"
fi
if [ "${1:-}" = "--install" ]; then echo "$TOOLS/bin/kubernetes-validate"; exit 0; fi
"$TOOLS/bin/kubernetes-validate" --strict --kubernetes-version "$K8S_VERSION" "$ROOT"/deploy/k8s/*.yaml
echo "lint_k8s: kubernetes-validate $K8S_VERSION --strict passed"

#!/usr/bin/env bash
# Prints the path of the k6 binary the load scripts use, building k6 from the Go module proxy
# the first time (K6 overrides the binary; K6_VERSION, pinned here, the version built).
set -euo pipefail
K6_VERSION="${K6_VERSION:-v1.8.1}"
bin="${K6:-$HOME/.cache/spate-k6/bin/k6}"
if [[ ! -x "$bin" ]]; then
  command -v go >/dev/null || { echo "k6.sh: needs Go to build k6 (or set K6)" >&2; exit 2; }
  echo "k6.sh: building k6 $K6_VERSION (once)" >&2
  mkdir -p "$(dirname "$bin")"
  GOBIN="$(dirname "$bin")" go install "go.k6.io/k6@$K6_VERSION" >&2
fi
echo "$bin"

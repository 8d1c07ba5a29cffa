#!/usr/bin/env bash
# Regenerates deploy/examples/grafana-dashboard.yaml and the spate chart's copy of the
# dashboard from deploy/grafana/spate.json (a cargo test checks they match).
set -euo pipefail
cd "$(dirname "$0")/../.."
cp deploy/grafana/spate.json deploy/helm/spate/dashboards/spate.json
{
  echo "# The Grafana dashboard (deploy/grafana/spate.json) as a ConfigMap for Grafana's dashboard"
  echo "# sidecar (label grafana_dashboard). Regenerate: scripts/k8s/gen-dashboard-configmap.sh"
  echo "apiVersion: v1"
  echo "kind: ConfigMap"
  echo "metadata:"
  echo "  name: spate-grafana-dashboard"
  echo "  labels:"
  echo "    grafana_dashboard: \"1\""
  echo "data:"
  echo "  spate.json: |-"
  sed 's/^/    /; s/^    $//' deploy/grafana/spate.json
} > deploy/examples/grafana-dashboard.yaml

#!/usr/bin/env bash
# Stops what scripts/k8s/up.sh WORKDIR started (by the pids it recorded).
set -uo pipefail
W="${1:?usage: down.sh WORKDIR}"
[ -f "$W/pids" ] || exit 0
tac "$W/pids" | while read -r name pid; do
  kill "$pid" 2>/dev/null && echo "stopped $name ($pid)"
done
sleep 1
tac "$W/pids" | while read -r _ pid; do kill -9 "$pid" 2>/dev/null; done
rm -f "$W/pids"

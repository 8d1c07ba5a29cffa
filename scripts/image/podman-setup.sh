#!/usr/bin/env bash
# Makes podman usable here, for scripts/image.sh and scripts/image-e2e.sh: installs podman and
# runc (and debootstrap with --debootstrap) from Debian's packages when missing, and gives
# podman the one setting it needs on these machines: `default_ulimits = []` in
# /etc/containers/containers.conf (the default ulimits are refused: "setrlimit ... operation
# not permitted"), written only when the file does not set default_ulimits already. The other
# setting, runc instead of crun (crun refuses the hybrid cgroup setup), is the `--runtime runc`
# every podman call of these scripts passes. Needs root. Safe to run repeatedly.
#   scripts/image/podman-setup.sh [--debootstrap]
set -euo pipefail
[[ $(id -u) -eq 0 ]] || { echo "podman-setup: needs root (podman runs as root here)" >&2; exit 1; }

need_apt=()
command -v podman >/dev/null 2>&1 || need_apt+=(podman)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
if [[ "${1:-}" == "--debootstrap" ]]; then
  command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
fi
if (( ${#need_apt[@]} )); then
  echo "podman-setup: installing ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

CONF=/etc/containers/containers.conf
if [[ -f "$CONF" ]] && grep -Eq '^[[:space:]]*default_ulimits[[:space:]]*=' "$CONF"; then
  echo "podman-setup: $CONF already sets default_ulimits ($(grep -E '^[[:space:]]*default_ulimits' "$CONF" | head -n1 | tr -s ' ')): left as it is"
else
  mkdir -p "$(dirname "$CONF")"
  if [[ -f "$CONF" ]] && grep -Eq '^[[:space:]]*\[containers\]' "$CONF"; then
    # A second [containers] table would make the file invalid: add the key under the first.
    sed -i '0,/^[[:space:]]*\[containers\]/s//&\ndefault_ulimits = []/' "$CONF"
  else
    printf '\n[containers]\n# Written by spate scripts/image/podman-setup.sh: the default ulimits are refused here.\ndefault_ulimits = []\n' >>"$CONF"
  fi
  echo "podman-setup: wrote default_ulimits = [] to $CONF"
fi

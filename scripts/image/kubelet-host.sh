#!/usr/bin/env bash
# What a kubelet changes on the host outside its own directories, recorded before it starts
# and put back after it stops (scripts/image/kubelet-smoke.sh, kubelet-operator-e2e.sh):
# kernel tunables it sets (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops, ...;
# and net.ipv4.ip_forward, which the CNI bridge plugin sets), the cgroups it makes
# (/sys/fs/cgroup/*/kubepods), its iptables canary chains (KUBE-KUBELET-CANARY,
# KUBE-IPTABLES-HINT, KUBE-FIREWALL) and /var/lib/kubelet (device-plugins is not under
# --root-dir).
#   kubelet-host.sh save FILE       before the kubelet starts
#   kubelet-host.sh restore FILE    after it and every container have stopped
set -euo pipefail
SYSCTLS=(net.ipv4.ip_forward vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
case "${1:-}" in
  save)
    : >"$2"
    for s in "${SYSCTLS[@]}"; do echo "sysctl $s=$(sysctl -n "$s")" >>"$2"; done
    if [[ -e /var/lib/kubelet ]]; then echo "had /var/lib/kubelet" >>"$2"; fi
    ;;
  restore)
    set +e
    for d in /sys/fs/cgroup/*/kubepods; do
      [[ -d "$d" ]] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
    done
    for t in filter nat mangle; do
      for ch in KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT KUBE-FIREWALL; do
        for chain in INPUT OUTPUT; do
          while iptables -t "$t" -D "$chain" -j "$ch" 2>/dev/null; do :; done
        done
        iptables -t "$t" -F "$ch" 2>/dev/null; iptables -t "$t" -X "$ch" 2>/dev/null
        ip6tables -t "$t" -F "$ch" 2>/dev/null; ip6tables -t "$t" -X "$ch" 2>/dev/null
      done
    done
    grep -q '^had /var/lib/kubelet$' "$2" || rm -rf /var/lib/kubelet
    sed -n 's/^sysctl //p' "$2" | while read -r kv; do sysctl -qw "$kv"; done
    exit 0
    ;;
  *) echo "usage: kubelet-host.sh save|restore FILE" >&2; exit 2 ;;
esac

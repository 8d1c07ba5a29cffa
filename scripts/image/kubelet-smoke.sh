#!/usr/bin/env bash
# The spate image under a real kubelet: kubelet built at the Kubernetes version of
# scripts/k8s/build.sh, containerd and runc from Debian's packages, the images imported into
# containerd. No API server: the kubelet runs standalone with a static pod, the chart's pod and
# container security context (uid/gid/fsGroup 10001, read-only root, no capabilities, no
# privilege escalation), its /ready and /health probes, host network on 127.0.0.1. Proves:
# the pod becomes Ready; records produced with acks=all; removing the pod makes the kubelet
# send SIGTERM (grace period 60 s) and spate exits 0 after "shutting down"; the pod started
# again on the same data reads every acknowledged record back.
# A step towards issue 31's kubelet e2e (operator, 3 pods, DNS, pod network), not that e2e.
#   scripts/image/kubelet-smoke.sh        (root; builds kubelet once, ~6 min on 2 cores)
# Two settings this machine needs, both below: kubelet failCgroupV1: false (cgroup v1 here),
# containerd restrict_oom_score_adj = true (a negative oom_score_adj cannot be written here,
# so the pod sandbox, which containerd gives -998, failed with "runc create failed: unable to
# start container process: can't get final child's PID from pipe: EOF").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
start=$SECONDS
[[ $(id -u) -eq 0 ]] || { echo "SKIPPED: kubelet-smoke needs root"; exit 0; }
CACHE="${SPATE_K8S_CACHE:-$HOME/.cache/spate-k8s}"
KUBELET="$CACHE/bin/kubelet"
command -v containerd >/dev/null 2>&1 || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containerd >/dev/null; }
scripts/image/podman-setup.sh
pm() { podman --runtime runc "$@"; }
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka

scripts/image/kubelet-build.sh

VERSION="$(cargo metadata --no-deps --format-version 1 --offline \
  | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "spate-server"))')"
suffix=""; if [[ "${SPATE_IMAGE_PROFILE:-}" == debug ]]; then suffix="-debug"; fi
IMAGE="localhost/spate:${SPATE_IMAGE_TAG:-$VERSION$suffix}"
pm image exists "$IMAGE" || scripts/image.sh
# The pod sandbox's image (no registry for registry.k8s.io/pause): a static pause.c.
W="$(mktemp -d /tmp/spate-kubelet.XXXXXX)"
CTR=(ctr -a "$W/containerd.sock" -n k8s.io)
KPID=""; CPID=""
cleanup() {
  local rc=$?
  if (( rc != 0 )); then tail -n 20 "$W/kubelet.log" "$W/containerd.log" >&2 2>/dev/null || true; fi
  rm -f "$W/manifests/"*.yaml
  [[ -z "$KPID" ]] || { kill "$KPID" 2>/dev/null; wait "$KPID" 2>/dev/null || true; }
  if [[ -n "$CPID" ]]; then
    for c in $("${CTR[@]}" containers ls -q 2>/dev/null); do
      "${CTR[@]}" tasks kill -s KILL "$c" >/dev/null 2>&1 || true
      for _ in 1 2 3 4 5 6 7 8 9 10; do "${CTR[@]}" tasks rm "$c" >/dev/null 2>&1 && break; sleep 0.3; done
      "${CTR[@]}" containers rm "$c" >/dev/null 2>&1 || true
    done
    kill "$CPID" 2>/dev/null; wait "$CPID" 2>/dev/null || true
  fi
  grep -o " ${W}[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  [[ ! -f "$W/host-before" ]] || scripts/image/kubelet-host.sh restore "$W/host-before"
  rm -rf "$W"
  echo "kubelet-smoke: $( (( rc == 0 )) && echo passed || echo FAILED) in $(( SECONDS - start )) s"
  exit "$rc"
}
trap cleanup EXIT
mkdir -p "$W/pause" "$W/manifests" "$W/data" "$W/cni"
scripts/image/kubelet-host.sh save "$W/host-before"
gcc -static -Os -o "$W/pause/pause" scripts/image/pause.c
printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$W/pause/Dockerfile"
pm build -q --pull=never --network=none -t localhost/pause:spate "$W/pause" >/dev/null

containerd config default >"$W/containerd.toml"
sed -i -e "s#^root = .*#root = \"$W/containerd/root\"#" -e "s#^state = .*#state = \"$W/containerd/state\"#" \
  -e "s#address = \"/run/containerd/containerd.sock\"#address = \"$W/containerd.sock\"#" \
  -e "s#sandbox_image = .*#sandbox_image = \"localhost/pause:spate\"#" \
  -e "s#conf_dir = \"/etc/cni/net.d\"#conf_dir = \"$W/cni\"#" \
  -e "s#restrict_oom_score_adj = false#restrict_oom_score_adj = true#" "$W/containerd.toml"
grep -q 'restrict_oom_score_adj = true' "$W/containerd.toml" || { echo "kubelet-smoke: containerd config has no restrict_oom_score_adj" >&2; exit 1; }
containerd --config "$W/containerd.toml" >"$W/containerd.log" 2>&1 &
CPID=$!
for _ in $(seq 1 50); do [[ -S "$W/containerd.sock" ]] && break; sleep 0.2; done
for img in "$IMAGE" localhost/pause:spate; do
  pm save --format docker-archive "$img" | "${CTR[@]}" images import - >/dev/null
done

read -r K H KP KH < <(python3 scripts/free-ports.py 4)
cat >"$W/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: $W/manifests
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$W/containerd.sock
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
address: 127.0.0.1
port: $KP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KH
enforceNodeAllocatable: []
podLogsDir: $W/pod-logs
EOF
chown 10001:10001 "$W/data"
cat >"$W/spate.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: spate, namespace: default}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 60
  securityContext: {runAsNonRoot: true, runAsUser: 10001, runAsGroup: 10001, fsGroup: 10001}
  containers:
    - name: spate
      image: $IMAGE
      imagePullPolicy: Never
      args: ["--listen", "127.0.0.1:$K", "--http-listen", "127.0.0.1:$H", "--data-dir", "/var/lib/spate/data"]
      readinessProbe: {httpGet: {path: /ready, port: $H, host: 127.0.0.1}, periodSeconds: 5}
      livenessProbe: {httpGet: {path: /health, port: $H, host: 127.0.0.1}, periodSeconds: 10, failureThreshold: 6}
      securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: ["ALL"]}}
      volumeMounts: [{name: data, mountPath: /var/lib/spate}]
  volumes:
    - {name: data, hostPath: {path: $W/data}}
EOF
"$KUBELET" --config "$W/kubelet.yaml" --root-dir "$W/kubelet" --cert-dir "$W/kubelet/pki" --hostname-override spate-smoke --v=2 >"$W/kubelet.log" 2>&1 &
KPID=$!

pod_state() {  # "ready restarts exitcode-of-last-termination" of the spate container, per the kubelet
  curl -sk --max-time 5 "https://127.0.0.1:$KP/pods" | python3 -c '
import json, sys
for p in json.load(sys.stdin)["items"]:
    for c in p["status"].get("containerStatuses", []):
        t = (c.get("lastState", {}).get("terminated") or c.get("state", {}).get("terminated") or {})
        print(c.get("ready"), c.get("restartCount"), t.get("exitCode", "-"))' 2>/dev/null || true
}
wait_ready() {
  for _ in $(seq 1 120); do [[ "$(pod_state)" == True* ]] && return 0; sleep 1; done
  echo "kubelet-smoke: the pod did not become Ready: $(pod_state)" >&2; return 1
}
cp "$W/spate.yaml" "$W/manifests/"
t0=$SECONDS
wait_ready
echo "kubelet-smoke: pod Ready in $(( SECONDS - t0 )) s (the kubelet's /ready probe), $(curl -s "127.0.0.1:$H/health" | head -c 40)..."
E2E=(timeout 300 python3 scripts/image/e2e.py)
"${E2E[@]}" create "127.0.0.1:$K" smoke 3 1
"${E2E[@]}" produce "127.0.0.1:$K" smoke "$W/acked" 3000 60
# Removing the static pod: the kubelet stops it with SIGTERM and the 60 s grace period.
rm "$W/manifests/spate.yaml"
t0=$SECONDS
for _ in $(seq 1 90); do curl -s --max-time 2 "127.0.0.1:$H/health" >/dev/null || break; sleep 1; done
id=""; line=""
for _ in $(seq 1 90); do
  id="$(sed -n 's/.*"Killing container with a grace period".*containerName="spate".*containerID="containerd:\/\/\([0-9a-f]*\)".*gracePeriod=60.*/\1/p' "$W/kubelet.log" | tail -n 1)"
  # (The kill is logged before the exit: no exit line yet is no failure.)
  [[ -n "$id" ]] && line="$(grep "container finished.*$id.*exitCode=" "$W/kubelet.log" | tail -n 1 || true)"
  [[ -n "$line" ]] && break
  sleep 1
done
[[ -n "$id" ]] || { echo "kubelet-smoke: no SIGTERM with the 60 s grace period in the kubelet's log" >&2; exit 1; }
[[ "$line" == *exitCode=0* ]] || { echo "kubelet-smoke: spate did not exit 0 on the kubelet's SIGTERM: ${line:-no exit seen}" >&2; exit 1; }
clean="$(find "$W/data/data" -name clean_shutdown -printf '%h\n' | grep -c '/topics/smoke/[0-9]*$' || true)"
(( clean == 3 )) || { echo "kubelet-smoke: $clean of 3 partitions closed clean" >&2; exit 1; }
echo "kubelet-smoke: the kubelet's SIGTERM (grace 60 s) stopped spate in $(( SECONDS - t0 )) s, exit code 0, every partition clean"
for _ in $(seq 1 60); do [[ -z "$(pod_state)" ]] && break; sleep 1; done
cp "$W/spate.yaml" "$W/manifests/"
wait_ready
echo "kubelet-smoke: pod started again on the same data and Ready"
"${E2E[@]}" check "127.0.0.1:$K" smoke "$W/acked"

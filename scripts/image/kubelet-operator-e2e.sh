#!/usr/bin/env bash
# The operator's SpateCluster on a real kubelet: issue 31's Kubernetes e2e with containers.
#
#   scripts/image/kubelet-operator-e2e.sh      (root; KEEP=1 leaves the work directory)
#
# The project's test plane (scripts/k8s/up.sh: etcd, kube-apiserver, controller-manager,
# scheduler; K8S_KWOK=0, so no kwok and no fake node) gains one real node: the kubelet of
# scripts/image/kubelet-build.sh registered with the apiserver, containerd and runc from
# Debian's packages, the spate image imported into containerd. Pods get a network from
# Debian's CNI plugins (bridge `spate-k0` on 10.244.77.0/24, host-local IPAM), and names
# from scripts/image/cluster_dns.py on the bridge's address (the kubelet's clusterDNS):
# `<pod>.<headless>.<ns>.svc.cluster.local`, which spate's peers and advertised addresses
# use. No kube-proxy: the DNS answers a ClusterIP Service's name with its ready endpoints,
# and the one ClusterIP a pod needs, the `kubernetes` Service's (the operator's in-cluster
# config), is sent by an iptables DNAT rule to scripts/image/api_relay.py on the bridge,
# which relays to the apiserver on 127.0.0.1 (TLS end to end).
# The operator is installed from its chart (deploy/helm/spate-operator: CRDs, ServiceAccount,
# least-privilege RBAC, a Deployment of 2 replicas, leader and standby) and runs as pods from
# the localhost/spate-operator image. The Python clients (scripts/image/e2e.py,
# confluent-kafka) run on the host and resolve the cluster's names through the same DNS, in
# their own mount namespace with a resolv.conf naming it.
#
# Proves, reading every acknowledged record back after each fault:
#   1. a 3-node SpateCluster (image localhost/spate:<version>-debug) starts 3 real pods that
#      become Ready and form one cluster: a topic with replication 3 takes acks=all records;
#   2. deleting a pod: the StatefulSet re-creates it (new uid and IP, same claim and volume),
#      it rejoins, and a producer running throughout loses nothing;
#   3. an image change (the same image under a second tag) rolls the pods one at a time,
#      highest ordinal first, never two down, while a producer runs; nothing acknowledged is
#      lost.
# Needs the images (scripts/image.sh; SPATE_IMAGE_PROFILE=debug SPATE_IMAGE_NO_CARGO=1 for
# test builds), the control plane and helm (scripts/k8s/build.sh) and the kubelet (built here
# once).
# Two settings this machine needs, as in kubelet-smoke.sh: kubelet failCgroupV1: false
# (cgroup v1) and containerd restrict_oom_score_adj = true.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
[[ $(id -u) -eq 0 ]] || { echo "SKIPPED: kubelet-operator-e2e needs root"; exit 0; }
CACHE="${SPATE_K8S_CACHE:-$HOME/.cache/spate-k8s}"
BIN="$CACHE/bin"
KUBELET="$BIN/kubelet"
BRIDGE=spate-k0
SUBNET_PREFIX=10.244.77
GW="$SUBNET_PREFIX.1"
NODE=spate-node-1
T0=$(date +%s.%N)
say() { printf '[%6.1fs] %s\n' "$(echo "$(date +%s.%N) - $T0" | bc)" "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# wait_for DESCRIPTION SECONDS COMMAND...: polls COMMAND every 0.5 s.
wait_for() {
  local what="$1" secs="$2"; shift 2
  local end=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    [[ $(date +%s) -lt $end ]] || fail "timed out after ${secs}s waiting for: $what"
    sleep 0.5
  done
}

for tool in bc curl openssl; do
  command -v "$tool" >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$tool" >/dev/null; }
done
command -v containerd >/dev/null 2>&1 || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containerd >/dev/null; }
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] ||
  { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containernetworking-plugins >/dev/null; }
scripts/image/podman-setup.sh
pm() { podman --runtime runc "$@"; }
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl helm; do
  [[ -x "$BIN/$b" ]] || { scripts/k8s/build.sh; break; }
done
scripts/image/kubelet-build.sh >/dev/null

VERSION="$(cargo metadata --no-deps --format-version 1 --offline \
  | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "spate-server"))')"
TAG="${SPATE_IMAGE_TAG:-$VERSION-debug}"
IMAGE="localhost/spate:$TAG"
IMAGE2="localhost/spate:$TAG-roll"
OPIMAGE="localhost/spate-operator:$TAG"
for img in "$IMAGE" "$OPIMAGE"; do
  pm image exists "$img" || fail "$img missing: SPATE_IMAGE_PROFILE=debug scripts/image.sh"
done
! ip link show "$BRIDGE" >/dev/null 2>&1 || fail "bridge $BRIDGE exists (a run not cleaned up?)"
if ip -4 route show to match "$GW" | grep -qv '^default'; then fail "$SUBNET_PREFIX.0/24 is routed on this machine already"; fi

W="$(mktemp -d /tmp/spate-kop-e2e.XXXXXX)"
CTR=(ctr -a "$W/containerd.sock" -n k8s.io)
KPID=""; CPID=""; DPID=""; RPID=""; PRODUCER=""; DNAT=()
scripts/image/kubelet-host.sh save "$W/host-before"
k() { KUBECONFIG="$W/k8s/kubeconfig" "$BIN/kubectl" "$@"; }
jp() { k get "$1" "$2" -o "jsonpath=$3" 2>/dev/null; }
stop_pid() { # pid seconds: SIGTERM, then SIGKILL after SECONDS
  local p="$1" i
  [[ -n "$p" ]] || return 0
  kill "$p" 2>/dev/null || return 0
  for (( i = 0; i < $2 * 5; i++ )); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
  kill -9 "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || true
}
cleanup() {
  local rc=$?
  set +e
  trap - EXIT
  if (( rc != 0 )); then
    echo "---- last lines of the logs (work directory $W) ----" >&2
    tail -n 15 "$W/kubelet.log" "$W/dns.log" >&2 2>/dev/null
    for f in "$W"/pod-logs/*/*/*.log; do [[ -f "$f" ]] && { echo "== $f" >&2; tail -n 8 "$f" >&2; }; done
  fi
  [[ -z "$PRODUCER" ]] || stop_pid "$PRODUCER" 5
  # The pods go the Kubernetes way first: deleted, stopped by the kubelet (which tears down
  # their sandboxes and network namespaces), before the kubelet stops.
  if [[ -n "$KPID" ]] && kill -0 "$KPID" 2>/dev/null; then
    # The SpateCluster first: with it gone the operator re-creates nothing.
    k delete spatecluster --all --wait=false >/dev/null 2>&1
    k delete deployment,statefulset --all --wait=false >/dev/null 2>&1
    for i in $(seq 1 60); do
      (( i % 5 == 1 )) && k delete pods --all --grace-period=20 --wait=false >/dev/null 2>&1
      [[ -z "$(k get pods -o name 2>/dev/null)" ]] && break
      sleep 1
    done
  fi
  stop_pid "$KPID" 10
  if [[ -n "$CPID" ]]; then
    for c in $("${CTR[@]}" containers ls -q 2>/dev/null); do
      "${CTR[@]}" tasks kill -s KILL "$c" >/dev/null 2>&1
      for _ in $(seq 1 10); do "${CTR[@]}" tasks rm "$c" >/dev/null 2>&1 && break; sleep 0.3; done
      "${CTR[@]}" containers rm "$c" >/dev/null 2>&1
    done
    stop_pid "$CPID" 10
  fi
  stop_pid "$DPID" 5
  stop_pid "$RPID" 5
  (( ${#DNAT[@]} == 0 )) || iptables -t nat -D PREROUTING "${DNAT[@]}" 2>/dev/null
  [[ ! -f "$W/k8s/pids" ]] || scripts/k8s/down.sh "$W/k8s" >/dev/null 2>&1
  # Network namespaces left by sandboxes the kubelet did not get to stop.
  for ns in "$W"/containerd/state/netns/*; do
    [[ -e "$ns" ]] || continue
    umount "$ns" 2>/dev/null; rm -f "$ns"
  done
  grep -o " ${W}[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
  ip link del "$BRIDGE" 2>/dev/null
  scripts/image/kubelet-host.sh restore "$W/host-before"
  pm untag "$IMAGE" "$IMAGE2" 2>/dev/null
  if (( rc == 0 )) && [[ -z "${KEEP:-}" ]]; then rm -rf "$W"; else echo "work directory kept: $W" >&2; fi
  say "kubelet-operator-e2e: $( (( rc == 0 )) && echo PASS || echo "FAILED (rc $rc)")"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- control plane (no kwok, no fake node) ---------------------------------------------------
K8S_KWOK=0 K8S_NODES=0 K8S_PVS=0 scripts/k8s/up.sh "$W/k8s" >/dev/null
API="$(sed -n 's#.*server: https://127.0.0.1:\([0-9]*\).*#\1#p' "$W/k8s/kubeconfig")"
say "control plane up (apiserver 127.0.0.1:$API, no kwok)"

# --- pod network: a bridge we own, its gateway address answering DNS ------------------------
ip link add "$BRIDGE" type bridge
ip addr add "$GW/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
mkdir -p "$W/cni" "$W/cni-ipam"
cat >"$W/cni/10-spate.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "spate-e2e",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "isDefaultGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$W/cni-ipam",
              "ranges": [[{"subnet": "$SUBNET_PREFIX.0/24", "gateway": "$GW"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
python3 scripts/image/cluster_dns.py "$GW:53" "$W/k8s/kubeconfig" >"$W/dns.log" 2>&1 &
DPID=$!
wait_for "cluster DNS" 20 grep -q serving "$W/dns.log"
# The apiserver for pods: the `kubernetes` Service's ClusterIP:443 -> the relay on the bridge.
read -r RELAY_PORT < <(python3 scripts/free-ports.py 1)
python3 scripts/image/api_relay.py "$GW:$RELAY_PORT" "127.0.0.1:$API" >"$W/relay.log" 2>&1 &
RPID=$!
KUBE_SVC_IP="$(jp service kubernetes '{.spec.clusterIP}')"
DNAT=(-s "$SUBNET_PREFIX.0/24" -d "$KUBE_SVC_IP/32" -p tcp --dport 443 -m comment --comment spate-kubelet-operator-e2e -j DNAT --to-destination "$GW:$RELAY_PORT")
iptables -t nat -A PREROUTING "${DNAT[@]}"
# Host-side processes that must resolve the cluster's names run in their own mount namespace
# with this resolv.conf (the pods get the same from the kubelet).
printf 'nameserver %s\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n' "$GW" >"$W/resolv.conf"
# (An array, not a function: started in the background it is the process itself, so its pid
# is the one to stop.)
# shellcheck disable=SC2016 # expanded by that sh
INCL=(unshare -m -- sh -c 'mount --bind "$1" /etc/resolv.conf && shift && exec "$@"' sh "$W/resolv.conf")
: >"$W/host-resolv.conf"   # the kubelet adds the host's search domains from here: none
say "pod network: bridge $BRIDGE $GW/24 (CNI bridge + host-local from /usr/lib/cni), DNS on $GW:53, $KUBE_SVC_IP:443 -> apiserver"

# --- containerd and the images -----------------------------------------------------------------
mkdir -p "$W/pause" "$W/pod-logs"
gcc -static -Os -o "$W/pause/pause" scripts/image/pause.c
printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$W/pause/Dockerfile"
pm build -q --pull=never --network=none -t localhost/pause:spate "$W/pause" >/dev/null
pm tag "$IMAGE" "$IMAGE2"
containerd config default >"$W/containerd.toml"
sed -i -e "s#^root = .*#root = \"$W/containerd/root\"#" -e "s#^state = .*#state = \"$W/containerd/state\"#" \
  -e "s#address = \"/run/containerd/containerd.sock\"#address = \"$W/containerd.sock\"#" \
  -e "s#sandbox_image = .*#sandbox_image = \"localhost/pause:spate\"#" \
  -e "s#bin_dir = \"/opt/cni/bin\"#bin_dir = \"/usr/lib/cni\"#" \
  -e "s#conf_dir = \"/etc/cni/net.d\"#conf_dir = \"$W/cni\"#" \
  -e "s#netns_mounts_under_state_dir = false#netns_mounts_under_state_dir = true#" \
  -e "s#restrict_oom_score_adj = false#restrict_oom_score_adj = true#" "$W/containerd.toml"
for want in 'restrict_oom_score_adj = true' 'netns_mounts_under_state_dir = true' 'bin_dir = "/usr/lib/cni"'; do
  grep -q "$want" "$W/containerd.toml" || fail "containerd config: could not set $want"
done
containerd --config "$W/containerd.toml" >"$W/containerd.log" 2>&1 &
CPID=$!
wait_for "containerd socket" 20 test -S "$W/containerd.sock"
for img in "$IMAGE" "$IMAGE2" "$OPIMAGE" localhost/pause:spate; do
  pm save --format docker-archive "$img" | "${CTR[@]}" images import - >/dev/null
done
"${CTR[@]}" images ls -q | grep -q "^$IMAGE2\$" || fail "$IMAGE2 not in containerd"
say "containerd up; imported $IMAGE, $IMAGE2 (same image, second tag), $OPIMAGE, localhost/pause:spate"

# --- the kubelet, registered as node $NODE -----------------------------------------------------
read -r KP KH < <(python3 scripts/free-ports.py 2)
cat >"$W/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
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
clusterDNS: [$GW]
clusterDomain: cluster.local
resolvConf: $W/host-resolv.conf
registerNode: true
EOF
# The kubelet's credentials: the test plane's admin token (no Node authorizer or bootstrap
# tokens on this apiserver).
"$KUBELET" --config "$W/kubelet.yaml" --kubeconfig "$W/k8s/kubeconfig" --root-dir "$W/kubelet" \
  --cert-dir "$W/kubelet/pki" --hostname-override "$NODE" --node-ip "$GW" --v=2 >"$W/kubelet.log" 2>&1 &
KPID=$!
t=$SECONDS
wait_for "node $NODE Ready" 120 bash -c "[[ \$(KUBECONFIG='$W/k8s/kubeconfig' '$BIN/kubectl' get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}') == True ]]"
wait_for "node $NODE untainted" 60 bash -c "[[ -z \$(KUBECONFIG='$W/k8s/kubeconfig' '$BIN/kubectl' get node $NODE -o jsonpath='{.spec.taints}') ]]"
say "kubelet $("$KUBELET" --version | cut -d' ' -f2) registered node $NODE, Ready in $(( SECONDS - t )) s ($(jp node "$NODE" '{.status.nodeInfo.containerRuntimeVersion}'), $(jp node "$NODE" '{.status.nodeInfo.kernelVersion}'))"

# --- volumes: pre-made, as a provisioner would (hostPath gets no fsGroup chown) -------------------
for i in 1 2 3 4; do
  mkdir -p "$W/pv/$i"; chown 10001:10001 "$W/pv/$i"; chmod 0750 "$W/pv/$i"
  cat <<PV
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-$i}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: $W/pv/$i, type: Directory}
---
PV
done | k apply -f - >/dev/null

# --- the operator, from its chart, as pods --------------------------------------------------------
"$BIN/helm" template spate-operator deploy/helm/spate-operator --namespace default --include-crds \
  --set image.tag="$TAG" >"$W/operator-chart.yaml"
k apply -f "$W/operator-chart.yaml" >/dev/null
k wait --for=condition=Established crd/spateclusters.spate.io crd/spatetopics.spate.io --timeout=60s >/dev/null
t=$SECONDS
wait_for "the operator's 2 pods Ready" 180 bash -c "[[ \$(KUBECONFIG='$W/k8s/kubeconfig' '$BIN/kubectl' get deployment spate-operator -o jsonpath='{.status.readyReplicas}') == 2 ]]"
wait_for "an operator holds the Lease" 60 bash -c "[[ -n \$(KUBECONFIG='$W/k8s/kubeconfig' '$BIN/kubectl' get lease spate-operator -o jsonpath='{.spec.holderIdentity}') ]]"
say "operator chart applied: 2 pods of $OPIMAGE Ready in $(( SECONDS - t )) s, $(jp lease spate-operator '{.spec.holderIdentity}') leads (service account spate-operator, the chart's RBAC, in-cluster config through $KUBE_SVC_IP)"

# --- 1. a 3-node cluster in real pods -------------------------------------------------------------
cluster_yaml() { # image
  cat <<EOF
apiVersion: spate.io/v1alpha1
kind: SpateCluster
metadata: {name: demo}
spec:
  replicas: 3
  image: $1
  imagePullPolicy: Never
  storage: {size: 1Gi, storageClassName: manual}
  antiAffinity: none
EOF
}
pods() { k get pods -l app.kubernetes.io/instance=demo -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid} {.status.podIP} {.spec.containers[0].image} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}'; }
spate_cid() { jp pod "$1" '{.status.containerStatuses[0].containerID}' | sed 's#^containerd://##'; }
# exit_codes CONTAINER_ID...: the spate containers' exit codes, as the kubelet saw them end.
exit_codes() {
  local id code out=""
  for id in "$@"; do
    code=""
    for _ in $(seq 1 60); do
      code="$(sed -n "s/.*container finished.*containerID=\"$id\" exitCode=\([0-9-]*\).*/\1/p" "$W/kubelet.log" | tail -n 1)"
      [[ -n "$code" ]] && break
      sleep 1
    done
    out="$out ${code:-none}"
  done
  echo "${out# }"
}
t_apply=$(date +%s)
cluster_yaml "$IMAGE" | k apply -f - >/dev/null
wait_for "3 pods Ready" 300 bash -c "[[ \$(KUBECONFIG='$W/k8s/kubeconfig' '$BIN/kubectl' get statefulset demo -o jsonpath='{.status.readyReplicas}') == 3 ]]"
t_ready=$(date +%s)
for p in demo-0 demo-1 demo-2; do
  created=$(jp pod "$p" '{.metadata.creationTimestamp}')
  started=$(jp pod "$p" '{.status.containerStatuses[0].state.running.startedAt}')
  ready=$(jp pod "$p" '{.status.conditions[?(@.type=="Ready")].lastTransitionTime}')
  python3 -c "
import datetime as d, sys
t = lambda s: d.datetime.strptime(s, '%Y-%m-%dT%H:%M:%SZ').timestamp()
print(f'  $p on {sys.argv[4]} ({sys.argv[5]}): container started {t(sys.argv[2]) - t(sys.argv[1]):.0f} s and Ready {t(sys.argv[3]) - t(sys.argv[1]):.0f} s after the pod was created')" \
    "$created" "$started" "$ready" "$(jp pod "$p" '{.spec.nodeName}')" "$(jp pod "$p" '{.status.podIP}')"
done
say "3 pods Ready $(( t_ready - t_apply )) s after the SpateCluster was applied"
wait_for "SpateCluster Ready" 120 bash -c "[[ \$(KUBECONFIG='$W/k8s/kubeconfig' '$BIN/kubectl' get spatecluster demo -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}') == True ]]"
say "SpateCluster Ready: controller $(jp spatecluster demo '{.status.controller}'), nodes $(jp spatecluster demo '{.status.nodes}'), URP $(jp spatecluster demo '{.status.underReplicatedPartitions}')"
# The cluster as spate sees it, through the client Service's name (from the operator's view).
"${INCL[@]}" curl -sf "http://demo.default.svc.cluster.local:9644/admin/cluster" >"$W/cluster.json"
python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
nodes = sorted(n["id"] for n in c["nodes"])
print("  spate /admin/cluster: nodes", nodes, "at", ", ".join(n["inter_node"] for n in c["nodes"]))
assert nodes == [1, 2, 3], nodes' "$W/cluster.json"
BOOT="demo-0.demo-nodes.default.svc.cluster.local:9092,demo-1.demo-nodes.default.svc.cluster.local:9092,demo-2.demo-nodes.default.svc.cluster.local:9092"
E2E=("${INCL[@]}" timeout 900 python3 scripts/image/e2e.py)
for topic in formed deleted rolled; do "${E2E[@]}" create "$BOOT" "$topic" 6 3; done
"${E2E[@]}" produce "$BOOT" formed "$W/acked-formed" 3000 60
"${E2E[@]}" check "$BOOT" formed "$W/acked-formed"
say "formed: topic formed (6 partitions, replication 3, min.insync 2) took acks=all records"

# --- 2. delete a pod: the StatefulSet re-creates it on its volume -----------------------------------
before="$(pods | awk '$1 == "demo-1"')"
deleted_cid="$(spate_cid demo-1)"
claim=$(jp pod demo-1 '{.spec.volumes[?(@.name=="data")].persistentVolumeClaim.claimName}')
pv=$(jp pvc "$claim" '{.spec.volumeName}')
"${E2E[@]}" produce "$BOOT" deleted "$W/acked-deleted" 1000000 600 "$W/stop-2" >"$W/producer-2.log" 2>&1 &
PRODUCER=$!
sleep 3
t=$(date +%s.%N)
k delete pod demo-1 --wait=false >/dev/null
wait_for "demo-1 re-created" 120 bash -c "[[ -n \$(KUBECONFIG='$W/k8s/kubeconfig' '$BIN/kubectl' get pod demo-1 -o jsonpath='{.metadata.uid}') && \$(KUBECONFIG='$W/k8s/kubeconfig' '$BIN/kubectl' get pod demo-1 -o jsonpath='{.metadata.uid}') != $(awk '{print $2}' <<<"$before") ]]"
wait_for "demo-1 Ready again" 180 bash -c "[[ \$(KUBECONFIG='$W/k8s/kubeconfig' '$BIN/kubectl' get pod demo-1 -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}') == True ]]"
back=$(printf %.1f "$(echo "$(date +%s.%N) - $t" | bc)")
after="$(pods | awk '$1 == "demo-1"')"
[[ $(jp pod demo-1 '{.spec.volumes[?(@.name=="data")].persistentVolumeClaim.claimName}') == "$claim" ]] || fail "demo-1 has another claim"
[[ $(jp pvc "$claim" '{.spec.volumeName}') == "$pv" ]] || fail "claim $claim bound elsewhere"
[[ -d "$W/pv/${pv#pv-}/data" ]] || fail "no data on $pv"
wait_for "SpateCluster Ready after the re-creation" 180 bash -c "[[ \$(KUBECONFIG='$W/k8s/kubeconfig' '$BIN/kubectl' get spatecluster demo -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}/{.status.underReplicatedPartitions}') == True/0 ]]"
touch "$W/stop-2"; wait "$PRODUCER"; PRODUCER=""
cat "$W/producer-2.log"
codes="$(exit_codes "$deleted_cid")"
[[ "$codes" == 0 ]] || fail "spate in the deleted pod exited with $codes on the kubelet's SIGTERM"
say "deleted demo-1 ($(awk '{print $2" at "$3}' <<<"$before")): re-created as $(awk '{print $2" at "$3}' <<<"$after") on claim $claim / $pv, Ready ${back}s after the delete; spate healthy again; the deleted pod's spate exited 0 on SIGTERM"
for topic in formed deleted; do "${E2E[@]}" check "$BOOT" "$topic" "$W/acked-$topic"; done

# --- 3. an image change rolls one pod at a time while a producer runs --------------------------------
"${E2E[@]}" produce "$BOOT" rolled "$W/acked-rolled" 1000000 900 "$W/stop-3" >"$W/producer-3.log" 2>&1 &
PRODUCER=$!
sleep 3
rolled_cids=()
for p in demo-0 demo-1 demo-2; do rolled_cids+=("$(spate_cid "$p")"); done
t_roll=$(date +%s.%N)
cluster_yaml "$IMAGE2" | k apply -f - >/dev/null
# Watch: each pod's uid, image and readiness, twice a second; never two pods not ready.
: >"$W/roll.log"
partitions=""   # the StatefulSet's rollingUpdate.partition as the operator steps it
end=$(( $(date +%s) + 600 ))
while :; do
  snap="$(pods)"
  sts="$(jp statefulset demo '{.spec.updateStrategy.rollingUpdate.partition}/{.status.updatedReplicas}')"
  printf '%s %s\n' "$(date +%s.%N)" "$(tr '\n' ';' <<<"$snap")" >>"$W/roll.log"
  [[ "${sts%/*}" == "${partitions##* }" ]] || partitions="$partitions ${sts%/*}"
  (( $(awk '$5 == "True"' <<<"$snap" | wc -l) >= 2 )) || fail "two pods down during the roll: $snap"
  [[ $(awk -v i="$IMAGE2" '$4 == i && $5 == "True"' <<<"$snap" | wc -l) == 3 && "$sts" == 0/3 ]] && break
  [[ $(date +%s) -lt $end ]] || fail "the roll did not finish in 600 s: $snap"
  sleep 0.5
done
roll=$(printf %.1f "$(echo "$(date +%s.%N) - $t_roll" | bc)")
order="$(python3 - "$W/roll.log" "$IMAGE2" <<'PY'
import sys
seen, order = {}, []
for line in open(sys.argv[1]):
    ts, snap = line.split(" ", 1)
    for p in filter(None, snap.strip().split(";")):
        f = p.split()
        if len(f) >= 4 and f[3] == sys.argv[2] and f[0] not in seen:
            seen[f[0]] = float(ts)
            order.append(f[0])
t0 = min(seen.values())
print(",".join(order), " ".join(f"{p}@+{seen[p] - t0:.0f}s" for p in order))
PY
)"
[[ "${order%% *}" == demo-2,demo-1,demo-0 ]] || fail "roll order: $order"
[[ "$partitions" == *" 2 1 0" ]] || fail "the operator's partition went$partitions, expected it to end 2 1 0"
wait_for "SpateCluster Ready after the roll" 180 bash -c "[[ \$(KUBECONFIG='$W/k8s/kubeconfig' '$BIN/kubectl' get spatecluster demo -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}/{.status.underReplicatedPartitions}') == True/0 ]]"
sleep 3
touch "$W/stop-3"; wait "$PRODUCER"; PRODUCER=""
cat "$W/producer-3.log"
codes="$(exit_codes "${rolled_cids[@]}")"
[[ "$codes" == "0 0 0" ]] || fail "spate exit codes of the rolled pods on SIGTERM: $codes"
say "image $IMAGE -> $IMAGE2 rolled in ${roll}s, one pod at a time (never fewer than 2 Ready; partition$partitions): ${order#* }; each old pod's spate exited 0 on SIGTERM"
pods | sed 's/^/  /'
for topic in formed deleted rolled; do "${E2E[@]}" check "$BOOT" "$topic" "$W/acked-$topic"; done
say "every acknowledged record read back: $(cat "$W"/acked-* | wc -l) records over the three phases"

#!/usr/bin/env bash
# Starts a throw-away Kubernetes control plane on loopback: etcd, kube-apiserver,
# kube-controller-manager (garbage collector, StatefulSet and PV binder controllers),
# kube-scheduler and kwok (fake kubelets: pods "run" without containers), plus fake nodes
# and pre-made PersistentVolumes (nothing provisions volumes here).
#
#   scripts/k8s/up.sh WORKDIR      # writes WORKDIR/kubeconfig and WORKDIR/pids
#   scripts/k8s/down.sh WORKDIR
#
# Binaries come from scripts/k8s/build.sh's cache ($SPATE_K8S_CACHE, ~/.cache/spate-k8s).
# K8S_NODES (default 6) fake nodes, K8S_PVS (default 12) 1Gi volumes of class `manual`;
# K8S_KWOK=0 starts no kwok (scripts/image/kubelet-operator-e2e.sh brings a real kubelet).
set -euo pipefail
W="${1:?usage: up.sh WORKDIR}"
CACHE="${SPATE_K8S_CACHE:-$HOME/.cache/spate-k8s}"
BIN="$CACHE/bin"
NODES="${K8S_NODES:-6}"
KWOK="${K8S_KWOK:-1}"
PVS="${K8S_PVS:-12}"
mkdir -p "$W"
W="$(cd "$W" && pwd)"
bins=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)
[ "$KWOK" = 0 ] || bins+=(kwok)
for b in "${bins[@]}"; do
  [ -x "$BIN/$b" ] || { echo "up.sh: $BIN/$b missing: run scripts/k8s/build.sh" >&2; exit 2; }
done
: >"$W/pids"
start() { # name, command...
  local name="$1"; shift
  "$@" >"$W/$name.log" 2>&1 &
  echo "$name $!" >>"$W/pids"
}
free_ports() {
  python3 -c '
import socket,sys
s=[socket.socket() for _ in range(int(sys.argv[1]))]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])' "$1"
}
read -r ETCD_C ETCD_P API < <(free_ports 3)

start etcd "$BIN/etcd" --name e2e --data-dir "$W/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_C" --advertise-client-urls "http://127.0.0.1:$ETCD_C" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_P" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_P" \
  --initial-cluster "e2e=http://127.0.0.1:$ETCD_P" --quota-backend-bytes 1073741824

mkdir -p "$W/pki"
[ -f "$W/pki/sa.key" ] || openssl genrsa -out "$W/pki/sa.key" 2048 2>/dev/null
TOKEN="$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
echo "$TOKEN,admin,admin,system:masters" >"$W/pki/tokens.csv"
# The audit log records every request: the e2e counts the operator's writes there too.
cat >"$W/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: None
POLICY
start kube-apiserver "$BIN/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$ETCD_C" --bind-address 127.0.0.1 --secure-port "$API" \
  --advertise-address 127.0.0.1 \
  --cert-dir "$W/pki" --service-cluster-ip-range 10.96.0.0/16 \
  --service-account-issuer https://kubernetes.default.svc \
  --service-account-key-file "$W/pki/sa.key" --service-account-signing-key-file "$W/pki/sa.key" \
  --token-auth-file "$W/pki/tokens.csv" --authorization-mode RBAC \
  --audit-policy-file "$W/audit-policy.yaml" --audit-log-path "$W/audit.log"

cat >"$W/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: https://127.0.0.1:$API
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: $TOKEN
contexts:
- name: e2e
  context: {cluster: e2e, user: admin, namespace: default}
current-context: e2e
KC
export KUBECONFIG="$W/kubeconfig"
K="$BIN/kubectl"
for _ in $(seq 1 120); do "$K" get --raw /readyz >/dev/null 2>&1 && break; sleep 0.5; done
"$K" get --raw /readyz >/dev/null || { echo "up.sh: kube-apiserver not ready; see $W/kube-apiserver.log" >&2; exit 1; }

start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$W/kubeconfig" \
  --leader-elect=false --secure-port=0 --use-service-account-credentials=false \
  --service-account-private-key-file "$W/pki/sa.key" --root-ca-file "$W/pki/apiserver.crt" \
  --controllers '*,-nodeipam,-cloud-node-lifecycle,-route,-service'
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$W/kubeconfig" --leader-elect=false --secure-port=0
[ "$KWOK" = 0 ] || start kwok "$BIN/kwok" --kubeconfig "$W/kubeconfig" --manage-all-nodes=false \
  --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --node-lease-duration-seconds=40 --cidr=10.0.0.1/24 --node-ip=10.0.0.1 \
  --config "$CACHE/kwok-stages.yaml"

for i in $(seq 1 "$NODES"); do
  cat <<NODE
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {type: kwok, kubernetes.io/hostname: kwok-node-$i, topology.kubernetes.io/zone: zone-$((i % 3))}
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "110"}
  capacity: {cpu: "32", memory: 256Gi, pods: "110"}
---
NODE
done | { if [ "$NODES" = 0 ]; then cat >/dev/null; else "$K" apply -f - >/dev/null; fi; }
# Admission taints new nodes not-ready until the node lifecycle controller sees them Ready;
# kwok reports them Ready at once, so drop the taint rather than wait for that controller.
for i in $(seq 1 "$NODES"); do
  "$K" taint node "kwok-node-$i" node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
done
# Class `manual`: pre-made volumes; expansion allowed so claims may be asked to grow (nothing
# resizes them here: the claim's request changes, its capacity does not).
cat <<'SC' | "$K" apply -f - >/dev/null
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: manual}
provisioner: kubernetes.io/no-provisioner
allowVolumeExpansion: true
volumeBindingMode: Immediate
SC
for i in $(seq 1 "$PVS"); do
  cat <<PV
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-$i}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: /tmp/kwok-pv-$i}
---
PV
done | { if [ "$PVS" = 0 ]; then cat >/dev/null; else "$K" apply -f - >/dev/null; fi; }
# The namespace's default ServiceAccount (pods need it) comes from the controller-manager.
for _ in $(seq 1 120); do "$K" get serviceaccount default >/dev/null 2>&1 && break; sleep 0.5; done
echo "control plane up: KUBECONFIG=$W/kubeconfig (logs in $W)"

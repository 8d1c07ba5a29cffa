#!/usr/bin/env bash
# End-to-end test of spate-operator against a real Kubernetes control plane (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler built from the Go module proxy;
# kwok as the kubelets) and a real spate cluster on loopback (the pods cannot run spate under
# kwok, so the SpateCluster's annotations point the operator at these processes).
#
#   scripts/k8s-e2e.sh            # builds what it needs once (Go binaries cached in
#                                 # ~/.cache/spate-k8s), then runs every phase
#
# Phases: CRDs; create (StatefulSet, Services, PDB, ConfigMap, ServiceMonitor, status from
# spate); idempotency (no write on a pass with nothing changed, by the operator's counter and
# the apiserver's audit log); SpateTopics (create, alter, grow, refused decrease, deletion
# policies); scale 3 -> 5 -> 3 through spate's add-node / balance / decommission; a config
# roll one pod at a time that pauses while spate has under-replicated partitions; bad input;
# leader failover (kill -9 the leading operator, time the standby's takeover); deletion
# (owned objects collected, volumes kept). Not part of scripts/test.sh (Go builds, minutes).
# KEEP=1 leaves the work directory.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CACHE="${SPATE_K8S_CACHE:-$HOME/.cache/spate-k8s}"
BIN="$CACHE/bin"
LEASE_SECONDS=10
LEASE_GRACE=3

for tool in openssl curl bc python3; do
  command -v "$tool" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$tool"; }
done
scripts/k8s/build.sh
cargo build -q -p spate-server -p spate-operator
SPATE="$ROOT/target/debug/spate"
OPERATOR="$ROOT/target/debug/spate-operator"

W="$(mktemp -d /tmp/spate-k8s-e2e.XXXXXX)"
PIDS=()
cleanup() {
  local rc=$?
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  scripts/k8s/down.sh "$W/k8s" >/dev/null 2>&1 || true
  if [[ $rc -ne 0 ]]; then
    echo "FAILED (rc $rc); logs in $W" >&2
  elif [[ -z "${KEEP:-}" ]]; then
    rm -rf "$W"
  fi
}
trap cleanup EXIT

T0=$(date +%s.%N)
say() { printf '[%6.1fs] %s\n' "$(echo "$(date +%s.%N) - $T0" | bc)" "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# wait_for DESCRIPTION SECONDS COMMAND...: polls COMMAND every 0.3 s.
wait_for() {
  local what="$1" secs="$2"; shift 2
  local end=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    [[ $(date +%s) -lt $end ]] || fail "timed out after ${secs}s waiting for: $what"
    sleep 0.3
  done
}

scripts/k8s/up.sh "$W/k8s"
export KUBECONFIG="$W/k8s/kubeconfig"
k() { "$BIN/kubectl" "$@"; }
jp() { k get "$1" "$2" -o "jsonpath=$3" 2>/dev/null; }

# --- a real spate cluster on loopback: nodes 1-3 found it, 4 and 5 join on scale-out -------
read -r -a PORTS < <(python3 "$ROOT/scripts/free-ports.py" 17)
declare -A KAFKA CLUSTER HTTP SPID
for n in 1 2 3 4 5; do
  KAFKA[$n]=${PORTS[$((n - 1))]}; CLUSTER[$n]=${PORTS[$((n + 4))]}; HTTP[$n]=${PORTS[$((n + 9))]}
done
OP_A_HTTP=${PORTS[15]}; OP_B_HTTP=${PORTS[16]}
# Admin API mutations need this token; the operator reads it from the SpateCluster's Secret.
ADMIN_TOKEN="e2e-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
FOUNDERS="1=127.0.0.1:${CLUSTER[1]},2=127.0.0.1:${CLUSTER[2]},3=127.0.0.1:${CLUSTER[3]}"
start_spate() { # id peers
  local n=$1 peers=$2
  mkdir -p "$W/spate/node$n"
  "$SPATE" --node-id "$n" --cluster-peers "$peers" --listen "127.0.0.1:${KAFKA[$n]}" \
    --http-listen "127.0.0.1:${HTTP[$n]}" --data-dir "$W/spate/node$n/data" \
    --replica-lag-time-max-ms 3000 --broker-session-timeout-ms 4000 --admin-token "$ADMIN_TOKEN" \
    >"$W/spate/node$n/stdout" 2>"$W/spate/node$n/spate.log" &
  SPID[$n]=$!
  PIDS+=($!)
}
for n in 1 2 3; do start_spate $n "$FOUNDERS"; done
for n in 1 2 3; do wait_for "spate node $n ready" 60 curl -sf "127.0.0.1:${HTTP[$n]}/ready"; done
ADMIN="127.0.0.1:${HTTP[1]}"
spate_nodes() { curl -sf "$ADMIN/admin/cluster" | python3 -c 'import json,sys; print(",".join(str(n["id"]) for n in json.load(sys.stdin)["nodes"]))'; }
say "spate cluster up: nodes $(spate_nodes)"

# --- CRDs, and the Prometheus operator's ServiceMonitor CRD (so the operator makes one) ----
"$OPERATOR" crds | k apply -f - >/dev/null
cat <<'EOF' | k apply -f - >/dev/null
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: servicemonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  names: {kind: ServiceMonitor, plural: servicemonitors, singular: servicemonitor}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
EOF
k wait --for=condition=Established crd/spateclusters.spate.io crd/spatetopics.spate.io \
  crd/servicemonitors.monitoring.coreos.com --timeout=60s >/dev/null
say "CRDs established"

# --- the chart: lint, render, and its ServiceAccount + least-privilege RBAC for the operators --
"$BIN/helm" lint deploy/helm/spate-operator deploy/helm/spate >/dev/null || fail "helm lint"
"$BIN/helm" template spate-operator deploy/helm/spate-operator --namespace default >"$W/operator-chart.yaml"
"$BIN/helm" template spate deploy/helm/spate --set metrics.serviceMonitor=true --set metrics.grafanaDashboard=true --set metrics.prometheusRule=true >"$W/spate-chart.yaml"
k apply --dry-run=server -f "$W/spate-chart.yaml" >/dev/null || fail "the spate chart does not apply"
"$BIN/helm" template spate-operator deploy/helm/spate-operator --namespace default \
  --show-only templates/serviceaccount.yaml --show-only templates/rbac.yaml | k apply -f - >/dev/null
# The operators below authenticate as the chart's ServiceAccount (the apiserver runs RBAC).
SA_TOKEN=$(k create token spate-operator --duration 2h)
sed "s/token: .*/token: $SA_TOKEN/" "$KUBECONFIG" >"$W/operator-kubeconfig"
say "helm lint and template clean; operators run as ServiceAccount spate-operator under the chart's RBAC"

# --- two operator replicas, one Lease -----------------------------------------------------
start_operator() { # identity port
  KUBECONFIG="$W/operator-kubeconfig" POD_NAME="$1" RUST_LOG=info,kube_client=error "$OPERATOR" run --http-listen "127.0.0.1:$2" \
    --lease-namespace default --lease-duration-seconds $LEASE_SECONDS \
    --lease-grace-seconds $LEASE_GRACE >>"$W/operator-$1.log" 2>&1 &
  PIDS+=($!)
  eval "OP_PID_${1//-/_}=$!"
}
start_operator op-a "$OP_A_HTTP"
wait_for "op-a leads" 60 bash -c "[[ \$('$BIN/kubectl' get lease spate-operator -o jsonpath='{.spec.holderIdentity}') == op-a ]]"
start_operator op-b "$OP_B_HTTP"
wait_for "op-b http" 30 curl -sf "127.0.0.1:$OP_B_HTTP/ready"
metric() { # port name -> sum of the series
  curl -sf "127.0.0.1:$1/metrics" | awk -v m="$2" '$1 ~ "^"m"(\\{|$)" {s+=$NF} END {print s+0}'
}
[[ $(metric "$OP_B_HTTP" spate_operator_leader) == 0 ]] || fail "op-b leads beside op-a"
say "op-a leads, op-b stands by"

# --- create --------------------------------------------------------------------------------
cluster_yaml() { # replicas
  cat <<EOF
apiVersion: spate.io/v1alpha1
kind: SpateCluster
metadata:
  name: demo
  annotations:
    spate.io/admin-endpoint: "$ADMIN"
    spate.io/node-addresses: "4=127.0.0.1:${CLUSTER[4]},5=127.0.0.1:${CLUSTER[5]}"
spec:
  replicas: $1
  image: spate:e2e
  storage: {size: 1Gi, storageClassName: manual}
  broker:
    fsync: interval
    config: {retention-check-interval-ms: "30000"}
  antiAffinity: required
  topologySpread: {topologyKey: topology.kubernetes.io/zone, maxSkew: 1}
  metrics: {serviceMonitor: true, interval: 15s}
  security: {adminTokenSecret: {name: spate-admin, key: token}}
EOF
}
k create secret generic spate-admin --from-literal=token="$ADMIN_TOKEN" >/dev/null
curl -sf -X POST "$ADMIN/admin/cluster/balance" >/dev/null && fail "spate accepted an admin mutation without the token"
cluster_yaml 3 | k apply -f - >/dev/null
wait_for "StatefulSet demo" 30 k get statefulset demo
[[ $(jp statefulset demo '{.spec.replicas}') == 3 ]] || fail "replicas"
[[ $(jp statefulset demo '{.spec.serviceName}') == demo-nodes ]] || fail "serviceName"
[[ $(jp statefulset demo '{.spec.podManagementPolicy}') == Parallel ]] || fail "Parallel"
[[ $(jp statefulset demo '{.metadata.ownerReferences[0].kind}') == SpateCluster ]] || fail "owner"
[[ $(jp statefulset demo '{.spec.persistentVolumeClaimRetentionPolicy.whenDeleted}') == Retain ]] || fail "retain"
jp statefulset demo '{.spec.template.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey}' | grep -q kubernetes.io/hostname || fail "anti-affinity"
jp statefulset demo '{.spec.template.spec.containers[0].env}' | grep -q '"SPATE_FOUNDING_REPLICAS","value":"3"' || fail "founding env"
wait_for "headless Service" 20 k get service demo-nodes
[[ $(jp service demo-nodes '{.spec.clusterIP}') == None ]] || fail "headless"
[[ $(jp service demo-nodes '{.spec.publishNotReadyAddresses}') == true ]] || fail "publishNotReady"
wait_for "client Service" 20 k get service demo
[[ $(jp pdb demo '{.spec.maxUnavailable}') == 1 ]] || fail "pdb"
jp configmap demo-config '{.data.spate\.toml}' | grep -q 'fsync = "interval"' || fail "config"
jp configmap demo-config '{.data.spate\.toml}' | grep -q 'retention-check-interval-ms = "30000"' || fail "config map"
wait_for "ServiceMonitor" 20 k get servicemonitor demo
[[ $(jp servicemonitor demo '{.spec.endpoints[0].port}') == http ]] || fail "servicemonitor port"
say "create: StatefulSet, Services, PDB, ConfigMap, ServiceMonitor have the expected specs"
wait_for "3 pods ready (kwok)" 90 bash -c "[[ \$('$BIN/kubectl' get statefulset demo -o jsonpath='{.status.readyReplicas}') == 3 ]]"
cond() { jp spatecluster demo "{.status.conditions[?(@.type==\"$1\")].$2}"; }
wait_for "SpateCluster Ready" 60 bash -c "[[ \$('$BIN/kubectl' get spatecluster demo -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}') == True ]]"
[[ -n $(jp spatecluster demo '{.status.controller}') ]] || fail "status.controller"
[[ $(jp spatecluster demo '{.status.underReplicatedPartitions}') == 0 ]] || fail "status URP"
say "status: Ready, controller $(jp spatecluster demo '{.status.controller}'), URP 0, nodes $(jp spatecluster demo '{.status.nodes}')"

# --- idempotency: a pass with nothing changed writes nothing ---------------------------------
audit_writes() { grep -c 'fieldManager=spate-operator' "$W/k8s/audit.log" || true; }
W0=$(metric "$OP_A_HTTP" spate_operator_api_writes_total); A0=$(audit_writes)
R0=$(metric "$OP_A_HTTP" 'spate_operator_reconciles_total')
for i in 1 2 3; do
  k annotate spatecluster demo "e2e/poke=$i" --overwrite >/dev/null
  wait_for "reconcile after poke $i" 30 bash -c "[[ \$(curl -sf 127.0.0.1:$OP_A_HTTP/metrics | awk '/^spate_operator_reconciles_total/ {s+=\$NF} END {print s+0}') -gt $((R0 + i - 1)) ]]"
  sleep 1
done
sleep 1
W1=$(metric "$OP_A_HTTP" spate_operator_api_writes_total); A1=$(audit_writes)
R1=$(metric "$OP_A_HTTP" 'spate_operator_reconciles_total')
[[ "$W0" == "$W1" ]] || fail "idempotency: writes went from $W0 to $W1 over $((R1 - R0)) reconciles"
[[ "$A0" == "$A1" ]] || fail "idempotency: audit log writes went from $A0 to $A1"
say "idempotent: $((R1 - R0)) reconciles with nothing changed made 0 writes (operator counter $W1, audit log $A1)"

# --- topics ---------------------------------------------------------------------------------
topic_yaml() { # name partitions retention policy
  cat <<EOF
apiVersion: spate.io/v1alpha1
kind: SpateTopic
metadata: {name: $1}
spec:
  cluster: demo
  partitions: $2
  replicationFactor: 3
  config: {retention.ms: "$3"}
  deletionPolicy: $4
EOF
}
topic_json() { curl -sf "$ADMIN/admin/topics/$1"; }
tready() { jp spatetopic "$1" '{.status.conditions[?(@.type=="Ready")].status}'; }
topic_yaml orders 3 3600000 Retain | k apply -f - >/dev/null
wait_for "orders created in spate" 60 bash -c "curl -sf $ADMIN/admin/topics/orders | grep -q '\"partitions\":3'"
wait_for "orders Ready" 30 bash -c "[[ \$('$BIN/kubectl' get spatetopic orders -o jsonpath='{.status.conditions[0].status}') == True ]]"
topic_json orders | grep -q '"retention.ms":{"source":"topic","value":"3600000"}' || topic_json orders | grep -q '3600000' || fail "retention.ms not set"
say "topic created: $(topic_json orders | python3 -c 'import json,sys; t=json.load(sys.stdin); print(t["name"], t["partitions"], "partitions, retention.ms", t["configs"]["retention.ms"]["value"])')"
topic_yaml orders 6 7200000 Retain | k apply -f - >/dev/null
wait_for "orders grown to 6" 60 bash -c "curl -sf $ADMIN/admin/topics/orders | grep -q '\"partitions\":6'"
wait_for "orders retention altered" 30 bash -c "curl -sf $ADMIN/admin/topics/orders | grep -q 7200000"
say "topic altered: 6 partitions, retention.ms 7200000"
topic_yaml orders 2 7200000 Retain | k apply -f - >/dev/null
wait_for "decrease refused in status" 30 bash -c "[[ \$('$BIN/kubectl' get spatetopic orders -o jsonpath='{.status.conditions[0].reason}') == PartitionDecreaseRefused ]]"
topic_json orders | grep -q '"partitions":6' || fail "partition decrease was applied"
say "decrease to 2: status $(jp spatetopic orders '{.status.conditions[0].reason}'): $(jp spatetopic orders '{.status.conditions[0].message}')"
topic_yaml orders 6 7200000 Retain | k apply -f - >/dev/null
topic_yaml scratch 1 600000 Delete | k apply -f - >/dev/null
wait_for "scratch created" 60 bash -c "curl -sf $ADMIN/admin/topics/scratch"
topic_yaml kept 1 600000 Retain | k apply -f - >/dev/null
wait_for "kept created" 60 bash -c "curl -sf $ADMIN/admin/topics/kept"
k delete spatetopic scratch kept --wait=true --timeout=60s >/dev/null
wait_for "scratch deleted from spate (policy Delete)" 60 bash -c "! curl -sf $ADMIN/admin/topics/scratch"
topic_json kept >/dev/null || fail "kept (policy Retain) was deleted from spate"
say "deletion policies: Delete removed 'scratch' from spate, Retain kept 'kept'"

# --- scale 3 -> 5 -> 3 ----------------------------------------------------------------------
for n in 4 5; do start_spate $n "$FOUNDERS,$n=127.0.0.1:${CLUSTER[$n]}"; done
k patch spatecluster demo --type merge -p '{"spec":{"replicas":5}}' >/dev/null
wait_for "StatefulSet at 5" 30 bash -c "[[ \$('$BIN/kubectl' get statefulset demo -o jsonpath='{.spec.replicas}') == 5 ]]"
wait_for "spate has 5 nodes" 120 bash -c "[[ \$(curl -sf $ADMIN/admin/cluster | python3 -c 'import json,sys; print(len(json.load(sys.stdin)[\"nodes\"]))') == 5 ]]"
wait_for "balanced for 5" 120 bash -c "[[ \$('$BIN/kubectl' get spatecluster demo -o jsonpath='{.status.balancedReplicas}') == 5 ]]"
wait_for "Ready at 5" 120 bash -c "[[ \$('$BIN/kubectl' get spatecluster demo -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}') == True ]]"
holds() { curl -sf "$ADMIN/admin/cluster" | python3 -c "import json,sys; print(sum(1 for p in json.load(sys.stdin)['partitions'] if $1 in p['replicas']))"; }
say "scaled out: spate nodes $(spate_nodes); replicas on node 4: $(holds 4), node 5: $(holds 5); balance calls $(metric "$OP_A_HTTP" 'spate_operator_spate_calls_total{call="balance",ok="true"}')"
k patch spatecluster demo --type merge -p '{"spec":{"replicas":3}}' >/dev/null
# The StatefulSet may only shrink past a node once spate no longer has it.
end=$(( $(date +%s) + 240 ))
seen=""
while :; do
  r=$(jp statefulset demo '{.spec.replicas}'); nodes=",$(spate_nodes),"
  [[ "$r" != "${seen##* }" ]] && seen="$seen $r"
  if [[ $r -lt 5 && $nodes == *",5,"* ]] || [[ $r -lt 4 && $nodes == *",4,"* ]]; then
    fail "StatefulSet shrank to $r while spate still has nodes $nodes"
  fi
  [[ $r == 3 && $nodes == ",1,2,3," ]] && break
  [[ $(date +%s) -lt $end ]] || fail "scale-in did not finish (replicas $r, nodes $nodes)"
  sleep 0.3
done
[[ "$seen" == " 5 4 3" ]] || fail "StatefulSet replicas went$seen, expected 5 4 3"
kill -9 "${SPID[4]}" "${SPID[5]}" 2>/dev/null || true
say "scaled in: StatefulSet replicas went$seen, each step after spate had decommissioned the node; spate nodes $(spate_nodes)"
wait_for "Ready at 3" 120 bash -c "[[ \$('$BIN/kubectl' get spatecluster demo -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}') == True ]]"

# --- config change: one pod at a time, held back while spate is under-replicated ------------
pod_uids() { k get pods -l app.kubernetes.io/instance=demo -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.uid} {end}'; }
partition() { jp statefulset demo '{.spec.updateStrategy.rollingUpdate.partition}'; }
# Stop spate node 3 first: its partitions go under-replicated, so no pod may restart yet.
kill -STOP "${SPID[3]}"
wait_for "spate reports under-replicated partitions" 60 bash -c "curl -sf $ADMIN/admin/cluster | grep -q '\"healthy\":false'"
k patch spatecluster demo --type merge -p '{"spec":{"broker":{"fsync":"always"}}}' >/dev/null
wait_for "ConfigMap has fsync always" 30 bash -c "'$BIN/kubectl' get configmap demo-config -o jsonpath='{.data.spate\.toml}' | grep -q 'fsync = \"always\"'"
wait_for "new template held back at partition 3" 30 bash -c "[[ \$('$BIN/kubectl' get statefulset demo -o jsonpath='{.spec.updateStrategy.rollingUpdate.partition}') == 3 ]]"
sleep 8
# (updatedReplicas is omitted from the status when 0.)
upd=$(jp statefulset demo '{.status.updatedReplicas}')
[[ $(partition) == 3 && ${upd:-0} == 0 ]] || fail "a pod restarted while spate was under-replicated (partition $(partition), updated ${upd:-0})"
held="$(cond Progressing reason): $(cond Progressing message)"
say "config roll held while spate node 3 is stopped: partition 3, 0 pods updated ($held)"
since=$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)
kill -CONT "${SPID[3]}"
wait_for "roll finished" 300 bash -c "[[ \$('$BIN/kubectl' get statefulset demo -o jsonpath='{.spec.updateStrategy.rollingUpdate.partition}/{.status.updatedReplicas}/{.status.readyReplicas}') == 0/3/3 ]]"
# Under kwok a pod is re-created and ready within ~100 ms, faster than polling can see, so
# the order is read from the apiserver's audit log.
python3 scripts/k8s/roll_order.py "$W/k8s/audit.log" "$since" demo 2,1,0 || fail "roll order"
say "config roll after spate recovered: partition 2, 1, 0, each step after the previous pod was re-created and ready"

# --- bad input ------------------------------------------------------------------------------
gen=$(jp statefulset demo '{.metadata.generation}'); uids=$(pod_uids)
expect_rejected() { # description pattern command...
  local what="$1" pat="$2"; shift 2
  local out
  if out=$("$@" 2>&1); then fail "$what was accepted: $out"; fi
  grep -qi -- "$pat" <<<"$out" || fail "$what: unexpected error: $out"
  say "rejected $what: $(grep -oi -- "$pat.*" <<<"$out" | head -1 | cut -c1-110)"
}
cluster_yaml 0 | sed 's/name: demo$/name: zero/' >"$W/zero.yaml"
expect_rejected "replicas 0" "should be greater than or equal to 1" k apply -f "$W/zero.yaml"
cluster_yaml 3 | sed 's/name: demo$/name: typo/; s/^  image:/  imagge: x\n  image:/' >"$W/typo.yaml"
expect_rejected "an unknown field" 'unknown field' k apply --validate=strict -f "$W/typo.yaml"
expect_rejected "an invalid config key" "broker.config has a key" \
  k patch spatecluster demo --type merge -p '{"spec":{"broker":{"config":{"no-such-setting":"1"}}}}'
expect_rejected "a reserved config key" "broker.config has a key" \
  k patch spatecluster demo --type merge -p '{"spec":{"broker":{"config":{"node-id":"7"}}}}'
expect_rejected "a storage shrink" "storage.size cannot shrink" \
  k patch spatecluster demo --type merge -p '{"spec":{"storage":{"size":"512Mi"}}}'
k patch spatecluster demo --type merge -p '{"spec":{"replicas":2}}' >/dev/null
wait_for "Degraded for replicas below RF" 30 bash -c "[[ \$('$BIN/kubectl' get spatecluster demo -o jsonpath='{.status.conditions[?(@.type==\"Degraded\")].reason}') == ReplicasBelowReplicationFactor ]]"
say "replicas 2 with RF-3 topics: Degraded/$(cond Degraded reason): $(cond Degraded message)"
sleep 4
[[ $(jp statefulset demo '{.spec.replicas}') == 3 ]] || fail "StatefulSet shrank below RF"
[[ $(spate_nodes) == 1,2,3 ]] || fail "a node was decommissioned below RF"
k patch spatecluster demo --type merge -p '{"spec":{"replicas":3}}' >/dev/null
wait_for "Ready again" 60 bash -c "[[ \$('$BIN/kubectl' get spatecluster demo -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}') == True ]]"
[[ $(jp statefulset demo '{.metadata.generation}') == "$gen" ]] || fail "bad input changed the StatefulSet"
[[ $(pod_uids) == "$uids" ]] || fail "bad input restarted pods"
say "bad input: StatefulSet generation $gen and pods unchanged, cluster Ready"

# --- leader failover --------------------------------------------------------------------------
leader=$(jp lease spate-operator '{.spec.holderIdentity}')
[[ $leader == op-a ]] || fail "expected op-a to lead, found $leader"
[[ $(metric "$OP_B_HTTP" spate_operator_api_writes_total) == 0 ]] || fail "the standby wrote while op-a led"
[[ $(metric "$OP_B_HTTP" spate_operator_reconciles_total) == 0 ]] || fail "the standby reconciled while op-a led"
renewed=$(jp lease spate-operator '{.spec.renewTime}')
kill -9 "$OP_PID_op_a"
t_kill=$(date +%s.%N)
expiry=$(python3 -c "
import datetime,sys
r=datetime.datetime.strptime('$renewed','%Y-%m-%dT%H:%M:%S.%fZ').replace(tzinfo=datetime.timezone.utc).timestamp()
print(round(r + $LEASE_SECONDS - $t_kill, 2))")
k patch spatecluster demo --type merge -p '{"spec":{"broker":{"config":{"retention-check-interval-ms":"45000"}}}}' >/dev/null
wait_for "op-b holds the Lease" $((LEASE_SECONDS * 3)) bash -c "[[ \$('$BIN/kubectl' get lease spate-operator -o jsonpath='{.spec.holderIdentity}') == op-b ]]"
t_lease=$(date +%s.%N)
wait_for "op-b applied the change" 60 bash -c "'$BIN/kubectl' get configmap demo-config -o jsonpath='{.data.spate\.toml}' | grep -q 45000"
t_applied=$(date +%s.%N)
takeover=$(echo "$t_lease - $t_kill" | bc); applied=$(echo "$t_applied - $t_kill" | bc)
say "failover: op-a killed (-9); op-b took the Lease after ${takeover}s and applied a pending change after ${applied}s (lease duration ${LEASE_SECONDS}s; op-a's last renewal was to expire ${expiry}s after the kill)"
(( $(echo "$takeover <= $LEASE_SECONDS + $LEASE_GRACE" | bc) )) || fail "takeover took ${takeover}s"
wait_for "roll under op-b done" 300 bash -c "[[ \$('$BIN/kubectl' get statefulset demo -o jsonpath='{.spec.updateStrategy.rollingUpdate.partition}/{.status.updatedReplicas}') == 0/3 ]]"

# --- storage growth: each claim is asked for the new size, the claim template stays -----------
uids=$(pod_uids); vct=$(jp statefulset demo '{.spec.volumeClaimTemplates[0].spec.resources.requests.storage}')
k patch spatecluster demo --type merge -p '{"spec":{"storage":{"size":"2Gi"}}}' >/dev/null
for i in 0 1 2; do
  wait_for "data-demo-$i asks for 2Gi" 30 bash -c "[[ \$('$BIN/kubectl' get pvc data-demo-$i -o jsonpath='{.spec.resources.requests.storage}') == 2Gi ]]"
done
[[ $(jp statefulset demo '{.spec.volumeClaimTemplates[0].spec.resources.requests.storage}') == "$vct" ]] || fail "claim template changed"
[[ $(pod_uids) == "$uids" ]] || fail "growing storage restarted pods"
say "storage 1Gi -> 2Gi: the 3 claims ask for 2Gi, claim template and pods unchanged"

# --- deletion: owned objects collected, volumes kept -------------------------------------------
k get pvc -o name | sort >"$W/pvcs-before"
k delete spatecluster demo --wait=true --timeout=60s >/dev/null
for o in statefulset/demo service/demo service/demo-nodes configmap/demo-config poddisruptionbudget/demo servicemonitor/demo; do
  wait_for "$o collected" 60 bash -c "! '$BIN/kubectl' get $o"
done
wait_for "pods gone" 60 bash -c "[[ -z \$('$BIN/kubectl' get pods -l app.kubernetes.io/instance=demo -o name) ]]"
k get pvc -o name | sort >"$W/pvcs-after"
diff -q "$W/pvcs-before" "$W/pvcs-after" >/dev/null || fail "volumes changed on delete"
say "delete: StatefulSet, Services, ConfigMap, PDB, ServiceMonitor and pods collected; $(wc -l <"$W/pvcs-after") PVCs kept"

say "PASS"

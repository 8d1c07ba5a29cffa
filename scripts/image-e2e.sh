#!/usr/bin/env bash
# The spate image, run: builds it (scripts/image.sh), then with podman (runc, host network,
# every listener on 127.0.0.1) proves
#  (a) a standalone broker container, its data on a named volume: /health and /ready answer
#      200 as the chart's probes ask them; records produced with confluent-kafka (acks=all);
#      `podman stop` (SIGTERM) is a controlled shutdown: exit code 0, "shutting down" in its
#      log, every partition closed clean; the restart recovers nothing; every acknowledged
#      record is read back;
#  (b) a 3-node cluster as 3 containers started as the chart starts pods (`/bin/sh -c` deriving
#      the node id from the pod name, a read-only spate.toml at /etc/spate), each on its own
#      volume: a producer (acks=all, idempotent) runs while the containers are stopped and
#      started one at a time, each waited for to be ready before the next; then every
#      acknowledged record is read back.
# Containers run as the chart runs them: uid 10001 from the image, read-only root file system
# without tmpfs, all capabilities dropped, no-new-privileges. Every container and volume this
# script makes is removed on exit, failed or not.
#   scripts/image-e2e.sh        (root; SKIPPED otherwise, or when podman cannot be installed)
# SPATE_IMAGE_E2E_NO_BUILD=1 uses the images already built (scripts/image.sh);
# SPATE_IMAGE_PROFILE=debug SPATE_IMAGE_NO_CARGO=1 (as CI runs it) builds the images from the
# debug binaries cargo has already built, without another (release) build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
start=$SECONDS
if [[ $(id -u) -ne 0 ]]; then
  echo "SKIPPED: image-e2e needs root (podman runs containers as root here)"; exit 0
fi
if ! scripts/image/podman-setup.sh --debootstrap; then
  echo "SKIPPED: image-e2e: podman, runc or debootstrap cannot be installed"; exit 0
fi
pm() { podman --runtime runc "$@"; }
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka
[[ -n "${SPATE_IMAGE_E2E_NO_BUILD:-}" ]] || scripts/image.sh
VERSION="$(cargo metadata --no-deps --format-version 1 --offline \
  | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "spate-server"))')"
suffix=""; if [[ "${SPATE_IMAGE_PROFILE:-}" == debug ]]; then suffix="-debug"; fi
IMAGE="localhost/spate:${SPATE_IMAGE_TAG:-$VERSION$suffix}"
pm image exists "$IMAGE" || { echo "image-e2e: $IMAGE not built" >&2; exit 1; }

WORK="$(mktemp -d)"
PREFIX="spate-e2e-$$"
CONTAINERS=(); VOLUMES=(); PRODUCER=""
cleanup() {
  local rc=$?
  if (( rc != 0 )); then
    for c in "${CONTAINERS[@]}"; do
      echo "--- last lines of $c:" >&2; pm logs --tail 30 "$c" >&2 2>&1 || true
    done
  fi
  [[ -z "$PRODUCER" ]] || kill "$PRODUCER" 2>/dev/null || true
  (( ${#CONTAINERS[@]} == 0 )) || pm rm -f -t 0 "${CONTAINERS[@]}" >/dev/null 2>&1 || true
  (( ${#VOLUMES[@]} == 0 )) || pm volume rm -f "${VOLUMES[@]}" >/dev/null 2>&1 || true
  rm -rf "$WORK"
  left="$(pm ps -a --filter "name=$PREFIX" -q; pm volume ls -q --filter "name=$PREFIX")"
  [[ -z "$left" ]] || { echo "image-e2e: left behind: $left" >&2; rc=1; }
  echo "image-e2e: $( (( rc == 0 )) && echo passed || echo FAILED) in $(( SECONDS - start )) s"
  exit "$rc"
}
trap cleanup EXIT
E2E=(timeout 300 python3 scripts/image/e2e.py)

# The chart's container: image user (10001), read-only root without podman's tmpfs extras
# (Kubernetes' readOnlyRootFilesystem gives none), no capabilities, no privilege escalation.
# k8s-file: `podman logs` without a journal.
run() {
  local name="$1" vol="$2"; shift 2
  pm volume create "$vol" >/dev/null; VOLUMES+=("$vol")
  CONTAINERS+=("$name")
  pm run -d --name "$name" --network host --log-driver k8s-file \
    --read-only --read-only-tmpfs=false --cap-drop ALL --security-opt no-new-privileges \
    -v "$vol:/var/lib/spate" "$@" >/dev/null
}
http_code() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://$1$2" || true; }
wait_ready() {  # HTTP_ADDR...: every one answers /ready with 200 in the same pass, within 120 s
  local _
  for _ in $(seq 1 240); do
    local all=1 h
    for h in "$@"; do [[ "$(http_code "$h" /ready)" == 200 ]] || { all=0; break; }; done
    (( all )) && return 0
    sleep 0.5
  done
  for h in "$@"; do echo "image-e2e: $h /ready: $(curl -s --max-time 5 "http://$h/ready")" >&2; done
  return 1
}
# SIGTERM, as Kubernetes sends it, with the chart's 60 s grace period; then the proofs that
# the shutdown was the controlled one.
stop_controlled() {
  local name="$1" t0=$SECONDS before
  before="$(pm logs "$name" 2>&1 | wc -l)"
  pm stop -t 60 "$name" >/dev/null
  local code; code="$(pm inspect -f '{{.State.ExitCode}}' "$name")"
  [[ "$code" == 0 ]] || { echo "image-e2e: $name exited $code after SIGTERM (137: killed after the grace period)" >&2; return 1; }
  pm logs "$name" 2>&1 | tail -n +"$((before + 1))" >"$WORK/stop.log"
  grep -q "shutting down" "$WORK/stop.log" \
    || { echo "image-e2e: $name's log has no 'shutting down'" >&2; return 1; }
  if grep -E "stopping anyway|clean shutdown of log failed|cannot save producer state" "$WORK/stop.log"; then
    echo "image-e2e: $name's shutdown was not clean" >&2; return 1
  fi
  echo "image-e2e: $name stopped by SIGTERM in $(( SECONDS - t0 )) s, exit code 0, 'shutting down' logged"
}

# --- (a) standalone -------------------------------------------------------------------------
read -r K H < <(python3 scripts/free-ports.py 2)
SOLO="$PREFIX-solo"
# The image's own entrypoint; the arguments replace its CMD (which listens on 0.0.0.0).
run "$SOLO" "$SOLO-data" "$IMAGE" --listen "127.0.0.1:$K" --http-listen "127.0.0.1:$H" \
  --data-dir /var/lib/spate/data
wait_ready "127.0.0.1:$H"
for path in /health /ready; do
  code="$(http_code "127.0.0.1:$H" "$path")"
  [[ "$code" == 200 ]] || { echo "image-e2e: GET $path answered $code" >&2; exit 1; }
  echo "image-e2e: GET $path -> 200 ($(curl -s --max-time 5 "http://127.0.0.1:$H$path" | head -c 80))"
done
MNT="$(pm volume inspect -f '{{.Mountpoint}}' "$SOLO-data")"
owner="$(stat -c %u:%g "$MNT")"
[[ "$owner" == 10001:10001 ]] || { echo "image-e2e: the fresh volume is owned by $owner, not 10001:10001" >&2; exit 1; }
echo "image-e2e: fresh volume owned by $owner (the image's /var/lib/spate)"
"${E2E[@]}" create "127.0.0.1:$K" solo 3 1
"${E2E[@]}" produce "127.0.0.1:$K" solo "$WORK/solo.acked" 3000 60
stop_controlled "$SOLO"
clean="$(find "$MNT/data" -name clean_shutdown -printf '%h\n' | grep -c '/topics/solo/[0-9]*$' || true)"
(( clean == 3 )) || { echo "image-e2e: $clean of 3 partitions marked clean after SIGTERM" >&2; exit 1; }
echo "image-e2e: all 3 partitions of 'solo' closed clean ($(find "$MNT/data" -name clean_shutdown | wc -l) partitions in all)"
before="$(pm logs "$SOLO" 2>&1 | wc -l)"
pm start "$SOLO" >/dev/null
wait_ready "127.0.0.1:$H"
# Without CAP_SYS_NICE (no capabilities, as in the chart) spate says once that its search
# indexers are niced rather than SCHED_IDLE: expected, not a recovery.
if pm logs "$SOLO" 2>&1 | tail -n +"$((before + 1))" | grep -v SCHED_IDLE | grep -E "recovery:|WARN|ERROR"; then
  echo "image-e2e: the restart after SIGTERM was not clean" >&2; exit 1
fi
echo "image-e2e: restarted clean (no recovery notes, no warnings)"
"${E2E[@]}" check "127.0.0.1:$K" solo "$WORK/solo.acked"
pm rm -f -t 0 "$SOLO" >/dev/null; CONTAINERS=()

# --- (b) 3-node cluster, rolling restart under acks=all load --------------------------------
read -r -a P < <(python3 scripts/free-ports.py 9)
(( ${#P[@]} == 9 )) || { echo "image-e2e: no free ports" >&2; exit 1; }
PEERS="1=127.0.0.1:${P[1]},2=127.0.0.1:${P[4]},3=127.0.0.1:${P[7]}"
mkdir -p "$WORK/etc"
# The chart's ConfigMap with its default values (listen and http-listen per node below: all
# nodes share one address here, not one port).
cat >"$WORK/etc/spate.toml" <<'TOML'
# Written by the spate Helm chart.
data-dir = "/var/lib/spate/data"
default-replication-factor = "3"
fsync = "interval"
produce-profile = "balanced"
TOML
chmod 0644 "$WORK/etc/spate.toml"; chmod 0755 "$WORK/etc"
# The chart's entrypoint, with its ports and DNS names replaced by this host's: the node id
# from the pod name's ordinal, then exec (spate is pid 1 and gets SIGTERM).
# shellcheck disable=SC2016 # expanded by the container's shell
ENTRY='set -eu
ord="${POD_NAME##*-}"
export SPATE_NODE_ID=$((ord + 1))
exec /usr/local/bin/spate --config /etc/spate/spate.toml'
BOOT=(); HTTPS=(); NODES=()
for i in 0 1 2; do
  k="${P[$((3 * i))]}"; c="${P[$((3 * i + 1))]}"; h="${P[$((3 * i + 2))]}"
  name="$PREFIX-$i"; NODES+=("$name"); BOOT+=("127.0.0.1:$k"); HTTPS+=("127.0.0.1:$h")
  run "$name" "$name-data" -v "$WORK/etc:/etc/spate:ro" \
    -e POD_NAME="$name" -e SPATE_LOG_FORMAT=json -e SPATE_CLUSTER_PEERS="$PEERS" \
    -e SPATE_CLUSTER_LISTEN="127.0.0.1:$c" -e SPATE_LISTEN="127.0.0.1:$k" \
    -e SPATE_HTTP_LISTEN="127.0.0.1:$h" -e SPATE_ADVERTISED_ADDRESS="127.0.0.1:$k" \
    -e SPATE_ADVERTISED_HTTP_ADDRESS="127.0.0.1:$h" \
    --entrypoint /bin/sh "$IMAGE" -c "$ENTRY"
done
wait_ready "${HTTPS[@]}"
BOOTSTRAP="$(IFS=,; echo "${BOOT[*]}")"
echo "image-e2e: 3-node cluster ready at $BOOTSTRAP"
"${E2E[@]}" create "$BOOTSTRAP" rolling 3 3
"${E2E[@]}" produce "$BOOTSTRAP" rolling "$WORK/rolling.acked" 100000 240 "$WORK/stop" &
PRODUCER=$!
sleep 3
for i in 0 1 2; do
  kill -0 "$PRODUCER" || { echo "image-e2e: the producer ended before the restarts" >&2; exit 1; }
  stop_controlled "${NODES[$i]}"
  pm start "${NODES[$i]}" >/dev/null
  t0=$SECONDS
  wait_ready "${HTTPS[@]}"
  echo "image-e2e: ${NODES[$i]} restarted, all 3 nodes ready again in $(( SECONDS - t0 )) s"
  sleep 3   # the restarted node follows and leads again under load before the next one stops
done
sleep 3
touch "$WORK/stop"
wait "$PRODUCER"; PRODUCER=""
"${E2E[@]}" check "$BOOTSTRAP" rolling "$WORK/rolling.acked"

# --- (c) the chart's own entrypoint script in the image's shell -------------------------------
# The StatefulSet's `/bin/sh -c` script, its template values filled in (3 replicas, release
# "spate", the default ports), run by the image's /bin/sh as pod spate-1 with `exec spate`
# replaced by printing what it exported.
# shellcheck disable=SC2016 # $name and the SPATE_ variables are the chart's, not this shell's
# `{{- if }}` blocks are left out: with the default values (PLAINTEXT) the chart renders none.
script="$(awk '/^ *- \|$/ { on = 1; next } on && /^ *env:$/ { exit }
               on && /\{\{- if/ { skip = 1; next } on && /\{\{- end/ { skip = 0; next } on && !skip' \
    deploy/helm/spate/templates/statefulset.yaml \
  | sed -e 's/{{ \$name }}/spate/g' -e 's/{{ \.Values\.replicas }}/3/g' \
        -e 's/{{ \.Values\.listeners\.kafka }}/9092/g' -e 's/{{ \.Values\.listeners\.cluster }}/9093/g' \
        -e 's/{{ \.Values\.listeners\.http }}/9644/g' \
        -e 's#^\( *\)exec /usr/local/bin/spate .*#\1printf "%s\\n" "$SPATE_NODE_ID" "$SPATE_CLUSTER_PEERS" "$SPATE_ADVERTISED_ADDRESS"#')"
if grep -q '{{' <<<"$script"; then
  echo "image-e2e: the chart's entrypoint has template expressions this test does not fill in:" >&2
  grep '{{' <<<"$script" >&2; exit 1
fi
got="$(pm run --rm --network none --read-only --read-only-tmpfs=false --cap-drop ALL \
  -e POD_NAME=spate-1 -e POD_NAMESPACE=ns --entrypoint /bin/sh "$IMAGE" -c "$script" | tr '\n' ' ')"
want="2 1=spate-0.spate-nodes.ns.svc:9093,2=spate-1.spate-nodes.ns.svc:9093,3=spate-2.spate-nodes.ns.svc:9093 spate-1.spate-nodes.ns.svc:9092 "
[[ "$got" == "$want" ]] || { echo "image-e2e: the chart's entrypoint in the image gave '$got', not '$want'" >&2; exit 1; }
echo "image-e2e: the chart's entrypoint runs in the image's /bin/sh: node id 2, peers and address as expected"

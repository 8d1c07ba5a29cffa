#!/usr/bin/env bash
# Searchable topics' cost on this machine, the seed's matrix. Prints numbers; asserts nothing.
#   1. Produce throughput and p50/p99 (spate-bench, acks=1, 512 B text records, 4 partitions)
#      to a plain and to a searchable topic, ROUNDS times (odd rounds plain first, even rounds
#      searchable first; each run starts with the page cache written back and dropped), standalone and on a
#      3-node cluster (replication factor 3). After the searchable run: how long the index
#      took to catch up (its indexing rate) and the index size per GiB of log.
#   2. Time-to-searchable: probe records (scripts/search_freshness.py, 100/s) produced among
#      a spate-bench load at half the saturated produce rate, and at half the indexing rate;
#      each probe's time from acknowledgement to the first search that finds it.
#   3. Match-query latency over QUERY_RECORDS (10 M) records of 100 B text.
# Env: BENCH_RECORDS (5000000 per produce run), ROUNDS (2), QUERY_RECORDS (10000000),
#      FRESH_SECONDS (20), ONLY=standalone|cluster|query, SPATE_BIN (default: builds release).
# The issue's overhead bar is for a broker without CAP_SYS_NICE: as root, run it as nobody with
# SPATE_BIN=scripts/spate-as-nobody.sh (after a release build).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RECORDS="${BENCH_RECORDS:-5000000}"
ROUNDS="${ROUNDS:-2}"
QUERY_RECORDS="${QUERY_RECORDS:-10000000}"
FRESH_SECONDS="${FRESH_SECONDS:-20}"
ONLY="${ONLY:-}"
if [[ -z "${SPATE_BIN:-}" ]]; then
  cargo build --release -q -p spate-server -p spate-bench --manifest-path "$ROOT/Cargo.toml"
  export SPATE_BIN="$ROOT/target/release/spate"
fi
export BENCH="$ROOT/target/release/spate-bench" ROOT RECORDS ROUNDS QUERY_RECORDS FRESH_SECONDS
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka

# The suite, run inside with-spate.sh or with-spate-cluster.sh (SPATE_BOOTSTRAP, SPATE_HTTP).
cat > /tmp/spate-bench-search-suite.sh <<'SUITE'
set -euo pipefail
label=$1 rf=$2
metric_sum() { # metric_sum NAME TOPIC: the sum of a per-partition search metric of TOPIC
  curl -s "$SPATE_HTTP/metrics" | awk -v m="$1" -v t="topic=\"$2\"" 'index($0, m"{") == 1 && index($0, t) { s += $NF } END { printf "%.0f", s }'
}
create() { # create NAME SEARCH
  curl -sf -XPOST "$SPATE_HTTP/admin/topics" -H 'content-type: application/json' \
    -d "{\"name\":\"$1\",\"partitions\":4,\"replication_factor\":$rf,\"configs\":{\"search.enabled\":\"$2\"}}" >/dev/null
}
log_bytes() {
  curl -s "$SPATE_HTTP/admin/topics/$1" | python3 -c 'import json,sys; t=json.load(sys.stdin); print(sum(p["size_bytes"] for p in t["partition_details"]))'
}
produce() { # produce TOPIC: prints "msg/s p50_ms p99_ms"
  "$BENCH" -b "$SPATE_BOOTSTRAP" -t "$1" -p 4 -c 1 -s 512 -n "$RECORDS" -w 0s --acks 1 \
    --payload-pattern text --no-progress --json-output "/tmp/sbs-$1.json" >/dev/null 2>&1
  python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["produce"]; l=p["latency_us"]; print("%.0f %.1f %.1f" % (p["msgs_per_sec"], l["p50_us"]/1000, l["p99_us"]/1000))' "/tmp/sbs-$1.json"
}
# Deleting a run's topic also writes back the dirty pages left and drops the page cache (when
# allowed): the next run otherwise pays for the kernel's writeback of the previous one's GiBs.
delete() {
  curl -sf -XDELETE "$SPATE_HTTP/admin/topics/$1" >/dev/null || true
  sleep 2
  "$ROOT/scripts/drop-page-cache.sh"
}
for round in $(seq 1 "$ROUNDS"); do
  # Alternating which goes first, so neither always runs on a machine the other just loaded.
  modes="plain search"
  (( round % 2 == 0 )) && modes="search plain"
  for mode in $modes; do
    topic="$mode-$round"
    create "$topic" "$([[ $mode == search ]] && echo true || echo false)"
    started=$(date +%s.%N)
    read -r rate p50 p99 < <(produce "$topic")
    echo "$label $mode round $round: $rate msg/s, p50 $p50 ms, p99 $p99 ms"
    echo "$label $mode $rate $p50 $p99" >> /tmp/sbs-results.txt
    if [[ $mode == search ]]; then
      # How long until every record is searchable: the indexing rate under no other load.
      for _ in $(seq 1 1200); do
        n=$(metric_sum spate_search_indexed_records_total "$topic")
        [[ "${n:-0}" -ge "$RECORDS" ]] && break
        sleep 0.5
      done
      took=$(python3 -c "import time; print(time.time() - $started)")
      index=$(metric_sum spate_search_index_size_bytes "$topic")
      logb=$(log_bytes "$topic")
      python3 -c "r=$RECORDS; t=$took; i=$index; l=$logb; print(f'$label index: {r} records searchable {t:.1f} s after the first was produced ({r/t:,.0f} records/s end to end); index {i/2**20:.0f} MiB for {l/2**20:.0f} MiB of log = {i/l*1024:.0f} MiB per GiB')"
      echo "$label indexrate $(python3 -c "print(int($RECORDS/$took))")" >> /tmp/sbs-results.txt
    fi
    delete "$topic"
  done
done
# Freshness at half the saturated produce rate and at half the indexing rate.
sat=$(awk -v l="$label" '$1 == l && $2 == "search" { s += $3; n++ } END { printf "%d", s / n }' /tmp/sbs-results.txt)
idx=$(awk -v l="$label" '$1 == l && $2 == "indexrate" { s += $3; n++ } END { printf "%d", s / n }' /tmp/sbs-results.txt)
for load in $(( sat / 2 )) $(( idx / 2 )); do
  topic="fresh-$load"
  create "$topic" true
  "$BENCH" -b "$SPATE_BOOTSTRAP" -t "$topic" -p 4 -c 1 -s 512 -d "$((FRESH_SECONDS + 5))s" -w 0s --acks 1 \
    --payload-pattern text --rate-limit "$load" --no-progress >/dev/null 2>&1 &
  bench=$!
  sleep 3
  echo -n "$label load $load msg/s: "
  python3 "$ROOT/scripts/search_freshness.py" "$SPATE_BOOTSTRAP" "$SPATE_HTTP" "$topic" 4 100 "$FRESH_SECONDS" 256
  wait "$bench" || true
  delete "$topic"
done
SUITE

: > /tmp/sbs-results.txt
# The first run too starts without another process's dirty pages being written back.
"$ROOT/scripts/drop-page-cache.sh"
if [[ -z "$ONLY" || "$ONLY" == standalone ]]; then
  echo "== standalone"
  "$ROOT/scripts/with-spate.sh" -- bash /tmp/spate-bench-search-suite.sh standalone 1
fi
if [[ -z "$ONLY" || "$ONLY" == cluster ]]; then
  echo "== 3-node cluster, replication factor 3, acks=1"
  "$ROOT/scripts/with-spate-cluster.sh" -- bash /tmp/spate-bench-search-suite.sh cluster 3
fi
if [[ -n "$ONLY" && "$ONLY" != query ]]; then exit 0; fi
echo "== match-query latency over $QUERY_RECORDS records"
"$ROOT/scripts/with-spate.sh" -- bash -c '
  set -euo pipefail
  curl -sf -XPOST "$SPATE_HTTP/admin/topics" -H "content-type: application/json" \
    -d "{\"name\":\"big\",\"partitions\":4,\"configs\":{\"search.enabled\":\"true\"}}" >/dev/null
  "$BENCH" -b "$SPATE_BOOTSTRAP" -t big -p 4 -c 1 -s 100 -n "$QUERY_RECORDS" -w 0s --acks 1 \
    --payload-pattern text --no-progress 2>/dev/null | grep -E "throughput" || true
  started=$(date +%s)
  for _ in $(seq 1 3600); do
    n=$(curl -s "$SPATE_HTTP/big/_count" | python3 -c "import json,sys; print(json.load(sys.stdin).get(\"count\", 0))")
    [[ "$n" -ge "$QUERY_RECORDS" ]] && break
    sleep 1
  done
  echo "indexed $n records in about $(( $(date +%s) - started )) s after producing"
  python3 - "$SPATE_HTTP" <<PY
import http.client, json, sys, time
host, port = sys.argv[1].split(":")
c = http.client.HTTPConnection(host, int(port))
words = ["alpha", "lorem", "error", "the", "zebra", "quick", "data", "stream", "a", "broker"]
def run(body):
    t = time.perf_counter()
    c.request("POST", "/big/_search", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse(); v = json.loads(r.read())
    assert r.status == 200, v
    return (time.perf_counter() - t) * 1000, v["hits"]["total"]["value"]
for name, make in [("match", lambda w: {"query": {"match": {"value": w}}}),
                   ("match_phrase", lambda w: {"query": {"match_phrase": {"value": w + " the"}}}),
                   ("range+sort", lambda w: {"query": {"range": {"offset": {"gte": 1000}}}, "sort": [{"timestamp": "desc"}]})]:
    for w in words: run(make(w))  # warm the caches
    lat = sorted(run(make(words[i % len(words)]))[0] for i in range(200))
    print(f"{name}: p50 {lat[100]:.1f} ms p99 {lat[197]:.1f} ms over 200 queries")
PY
  index=$(curl -s "$SPATE_HTTP/metrics" | awk "index(\$0, \"spate_search_index_size_bytes{\") == 1 { s += \$NF } END { printf \"%.0f\", s }")
  echo "index size $(( index / 1048576 )) MiB for $QUERY_RECORDS records"
'

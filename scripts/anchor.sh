# Sourced by scripts that use the Kafka anchor: sets ANCHOR to its directory.
# Looked for in $SPATE_KAFKA_ANCHOR, then ../shared/anchors/kafka beside the repository, then
# /work/shared/anchors/kafka (where these machines keep it).
ANCHOR=""
for candidate in "${SPATE_KAFKA_ANCHOR:-}" "$ROOT/../shared/anchors/kafka" /work/shared/anchors/kafka; do
  if [[ -n "$candidate" && -x "$candidate/perf.sh" ]]; then ANCHOR="$(cd "$candidate" && pwd)"; break; fi
done

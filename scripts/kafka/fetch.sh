#!/usr/bin/env bash
# Downloads the jars listed in jars.lock from Maven Central into the cache
# ($SPATE_KAFKA_HOME, default ~/.cache/spate-kafka) and checks each one's SHA-256. A complete
# cache for the current lock is left alone; a jar with another checksum fails the run and
# nothing half-filled is kept.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
LOCK="$KIT_DIR/jars.lock"
MAVEN="${SPATE_MAVEN_URL:-https://repo1.maven.org/maven2}"
stamp="$(sha256sum "$LOCK" | cut -d' ' -f1)"
if [[ -f "$KAFKA_LIB/.complete" && "$(cat "$KAFKA_LIB/.complete")" == "$stamp" ]]; then
  echo "Kafka $KAFKA_VERSION jars present in $KAFKA_LIB"; exit 0
fi
command -v curl >/dev/null || kit_die "curl is needed to fetch Kafka's jars"
tmp="$KAFKA_LIB.partial.$$"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"
n=0
while read -r coord sum; do
  [[ -z "$coord" || "$coord" == \#* ]] && continue
  IFS=: read -r group artifact version <<<"$coord"
  file="$artifact-$version.jar"
  # A jar already in the old cache with the right checksum need not be downloaded again.
  if [[ -f "$KAFKA_LIB/$file" ]] && [[ "$(sha256sum "$KAFKA_LIB/$file" | cut -d' ' -f1)" == "$sum" ]]; then
    cp "$KAFKA_LIB/$file" "$tmp/$file"
  else
    url="$MAVEN/${group//.//}/$artifact/$version/$file"
    curl -fsSL --retry 3 --connect-timeout 20 -o "$tmp/$file" "$url" || kit_die "cannot download $url"
  fi
  got="$(sha256sum "$tmp/$file" | cut -d' ' -f1)"
  [[ "$got" == "$sum" ]] || kit_die "checksum mismatch for $coord: expected $sum, got $got"
  n=$((n + 1))
done < "$LOCK"
echo "$stamp" > "$tmp/.complete"
rm -rf "$KAFKA_LIB"
mkdir -p "$(dirname "$KAFKA_LIB")"
mv "$tmp" "$KAFKA_LIB"
trap - EXIT
echo "fetched $n jars of Kafka $KAFKA_VERSION into $KAFKA_LIB ($(du -sh "$KAFKA_LIB" | cut -f1))"

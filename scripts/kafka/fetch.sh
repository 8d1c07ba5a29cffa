#!/usr/bin/env bash
# Fills $SPATE_KAFKA_HOME/<version>/lib (default ~/.cache/spate-kafka) with exactly the jars
# jars.lock pins, from Maven Central (SPATE_MAVEN_URL overrides: a mirror, or file:// in tests),
# and checks every jar's SHA-256 on every run (a fraction of a second for the 44 MB):
#   - a complete cache whose jars all match is left alone, with no network;
#   - a cached jar that does not match is named, and the cache loses the stamp tools trust
#     until the jar is downloaded again;
#   - a downloaded jar that does not match fails the run and installs nothing.
# The new lib dir is put together beside the old one and renamed into place under a lock, so
# a concurrent fetch, or a tool starting meanwhile, never sees half a cache.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
MAVEN="${SPATE_MAVEN_URL:-https://repo1.maven.org/maven2}"
command -v flock >/dev/null || kit_die "flock (util-linux) is needed to fetch Kafka's jars"
mkdir -p "$(dirname "$KAFKA_LIB")"
exec 9> "$SPATE_KAFKA_HOME/.fetch.lock"
flock -w 600 9 || kit_die "another fetch.sh kept $SPATE_KAFKA_HOME/.fetch.lock for 10 minutes"

# jars.lock lines: group:artifact:version sha256
coords=(); sums=(); files=(); urls=()
while read -r coord sum rest; do
  [[ -z "$coord" || "$coord" == \#* ]] && continue
  [[ "$sum" =~ ^[0-9a-f]{64}$ && -z "$rest" ]] || kit_die "malformed line in $KAFKA_LOCK: $coord $sum $rest"
  IFS=: read -r group artifact version <<<"$coord"
  coords+=("$coord"); sums+=("$sum"); files+=("$artifact-$version.jar")
  urls+=("$MAVEN/${group//.//}/$artifact/$version/$artifact-$version.jar")
done < "$KAFKA_LOCK"

# What the cache holds now: file -> SHA-256, from one sha256sum over every jar.
declare -A cached=()
if compgen -G "$KAFKA_LIB/*.jar" >/dev/null; then
  while read -r sum path; do cached["${path##*/}"]=$sum; done < <(sha256sum "$KAFKA_LIB"/*.jar)
fi
todo=()
for i in "${!files[@]}"; do
  have="${cached[${files[$i]}]:-}"
  [[ "$have" == "${sums[$i]}" ]] && continue
  todo+=("$i")
  if [[ -n "$have" ]]; then
    echo "kafka kit: cached ${files[$i]} fails its checksum (expected ${sums[$i]}, found $have); refusing it, downloading it again" >&2
  fi
done
# Tools trust the stamp: a cache with a bad jar loses it now, whatever the download does.
if (( ${#todo[@]} )); then rm -f "$KAFKA_LIB/.complete"; fi
stamp="$(kit_lock_stamp)"
if (( ${#todo[@]} == 0 && ${#cached[@]} == ${#files[@]} )) && [[ "$(cat "$KAFKA_LIB/.complete" 2>/dev/null)" == "$stamp" ]]; then
  echo "Kafka $KAFKA_VERSION: all ${#files[@]} jars in $KAFKA_LIB match jars.lock"; exit 0
fi

command -v curl >/dev/null || kit_die "curl is needed to fetch Kafka's jars"
rm -rf "$KAFKA_LIB".partial.*  # left by a run that was killed; we hold the lock
tmp="$(mktemp -d "$KAFKA_LIB.partial.XXXXXX")"; chmod 755 "$tmp"
trap 'rm -rf "$tmp" "$tmp.old"' EXIT
# Intact cached jars are reused (hard links when the file system allows), the rest downloaded,
# up to 8 at a time.
for i in "${!files[@]}"; do
  [[ "${cached[${files[$i]}]:-}" == "${sums[$i]}" ]] || continue
  ln "$KAFKA_LIB/${files[$i]}" "$tmp/" 2>/dev/null || cp "$KAFKA_LIB/${files[$i]}" "$tmp/"
done
if (( ${#todo[@]} )); then
  for i in "${todo[@]}"; do printf 'url = "%s"\noutput = "%s"\n' "${urls[$i]}" "$tmp/${files[$i]}"; done > "$tmp/.curl"
  curl -fsSL --no-progress-meter --retry 3 --connect-timeout 20 --parallel --parallel-max 8 -K "$tmp/.curl" \
    || kit_die "downloading from $MAVEN failed (curl's reason above); nothing was installed"
  rm -f "$tmp/.curl"
fi
for i in "${todo[@]}"; do
  got="$(sha256sum "$tmp/${files[$i]}" | cut -d' ' -f1)"
  [[ "$got" == "${sums[$i]}" ]] \
    || kit_die "checksum mismatch for ${coords[$i]} from ${urls[$i]}: expected ${sums[$i]}, got $got; nothing was installed"
done
echo "$stamp" > "$tmp/.complete"
if [[ -d "$KAFKA_LIB" ]]; then mv "$KAFKA_LIB" "$tmp.old"; fi
mv "$tmp" "$KAFKA_LIB"
echo "Kafka $KAFKA_VERSION: downloaded ${#todo[@]} and kept $(( ${#files[@]} - ${#todo[@]} )) of ${#files[@]} jars, all matching jars.lock, in $KAFKA_LIB ($(du -sh "$KAFKA_LIB" | cut -f1))"

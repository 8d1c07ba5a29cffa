#!/usr/bin/env bash
# Fills $SPATE_OPENSEARCH_HOME/<version>/lib (default ~/.cache/spate-opensearch) with exactly the
# jars jars.lock pins, from Maven Central (SPATE_MAVEN_URL overrides), checking every jar's
# SHA-256: a complete cache whose jars all match is left alone without network; a jar that does
# not match (cached or downloaded) is named and the run fails, installing nothing. The lib dir is
# put together beside the old one and renamed into place under a lock.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
MAVEN="${SPATE_MAVEN_URL:-https://repo1.maven.org/maven2}"
command -v flock >/dev/null || os_die "flock (util-linux) is needed to fetch OpenSearch's jars"
mkdir -p "$(dirname "$OS_LIB")"
exec 9> "$SPATE_OPENSEARCH_HOME/.fetch.lock"
flock -w 600 9 || os_die "another fetch.sh kept $SPATE_OPENSEARCH_HOME/.fetch.lock for 10 minutes"

files=(); sums=(); urls=()
while read -r coord sum rest; do
  [[ -z "$coord" || "$coord" == \#* ]] && continue
  [[ "$sum" =~ ^[0-9a-f]{64}$ && -z "$rest" ]] || os_die "malformed line in $OS_LOCK: $coord $sum $rest"
  IFS=: read -r group artifact version <<<"$coord"
  files+=("$artifact-$version.jar"); sums+=("$sum")
  urls+=("$MAVEN/${group//.//}/$artifact/$version/$artifact-$version.jar")
done < "$OS_LOCK"
stamp="$(os_lock_stamp)"
declare -A cached=()
if compgen -G "$OS_LIB/*.jar" >/dev/null; then
  while read -r sum path; do cached["${path##*/}"]=$sum; done < <(sha256sum "$OS_LIB"/*.jar)
fi
todo=()
for i in "${!files[@]}"; do
  [[ "${cached[${files[$i]}]:-}" == "${sums[$i]}" ]] || todo+=("$i")
done
if (( ${#todo[@]} == 0 && ${#cached[@]} == ${#files[@]} )) && [[ "$(cat "$OS_LIB/.complete" 2>/dev/null)" == "$stamp" ]]; then
  echo "OpenSearch $OS_VERSION: all ${#files[@]} jars in $OS_LIB match jars.lock"; exit 0
fi
rm -f "$OS_LIB/.complete"
command -v curl >/dev/null || os_die "curl is needed to fetch OpenSearch's jars"
rm -rf "$OS_LIB".partial.*  # left by a run that was killed; we hold the lock
tmp="$(mktemp -d "$OS_LIB.partial.XXXXXX")"; chmod 755 "$tmp"
trap 'rm -rf "$tmp" "$tmp.old"' EXIT
for i in "${!files[@]}"; do
  [[ "${cached[${files[$i]}]:-}" == "${sums[$i]}" ]] && cp "$OS_LIB/${files[$i]}" "$tmp/"
done
if (( ${#todo[@]} )); then
  for i in "${todo[@]}"; do printf 'url = "%s"\noutput = "%s"\n' "${urls[$i]}" "$tmp/${files[$i]}"; done > "$tmp/.curl"
  curl -fsSL --no-progress-meter --retry 3 --connect-timeout 20 --parallel --parallel-max 8 -K "$tmp/.curl" \
    || os_die "downloading from $MAVEN failed (curl's reason above); nothing was installed"
  rm -f "$tmp/.curl"
fi
for i in "${todo[@]}"; do
  got="$(sha256sum "$tmp/${files[$i]}" | cut -d' ' -f1)"
  [[ "$got" == "${sums[$i]}" ]] \
    || os_die "checksum mismatch for ${urls[$i]}: expected ${sums[$i]}, got $got; nothing was installed"
done
echo "$stamp" > "$tmp/.complete"
if [[ -d "$OS_LIB" ]]; then mv "$OS_LIB" "$tmp.old"; fi
mv "$tmp" "$OS_LIB"
echo "OpenSearch $OS_VERSION: downloaded ${#todo[@]} of ${#files[@]} jars, all matching jars.lock, into $OS_LIB ($(du -sh "$OS_LIB" | cut -f1))"

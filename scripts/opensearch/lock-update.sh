#!/usr/bin/env bash
# Regenerates jars.lock from pom.xml: Maven resolves OpenSearch, its Netty4 plugin and log4j-core
# with their runtime dependencies (the only step that needs mvn), each jar's SHA-1 is checked
# against the one Maven Central publishes beside it, and the lock pins coordinates and SHA-256.
# Change the versions in pom.xml, run this, then fetch.sh into an empty SPATE_OPENSEARCH_HOME
# and scripts/search-differential.sh, and review the diff.
set -euo pipefail
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MAVEN="${SPATE_MAVEN_URL:-https://repo1.maven.org/maven2}"
die() { echo "opensearch kit: $*" >&2; exit 2; }
command -v mvn >/dev/null || die "mvn is needed to resolve a new lock"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
mvn -B -q -f "$DIR/pom.xml" dependency:list -DincludeScope=runtime -DoutputAbsoluteArtifactFilename=true \
  -DoutputFile="$work/deps.txt" > "$work/mvn.log" 2>&1 || { cat "$work/mvn.log" >&2; die "mvn could not resolve pom.xml"; }
version="$(sed -n 's:.*<opensearch.version>\(.*\)</opensearch.version>.*:\1:p' "$DIR/pom.xml")"
{
  echo "# OpenSearch $version (server, Netty4 transport plugin, log4j-core) with its runtime dependencies,"
  echo "# as Maven Central serves them: group:artifact:version and the jar's SHA-256."
  echo "# scripts/opensearch/fetch.sh downloads exactly these and refuses any jar whose checksum"
  echo "# differs. Regenerate from pom.xml: scripts/opensearch/lock-update.sh."
  grep ":jar:" "$work/deps.txt" | sed 's/^ *//' | while IFS=: read -r g a _ v _ path; do
    jar="${path%% *}"
    central="$(curl -fsSL --retry 3 "$MAVEN/${g//.//}/$a/$v/$a-$v.jar.sha1" | cut -c1-40)" \
      || die "Maven Central publishes no SHA-1 for $g:$a:$v"
    [[ "$(sha1sum "$jar" | cut -d' ' -f1)" == "$central" ]] || die "$jar differs from Maven Central's $g:$a:$v"
    echo "$g:$a:$v $(sha256sum "$jar" | cut -d' ' -f1)"
  done | sort
} > "$work/jars.lock"
grep -q "^org.opensearch:opensearch:$version " "$work/jars.lock" || die "the resolved jars lack org.opensearch:opensearch:$version"
mv "$work/jars.lock" "$DIR/jars.lock"
echo "jars.lock now pins $(grep -vc '^#' "$DIR/jars.lock") jars of OpenSearch $version"

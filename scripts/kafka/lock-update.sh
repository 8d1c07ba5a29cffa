#!/usr/bin/env bash
# Regenerates jars.lock for a Kafka version: Maven resolves the broker, tools, clients, Streams
# and Connect (the runtime with its REST server, and the FileStream connectors) with their
# runtime dependencies once (the only step that needs mvn), each jar's SHA-1 is checked against
# the one Maven Central publishes beside it, and the lock pins coordinates and SHA-256.
# Run fetch.sh into an empty SPATE_KAFKA_HOME and the tool checks, then review the diff.
#   scripts/kafka/lock-update.sh 4.3.1
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
VERSION="${1:?usage: lock-update.sh KAFKA_VERSION}"
LOG4J="${LOG4J_VERSION:-2.25.4}"  # the logging backend the binary distribution ships
MAVEN="${SPATE_MAVEN_URL:-https://repo1.maven.org/maven2}"
command -v mvn >/dev/null || kit_die "mvn is needed to resolve a new lock"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
dep() { echo "<dependency><groupId>$1</groupId><artifactId>$2</artifactId><version>$3</version>$4</dependency>"; }
# connect-runtime brings the worker's REST server (Jetty 12, Jersey 3, HK2, Jackson's JAX-RS
# provider, ~9 MB); connect-file is the FileStreamSource/Sink connectors (scripts/connect-e2e.sh).
# kafka-streams' rocksdbjni (72 MB of native libraries) serves only RocksDB stores; the kit's
# Streams apps (scripts/txn/StreamsEos.java) use in-memory stores and run without it.
no_rocksdb="<exclusions><exclusion><groupId>org.rocksdb</groupId><artifactId>rocksdbjni</artifactId></exclusion></exclusions>"
cat > "$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>spate</groupId><artifactId>kafka-kit</artifactId><version>1</version><packaging>pom</packaging>
<dependencies>
$(dep org.apache.kafka kafka_2.13 "$VERSION" "")
$(dep org.apache.kafka kafka-server "$VERSION" "")
$(dep org.apache.kafka kafka-storage "$VERSION" "")
$(dep org.apache.kafka kafka-tools "$VERSION" "")
$(dep org.apache.kafka kafka-streams "$VERSION" "$no_rocksdb")
$(dep org.apache.kafka connect-api "$VERSION" "")
$(dep org.apache.kafka connect-json "$VERSION" "")
$(dep org.apache.kafka connect-transforms "$VERSION" "")
$(dep org.apache.kafka connect-runtime "$VERSION" "")
$(dep org.apache.kafka connect-file "$VERSION" "")
$(dep org.apache.logging.log4j log4j-api "$LOG4J" "")
$(dep org.apache.logging.log4j log4j-core "$LOG4J" "")
$(dep org.apache.logging.log4j log4j-slf4j-impl "$LOG4J" "")
</dependencies></project>
POM
mvn -B -q -f "$work/pom.xml" dependency:list -DincludeScope=runtime -DoutputAbsoluteArtifactFilename=true \
  -DoutputFile="$work/deps.txt" > "$work/mvn.log" 2>&1 || { cat "$work/mvn.log" >&2; kit_die "mvn could not resolve Kafka $VERSION"; }
{
  sed -n '1,4p' "$KAFKA_LOCK" | sed "s/Kafka [0-9][0-9.]*'s/Kafka $VERSION's/"
  grep ":jar:" "$work/deps.txt" | sed 's/^ *//' | while IFS=: read -r g a _ v _ path; do
    jar="${path%% *}"
    central="$(curl -fsSL --retry 3 "$MAVEN/${g//.//}/$a/$v/$a-$v.jar.sha1" | cut -c1-40)" \
      || kit_die "Maven Central publishes no SHA-1 for $g:$a:$v"
    [[ "$(sha1sum "$jar" | cut -d' ' -f1)" == "$central" ]] || kit_die "$jar differs from Maven Central's $g:$a:$v"
    echo "$g:$a:$v $(sha256sum "$jar" | cut -d' ' -f1)"
  done | sort
} > "$work/jars.lock"
grep -q "^org.apache.kafka:kafka-clients:$VERSION " "$work/jars.lock" || kit_die "the resolved jars lack kafka-clients $VERSION"
mv "$work/jars.lock" "$KAFKA_LOCK"
echo "jars.lock now pins $(grep -vc '^#' "$KAFKA_LOCK") jars of Kafka $VERSION"

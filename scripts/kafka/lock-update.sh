#!/usr/bin/env bash
# Regenerates jars.lock for a Kafka version: resolves the broker, tools and clients with their
# runtime dependencies once with Maven (needs mvn and java), then pins each jar's coordinates
# and SHA-256. Review the diff before committing it.
#   scripts/kafka/lock-update.sh 4.3.1
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
VERSION="${1:?usage: lock-update.sh KAFKA_VERSION}"
command -v mvn >/dev/null || kit_die "mvn is needed to resolve a new lock"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
dep() { echo "<dependency><groupId>$1</groupId><artifactId>$2</artifactId><version>$3</version>$4</dependency>"; }
cat > "$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>spate</groupId><artifactId>kafka-kit</artifactId><version>1</version><packaging>pom</packaging>
<dependencies>
$(dep org.apache.kafka kafka_2.13 "$VERSION" "")
$(dep org.apache.kafka kafka-server "$VERSION" "")
$(dep org.apache.kafka kafka-storage "$VERSION" "")
$(dep org.apache.kafka kafka-tools "$VERSION" "<exclusions><exclusion><groupId>org.apache.kafka</groupId><artifactId>connect-runtime</artifactId></exclusion><exclusion><groupId>com.fasterxml.jackson.jakarta.rs</groupId><artifactId>jackson-jakarta-rs-json-provider</artifactId></exclusion></exclusions>")
$(dep org.apache.logging.log4j log4j-api 2.25.4 "")
$(dep org.apache.logging.log4j log4j-core 2.25.4 "")
$(dep org.apache.logging.log4j log4j-slf4j-impl 2.25.4 "")
</dependencies></project>
POM
mvn -B -q -f "$work/pom.xml" dependency:list -DincludeScope=runtime -DoutputAbsoluteArtifactFilename=true \
  -DoutputFile="$work/deps.txt" >/dev/null
{
  sed -n '1,4p' "$KIT_DIR/jars.lock" | sed "s/Kafka [0-9.]*'s/Kafka $VERSION's/"
  grep ":jar:" "$work/deps.txt" | sed 's/^ *//' | while IFS=: read -r g a _ v _ path; do
    echo "$g:$a:$v $(sha256sum "${path%% *}" | cut -d' ' -f1)"
  done | sort
} > "$work/jars.lock"
mv "$work/jars.lock" "$KIT_DIR/jars.lock"
sed -i "s/^KAFKA_VERSION=.*/KAFKA_VERSION=\"$VERSION\"/" "$KIT_DIR/lib.sh"
echo "jars.lock now pins $(grep -vc '^#' "$KIT_DIR/jars.lock") jars of Kafka $VERSION"

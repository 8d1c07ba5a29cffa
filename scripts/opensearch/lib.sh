# Sourced by the scripts in scripts/opensearch: where the pinned OpenSearch's jars live and how to
# run them. Jars and run directories stay outside the repository, in a cache.
OS_KIT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OS_LOCK="$OS_KIT_DIR/jars.lock"
os_die() { echo "opensearch kit: $*" >&2; exit 2; }
# The lock is the one place the version is written: the server jar's version there.
OS_VERSION="$(awk '$1 ~ /^org\.opensearch:opensearch:/ { split($1, c, ":"); print c[3] }' "$OS_LOCK")"
[[ -n "$OS_VERSION" ]] || os_die "$OS_LOCK pins no org.opensearch:opensearch"
SPATE_OPENSEARCH_HOME="$(realpath -m "${SPATE_OPENSEARCH_HOME:-$HOME/.cache/spate-opensearch}")"
OS_LIB="$SPATE_OPENSEARCH_HOME/$OS_VERSION/lib"
JAVA="${JAVA:-java}"
# The stamp fetch.sh writes after checking every jar: the lock's own SHA-256.
os_lock_stamp() { sha256sum "$OS_LOCK" | cut -d' ' -f1; }
# The classpath; fetch.sh runs first unless the cache is stamped for this lock.
os_classpath() {
  command -v "$JAVA" >/dev/null || os_die "no '$JAVA' on PATH: OpenSearch $OS_VERSION needs Java 11+ (scripts/setup.sh installs 17)"
  if [[ "$(cat "$OS_LIB/.complete" 2>/dev/null)" != "$(os_lock_stamp)" ]]; then
    "$OS_KIT_DIR/fetch.sh" >&2 || os_die "cannot fetch OpenSearch $OS_VERSION's jars"
  fi
  echo "$OS_LIB/*"
}

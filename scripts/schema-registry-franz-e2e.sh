#!/usr/bin/env bash
# The built-in schema registry with franz-go's registry client and Serde (pkg/sr, hamba/avro)
# and franz-go's Kafka client (kgo): register and look up, the Confluent wire format written
# and read back through the registry's schema, compatibility verdicts (409 for a breaking
# change), ids by subject and version, a subject's level, soft deletes. Go modules pinned in
# scripts/franz-sr/go.mod and go.sum, fetched from the Go module proxy on first use (Go itself
# too, by scripts/go-toolchain.sh, where the machine has none new enough).
#   scripts/schema-registry-franz-e2e.sh     (target/debug/spate; SPATE_BIN overrides)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/target/franz-sr"
mkdir -p "$OUT"
GO="$("$ROOT/scripts/go-toolchain.sh")"
(cd "$ROOT/scripts/franz-sr" && GOFLAGS=-mod=readonly "$GO" build -o "$OUT/franz-sr" .)
# The registry's address is on spate's first stdout line, which with-spate.sh keeps beside
# SPATE_LOG.
exec timeout "${SCHEMA_REGISTRY_E2E_TIMEOUT:-300}" "$ROOT/scripts/with-spate.sh" \
  --spate-arg --schema-registry-listen --spate-arg 127.0.0.1:0 \
  -- bash -c 'SPATE_REGISTRY="http://$(sed -n "s/.*schema registry on \([^,[:space:]]*\).*/\1/p" "$(dirname "$SPATE_LOG")/stdout")" exec "$0"' "$OUT/franz-sr"

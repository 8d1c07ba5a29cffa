#!/usr/bin/env bash
# A real REST Proxy client, Confluent's Node.js `kafka-rest` (npm, v1 API), produces to a
# throw-away spate: strings, Buffers, keys, explicit partitions and a partition that does not
# exist (a 404 for the client); then every record is read back with librdkafka
# (confluent-kafka) and compared byte for byte. The npm package goes to ~/.cache/spate-npm
# (NPM_PREFIX overrides).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="${NPM_PREFIX:-$HOME/.cache/spate-npm}"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    apt-get install -y nodejs npm >/dev/null
  else
    echo "rest-client-e2e: needs node and npm (apt-get install -y nodejs npm)" >&2
    exit 2
  fi
fi
if [[ ! -d "$PREFIX/node_modules/kafka-rest" ]]; then
  mkdir -p "$PREFIX"
  npm install --silent --no-audit --no-fund --prefix "$PREFIX" kafka-rest@0.0.5 >&2
fi
python3 -c "import confluent_kafka" 2>/dev/null || pip install -q confluent-kafka
export NODE_PATH="$PREFIX/node_modules"
SENT="$(mktemp)"
trap 'rm -f "$SENT"' EXIT
export SENT
"$ROOT/scripts/with-spate.sh" -- bash -c '
  set -euo pipefail
  curl -sf -XPOST "http://$SPATE_HTTP/admin/topics" -H "content-type: application/json" \
    -d "{\"name\":\"rest-client\",\"partitions\":3}" >/dev/null
  node "'"$ROOT"'/scripts/rest_client_e2e.js" "http://$SPATE_HTTP" > "$SENT"
  python3 "'"$ROOT"'/scripts/rest_client_readback.py" "$SPATE_BOOTSTRAP" rest-client "$SENT"
'

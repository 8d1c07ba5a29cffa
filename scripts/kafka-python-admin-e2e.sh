#!/usr/bin/env bash
# kafka-python's admin client (a client nobody on the team wrote) against a throw-away spate:
# delete_records, describe_log_dirs, describe_topic_partitions, list_config_resources,
# describe_features, client quotas, and the broker version it infers from ApiVersions.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# 3.x has the admin calls checked here.
python3 -c "import kafka, sys; sys.exit(int(kafka.__version__.split('.')[0]) < 3)" 2>/dev/null \
  || pip install -q 'kafka-python>=3.0.12,<4'
exec "$ROOT/scripts/with-spate.sh" -- python3 "$ROOT/scripts/kafka_python_admin_e2e.py"

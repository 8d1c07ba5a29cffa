#!/usr/bin/env bash
# Prints how many records a topic holds (high watermark minus log start, summed over its
# partitions), from a spate node's admin API.
#   scripts/topic-records.sh HTTP_ADDR TOPIC
set -euo pipefail
curl -sf "http://$1/admin/topics/$2" |
  python3 -c 'import json,sys; print(sum(p["high_watermark"]-p["log_start_offset"] for p in json.load(sys.stdin)["partition_details"]))'

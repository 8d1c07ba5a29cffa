#!/usr/bin/env bash
# Writes DIR/body.json (one ingest request: RECORDS keyless records of 256 B, distinct values)
# and DIR/post.lua (a wrk script that POSTs it as application/json), for the ingest benchmarks.
#   scripts/wrk-ingest-body.sh DIR RECORDS
set -euo pipefail
dir="$1" records="$2"
python3 - "$records" >"$dir/body.json" <<'PY'
import sys
fill = "abcdefghijklmnopqrstuvwxyz0123456789" * 8
n = int(sys.argv[1])
print('{"records":[%s]}' % ",".join('{"value":"%s"}' % (("%d|" % i) + fill)[:256] for i in range(n)), end="")
PY
cat >"$dir/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$dir/body.json")
wrk.body = f:read("*a")
f:close()
LUA

#!/usr/bin/env bash
# Karapace 3.16.0 (Aiven's Confluent-compatible schema registry, in Python) as a separate program
# beside spate, for scripts/schema-registry-differential.sh and scripts/bench-schema-registry.sh.
#
#   scripts/karapace.sh install            prints the cache dir (src/ and venv/) or exits 3
#   scripts/karapace.sh start DIR PORT BOOTSTRAP [COMPAT]   registry on 127.0.0.1:PORT, logs in DIR
#   scripts/karapace.sh stop DIR           stops only the pid start wrote in DIR
#
# Karapace is not published on PyPI (nor on any other registry reachable here), so its source
# cannot be downloaded by this script. It is taken, in this order, from:
#   KARAPACE_SRC   a directory holding Karapace 3.16.0's source tree (karapace/, requirements/)
#   the cache      ~/.cache/spate-karapace/3.16.0/src (or $SPATE_KARAPACE_HOME/3.16.0/src),
#                  filled by an earlier run
#   KARAPACE_GIT   a git directory of Aiven-Open/karapace that has the tag 3.16.0 (default: the
#                  snapshot a session's search tool `fetch github:Aiven-Open/karapace` leaves,
#                  /work/.mirror/Aiven-Open+karapace/repo); `git archive 3.16.0` fills the cache
# and when none is there `install` says so and exits 3 (the callers then skip). Its Python
# dependencies are its own pins (requirements/requirements.txt at the tag) from PyPI, in a venv,
# with stock avro==1.11.3 in place of the patched avro that the pins take from a git archive.
set -euo pipefail
VERSION=3.16.0
HOME_DIR="$(realpath -m "${SPATE_KARAPACE_HOME:-$HOME/.cache/spate-karapace}")/$VERSION"
SRC="$HOME_DIR/src"
VENV="$HOME_DIR/venv"
PY_FOR_VENV="${KARAPACE_PYTHON:-python3.11}"
die() { echo "karapace: $*" >&2; exit 2; }

have_src() { [[ -f "$1/karapace/schema_registry_apis.py" && -f "$1/requirements/requirements.txt" ]]; }

install() {
  if [[ -n "${KARAPACE_SRC:-}" ]]; then
    have_src "$KARAPACE_SRC" || die "KARAPACE_SRC=$KARAPACE_SRC holds no Karapace source tree"
    if [[ "$(realpath -m "$KARAPACE_SRC")" != "$SRC" ]]; then
      rm -rf "$SRC.new"; mkdir -p "$SRC.new"
      cp -a "$KARAPACE_SRC/." "$SRC.new/"
      rm -rf "$SRC"; mv "$SRC.new" "$SRC"
    fi
  elif ! have_src "$SRC"; then
    local git="${KARAPACE_GIT:-/work/.mirror/Aiven-Open+karapace/repo}"
    if git --git-dir "$git" rev-parse -q --verify "refs/tags/$VERSION" >/dev/null 2>&1; then
      rm -rf "$SRC.new"; mkdir -p "$SRC.new"
      # Only what runs (a fetched snapshot may lack large unrelated files such as the website's).
      git --git-dir "$git" archive "$VERSION" karapace requirements LICENSE 2>/dev/null | tar -x -C "$SRC.new"
      have_src "$SRC.new" || die "git archive $VERSION from $git gave no Karapace source"
      rm -rf "$SRC"; mv "$SRC.new" "$SRC"
    else
      echo "karapace: Karapace $VERSION's source is not on this machine and no package registry" \
           "reachable here serves it (it is not on PyPI). Give KARAPACE_SRC=<source tree of tag" \
           "$VERSION> or KARAPACE_GIT=<git dir of Aiven-Open/karapace>." >&2
      exit 3
    fi
  fi
  # The version module setup.py would write from `git describe`.
  [[ -f "$SRC/karapace/version.py" ]] || printf '__version__ = "%s"\n' "$VERSION" > "$SRC/karapace/version.py"
  local stamp; stamp="$(sha256sum "$SRC/requirements/requirements.txt" | cut -d' ' -f1)-avro-1.11.3"
  if [[ "$(cat "$VENV/.complete" 2>/dev/null)" != "$stamp" ]]; then
    command -v "$PY_FOR_VENV" >/dev/null || die "no $PY_FOR_VENV (Karapace $VERSION's pins build for Python 3.8-3.11; KARAPACE_PYTHON overrides)"
    rm -rf "$VENV"
    "$PY_FOR_VENV" -m venv "$VENV"
    grep -v '^avro @' "$SRC/requirements/requirements.txt" > "$HOME_DIR/requirements.txt"
    echo "avro==1.11.3" >> "$HOME_DIR/requirements.txt"
    "$VENV/bin/pip" install -q --disable-pip-version-check -r "$HOME_DIR/requirements.txt" >&2 \
      || die "installing Karapace's pinned requirements from PyPI failed"
    echo "$stamp" > "$VENV/.complete"
  fi
  echo "$HOME_DIR"
}

start() {  # start DIR PORT BOOTSTRAP [COMPATIBILITY]
  local dir port=$2 bootstrap=$3 compat="${4:-BACKWARD}"
  dir="$(realpath -m "$1")"
  install >/dev/null
  mkdir -p "$dir"
  cat > "$dir/karapace.json" <<EOF
{
  "advertised_hostname": "127.0.0.1",
  "bootstrap_uri": "$bootstrap",
  "client_id": "sr-diff",
  "compatibility": "$compat",
  "group_id": "schema-registry-$port",
  "host": "127.0.0.1",
  "port": $port,
  "karapace_rest": false,
  "karapace_registry": true,
  "log_level": "${KARAPACE_LOG_LEVEL:-WARNING}",
  "master_eligibility": true,
  "replication_factor": 1,
  "topic_name": "_schemas",
  "protobuf_runtime_directory": "$dir/runtime"
}
EOF
  cd "$dir"
  PYTHONPATH="$SRC" nohup "$VENV/bin/python" -m karapace.karapace_all "$dir/karapace.json" \
    > "$dir/karapace.log" 2>&1 < /dev/null &
  local pid=$!
  echo "$pid" > "$dir/karapace.pid"
  local deadline=$((SECONDS + ${KARAPACE_START_TIMEOUT:-120}))
  # Ready when it answers and has caught up with _schemas (it answers /subjects only then).
  until curl -sf -o /dev/null "http://127.0.0.1:$port/subjects"; do
    kill -0 "$pid" 2>/dev/null || { tail -30 "$dir/karapace.log" >&2; die "Karapace (pid $pid) exited while starting"; }
    (( SECONDS < deadline )) || { tail -30 "$dir/karapace.log" >&2; die "Karapace did not answer on $port"; }
    sleep 0.3
  done
  echo "karapace $VERSION: pid $pid, http://127.0.0.1:$port"
}

stop() {  # stop DIR
  local dir; dir="$(realpath -m "$1")"
  [[ -f "$dir/karapace.pid" ]] || return 0
  local pid; pid="$(cat "$dir/karapace.pid")"
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "karapace.karapace_all $dir/karapace.json"; then
    kill -TERM "$pid"
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -f "$dir/karapace.pid"
}

case "${1:-}" in
  install) install ;;
  start) shift; [[ $# -ge 3 ]] || die "usage: $0 start DIR PORT BOOTSTRAP [COMPAT]"; start "$@" ;;
  stop) shift; [[ $# -ge 1 ]] || die "usage: $0 stop DIR"; stop "$1" ;;
  *) die "usage: $0 install | start DIR PORT BOOTSTRAP [COMPAT] | stop DIR" ;;
esac

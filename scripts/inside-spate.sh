# Sourced by a script that runs against a throw-away broker: when it is not inside one yet
# (SPATE_PID unset), it re-executes itself inside scripts/with-spate.sh, which starts SPATE_BIN
# with the flags in SPATE_ARGS and stops it afterwards. Needs ROOT and SPATE_BIN set.
if [[ -z "${SPATE_PID:-}" ]]; then
  spate_args=()
  for a in ${SPATE_ARGS:-}; do spate_args+=(--spate-arg "$a"); done
  SPATE_BIN="$SPATE_BIN" exec "$ROOT/scripts/with-spate.sh" "${spate_args[@]}" -- "$0" "$@"
fi

#!/usr/bin/env bash
# Mutation check of the replication simulation and the replication tests: applies each
# deliberately broken variant in scripts/sim-variants/*.patch (one defect each, the defects
# issue 22 fixed among them) to a scratch worktree of HEAD and runs the test named in its
# "# caught by:" line ("sim" is the replication simulation). Every variant must make its test
# fail; a variant that passes is a hole in the tests, one that does not build or apply is a
# stale patch. Both fail the run.
#   scripts/sim-variants.sh                 every variant
#   scripts/sim-variants.sh 07 12           only variants whose file name starts so
#   SPATE_SEEDS=N                           seeds per mode for the simulation (default 64)
# Builds into target/variants (not the main target dir, so the next normal build stays
# incremental); the first build takes a few minutes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WT="${TMPDIR:-/tmp}/spate-variants-$$"
export CARGO_TARGET_DIR="${SPATE_VARIANTS_TARGET:-$ROOT/target/variants}"
SIM=(cargo test -q -p spate-broker --test replication_sim)

cleanup() { git worktree remove --force "$WT" >/dev/null 2>&1 || rm -rf "$WT"; }
trap cleanup EXIT
git worktree add -q --detach "$WT" HEAD

patches=()
for p in scripts/sim-variants/*.patch; do
  name="$(basename "$p" .patch)"
  if (( $# )); then
    keep=0
    for want in "$@"; do [[ "$name" == "$want"* ]] && keep=1; done
    (( keep )) || continue
  fi
  patches+=("$p")
done
(( ${#patches[@]} )) || { echo "no variant matches: $*" >&2; exit 2; }

caught=0 missed=() stale=()
for p in "${patches[@]}"; do
  name="$(basename "$p" .patch)"
  what="$(sed -n 's/^# what: //p' "$p")"
  test="$(sed -n 's/^# caught by: //p' "$p")"
  git -C "$WT" checkout -q -- .
  if ! git -C "$WT" apply "$ROOT/$p"; then
    echo "STALE   $name: the patch no longer applies"; stale+=("$name"); continue
  fi
  if [[ "$test" == sim ]]; then cmd=("${SIM[@]}"); else read -r -a cmd <<<"$test"; fi
  # Build first: a variant that does not compile proves nothing.
  if ! (cd "$WT" && "${cmd[@]}" --no-run >/dev/null 2>"$WT/build.log"); then
    echo "STALE   $name: does not build"; tail -5 "$WT/build.log"; stale+=("$name"); continue
  fi
  started=$SECONDS
  if (cd "$WT" && timeout 1200 "${cmd[@]}" >"$WT/test.log" 2>&1); then
    echo "MISSED  $name ($what): '${cmd[*]}' passed"; missed+=("$name")
  else
    first="$(grep -m1 -E "replication sim:|panicked at|assertion" "$WT/test.log" | cut -c1-160 || true)"
    echo "caught  $name in $((SECONDS - started)) s: ${first:-the test failed}"
    caught=$((caught + 1))
  fi
done
git -C "$WT" checkout -q -- .
echo "variants: ${#patches[@]}, caught: $caught, missed: ${#missed[@]} ${missed[*]:-}, stale: ${#stale[@]} ${stale[*]:-}"
(( ${#missed[@]} == 0 && ${#stale[@]} == 0 ))

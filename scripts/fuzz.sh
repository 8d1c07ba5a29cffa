#!/usr/bin/env bash
# Short fuzzing runs of the request decoder, the RecordBatch parser and the SASL (PLAIN, SCRAM)
# parsers (needs nightly and
# cargo-fuzz: `rustup toolchain install nightly && cargo install cargo-fuzz`).
#   scripts/fuzz.sh [SECONDS_PER_TARGET]     default 60
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../fuzz"
secs="${1:-60}"
grep -q '^nightly' <<<"$(rustup toolchain list)" || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
for target in request_decoder record_batch sasl; do
  mkdir -p "corpus/$target"
  cargo +nightly fuzz run "$target" "corpus/$target" -- -max_total_time="$secs" -max_len=65536
done

#!/usr/bin/env bash
# The reference shape (issue 26): 20 nodes, 10^5 keys, 50,000 req/s, seed 7, SECONDS
# seconds (default 10), each steady scenario at two plan sizes, with standing options on
# (500) and off (0). One JSON report per run into OUT (default ./reference-runs), with
# the run's wall seconds beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/foldgate-target}"
cargo build --release -p ops --bin foldgate
bin="$CARGO_TARGET_DIR/release/foldgate"
out="${OUT:-reference-runs}"
mkdir -p "$out"
for limits in "100 3000" "10 200"; do
  set -- $limits
  for scenario in uniform pinned zipf hot-key all-burst; do
    for standing in 500 0; do
      f="$out/$scenario-$1-$standing.json"
      /usr/bin/time -f "%e" -o "$f.time" "$bin" sim --json --scenario "$scenario" \
        --nodes 20 --keys 100000 --rate 50000 --seconds "${SECONDS_OF_TRAFFIC:-10}" --seed 7 \
        --limit-1s "$1" --limit-60s "$2" --standing-permille "$standing" >"$f"
    done
  done
done

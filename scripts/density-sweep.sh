#!/usr/bin/env bash
# Under-admission across densities (issue 26): each steady scenario at 0.1, 1, 10 and 100
# requests per key per second, the fleet's offered rate held at RATE (default 10,000
# req/s) and the key count set to RATE / density, 20 nodes, seed 7, SECONDS_OF_TRAFFIC
# seconds (default 10), plans 100/1 s + 3,000/60 s (L >= 5N). One JSON report per run into
# OUT (default ./density-runs); `python3 scripts/density-table.py OUT` makes the table.
# BIN names a prebuilt `foldgate` (default: build the release one).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/foldgate-target}"
if [ -z "${BIN:-}" ]; then
  cargo build --release -p ops --bin foldgate
  BIN="$CARGO_TARGET_DIR/release/foldgate"
fi
out="${OUT:-density-runs}"
rate="${RATE:-10000}"
seconds="${SECONDS_OF_TRAFFIC:-10}"
mkdir -p "$out"
for density in 0.1 1 10 100; do
  keys=$(python3 -c "print(round($rate / $density))")
  for scenario in uniform pinned zipf hot-key all-burst; do
    f="$out/$scenario-$density.json"
    /usr/bin/time -f "%e" -o "$f.time" "$BIN" sim --json --nodes 20 --keys "$keys" \
      --rate "$rate" --seconds "$seconds" --seed 7 --scenario "$scenario" \
      --limit-1s 100 --limit-60s 3000 >"$f" 2>"$f.err" || true
  done
done

#!/usr/bin/env bash
# The reference shape (issue 26): 20 nodes, 10^5 keys, 50,000 req/s, seed 7,
# SECONDS_OF_TRAFFIC seconds (default 60), each steady scenario at two plan sizes. Rows:
# leasing with standing options on (500) and, with OFF=1, off (0); FIXED_GS=1 adds fixed
# and global-sync for the scenarios in FIXED_GS_SCENARIOS (default uniform). One JSON
# report per run into OUT (default ./reference-runs), with the run's wall seconds beside
# it. BIN names a prebuilt `foldgate` (default: build the release one).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/foldgate-target}"
if [ -z "${BIN:-}" ]; then
  cargo build --release -p ops --bin foldgate
  BIN="$CARGO_TARGET_DIR/release/foldgate"
fi
out="${OUT:-reference-runs}"
seconds="${SECONDS_OF_TRAFFIC:-60}"
mkdir -p "$out"
run() { # name, then sim flags
  local f="$out/$1.json"
  shift
  /usr/bin/time -f "%e" -o "$f.time" "$BIN" sim --json --nodes 20 --keys 100000 \
    --rate 50000 --seconds "$seconds" --seed 7 "$@" >"$f" 2>"$f.err" || true
}
for limits in "100 3000" "10 200"; do
  set -- $limits
  for scenario in uniform pinned zipf hot-key all-burst; do
    run "$scenario-$1-500" --scenario "$scenario" --limit-1s "$1" --limit-60s "$2" --standing-permille 500
    if [ "${OFF:-0}" = 1 ]; then
      run "$scenario-$1-0" --scenario "$scenario" --limit-1s "$1" --limit-60s "$2" --standing-permille 0
    fi
  done
  if [ "${FIXED_GS:-0}" = 1 ]; then
    for scenario in ${FIXED_GS_SCENARIOS:-uniform}; do
      for mode in fixed global-sync; do
        run "$scenario-$1-$mode" --scenario "$scenario" --mode "$mode" --limit-1s "$1" --limit-60s "$2"
      done
    done
  fi
done

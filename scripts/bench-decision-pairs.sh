#!/usr/bin/env bash
# Interleaved pairs of two decision-bench binaries (A B, then B A, ...), for a before/after
# comparison on a noisy shared machine: pass the same binary twice for the A/A noise floor.
#
#   ./scripts/bench-decision-pairs.sh OUTDIR A_BIN B_BIN PAIRS
#
# Build a bench binary with `cargo bench -p gateway-node --bench decision --no-run` (it
# prints the executable's path) and copy it aside before building the other. Prints one
# line per run and function: label, pair, criterion group, function, median ns.
set -euo pipefail
OUT=$1 A=$2 B=$3 PAIRS=$4
mkdir -p "$OUT"
unset CARGO_TARGET_DIR # criterion then writes under each run's own ./target
run() { # label binary pair
  local dir="$OUT/$1-$3"
  mkdir -p "$dir"
  (
    cd "$dir"
    "$2" --bench decision_1e5_keys --measurement-time 3 --warm-up-time 1 --noplot \
      --save-baseline r >/dev/null 2>&1
    for f in foldgate_two_windows governor_keyed_one_window dashmap_floor_one_word; do
      for g in decision_1e5_keys decision_1e5_keys_thread_cpu; do
        m=$(python3 -c "import json; print(round(json.load(open('target/criterion/$g/$f/r/estimates.json'))['median']['point_estimate'], 2))")
        echo "$1 $3 $g $f $m"
      done
    done
  )
}
for i in $(seq "$PAIRS"); do
  if ((i % 2)); then run A "$A" "$i"; run B "$B" "$i"; else run B "$B" "$i"; run A "$A" "$i"; fi
done

#!/usr/bin/env bash
# What the issue-3 targets would take: every leasing scenario at ACCURACY.md's shape, as
# built and with rules of the design lifted (`foldgate sim --what-if`), printed as the
# markdown table ACCURACY.md quotes ("What the 60 s targets would take").
#
#   ./scripts/what-if-table.sh > /tmp/what-if.md
#
# A lifted rule is never a production setting; each row names the lifts it ran with.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/foldgate-target}"
cargo build -q --release -p ops --bin foldgate
BIN="$CARGO_TARGET_DIR/release/foldgate"
SHAPE=(--nodes 20 --keys 200 --rate 10000 --seconds 90 --seed 1)
LIFTS=(
  ""
  "no-fast-path-misses"
  "fast-path-every-request"
  "no-fast-path-misses,fast-path-every-request"
  "central-endgame"
  "no-fast-path-misses,fast-path-every-request,central-endgame"
)
echo "Shape: \`${SHAPE[*]}\`, \`--mode leasing\`. Targets: under p99 (60 s) <= 0.1% in the steady"
echo "scenarios, fast path < 0.5% in pinned, over max <= 0.5% (steady) / 2% (faults)."
echo
echo "| --what-if | scenario | over max % | under p99 % (1 s) | under mean % (1 s) | under p99 % (60 s) | fast path % | deadline misses | violations |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for lifts in "${LIFTS[@]}"; do
  for scenario in uniform pinned zipf bursty shift hot-key all-burst owner-crash partition restarts lossy skew; do
    args=()
    [ -n "$lifts" ] && args=(--what-if "$lifts")
    # A violation makes the run exit non-zero; the row still records it.
    { "$BIN" sim --scenario "$scenario" --mode leasing "${SHAPE[@]}" "${args[@]}" --json || true; } |
      python3 -c '
import json, sys
d = json.load(sys.stdin)
w1, w60 = d["by_window"]["1000"], d["by_window"]["60000"]
lifts = ", ".join(d.get("what_if", [])) or "(as built)"
print("| %s | %s | %.2f | %.2f | %.3f | %.3f | %.2f | %d | %d |" % (
    lifts, d["scenario"], d["over_admission_pct_max"], w1["under_admission_pct_p99"],
    w1["under_admission_pct_mean"], w60["under_admission_pct_p99"], d["fast_path_share_pct"],
    d["counts"]["fast_path_deadline_missed"], d["invariant_violations"]))'
  done
done

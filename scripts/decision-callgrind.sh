#!/usr/bin/env bash
# Instructions, data accesses and simulated cache misses per `DecisionSurface::decide`
# call, from valgrind's callgrind: counts that do not move with the host's load, for
# comparing two builds of the decision path.
#
#   ./scripts/decision-callgrind.sh BENCH_BIN [BENCH_BIN ...]
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for bin in "$@"; do
  valgrind --tool=callgrind --cache-sim=yes --callgrind-out-file="$tmp/out" "$bin" \
    --profile-time 3 --exact decision_1e5_keys/foldgate_two_windows >/dev/null 2>&1
  python3 - "$tmp/out" "$bin" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().split("\n")
events = next(l for l in lines if l.startswith("events:")).split()[1:]
names, callee, calls, total = {}, None, 0, [0] * len(events)
for i, line in enumerate(lines):
    m = re.match(r"^c?fn=\((\d+)\)(?: (.*))?$", line)
    if m:
        if m.group(2):
            names[m.group(1)] = m.group(2)
        if line.startswith("cfn="):
            callee = names.get(m.group(1), "")
    if line.startswith("calls=") and callee and re.search(r"DecisionSurface.*::decide$", callee):
        calls += int(line.split("=")[1].split()[0])
        cost = [int(x) for x in lines[i + 1].split()[1:]]
        total = [a + b for a, b in zip(total, cost + [0] * (len(events) - len(cost)))]
per = ", ".join(f"{e} {v / calls:.2f}" for e, v in zip(events, total)) if calls else "no calls"
print(f"{sys.argv[2]}: {calls} calls; per call: {per}")
PY
done

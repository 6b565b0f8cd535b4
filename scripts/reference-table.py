#!/usr/bin/env python3
"""Rows of ACCURACY.md's reference-shape table from `scripts/reference-shape.sh` output.

    python3 scripts/reference-table.py [OUT]   (default ./reference-runs)

One Markdown row per JSON report found: scenario, limits, protocol, fast-path share,
denials of keys under half their limit, over-admission max / p99, under-admission p99 per
1 s window, under-admitted requests as a share of the oracle's admissions, bus messages
and grants per request, loans, invariant violations, wall seconds.
"""
import json
import os
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "reference-runs"
protocols = [("500", "options"), ("0", "no options"), ("fixed", "fixed"), ("global-sync", "global-sync")]
for lim, label in [("100", "100/3000"), ("10", "10/200")]:
    for scenario in ["uniform", "pinned", "zipf", "hot-key", "all-burst"]:
        for suffix, protocol in protocols:
            f = os.path.join(out, f"{scenario}-{lim}-{suffix}.json")
            if not os.path.exists(f) or os.path.getsize(f) == 0:
                continue
            d = json.load(open(f))
            c, o = d["counts"], d["offered"]
            wall = open(f + ".time").read().strip().splitlines()[-1]
            print(
                f"| {scenario} | {label} | {protocol} | {d['fast_path_share_pct']:.3f}% "
                f"| {d['denied_under_half_limit']} ({d['denied_under_half_limit_pct']:.4f}%) "
                f"| {d['over_admission_pct_max']:.2f} / {d['over_admission_pct_p99']:.2f} "
                f"| {d['under_admission_pct_p99']:.2f} | {d['under_admitted_pct_of_oracle']:.3f}% "
                f"| {c['bus_sent'] / o:.2f} | {c['grants_applied'] / o:.3f} "
                f"| {c.get('deadline_loans', 0)} | {d['invariant_violations']} | {wall} |"
            )

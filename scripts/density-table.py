#!/usr/bin/env python3
"""Rows of ACCURACY.md's density table from `scripts/density-sweep.sh` output.

    python3 scripts/density-table.py [OUT]   (default ./density-runs)

One Markdown row per JSON report: scenario, requests per key per second, keys, requests
the oracle admitted, under-admitted requests (count and share of the oracle's
admissions), under-admission p99 per 1 s window, over-admission max, fast-path share.
"""
import json
import os
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "density-runs"
for scenario in ["uniform", "pinned", "zipf", "hot-key", "all-burst"]:
    for density in ["0.1", "1", "10", "100"]:
        f = os.path.join(out, f"{scenario}-{density}.json")
        if not os.path.exists(f) or os.path.getsize(f) == 0:
            continue
        d = json.load(open(f))
        print(
            f"| {scenario} | {density} | {d['keys']} | {d['under_admitted_requests']} "
            f"| {d['under_admitted_pct_of_oracle']:.3f}% | {d['under_admission_pct_p99']:.2f} "
            f"| {d['over_admission_pct_max']:.2f} | {d['fast_path_share_pct']:.3f}% |"
        )

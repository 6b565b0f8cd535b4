#!/usr/bin/env python3
"""Summarises ./scripts/bench-http.sh output (stdin): medians over reps, the limiter's
added latency as the median of per-rep (on - off) differences within an interleaved pair,
the proxy hop as (off - direct) within the second pair, the in-process histogram's quantile buckets, and max-throughput ratios."""
import json, re, statistics, sys

runs, hist, oha = {}, [], {}
for line in sys.stdin:
    line = line.strip()
    m = re.match(r'# foldgate_limiter_added_latency_seconds_bucket\{le="([^"]+)"\} (\d+)', line)
    if m:
        hist.append((m.group(1), int(m.group(2))))
        continue
    if not line.startswith("{"):
        if line.startswith('# machine'):
            print(line)
        continue
    d = json.loads(line)
    if 'report' in d:
        runs.setdefault(d['run'], {})[d['rep']] = d['report']
    else:
        oha.setdefault(d['run'], []).append(d)

med = statistics.median
for name in ('direct', 'limiter_off_b', 'limiter_off', 'limiter_on', 'limiter_off_aa', 'limiter_off2'):
    rs = list(runs.get(name, {}).values())
    if rs:
        print(f"{name:12} reps {len(rs)}  median p50 {med(r['latency_us_p50'] for r in rs):7.1f} us"
              f"  p99 {med(r['latency_us_p99'] for r in rs):7.1f} us  p999 {med(r['latency_us_p999'] for r in rs):7.1f} us"
              f"  non-2xx {sum(r['sent'] - r['ok'] for r in rs)}")
def diff(a, b, q):
    reps = sorted(set(runs.get(a, {})) & set(runs.get(b, {})))
    ds = [runs[a][r][q] - runs[b][r][q] for r in reps]
    return (med(ds), ds) if ds else (float('nan'), [])
for q in ('latency_us_p50', 'latency_us_p99', 'latency_us_p999'):
    m, ds = diff('limiter_on', 'limiter_off', q)
    h, hs = diff('limiter_off_b', 'direct', q)
    print(f"{q[11:]:5}: limiter adds {m:+7.1f} us (per rep {', '.join(f'{x:+.0f}' for x in ds)});"
          f" proxy hop {h:+7.1f} us (per rep {', '.join(f'{x:+.0f}' for x in hs)})")
if runs.get('limiter_off2'):
    for q in ('latency_us_p50', 'latency_us_p99', 'latency_us_p999'):
        m, ds = diff('limiter_off_aa', 'limiter_off2', q)
        print(f"{q[11:]:5}: A/A (off - off, noise floor) {m:+7.1f} us (per rep {', '.join(f'{x:+.0f}' for x in ds)});"
              f" median |A/A| {med(abs(x) for x in ds):.1f} us, median |on - off| "
              f"{med(abs(x) for x in diff('limiter_on', 'limiter_off', q)[1]):.1f} us")
if hist:
    total = hist[-1][1]
    for q in (0.5, 0.99, 0.999):
        le = next(le for le, c in hist if c >= q * total)
        print(f"in-process limiter time p{q*100:g}: <= {float(le)*1e6:g} us ({total} decisions)")
on = {d['rep']: d for d in oha.get('oha_max_limiter_on', [])}
off = {d['rep']: d for d in oha.get('oha_max_limiter_off', [])}
if on and off:
    ratios = [on[r]['rps'] / off[r]['rps'] for r in sorted(set(on) & set(off))]
    on, off = list(on.values()), list(off.values())
    print(f"max throughput (oha, 64 conns): on median {med(x['rps'] for x in on):.0f} req/s, off median"
          f" {med(x['rps'] for x in off):.0f} req/s; on/off per rep {', '.join(f'{r:.3f}' for r in ratios)};"
          f" median {med(ratios):.3f}")
for r in oha.get('oha_rate_limiter_on', []):
    print(f"oha at {r['rate']} req/s on the limiter-on node: p50 {r['p50_us']} us, p99 {r['p99_us']} us, {r['status']}")

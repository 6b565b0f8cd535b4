#!/usr/bin/env python3
"""An idealized floor for the sim's `uniform` scenario (ACCURACY.md, BENCHMARKS.md issue 3).

One key, 20 nodes, Poisson 50 req/s spread uniformly over the nodes, one 1 s window of
L = 40, rounds of 25 ms. The owner is better than any real protocol can be: it knows the
past exactly, has zero latency, and at every round RECALLS all unspent credit and places
it again (C6 grants never shrink, so a real owner cannot). Within a round a node spends
only what it holds, plus, in the second model, one fast-path unit from what the owner
held back (D5: once per node per round). Under = min(L, offered) - admitted, in percent
of L, per window (the oracle admits the first L). Pure Python, seeded, ~20 s.
"""
import math
import random


def poisson(lam, r):
    limit = math.exp(-lam)
    k, p = 0, 1.0
    while True:
        p *= r.random()
        if p <= limit:
            return k
        k += 1


def run(keep, fast_path, windows=20000, seed=1, nodes=20, rate=50.0, limit=40, rounds=40):
    r = random.Random(seed)
    unders, fps, total = [], 0, 0
    for _ in range(windows):
        left, admitted, offered = limit, 0, 0
        for _ in range(rounds):
            placed = max(0, min(left - keep, nodes))
            held = [0] * nodes
            for n in r.sample(range(nodes), placed):
                held[n] = 1
            pool = left - placed
            used_fp = [False] * nodes
            for _ in range(poisson(rate / rounds, r)):
                offered += 1
                total += 1
                n = r.randrange(nodes)
                if held[n] > 0:
                    held[n] -= 1
                    left -= 1
                    admitted += 1
                elif fast_path and pool > 0 and not used_fp[n]:
                    used_fp[n] = True
                    fps += 1
                    pool -= 1
                    left -= 1
                    admitted += 1
        unders.append(max(0, min(limit, offered) - admitted) * 100.0 / limit)
    unders.sort()
    return sum(unders) / len(unders), unders[int(0.99 * len(unders))], fps * 100.0 / total


if __name__ == "__main__":
    m, p99, _ = run(keep=0, fast_path=False)
    print(f"recall every round, no fast path: under mean {m:.2f}% p99 {p99:.2f}%")
    for keep in (0, 5, 10, 20, 40):
        m, p99, fp = run(keep=keep, fast_path=True)
        print(f"recall every round, fast path, {keep} held back: under mean {m:.2f}% "
              f"p99 {p99:.2f}%, fast path {fp:.1f}% of requests")

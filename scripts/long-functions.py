#!/usr/bin/env python3
"""Production Rust functions longer than a limit, longest first.

    ./scripts/long-functions.py [ROOT] [LIMIT]   (defaults: . and 80)

Counts a function from its `fn` line to its closing brace by brace matching (strings and
line comments stripped); skips tests/, benches/, examples/ and a file's #[cfg(test)] module.
A function past the limit wants splitting, or a comment beside it saying why not."""
import os, re, sys
root = sys.argv[1] if len(sys.argv) > 1 else "."
limit = int(sys.argv[2]) if len(sys.argv) > 2 else 80
fn_re = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)')
out = []
for dp, dn, fns in os.walk(root):
    dn[:] = [d for d in dn if d not in ("target", ".git", "tests", "benches", "examples")]
    for f in fns:
        if not f.endswith(".rs"): continue
        p = os.path.join(dp, f)
        lines = open(p).read().split("\n")
        # cut at #[cfg(test)]
        end = len(lines)
        for i, l in enumerate(lines):
            if l.strip() == "#[cfg(test)]" and i + 1 < len(lines) and lines[i+1].strip().startswith("mod "):
                end = i; break
        i = 0
        while i < end:
            m = fn_re.match(lines[i])
            if m:
                depth = 0; started = False; j = i
                while j < end:
                    s = re.sub(r'"(\\.|[^"\\])*"', '""', lines[j]); s = s.split("//")[0]
                    for ch in s:
                        if ch == "{": depth += 1; started = True
                        elif ch == "}": depth -= 1
                    if started and depth <= 0: break
                    if not started and s.rstrip().endswith(";"): break
                    j += 1
                n = j - i + 1
                if started and n > limit: out.append((n, p, i+1, m.group(6)))
            i += 1
out.sort(reverse=True)
for n, p, l, name in out: print(f"{n:5d} {p}:{l} {name}")
print(f"{len(out)} functions over {limit} lines", file=sys.stderr)

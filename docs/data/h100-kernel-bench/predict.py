"""What the kernel-level timings predict end to end: one decode token runs the FA op once per layer, so a
kernel saving d µs per op saves n_layers * d per token; with upstream's tg128 t/s (from the stored
results' report.md) the predicted speedup is 1 / (1 - n_layers * d * t/s). Run from this folder."""

import re
import statistics
from collections import defaultdict

us = defaultdict(list)
for f in ("kbench-1b.txt", "kbench-8b.txt"):
    for ln in open(f):
        p = ln.split()
        if len(p) >= 6 and p[0].startswith("llama") and p[1].isdigit():
            us[(p[0], int(re.search(r"nkv(\d+)", p[3]).group(1)), p[2])].append(float(p[4]))

# (model, layers, depth, n_kv of its tg128 cell, kernel, upstream tg128 t/s from results/sm_90/*/report.md)
cases = [
    ("llama-3.2-1b", 16, 16384, 16640, "MMA", 660.62),
    ("llama-3.2-1b", 16, 16384, 16640, "TILE", 660.62),
    ("llama-3.2-1b", 16, 32768, 33024, "TILE", 540.81),
    ("llama-3.2-1b", 16, 65536, 65792, "TILE", 396.92),
    ("llama-3.1-8b", 32, 32768, 33024, "MMA", 173.58),
    ("llama-3.1-8b", 32, 65536, 65792, "MMA", 127.65),
]
for model, layers, depth, nkv, kern, ts in cases:
    d = statistics.median(us[(model, nkv, "upstream")]) - statistics.median(us[(model, nkv, kern)])
    print(f"{model} d{depth} {kern}: saves {d:.2f} us/op, predicted {100 * (1 / (1 - layers * d * 1e-6 * ts) - 1):+.1f}%")

# The speedup table of docs/llama-bench-cost.md: upstream µs / forced µs per round (rounds pair by order),
# mean [min-max] over rounds.
for model in ("llama-3.2-1b", "llama-3.1-8b"):
    for nkv in sorted({k[1] for k in us if k[0] == model}):
        up = us[(model, nkv, "upstream")]
        cols = []
        for kern in ("VEC", "TILE", "MMA"):
            r = [u / x for u, x in zip(up, us[(model, nkv, kern)])]
            cols.append(f"{kern} {statistics.mean(r):.3f} [{min(r):.3f}-{max(r):.3f}]")
        print(f"{model} n_kv {nkv}: upstream {statistics.median(up):.2f} us; " + "; ".join(cols))

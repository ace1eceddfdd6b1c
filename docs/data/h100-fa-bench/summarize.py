"""The per-shape ratios of fab.txt: forced kernel's speedup over upstream's pick (upstream µs / forced µs),
median [range] over the rounds, per timer (python3 summarize.py)."""

import collections
import re
import statistics
from pathlib import Path

rows = collections.defaultdict(dict)
for line in (Path(__file__).parent / "fab.txt").read_text().splitlines():
    m = re.match(r"(fa-bench|test-backend-ops) (\d) (\w+) (\S+) ([\d.]+) ", line)
    if m:
        rows[(m[1], m[4], m[3])][int(m[2])] = float(m[5])
for timer in ("fa-bench", "test-backend-ops"):
    print(f"\n{timer}\n| shape | upstream µs (rounds) | VEC forced (A/A) | TILE | MMA |\n|---|---|---|---|---|")
    for shape in dict.fromkeys(k[1] for k in rows if k[0] == timer):
        up = rows[(timer, shape, "upstream")]
        cells = []
        for c in ("VEC", "TILE", "MMA"):
            r = [up[i] / us for i, us in rows[(timer, shape, c)].items() if i in up]
            cells.append(f"{statistics.median(r):.2f} [{min(r):.2f}-{max(r):.2f}]")
        print(f"| {shape} | {', '.join(f'{v:g}' for v in up.values())} | " + " | ".join(cells) + " |")

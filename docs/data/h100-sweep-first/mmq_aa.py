"""Median and 90th percentile of |log(A/A / upstream)| per batch size in an MMQ sweep's samples.

python3 docs/data/h100-sweep-first/mmq_aa.py mmq-3models.sqlite3   (xz -dk the stored file first)"""
import math
import sqlite3
import statistics
import sys

db = sqlite3.connect(sys.argv[1])
us = {
    (t, m, k, n, c, r): v
    for t, m, k, n, c, r, v in db.execute(
        "SELECT type, m, k, ne11, config, round, us_per_op FROM mm_samples WHERE us_per_op IS NOT NULL"
    )
}
by_n: dict[int, list[float]] = {}
for (t, m, k, n, c, r), v in us.items():
    if c == "default" and (t, m, k, n, "A/A", r) in us:
        by_n.setdefault(n, []).append(abs(math.log(us[(t, m, k, n, "A/A", r)] / v)))
for n in sorted(by_n):
    xs = sorted(by_n[n])
    print(f"ne11 {n}: {len(xs)} pairs, median |log A/A| {100 * statistics.median(xs):.1f}%, p90 {100 * xs[int(0.9 * len(xs))]:.1f}%")

"""Make docs/img/speedup-example.{png,md} from data recorded on the H100 (nothing is measured).

Source data (docs/h100.md; llama-3.2-1b shape, Q4_K_M, NVIDIA H100 80GB HBM3,
llama.cpp 0c1e57098, -fa 1, depths 0/4096/16384/32768):

- upstream side: ``tests/data/replay/{pp,tg}-default.jsonl`` (upstream kernel selection);
- tuned side: a rule in the shape of llama.cpp PR 15035, "decode with the MMA kernel from n_kv >= 16384,
  upstream selection below": ``tg-MMA.jsonl`` at d16384/d32768, ``tg-VEC.jsonl`` below
  (VEC is what upstream picks there) and ``pp-MMA.jsonl`` for prefill (upstream's pick);
  where the tuned side runs upstream's kernel the plot shows a second run of the same kernel;
- A/A noise: |Δ%| between ``tests/data/bench/h100/default-run1.jsonl`` and ``default-run2.jsonl``
  (the same default build benchmarked twice, 20 s apart).

The first repetition of every llama-bench record is dropped (warm-up), as ``tuner bench`` does.
The rule was chosen by looking at these same numbers, so this is an illustration of the plot, not
a validated result.

Run from the repository root: ``python docs/img/make-speedup-example.py``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from tuner.bench import load_results
from tuner.replay import load_grid
from tuner.report import compare_table, plot_speedup
from tuner.stats import compare

ROOT = Path(__file__).resolve().parents[2]
GRID = ROOT / "tests" / "data" / "replay"
RUNS = ROOT / "tests" / "data" / "bench" / "h100"
UPSTREAM = {"pp": "MMA", "tg": "VEC"}  # the hook's "kernel=... (default)" log lines on this build
TESTS = {"pp": "pp512", "tg": "tg128"}


def tuned_kernel(phase: str, depth: int) -> str:
    return "MMA" if phase == "tg" and depth >= 16384 else UPSTREAM[phase]


def main() -> None:
    grid = load_grid(sorted(GRID.glob("*.jsonl")))
    run1, run2 = load_results(RUNS / "default-run1.jsonl"), load_results(RUNS / "default-run2.jsonl")
    med1 = {(r.test, int(r.depth)): float(r.median_ts) for r in run1.itertuples()}
    med2 = {(r.test, int(r.depth)): float(r.median_ts) for r in run2.itertuples()}
    points = []
    for phase in ("pp", "tg"):
        for depth, base in sorted(grid.samples[(phase, "default")].items()):
            k = tuned_kernel(phase, depth)
            tuned = grid.samples[(phase, k)][depth]
            v = compare(base, tuned)
            test = TESTS[phase]
            noise = abs(med2[(test, depth)] / med1[(test, depth)] - 1) * 100
            verdict = v.verdict
            if verdict != "no difference" and v.ci_low <= noise and v.ci_high >= -noise:
                verdict = "within noise"
            points.append({
                "phase": phase, "depth": depth, "test": test,
                "base_ts": statistics.median(base), "tuned_ts": statistics.median(tuned),
                "speedup": 1 + v.delta_pct / 100, "ci_low": 1 + v.ci_low / 100, "ci_high": 1 + v.ci_high / 100,
                "aa_noise_pct": noise, "verdict": verdict, "upstream_kernel": UPSTREAM[phase], "kernel": k,
            })
    out = ROOT / "docs" / "img"
    png = plot_speedup(points, out / "speedup-example.png",
                       title="H100, llama-3.2-1b shape Q4_K_M: decode with MMA from n_kv ≥ 16384 vs upstream "
                             "(recorded H100 grid; illustration)")
    md = compare_table(points, name_a="upstream", name_b="tuned", model="llama 1B Q4_K_M")
    (out / "speedup-example.md").write_text(md + "\n", encoding="utf-8")
    print(md)
    print(png)


if __name__ == "__main__":
    main()

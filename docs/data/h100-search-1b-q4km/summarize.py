"""Per-round decode ratios of the confirm stage in study.db (xz -dk study.db.xz first), by the machine each
round ran on: rounds 0-2 on the H100, 3-5 on the H200 that the resumed search landed on (see README.md).

    python summarize.py study.db
"""

import math
import sys

import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)
path = sys.argv[1] if len(sys.argv) > 1 else "study.db"
storage = f"sqlite:///{path}"
(summary,) = optuna.get_all_study_summaries(storage)
attrs = optuna.load_study(study_name=summary.study_name, storage=storage).user_attrs
print("stage seconds (summed over the three calls):", attrs["stage_seconds"])
rounds = next(v for k, v in attrs.items() if k.startswith("confirm_rounds_"))
tg = [r for r in rounds if r["phase"] == "tg"]
depths = sorted({int(d) for r in tg for d in r["depths"]})
print("\ndecode confirm: final/upstream and A/A (upstream-aa/upstream) per round; H100 = rounds 0-2, H200 = 3-5")
print(f"{'depth':>6} " + " ".join(f"{'r' + str(r['round']) + (' H100' if r['round'] < 3 else ' H200'):>17}" for r in tg))
for d in depths:
    cells = []
    for r in tg:
        v = r["values"]
        if str(d) not in v.get("upstream", {}):
            cells.append(f"{'-':>17}")
            continue
        up = v["upstream"][str(d)]
        cells.append(f"{v['final'][str(d)] / up:>8.3f} {v['upstream-aa'][str(d)] / up:>8.3f}")
    print(f"{d:>6} " + " ".join(cells))


def gmean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


print("\ngeometric mean of final/upstream over the H100 rounds (0-2) only, every depth:")
for d in depths:
    xs = [r["values"]["final"][str(d)] / r["values"]["upstream"][str(d)] for r in tg[:3]]
    print(f"  d{d}: {gmean(xs):.3f} (rounds: {', '.join(f'{x:.3f}' for x in xs)})")

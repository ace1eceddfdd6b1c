"""Power and false-claim rate of the search's decision rules, replayed on the recorded rounds' noise.

Nothing is measured. The noise is the recorded one: every CUDA screen and confirm round stored in this
repository's study databases (``docs/data/noise-floors/*.db.xz``, ``results/*/*/evidence/study.db.xz``),
per phase and depth as a rounds x configurations table of log t/s. Each table's round and configuration
means are removed (what is left is the noise of one measurement in one round; rescaled by
``sqrt(RC / ((R-1)(C-1)))`` for the means removed), and a simulated screen draws it back:

* a phase is screened at 4 depths with upstream, its A/A twin and the forced kernels (decode: two,
  prefill: one), as the search does on an H100; each depth takes the noise of one recorded table drawn
  at random (its residuals' root mean square; depths differ in noise as they do on the machine), and each
  round one recorded round's residuals, drawn from every table of the phase (bootstrap over rounds),
  standardized by their own table's noise and scaled to the depth's (a table of 3 rounds alone would
  repeat its rounds and fake agreement); configurations are shuffled within the round;
* a known multiplicative effect is injected into one candidate at one depth (``--effects``, percent);
* rounds are added as the search adds them (``screen.depths_to_measure`` with the rule's settle
  function, the same minimum and maximum rounds and CI target as ``SearchConfig``), and the phase is
  judged by ``compose.judge_phase`` with that rule: the very functions the live search calls.

Reported per rule and effect: the share of searches that claim the injected cell faster (power), the
share that claim anything (at effect 0: the false-claim rate of a whole search, both phases), and the
mean rounds per depth. Run from the repository root: ``python tools/power.py`` (``--markdown FILE``
writes the table into that file between its ``<!-- power table -->`` markers).
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import sqlite3
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.search import compose  # noqa: E402
from tuner.search.screen import UPSTREAM, depths_to_measure, summarize_phase  # noqa: E402

DEPTHS = (0, 4096, 16384, 32768)
KERNELS = {"tg": ("VEC", ("TILE", "MMA")), "pp": ("MMA", ("TILE",))}
"""Per phase: upstream's kernel (so the forced twin is the A/A pair) and the other forced kernels."""
TARGET = ("TILE", 16384)
"""The cell the effect is injected into."""


@dataclass(frozen=True)
class Table:
    """One recorded phase and depth: noise residuals, rounds x configurations (log t/s)."""

    source: str
    phase: str
    depth: int
    resid: np.ndarray


def tables(dbs: Sequence[Path]) -> dict[str, list[Table]]:
    """The recorded CUDA tables with at least 3 complete rounds, per phase; a study's latest copy counts."""
    last: dict[tuple[str, str, str, int], Table] = {}
    for db in dbs:
        with tempfile.TemporaryDirectory() as tmp:
            plain = Path(tmp) / "study.db"
            plain.write_bytes(lzma.decompress(db.read_bytes()))
            con = sqlite3.connect(f"file:{plain}?mode=ro", uri=True)
            try:
                for sid, name in con.execute("select study_id, study_name from studies"):
                    attrs = {
                        k: json.loads(v)
                        for k, v in con.execute(
                            "select key, value_json from study_user_attributes where study_id = ?", (sid,)
                        )
                    }
                    if not str(attrs.get("arch", "")).startswith("sm_"):
                        continue
                    for key, recs in attrs.items():
                        if not (key == "screen_rounds" or key.startswith("confirm_rounds")):
                            continue
                        for phase in ("pp", "tg"):
                            for d in sorted({int(d) for r in recs if r["phase"] == phase for d in r["depths"]}):
                                rows = [r for r in recs if r["phase"] == phase and str(d) in r["values"][UPSTREAM]]
                                names = sorted(rows[0]["values"])
                                y = [[r["values"].get(n, {}).get(str(d)) for n in names] for r in rows]
                                y = [row for row in y if all(isinstance(v, (int, float)) and v > 0 for v in row)]
                                if len(y) < 3 or len(names) < 3:
                                    continue
                                a = np.log(np.asarray(y, dtype=float))
                                r_, c_ = a.shape
                                res = a - a.mean(1, keepdims=True) - a.mean(0, keepdims=True) + a.mean()
                                res *= math.sqrt(r_ * c_ / ((r_ - 1) * (c_ - 1)))
                                last[(name, key, phase, d)] = Table(db.relative_to(ROOT).as_posix(), phase, d, res)
            finally:
                con.close()
    out: dict[str, list[Table]] = {"pp": [], "tg": []}
    for t in last.values():
        out[t.phase].append(t)
    return out


def _sd(t: Table) -> float:
    """A table's noise: the root mean square of its (rescaled) residuals."""
    return float(np.sqrt(np.mean(t.resid**2)))


def _record(
    phase: str,
    rnd: int,
    depths: Sequence[int],
    draws: Mapping[int, np.ndarray],
    names: Sequence[str],
    limits: tuple[int, int],
) -> dict[str, Any]:
    up_k, _ = KERNELS[phase]
    rec: dict[str, Any] = {
        "phase": phase,
        "depths": list(depths),
        "round": rnd,
        "order": list(names),
        "limits": list(limits),
    }
    rec["values"] = {n: {str(d): float(100.0 * math.exp(draws[d][j])) for d in depths} for j, n in enumerate(names)}
    rec["kernels"] = {n: {str(d): (up_k if n == UPSTREAM else n) for d in depths} for n in names}
    rec["why"] = {n: {str(d): ("default" if n == UPSTREAM else "rule") for d in depths} for n in names}
    rec["errors"] = {}
    return rec


def screen_once(
    phase: str,
    pool: Sequence[Table],
    effect_pct: float,
    rule: str,
    rng: np.random.Generator,
    *,
    min_rounds: int = 3,
    max_rounds: int = 6,
    target_ci: float = 1.0,
) -> tuple[bool, bool, float]:
    """One simulated screen of ``phase``: (claims the injected cell, claims anything, mean rounds per depth)."""
    up_k, others = KERNELS[phase]
    names = [UPSTREAM, up_k, *others]
    pool = [t for t in pool if t.resid.shape[1] >= len(names)]
    rows = np.concatenate([t.resid[:, : len(names)] / _sd(t) for t in pool])  # every recorded round's shape
    scale = {d: _sd(pool[int(rng.integers(len(pool)))]) for d in DEPTHS}  # one recorded table's noise per depth
    shift = np.zeros(len(names))
    shift[names.index(TARGET[0])] = math.log1p(effect_pct / 100.0)
    settle = partial(compose.open_depths, rule=rule)
    mine: list[dict[str, Any]] = []
    while True:
        todo = depths_to_measure(phase, mine, DEPTHS, min_rounds, max_rounds, target_ci, settle)
        if not todo:
            break
        draws = {}
        for d in todo:
            row = rows[int(rng.integers(rows.shape[0]))][rng.permutation(len(names))] * scale[d]
            draws[d] = row + (shift if d == TARGET[1] else 0.0)
        mine.append(_record(phase, len(mine), todo, draws, names, (min_rounds, max_rounds)))
    cells = compose.judge_phase(phase, summarize_phase(phase, mine, DEPTHS), rule=rule)
    claims = {(d, n) for d, c in cells.items() for n, v in c.verdicts.items() if v == "faster" and n != c.aa}
    rounds = float(np.mean([c.effects[TARGET[0]].n for c in cells.values()]))
    return (TARGET[1], TARGET[0]) in claims, bool(claims), rounds


def run(
    effects: Sequence[float],
    reps: int,
    seed: int,
    rules: Sequence[str] = compose.RULES,
    *,
    min_rounds: int = 3,
    max_rounds: int = 6,
) -> list[dict[str, Any]]:
    """One row per rule and effect: power, false-claim shares and rounds (both phases screened per search)."""
    pool = tables(
        sorted(ROOT.glob("docs/data/noise-floors/*.db.xz")) + sorted(ROOT.glob("results/*/*/evidence/study.db.xz"))
    )
    out = []
    for rule in rules:
        for eff in effects:
            rng = np.random.default_rng([seed, round(eff * 100)])  # same draws for both rules
            hit = {"tg": 0, "pp": 0}
            anyc = {"tg": 0, "pp": 0}
            both = 0
            rounds = {"tg": 0.0, "pp": 0.0}
            for _ in range(reps):
                claimed = False
                for phase in ("tg", "pp"):
                    h, a, r = screen_once(
                        phase, pool[phase], eff, rule, rng, min_rounds=min_rounds, max_rounds=max_rounds
                    )
                    hit[phase] += h
                    anyc[phase] += a
                    rounds[phase] += r
                    claimed = claimed or a
                both += claimed
            out.append(
                {
                    "rule": rule,
                    "effect_pct": eff,
                    "power_tg": hit["tg"] / reps,
                    "power_pp": hit["pp"] / reps,
                    "any_claim_tg": anyc["tg"] / reps,
                    "any_claim_pp": anyc["pp"] / reps,
                    "any_claim_search": both / reps,
                    "rounds_tg": rounds["tg"] / reps,
                    "rounds_pp": rounds["pp"] / reps,
                }
            )
    return out


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    head = (
        "| rule | injected effect | claims it: decode | claims it: prefill | claims anything: decode | "
        "claims anything: prefill | claims anything: search | mean rounds per depth: decode / prefill |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )

    def pct(x: float) -> str:
        return f"{100 * x:.1f}%"

    return head + "".join(
        f"| {r['rule']} | {r['effect_pct']:+g}% | {pct(r['power_tg'])} | {pct(r['power_pp'])} | "
        f"{pct(r['any_claim_tg'])} | {pct(r['any_claim_pp'])} | {pct(r['any_claim_search'])} | "
        f"{r['rounds_tg']:.2f} / {r['rounds_pp']:.2f} |\n"
        for r in rows
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--effects", default="0,2,3,4,6", help="injected effects, percent, comma separated")
    ap.add_argument("--reps", type=int, default=400, help="simulated searches per rule and effect")
    ap.add_argument("--seed", type=int, default=20261125)
    ap.add_argument("--min-rounds", type=int, default=3, help="as tuner search --min-rounds")
    ap.add_argument("--max-rounds", type=int, default=6, help="as tuner search --max-rounds")
    ap.add_argument("--markdown", type=Path, help="write the table between <!-- power table --> markers")
    args = ap.parse_args(argv)
    try:
        effects = [float(x) for x in args.effects.split(",") if x.strip()]
    except ValueError:
        print(f"power: --effects must be numbers separated by commas (got {args.effects!r})", file=sys.stderr)
        return 2
    if args.reps < 1 or not 2 <= args.min_rounds <= args.max_rounds:
        print(
            f"power: --reps must be at least 1 and 2 <= --min-rounds <= --max-rounds (got {args.reps}, "
            f"{args.min_rounds}, {args.max_rounds})",
            file=sys.stderr,
        )
        return 2
    t0 = time.monotonic()
    rows = run(effects, args.reps, args.seed, min_rounds=args.min_rounds, max_rounds=args.max_rounds)
    table = markdown(rows)
    print(table)
    print(f"({args.reps} searches per row, {time.monotonic() - t0:.0f} s)", file=sys.stderr)
    if args.markdown:
        text = args.markdown.read_text()
        mark = "<!-- power table -->"
        if text.count(mark) != 2:
            print(f"power: {args.markdown} needs two {mark} lines around the table", file=sys.stderr)
            return 2
        a, _, b = text.split(mark)
        args.markdown.write_text(a + mark + "\n" + table + mark + b)
    return 0


if __name__ == "__main__":
    sys.exit(main())

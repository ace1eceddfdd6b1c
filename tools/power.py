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
* rounds are added as the search adds them (``rounds.joint.depths_to_measure`` with the rule's settle
  function, the same minimum and maximum rounds and CI target as a GPU search's defaults), and the phase is
  judged by ``compose.judge_phase`` with that rule: the very functions the live search calls.

Reported per rule and effect: the share of searches that claim the injected cell faster (power), the
share that claim anything (at effect 0: the false-claim rate of a whole search, both phases), and the
mean rounds per depth. Run from the repository root: ``python tools/power.py`` (``--markdown FILE``
writes the table into that file between its ``<!-- power table -->`` markers).

``--scenario confirm`` replays the confirm of one decode rule instead (:func:`confirm_once`): upstream, its
A/A twin and the final config at :data:`CONFIRM_DEPTHS`, the rule ``decode:<--rule-from>-=MMA`` (the final
config runs upstream's VEC where it does not cover a depth), the effect injected at every covered depth,
the same noise drawn the same way (every decode table with the 3 configurations a confirm has); rounds as
``confirm._confirm_attempt`` adds them for rules alone, the points judged by ``confirm.point_rows`` and the
rule kept or dropped by ``confirm.judge``. Reported per Holm family (the cells that can differ, the
search's; every cell, the family before) and effect: the share of confirms that keep the rule, that claim
its shallowest covered point, that claim any point faster or slower, and the rounds per depth (covered /
other); ``--markdown`` writes between ``<!-- confirm power table -->`` markers.
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

from tuner.plan.fa_rules import FaRule, Phase  # noqa: E402
from tuner.rounds import compose  # noqa: E402
from tuner.rounds.joint import depths_to_measure  # noqa: E402
from tuner.rounds.stats import AA_NAME, UPSTREAM, summarize_phase  # noqa: E402
from tuner.search import confirm  # noqa: E402

DEPTHS = (0, 4096, 16384, 32768)
KERNELS = {"tg": ("VEC", ("TILE", "MMA")), "pp": ("MMA", ("TILE",))}
"""Per phase: upstream's kernel (so the forced twin is the A/A pair) and the other forced kernels."""
TARGET = ("TILE", 16384)
"""The cell the effect is injected into."""
CONFIRM_DEPTHS = (0, 4096, 8192, 12288, 16384, 32768, 49152, 65536)
"""The confirm scenario's depths: the screen's ladder plus the depths a confirm adds between them."""
CONFIRM_KERNELS = ("VEC", "MMA")
"""The confirm scenario's decode kernels: upstream's (outside the rule) and the rule's (inside it)."""


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
    kernels: Mapping[str, Mapping[int, str]],
) -> dict[str, Any]:
    """One round's record as the search stores it; ``kernels[name][depth]``: the kernel the hook reported."""
    rec: dict[str, Any] = {
        "phase": phase,
        "depths": list(depths),
        "round": rnd,
        "order": list(names),
        "limits": list(limits),
    }
    rec["values"] = {n: {str(d): float(100.0 * math.exp(draws[d][j])) for d in depths} for j, n in enumerate(names)}
    rec["kernels"] = {n: {str(d): kernels[n][d] for d in depths} for n in names}
    rec["why"] = {n: {str(d): ("default" if n == UPSTREAM else "rule") for d in depths} for n in names}
    rec["errors"] = {}
    return rec


def _noise(
    pool: Sequence[Table], k: int, depths: Sequence[int], rng: np.random.Generator
) -> tuple[np.ndarray, dict[int, float]]:
    """Every recorded round's residuals over ``k`` configurations (tables with at least ``k``), each
    standardized by its table's noise, and per depth the noise of one recorded table drawn at random."""
    pool = [t for t in pool if t.resid.shape[1] >= k]
    rows = np.concatenate([t.resid[:, :k] / _sd(t) for t in pool])
    return rows, {d: _sd(pool[int(rng.integers(len(pool)))]) for d in depths}


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
    kernels = {n: dict.fromkeys(DEPTHS, up_k if n == UPSTREAM else n) for n in names}
    rows, scale = _noise(pool, len(names), DEPTHS, rng)
    shift = np.zeros(len(names))
    shift[names.index(TARGET[0])] = math.log1p(effect_pct / 100.0)
    settle = partial(compose.open_depths, rule=rule)
    mine: list[dict[str, Any]] = []
    while True:
        todo = depths_to_measure(phase, mine, DEPTHS, min_rounds, max_rounds, target_ci, settle=settle)
        if not todo:
            break
        draws = {}
        for d in todo:
            row = rows[int(rng.integers(rows.shape[0]))][rng.permutation(len(names))] * scale[d]
            draws[d] = row + (shift if d == TARGET[1] else 0.0)
        mine.append(_record(phase, len(mine), todo, draws, names, (min_rounds, max_rounds), kernels))
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


def confirm_once(
    pool: Sequence[Table],
    effect_pct: float,
    family: compose.Family,
    rng: np.random.Generator,
    *,
    rule_from: int = 32768,
    min_rounds: int = 3,
    max_rounds: int = 6,
    target_ci: float = 1.0,
) -> dict[str, float]:
    """One simulated confirm of the decode rule ``decode:<rule_from>-=MMA`` (rules alone, as
    ``confirm._confirm_attempt`` runs it): upstream, its A/A twin and the final config at
    :data:`CONFIRM_DEPTHS`; the final config runs the rule's kernel where the rule covers a depth (the
    effect is injected there) and upstream's elsewhere. Judged by ``confirm.point_rows`` and ``confirm.judge``."""
    names = [UPSTREAM, AA_NAME, confirm.FINAL]
    up_k, rule_k = CONFIRM_KERNELS
    rule = FaRule(phase=Phase.DECODE, lo=rule_from, hi=None, kernel=rule_k)
    kernels = {n: dict.fromkeys(CONFIRM_DEPTHS, up_k) for n in names}
    kernels[confirm.FINAL] = {d: (rule_k if rule.covers(d) else up_k) for d in CONFIRM_DEPTHS}
    rows, scale = _noise(pool, len(names), CONFIRM_DEPTHS, rng)
    shift = np.zeros(len(names))
    shift[names.index(confirm.FINAL)] = math.log1p(effect_pct / 100.0)
    # Every depth's rounds are drawn up front, the same number whatever the rule does: the k-th round of
    # a depth gets the same noise under either family (common draws), and the stream stays aligned.
    noise = {
        d: [rows[int(rng.integers(rows.shape[0]))][rng.permutation(len(names))] * scale[d] for _ in range(max_rounds)]
        for d in CONFIRM_DEPTHS
    }
    settle = partial(compose.open_depths, family=family)
    mine: list[dict[str, Any]] = []
    while True:
        todo = depths_to_measure("tg", mine, CONFIRM_DEPTHS, min_rounds, max_rounds, target_ci, settle=settle)
        if not todo:
            break
        k = {d: sum(str(d) in r["values"][UPSTREAM] for r in mine) for d in todo}
        draws = {d: noise[d][k[d]] + (shift if rule.covers(d) else 0.0) for d in todo}
        mine.append(_record("tg", len(mine), todo, draws, names, (min_rounds, max_rounds), kernels))
    points = confirm.point_rows("tg", summarize_phase("tg", mine, CONFIRM_DEPTHS), mine, family=family)
    kept = confirm.judge([rule], points, process_changed=False)["kept"]
    v = {int(x["depth"]): x["verdict"] for x in points}
    n = {int(x["depth"]): x["rounds"] for x in points}
    inside = [d for d in CONFIRM_DEPTHS if rule.covers(d)]
    outside = [d for d in CONFIRM_DEPTHS if not rule.covers(d)]
    return {
        "kept": float(bool(kept)),
        "shallowest": float(v[inside[0]] == "faster"),
        "any_faster": float("faster" in v.values()),
        "any_slower": float("slower" in v.values()),
        "rounds_in": float(np.mean([n[d] for d in inside])),
        "rounds_out": float(np.mean([n[d] for d in outside])) if outside else math.nan,
    }


def run_confirm(
    effects: Sequence[float],
    reps: int,
    seed: int,
    families: Sequence[compose.Family] = ("changed", "all"),
    *,
    rule_from: int = 32768,
    min_rounds: int = 3,
    max_rounds: int = 6,
) -> list[dict[str, Any]]:
    """One row per Holm family and effect: the shares of :func:`confirm_once`'s outcomes and its rounds."""
    if not any(d >= rule_from for d in CONFIRM_DEPTHS):
        raise ValueError(f"a rule from {rule_from} covers none of the depths {CONFIRM_DEPTHS}")
    pool = tables(
        sorted(ROOT.glob("docs/data/noise-floors/*.db.xz")) + sorted(ROOT.glob("results/*/*/evidence/study.db.xz"))
    )["tg"]
    out = []
    for family in families:
        for eff in effects:
            rng = np.random.default_rng([seed, round(eff * 100)])  # same draws for both families
            runs = [
                confirm_once(pool, eff, family, rng, rule_from=rule_from, min_rounds=min_rounds, max_rounds=max_rounds)
                for _ in range(reps)
            ]
            cells = sum(d >= rule_from for d in CONFIRM_DEPTHS) if family == "changed" else len(CONFIRM_DEPTHS)
            row: dict[str, Any] = {"family": family, "cells": cells, "effect_pct": eff}
            row |= {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
            out.append(row)
    return out


def pct(x: float) -> str:
    """A share as a percentage with one decimal."""
    return f"{100 * x:.1f}%"


def confirm_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    head = (
        "| Holm family | true effect inside the rule | rule kept | shallowest covered point faster | "
        "any point faster | any point slower | mean rounds per depth: covered / other |\n"
        "|---|---|---|---|---|---|---|\n"
    )

    what = {"changed": "cells that can differ", "all": "every cell (before)"}
    return head + "".join(
        f"| {what[r['family']]} ({r['cells']}) | {r['effect_pct']:+g}% | {pct(r['kept'])} | {pct(r['shallowest'])} | "
        f"{pct(r['any_faster'])} | {pct(r['any_slower'])} | {r['rounds_in']:.2f} / {r['rounds_out']:.2f} |\n"
        for r in rows
    )


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    head = (
        "| rule | injected effect | claims it: decode | claims it: prefill | claims anything: decode | "
        "claims anything: prefill | claims anything: search | mean rounds per depth: decode / prefill |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )

    return head + "".join(
        f"| {r['rule']} | {r['effect_pct']:+g}% | {pct(r['power_tg'])} | {pct(r['power_pp'])} | "
        f"{pct(r['any_claim_tg'])} | {pct(r['any_claim_pp'])} | {pct(r['any_claim_search'])} | "
        f"{r['rounds_tg']:.2f} / {r['rounds_pp']:.2f} |\n"
        for r in rows
    )


def _write_between(path: Path, mark: str, table: str) -> bool:
    """Replace what lies between the two ``mark`` lines of ``path`` with ``table``; False without them."""
    text = path.read_text()
    if text.count(mark) != 2:
        print(f"power: {path} needs two {mark} lines around the table", file=sys.stderr)
        return False
    a, _, b = text.split(mark)
    path.write_text(a + mark + "\n" + table + mark + b)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--scenario",
        choices=("screen", "confirm"),
        default="screen",
        help="screen: a kernel screen of both phases; confirm: the confirm of one decode rule",
    )
    ap.add_argument("--effects", default="0,2,3,4,6", help="injected effects, percent, comma separated")
    ap.add_argument("--reps", type=int, default=400, help="simulated searches (confirms) per row")
    ap.add_argument("--seed", type=int, default=20261125)
    ap.add_argument("--min-rounds", type=int, default=3, help="as tuner search --min-rounds")
    ap.add_argument("--max-rounds", type=int, default=6, help="as tuner search --max-rounds")
    ap.add_argument("--rule-from", type=int, default=32768, help="confirm: the decode rule's first depth")
    ap.add_argument(
        "--markdown",
        type=Path,
        help="write the table between <!-- power table --> (confirm: <!-- confirm power table -->) markers",
    )
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
    if args.scenario == "confirm" and not 0 <= args.rule_from <= max(CONFIRM_DEPTHS):
        print(f"power: --rule-from must lie in 0..{max(CONFIRM_DEPTHS)} (got {args.rule_from})", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    lims = {"min_rounds": args.min_rounds, "max_rounds": args.max_rounds}
    if args.scenario == "confirm":
        table = confirm_markdown(run_confirm(effects, args.reps, args.seed, rule_from=args.rule_from, **lims))
        mark = "<!-- confirm power table -->"
    else:
        table = markdown(run(effects, args.reps, args.seed, **lims))
        mark = "<!-- power table -->"
    print(table)
    print(f"({args.reps} {args.scenario}s per row, {time.monotonic() - t0:.0f} s)", file=sys.stderr)
    if args.markdown and not _write_between(args.markdown, mark, table):
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

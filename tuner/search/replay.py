"""``tuner search --replay FILE...``: the search logic on recorded llama-bench results.

Nothing is measured, and every line printed says REPLAY. Uses: CI of the search logic, results shared by
users.

Recording convention (``tests/data/replay/``, recorded on the H100): one llama-bench JSONL per (phase, forced
FlashAttention kernel), named ``<pp|tg>-<default|VEC|TILE|MMA>.jsonl``, each covering the same depths, e.g.::

    GGML_TUNER_FA_RULES=decode:0-=VEC llama-bench -m M -fa 1 -p 0 -n 128 -d 0,4096,16384,32768 -r 6 -o jsonl > tg-VEC.jsonl

"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from tuner import log
from tuner.errors import UsageError
from tuner.measure.bench import parse_bench_jsonl
from tuner.measure.stats import median
from tuner.plan.fa_rules import rules_texts
from tuner.rounds import compose as comp
from tuner.rounds.joint import Candidate, Point, candidates_for, run_phase_rounds
from tuner.rounds.stats import AA_NAME, UPSTREAM, summarize_phase

_NAME = re.compile(r"^(pp|tg)-(default|VEC|TILE|MMA)\.jsonl$")
TAG = "REPLAY"
_SCREEN_COLUMNS = (
    "mode",
    "point",
    "grid winner (median of all samples)",
    "screen pick",
    "Δ",
    "A/A noise",
    "reproduced",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplayGrid:
    """Recorded samples: (phase, kernel) -> depth -> tokens/s samples."""

    samples: Mapping[tuple[str, str], Mapping[int, tuple[float, ...]]]
    files: tuple[str, ...]

    def kernels(self, phase: str) -> list[str]:
        return sorted({k for (ph, k) in self.samples if ph == phase}, key=lambda k: (k != "default", k))

    def depths(self, phase: str) -> list[int]:
        return sorted(self.samples[(phase, "default")])


def load_grid(files: Sequence[Path]) -> ReplayGrid:
    """Read recorded llama-bench JSONL files named ``<pp|tg>-<KERNEL>.jsonl``; UsageError for a name outside the
    convention, or no ``default`` recording for a phase."""
    out: dict[tuple[str, str], dict[int, tuple[float, ...]]] = {}
    for f in files:
        m = _NAME.match(Path(f).name)
        if not m:
            raise UsageError(
                f"replay file {f} is not named <pp|tg>-<default|VEC|TILE|MMA>.jsonl; record one llama-bench "
                "JSONL per phase and forced kernel and name it that way (see `tuner search --help`)."
            )
        phase, kernel = m.groups()
        recs = parse_bench_jsonl(Path(f).read_text())
        # Drop the first repetition like the live benchmark does (warm-up).
        out[(phase, kernel)] = {int(r["n_depth"]): tuple(float(x) for x in r["samples_ts"][1:]) for r in recs}
    for phase in {p for p, _ in out}:
        if (phase, "default") not in out:
            raise UsageError(f"replay needs {phase}-default.jsonl (the upstream selection) as the baseline.")
    return ReplayGrid(samples=out, files=tuple(str(f) for f in files))


class GridMeasure:
    """A measure that serves round ``i`` from the i-th recorded sample; ``calls["n"]`` counts the measurements
    served. The A/A twin reads the default recording one sample later (upstream's pick is unknown)."""

    def __init__(self, grid: ReplayGrid) -> None:
        self.grid, self.aa_name, self.upstream = grid, AA_NAME, UPSTREAM
        self.calls = {"n": 0}

    def __call__(self, cand: Candidate, phase: str, depths: Sequence[int], label: str) -> dict[int, Point]:
        rnd = re.search(r"-r(\d+)-", label)
        i = int(rnd.group(1)) if rnd else 0
        kernel = "default" if cand.name in (self.upstream, self.aa_name) else cand.name
        shift = 1 if cand.name == self.aa_name else 0
        out: dict[int, Point] = {}
        for d in depths:
            s = self.grid.samples.get((phase, kernel), {}).get(d)
            if not s:
                out[d] = {
                    "ts": None,
                    "kernel": None,
                    "why": None,
                    "error": f"no recording of {phase}-{kernel} at depth {d}",
                }
                continue
            self.calls["n"] += 1
            out[d] = {
                "ts": s[(i + shift) % len(s)],
                "kernel": None if kernel == "default" else kernel,
                "why": "default" if kernel == "default" else "rule",
                "error": "",
            }
        return out


def replay_screen(
    files: Sequence[Path], *, min_rounds: int = 3, max_rounds: int = 5, ci_target: float = 1.0, as_json: bool = False
) -> dict[str, object]:
    """Screen and compose on recorded grids; compare each depth's decision with the grid's own winner (the
    kernel with the highest median over all its samples). Prints the tables (or JSON) on stdout and returns
    per phase the decisions, the grid's winners and the measurements used against the exhaustive grid."""
    grid = load_grid(files)
    log.info(f"{TAG}: screen -> compose on {len(files)} recorded llama-bench files; nothing is measured now.")
    measure = GridMeasure(grid)
    out: dict[str, object] = {}
    for phase in ("tg", "pp"):
        if (phase, "default") not in grid.samples:
            continue
        kernels = [k for k in grid.kernels(phase) if k != "default"]
        depths = grid.depths(phase)
        n_rec = min(len(s) for (ph, _), per in grid.samples.items() if ph == phase for s in per.values())
        recs: list[dict[str, Any]] = []
        cands = candidates_for(phase, kernels) + ([] if not kernels else candidates_for(phase, [])[1:])
        before = measure.calls["n"]
        run_phase_rounds(
            measure,
            phase,
            cands,
            depths,
            recs,
            min_rounds=min_rounds,
            max_rounds=min(max_rounds, n_rec - 1),
            target_ci=ci_target,
            tag=TAG,
        )
        cells = summarize_phase(phase, recs, depths)
        decisions = comp.compose_phase(phase, cells)
        exhaustive = sum(len(grid.samples[(phase, k)][d]) for k in grid.kernels(phase) for d in depths)
        rows, agree, winners = [], 0, {}
        for dec in decisions:
            meds = {k: median(grid.samples[(phase, k)][dec.depth]) for k in grid.kernels(phase)}
            best = max(meds, key=lambda k: meds[k])
            gain = 100 * (meds[best] / meds["default"] - 1)
            # reproduced: the screen picked it, or kept upstream where the best gains less than the noise
            ok = (dec.winner == best) or (dec.winner is None and (best == "default" or gain <= dec.noise_pct))
            agree += ok
            winners[dec.depth] = best
            rows.append(
                [
                    TAG,
                    f"{phase}@d{dec.depth}",
                    f"{best} ({gain:+.1f}% vs default)",
                    dec.winner or "upstream",
                    f"{dec.effect_pct:+.1f}%",
                    f"±{dec.noise_pct:.1f}%",
                    "yes" if ok else "NO",
                ]
            )
        used = measure.calls["n"] - before
        if not as_json:
            click.echo(log.table(_SCREEN_COLUMNS, rows))
            click.echo(
                f"{TAG}: {phase}: {agree}/{len(decisions)} depth winners reproduced; the screen used {used} measurements "
                f"({len(recs)} rounds x {len(cands)} candidates x {len(depths)} depths) against {exhaustive} in the exhaustive grid."
            )
        out[phase] = {
            "decisions": [d.as_dict() for d in decisions],
            "agree": agree,
            "n": len(decisions),
            "used": used,
            "exhaustive": exhaustive,
            "grid_winners": winners,
            "rules": rules_texts(comp.rules_from(decisions, comp.Shape(D=None, gqa=None, kv=None))),
        }
    if as_json:
        click.echo(json.dumps(out, indent=2, default=str))
    return out

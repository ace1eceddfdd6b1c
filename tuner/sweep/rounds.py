"""Paired rounds per cell, the verdicts, and the composition of the sweep's FlashAttention table.

Each cell runs ``rounds`` rounds; a round times every config of the cell once, back to back, in the
order :func:`tuner.measure.paired.rotated` gives it: upstream's own choice (``default``, the
reference), the same choice again (``A/A``, the noise of the whole procedure) and each legal kernel
other than upstream's, forced. A config's value in a round is its throughput, the inverse of the
median of the timer's samples; :func:`tuner.measure.paired.block_effects` turns the rounds into
effects and the A/A effect into the cell's noise.

The verdicts and the rules are the search's (:mod:`tuner.search.compose`), applied to each shape over
its n_kv points as the search applies them to one model over its depths: the A/A bar, the phase's
noise floor, intervals of consecutive winning points. :func:`decide` is the one call of the verdict
rule; a sharper rule there changes every decision of the sweep.
"""

from __future__ import annotations

__all__ = [
    "KernelTimer",
    "SweepResult",
    "cell_stats",
    "compose_fa",
    "decide",
    "measure_cell",
    "midpoints",
    "pack_groups",
    "paired_rounds",
    "run_fa_sweep",
    "run_processes",
]

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Protocol, TypeVar

from tuner import log
from tuner.errors import TunerError
from tuner.measure.paired import block_effects, noise_pct, rotated
from tuner.progress import format_seconds
from tuner.search.compose import Decision, Shape, bisect_depths, compose_phase, rules_from
from tuner.search.screen import UPSTREAM, CellStats
from tuner.sweep.grid import AA, DEFAULT, Cell, FaShape
from tuner.sweep.table import TableRule

T = TypeVar("T")


class KernelTimer(Protocol):
    """Times ``FLASH_ATTN_EXT`` at one exact shape with one kernel (the GPU side plugs in here).

    ``kernel`` is ``VEC``, ``TILE`` or ``MMA`` to force that kernel, or None for upstream's own choice.
    Returns seconds per launch, one sample per timed launch (at least one).
    """

    def __call__(self, shape: FaShape, n_kv: int, kernel: str | None) -> Sequence[float]: ...


def paired_rounds(
    call: Callable[[str], Sequence[float]], configs: Sequence[str], rounds: int
) -> dict[str, list[float]]:
    """Throughput per config and round: ``rounds`` rounds of every config, order rotated each round.

    Raises:
        TunerError: The timer returned no positive finite sample for a config.
    """
    if rounds < 2:
        raise TunerError(f"A paired verdict needs at least 2 rounds per cell; {rounds} were asked for.")
    out: dict[str, list[float]] = {c: [] for c in configs}
    for r in range(rounds):
        for name in rotated(list(configs), r):
            samples = [float(s) for s in call(name) if math.isfinite(s) and s > 0]
            if not samples:
                raise TunerError(f"The timer returned no positive sample for {name!r}; a kernel time must be > 0 s.")
            out[name].append(1.0 / statistics.median(samples))
    return out


def cell_stats(n_kv: int, upstream: str, values: Mapping[str, Sequence[float]]) -> CellStats:
    """The screen's per-depth summary of one cell's rounds (``values``: throughput per config and round)."""
    effects = block_effects(values, DEFAULT)
    kernels: dict[str, str | None] = {DEFAULT: upstream, AA: upstream}
    kernels.update({n: n for n in values if n not in (DEFAULT, AA)})
    return CellStats(
        depth=n_kv,
        upstream_kernel=upstream,
        aa=AA,
        noise_pct=noise_pct(effects[AA]) if AA in effects else math.inf,
        upstream_ts=statistics.median(values[DEFAULT]),
        effects=effects,
        verdicts={},
        fallback=(),
        kernels=kernels,
        # a fixed number of rounds, decided once: one look, so the decision rule spends all its alpha on it
        limits=(len(values[DEFAULT]), len(values[DEFAULT])),
        # the per-round throughputs the decision rule pairs (it names upstream as the screen does)
        series={(UPSTREAM if n == DEFAULT else n): tuple(v) for n, v in values.items()},
    )


def measure_cell(timer: KernelTimer, cell: Cell, rounds: int) -> CellStats:
    """One cell's paired rounds through ``timer``."""

    def call(name: str) -> Sequence[float]:
        return timer(cell.shape, cell.n_kv, None if name in (DEFAULT, AA) else name)

    return cell_stats(cell.n_kv, cell.upstream, paired_rounds(call, cell.configs, rounds))


def decide(phase: str, cells: Mapping[int, CellStats]) -> list[Decision]:
    """The verdict per point of one shape (``phase`` ``tg`` or ``pp``; ``cells`` by n_kv or batch size).

    The sweep's only call of the verdict rule (module doc)."""
    return compose_phase(phase, cells)


def compose_fa(
    stats: Mapping[FaShape, Mapping[int, CellStats]],
) -> tuple[tuple[TableRule, ...], dict[FaShape, list[Decision]]]:
    """The table's rules (shape by shape, n_kv ascending) and every shape's decisions."""
    rules: list[TableRule] = []
    decisions: dict[FaShape, list[Decision]] = {}
    for shape in sorted(stats):
        ds = decide(shape.phase.bench, stats[shape])
        decisions[shape] = ds
        for r in rules_from(ds, Shape(D=shape.D, gqa=shape.gqa, kv=shape.kv)):
            rules.append(TableRule.of(r, ne1=shape.ne1))
    return tuple(rules), decisions


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepResult:
    """A whole sweep: every cell's statistics, every shape's decisions, the composed rules."""

    stats: Mapping[FaShape, Mapping[int, CellStats]]
    decisions: Mapping[FaShape, Sequence[Decision]]
    rules: tuple[TableRule, ...]


def run_fa_sweep(timer: KernelTimer, cells: Sequence[Cell], *, rounds: int) -> SweepResult:
    """Measure every cell (in the given order) and compose the table."""
    stats: dict[FaShape, dict[int, CellStats]] = {}
    for cell in cells:
        stats.setdefault(cell.shape, {})[cell.n_kv] = measure_cell(timer, cell, rounds)
    rules, decisions = compose_fa(stats)
    return SweepResult(stats=stats, decisions=decisions, rules=rules)


def midpoints(result: SweepResult) -> dict[FaShape, list[int]]:
    """Per shape, the n_kv points a second pass should add: halfway between neighbours whose winners differ
    by more than the noise (:func:`tuner.search.compose.bisect_depths`); shapes without any are left out."""
    out = {}
    for shape, ds in result.decisions.items():
        mids = bisect_depths(ds, sorted(result.stats[shape]))
        if mids:
            out[shape] = mids
    return out


def pack_groups(items: Sequence[T], key: Callable[[T], Hashable], size: int) -> list[list[T]]:
    """``items`` packed into chunks of at most ``size``, whole groups (equal ``key``, in first-seen order)
    at a time; a group larger than ``size`` is a chunk of its own, and everything fits one chunk when it can."""
    groups: dict[Hashable, list[T]] = {}
    for x in items:
        groups.setdefault(key(x), []).append(x)
    out: list[list[T]] = []
    cur: list[T] = []
    for group in groups.values():
        if cur and len(cur) + len(group) > size:
            out.append(cur)
            cur = []
        cur = cur + group
    if cur:
        out.append(cur)
    return out


def run_processes(
    todo: Sequence[tuple[int, int, str, T]],
    *,
    chunks: int,
    rounds: int,
    cases: Callable[[T], int],
    measure: Callable[[int, int, str, T], int],
) -> None:
    """Run a sweep's processes in order: ``todo`` is (chunk, round, config, its items) with a chunk's
    round consecutive; ``measure(chunk, round, config, items)`` runs and stores one process and returns
    its failed samples. After each chunk's round, a progress line: its cases, time and failures, the
    cases done and the ETA at the rate so far."""
    total = sum(cases(items) for *_, items in todo)
    start, done, i = time.monotonic(), 0, 0
    while i < len(todo):
        ci, r = todo[i][0], todo[i][1]
        t0 = time.monotonic()
        failed = n_round = 0
        while i < len(todo) and todo[i][:2] == (ci, r):
            _, _, cfg, items = todo[i]
            failed += measure(ci, r, cfg, items)
            n_round += cases(items)
            i += 1
        done += n_round
        eta = (time.monotonic() - start) / done * (total - done) if done else 0.0
        log.info(
            f"chunk {ci + 1}/{chunks} round {r + 1}/{rounds}: {n_round} cases in {time.monotonic() - t0:.1f} s"
            + (f", {failed} failed" if failed else "")
            + f"; {done}/{total} cases done, ETA {format_seconds(eta)}"
        )

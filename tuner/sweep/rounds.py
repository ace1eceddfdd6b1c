"""Paired rounds per cell, the verdicts, and the composition of the sweep's FlashAttention table.

Each cell runs between ``min_rounds`` and ``max_rounds`` rounds (``limits``; the search's defaults, 3 and 6);
a round times every config of the cell once, back to back, in the
order :func:`tuner.measure.paired.rotated` gives it: upstream's own choice (``default``, the
reference), the same choice again (``A/A``, the noise of the whole procedure) and each legal kernel
other than upstream's, forced. A config's value in a round is its throughput, the inverse of the
median of the timer's samples; :func:`tuner.measure.paired.block_effects` turns the rounds into
effects and the A/A effect into the cell's noise.

The verdicts and the rules are the search's (:mod:`tuner.search.compose`), applied to each shape over
its n_kv points as the search applies them to one model over its depths: the A/A bar, the phase's
noise floor, intervals of consecutive winning points. :func:`decide` is the one call of the verdict
rule; a sharper rule there changes every decision of the sweep.

**Sequential rounds, as the search's screen adds them** (:mod:`tuner.search.screen`,
:func:`tuner.search.compose.open_depths`). Every cell gets ``min_rounds`` rounds; after that a round goes
only to the cells whose decision is still *open* (:func:`open_points`): a forced kernel that is neither
claimed (faster or slower) nor settled by futility (its one-sided 95% upper bound below the practical
minimum effect). A settled cell gets no further round, and a cell that has stopped does not come back. The
decision rule is the search's sequential one (:mod:`tuner.measure.decide`): a cell's p-value is divided by
the share of alpha of the round count it stopped at (:func:`tuner.measure.decide.look_weight` over
``limits``: 0.8 at ``max_rounds``, the rest split over the earlier counts), then Holm over the shape's
points; that p-value is valid whatever the data-dependent stopping, so stopping settled cells early keeps
the family-wise error of a fixed number of rounds. With ``min_rounds == max_rounds`` it is the fixed-round
sweep (one look, all the alpha on it).
"""

from __future__ import annotations

__all__ = [
    "KernelTimer",
    "SweepResult",
    "add_round",
    "cell_stats",
    "check_limits",
    "compose_fa",
    "decide",
    "measure_cell",
    "midpoints",
    "open_for_round",
    "open_in_round",
    "open_points",
    "pack_groups",
    "paired_rounds",
    "run_fa_sweep",
]

import dataclasses
import math
import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Protocol, TypeVar

from tuner.errors import TunerError
from tuner.measure.decide import DEFAULT_LIMITS
from tuner.measure.paired import block_effects, noise_pct, rotated
from tuner.rounds.compose import Decision, Shape, bisect_depths, compose_phase, open_depths, rules_from
from tuner.rounds.stats import UPSTREAM, CellStats
from tuner.sweep.grid import AA, DEFAULT, Cell, FaShape
from tuner.sweep.table import TableRule

T = TypeVar("T")
H = TypeVar("H", bound=Hashable)


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
        add_round(call, configs, r, out)
    return out


def add_round(
    call: Callable[[str], Sequence[float]], configs: Sequence[str], r: int, out: dict[str, list[float]]
) -> None:
    """Round ``r`` of every config (order rotated by ``r``), its throughput appended to ``out[config]``.

    Raises:
        TunerError: The timer returned no positive finite sample for a config.
    """
    for name in rotated(list(configs), r):
        samples = [float(s) for s in call(name) if math.isfinite(s) and s > 0]
        if not samples:
            raise TunerError(f"The timer returned no positive sample for {name!r}; a kernel time must be > 0 s.")
        out.setdefault(name, []).append(1.0 / statistics.median(samples))


def check_limits(limits: tuple[int, int]) -> tuple[int, int]:
    """``limits`` (min_rounds, max_rounds) as given, or a TunerError where no paired verdict can come of them."""
    lo, hi = limits
    if lo < 2 or hi < lo:
        raise TunerError(f"Round limits {lo}..{hi}: a paired verdict needs at least 2 rounds, and max >= min.")
    return lo, hi


def cell_stats(
    n_kv: int, upstream: str, values: Mapping[str, Sequence[float]], limits: tuple[int, int] | None = None
) -> CellStats:
    """The screen's per-depth summary of one cell's rounds (``values``: throughput per config and round).

    ``limits``: the (min, max) round counts the cell could stop at, the looks the decision rule spends its
    alpha over; None: a fixed number of rounds, the ones in ``values`` (one look)."""
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
        # the looks: a fixed number of rounds is one look, so the decision rule spends all its alpha on it
        limits=limits or (len(values[DEFAULT]), len(values[DEFAULT])),
        # the per-round throughputs the decision rule pairs (it names upstream as the screen does)
        series={(UPSTREAM if n == DEFAULT else n): tuple(v) for n, v in values.items()},
    )


def measure_cell(timer: KernelTimer, cell: Cell, rounds: int) -> CellStats:
    """One cell's paired rounds through ``timer`` (a fixed number: one look)."""
    return cell_stats(cell.n_kv, cell.upstream, paired_rounds(_cell_call(timer, cell), cell.configs, rounds))


def open_points(phase: str, cells: Mapping[int, CellStats]) -> set[int]:
    """The points (n_kv) of one shape whose decision more rounds could still change: the search's settle
    rule, :func:`tuner.search.compose.open_depths` with the sequential rule (module doc). ``cells``: every
    point of the shape with a verdict so far (the whole Holm family, stopped points included)."""
    return open_depths(phase, cells)


def open_in_round(
    stats: Mapping[H, Mapping[int, CellStats]], phase_of: Callable[[H], str], r: int
) -> set[tuple[H, int]]:
    """(family, point) of every point that gets round ``r`` (0-based) past ``min_rounds``: open by
    :func:`open_points` over its family (a shape's n_kv points, a quant type and size's batch sizes) and
    with all ``r`` rounds so far (a point that stopped, or failed a round, gets no more). ``stats``: the
    families' verdicts from the rounds before ``r``; ``phase_of``: a family's phase (``tg`` or ``pp``)."""
    return {(f, x) for f, st in stats.items() for x in open_points(phase_of(f), st) if len(st[x].series[UPSTREAM]) == r}


def open_for_round(
    chunk: Sequence[T],
    r: int,
    limits: tuple[int, int],
    stats_before: Callable[[int], Mapping[H, Mapping[int, CellStats]]],
    phase_of: Callable[[H], str],
    key: Callable[[T], tuple[H, int]],
) -> list[T]:
    """The items of ``chunk`` (cells, MMQ points) that get round ``r`` (0-based), in the chunk's order: every
    item below ``min_rounds``, none from ``max_rounds``; in between those :func:`open_in_round` names from
    ``stats_before(r)``, the families' verdicts from the samples of rounds ``< r`` only, so that a resumed
    run takes the same decisions. ``key``: an item's (family, point)."""
    lo, hi = limits
    if r >= hi:
        return []
    if r < lo:
        return list(chunk)
    want = open_in_round(stats_before(r), phase_of, r)
    return [x for x in chunk if key(x) in want]


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


def run_fa_sweep(timer: KernelTimer, cells: Sequence[Cell], *, limits: tuple[int, int] = DEFAULT_LIMITS) -> SweepResult:
    """Measure every cell with sequential rounds (module doc) and compose the table.

    Round ``r`` (in the given order of cells) goes to every cell while ``r < min_rounds``, then only to the
    cells that have all ``r`` rounds and whose point :func:`open_points` calls open; at ``max_rounds`` or
    when no cell is open, the sweep stops."""
    lo, hi = check_limits(limits)
    values: dict[Cell, dict[str, list[float]]] = {c: {} for c in cells}
    by_shape: dict[FaShape, list[Cell]] = {}
    for c in cells:
        by_shape.setdefault(c.shape, []).append(c)

    def stats_of(cs: Sequence[Cell]) -> dict[int, CellStats]:
        return {c.n_kv: cell_stats(c.n_kv, c.upstream, values[c], (lo, hi)) for c in cs}

    for r in range(hi):
        todo: list[Cell] = []
        for shape, cs in by_shape.items():
            want = {c.n_kv for c in cs} if r < lo else open_points(shape.phase.bench, stats_of(cs))
            todo += [c for c in cs if c.n_kv in want and len(values[c].get(DEFAULT, ())) == r]
        if not todo:
            break
        for cell in todo:
            add_round(_cell_call(timer, cell), cell.configs, r, values[cell])
    stats = {shape: stats_of(cs) for shape, cs in by_shape.items()}
    rules, decisions = compose_fa(stats)
    return SweepResult(stats=stats, decisions=decisions, rules=rules)


def _cell_call(timer: KernelTimer, cell: Cell) -> Callable[[str], Sequence[float]]:
    def call(name: str) -> Sequence[float]:
        return timer(cell.shape, cell.n_kv, None if name in (DEFAULT, AA) else name)

    return call


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

"""Paired rounds over many points, batched into timer processes: the engine both kernel sweeps are specs of.

A *point* is one exact shape the timer runs (a FlashAttention cell, :mod:`tuner.sweep.live`; an MMQ
point, :mod:`tuner.sweep.mmq`); a :class:`Spec` says how to key it, which *family* it belongs to (the
points one Holm correction runs over: a shape's n_kv points, a quant type and size's batch sizes) and
which configs its rounds time: upstream's own choice (:data:`DEFAULT`, the reference of every effect), the
same again (:data:`AA`, the noise of the whole procedure) and each forced alternative.

**Rounds** (:func:`run_rounds`). The points are packed, whole groups at a time, into chunks; per chunk and round
one timer process runs per config, configs in an order rotated from round to round. Samples go into a
:class:`tuner.rounds.store.SampleStore` as each process ends; a rerun skips recorded rounds and measures a
partly recorded one again whole. With a budget, no round starts that would end past its deadline, each priced
at its estimate times the most any finished round of the call overran its own.

**Sequential rounds** (:func:`open_points`). Every point gets ``min_rounds`` rounds; after that a round goes only
to the points whose decision is still open (:func:`tuner.rounds.compose.open_depths` over the family), decided
from the stored rounds before it only, so a resumed run takes the same decisions. A point's p-value is divided by
the share of alpha of the round count it stopped at, then Holm over its family, which keeps the family-wise error
of fixed rounds.

**Verdicts** (:func:`judge`). A point's value per config and round is its throughput, ``1 / us``; a point has a
verdict when every config has a good sample in each of its leading complete rounds and it has at least
``min_rounds`` of them; the others stand in their family's decisions as points without a winner, so no interval
composed from them spans a point that was not measured.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from tuner import log
from tuner.errors import TunerError
from tuner.measure.paired import block_effects, noise_pct, rotated
from tuner.progress import format_seconds
from tuner.rounds.budget import Budget
from tuner.rounds.compose import Decision, compose_phase, open_depths
from tuner.rounds.stats import UPSTREAM, CellStats
from tuner.rounds.store import Sample, SampleStore

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison

DEFAULT = "default"
"""The config that runs upstream's own choice (the reference of every paired effect); the stores' name."""
AA = "A/A"
"""Upstream's choice once more: the A/A pair that measures the noise of the procedure."""


T = TypeVar("T")
P = TypeVar("P")
K = TypeVar("K", bound=Hashable)
F = TypeVar("F", bound="SupportsRichComparison")

Measure = Callable[[Sequence[P], str, int, Path], list[Sample[K]]]
"""One timer process: (its points, config, round, its log folder) -> a sample per point."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Spec(Generic[P, K, F]):
    """What the engine needs of one kind of point (module doc). ``configs``: every config in its base order;
    ``configs_of``: the ones a point's round times; ``labels``: a config's process and log folder name;
    ``open_share``: the share of points assumed open after ``min_rounds`` (the log's estimate)."""

    name: str
    noun: str
    configs: tuple[str, ...]
    labels: Mapping[str, str]
    key: Callable[[P], K]
    family: Callable[[P], F]
    x: Callable[[P], int]
    group: Callable[[P], Hashable]
    phase: Callable[[F], str]
    upstream: Callable[[P], str]
    configs_of: Callable[[P], Sequence[str]]
    open_share: float
    reason_names: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def reason_name(self, config: str) -> str:
        return self.reason_names.get(config, config)


def rounds_text(limits: tuple[int, int], noun: str = "cell") -> str:
    lo, hi = limits
    if lo == hi:
        return f"{lo} rounds"
    return f"{lo} rounds for every {noun}, up to {hi} for the {noun}s whose verdict is still open"


def pack_groups(items: Sequence[T], key: Callable[[T], Hashable], size: int) -> list[list[T]]:
    """``items`` packed into chunks of at most ``size``, whole groups (equal ``key``) at a time; a group larger
    than ``size`` is a chunk of its own."""
    groups: dict[Hashable, list[T]] = {}
    for x in items:
        groups.setdefault(key(x), []).append(x)
    out: list[list[T]] = []
    for group in groups.values():
        if out and len(out[-1]) + len(group) <= size:
            out[-1] += group
        else:
            out.append(group)
    return out


def round_processes(spec: Spec[P, K, F], chunk: Sequence[P], round_index: int) -> list[tuple[str, list[P]]]:
    """One round of a chunk: (config, the points it times) per process, configs in the round's rotated order."""
    base = [cfg for cfg in spec.configs if any(cfg in spec.configs_of(p) for p in chunk)]
    return [(cfg, [p for p in chunk if cfg in spec.configs_of(p)]) for cfg in rotated(base, round_index)]


def _values(
    spec: Spec[P, K, F], p: P, got: Mapping[tuple[K, str, int], Sample[K]], max_rounds: int
) -> tuple[dict[str, list[float]], str]:
    """One point's throughput per config over its leading complete rounds, and why it has no verdict ("" if
    none: a failed sample among them is the reason)."""
    key, cfgs = spec.key(p), spec.configs_of(p)
    n = 0
    while n < max_rounds and all((key, cfg, n) in got for cfg in cfgs):
        n += 1
    values: dict[str, list[float]] = {}
    why = ""
    for r in range(n):
        for cfg in cfgs:
            s = got[(key, cfg, r)]
            if not s.ok or s.us is None:
                why = why or f"{spec.reason_name(cfg)} round {r + 1}: {s.error}"
                continue
            values.setdefault(cfg, []).append(1e6 / s.us)
    return values, why


def point_verdicts(
    spec: Spec[P, K, F],
    points: Sequence[P],
    samples: Iterable[Sample[K]],
    *,
    limits: tuple[int, int],
    below: int | None = None,
) -> tuple[dict[F, dict[int, CellStats]], dict[F, dict[int, str]]]:
    """(stats of the points with a verdict, by family and point; the others and why), from the samples of
    rounds ``< below`` (default ``max_rounds``)."""
    lo, hi = limits
    top = hi if below is None else min(below, hi)
    got = {(s.key, s.config, s.round): s for s in samples if s.round < top}
    stats: dict[F, dict[int, CellStats]] = {}
    gaps: dict[F, dict[int, str]] = {}
    for p in points:
        values, why = _values(spec, p, got, top)
        n = len(values.get(DEFAULT, ()))
        if not why and n < lo:
            cfg = next((c for c in spec.configs_of(p) if (spec.key(p), c, n) not in got), DEFAULT)
            why = f"{spec.reason_name(cfg)} round {n + 1}: not measured"
        if why:
            gaps.setdefault(spec.family(p), {})[spec.x(p)] = why
            continue
        # the screen's per-point summary of the point's rounds
        effects, up = block_effects(values, DEFAULT), spec.upstream(p)
        kernels: dict[str, str | None] = {DEFAULT: up, AA: up, **{c: c for c in values if c not in (DEFAULT, AA)}}
        stats.setdefault(spec.family(p), {})[spec.x(p)] = CellStats(
            depth=spec.x(p),
            upstream_kernel=up,
            aa=AA,
            noise_pct=noise_pct(effects[AA]) if AA in effects else math.inf,
            upstream_ts=statistics.median(values[DEFAULT]),
            effects=effects,
            verdicts={},
            fallback=(),
            kernels=kernels,
            limits=limits,
            series={(UPSTREAM if c == DEFAULT else c): tuple(v) for c, v in values.items()},
        )
    return stats, gaps


def open_points(
    spec: Spec[P, K, F], chunk: Sequence[P], samples: Iterable[Sample[K]], r: int, limits: tuple[int, int]
) -> list[P]:
    """The points of ``chunk`` that get round ``r`` (0-based): every point below ``min_rounds``, none from
    ``max_rounds``; in between, those with all ``r`` rounds that are open over their whole family, judged on
    the samples of rounds ``< r`` only."""
    lo, hi = limits
    if r >= hi:
        return []
    if r < lo:
        return list(chunk)
    stats = point_verdicts(spec, chunk, samples, limits=limits, below=r)[0]
    want = {
        (f, x) for f, st in stats.items() for x in open_depths(spec.phase(f), st) if len(st[x].series[UPSTREAM]) == r
    }
    return [p for p in chunk if (spec.family(p), spec.x(p)) in want]


def run_rounds(
    spec: Spec[P, K, F],
    points: Sequence[P],
    *,
    limits: tuple[int, int],
    store: SampleStore[K],
    measure: Measure[P, K],
    log_dir: Path,
    chunk_size: int,
    cost: tuple[float, float],
    forced_reason: str = "",
    budget: Budget | None = None,
) -> tuple[int, int]:
    """Measure what ``store`` does not hold yet, one ``measure`` process per config and round (log folder
    ``log_dir/chunkNNNN/rR/LABEL``). Returns (processes run, processes already recorded).

    ``cost``: (seconds a process, seconds a case), the estimate. ``forced_reason``: why no forced config can
    run (a build without the tuner's hook): its samples are stored failed with it, no process started."""
    lo, hi = limits
    if lo < 2 or hi < lo:
        raise TunerError(f"Round limits {lo}..{hi}: a paired verdict needs at least 2 rounds, and max >= min.")
    store.set_limits(limits)
    chunks = pack_groups(points, spec.group, chunk_size)
    process_s, case_s = cost

    def runs(cfg: str) -> bool:
        return not forced_reason or cfg in (DEFAULT, AA)

    first = []
    for chunk in chunks:
        for r in range(lo):
            for cfg, ps in round_processes(spec, chunk, r):
                have = store.recorded(cfg, r)
                first.append((cfg, [p for p in ps if spec.key(p) not in have]))
    first_cases = sum(len(ps) for cfg, ps in first if runs(cfg))
    first_procs = sum(1 for cfg, ps in first if ps and runs(cfg))
    later = (hi - lo) * spec.open_share * sum(len(spec.configs_of(p)) for p in points)
    noun = spec.noun
    log.info(
        f"{spec.name}: {len(points)} {noun}s in {len(chunks)} chunk(s), {rounds_text(limits, noun)}; first {lo} "
        f"rounds: {first_procs} processes ({first_cases} cases) to run, {sum(1 for _, ps in first if not ps)} already "
        f"recorded; estimated at the H100 sweep's rates {format_seconds(first_procs * process_s + first_cases * case_s)}"
        + (
            f", and about {round(later)} cases more if {spec.open_share:.0%} of the {noun}s stay open"
            if hi > lo
            else ""
        )
    )
    ran = skipped = done = 0
    start, slower = time.monotonic(), 1.0
    for ci, chunk in enumerate(chunks):
        for r in range(hi):
            want = open_points(spec, chunk, store.samples([spec.key(p) for p in chunk]), r, limits)
            if not want:
                break
            t0, n_round, failed, what = time.monotonic(), 0, 0, f"chunk {ci + 1} round {r + 1}"
            procs = round_processes(spec, want, r)
            todo = store.whole_round({cfg: [spec.key(p) for p in ps] for cfg, ps in procs}, r, what)
            started = [ks for cfg, ks in todo if ks and runs(cfg)]
            est = len(started) * process_s + sum(len(ks) for ks in started) * case_s
            if budget and started:  # a round is paired: started whole or not at all
                budget.fits(est * slower, what, worded=True)
            for (cfg, ks), (_, ps) in zip(todo, procs, strict=True):
                missing = [p for p in ps if spec.key(p) in ks]
                if not missing:
                    skipped += 1
                elif not runs(cfg):
                    store.add(
                        Sample(key=spec.key(p), config=cfg, round=r, us=None, error=forced_reason) for p in missing
                    )
                else:
                    got = measure(missing, cfg, r, log_dir / f"chunk{ci:04d}" / f"r{r}" / spec.labels[cfg])
                    store.add(got)
                    failed += sum(1 for s in got if s.error)
                    ran += 1
                    n_round += len(missing)
            if started and est > 0:
                slower = max(slower, (time.monotonic() - t0) / est)
            if n_round:
                done += n_round
                eta = (time.monotonic() - start) / done * max(0.0, first_cases + later - done)
                log.info(
                    f"chunk {ci + 1}/{len(chunks)} round {r + 1}/{hi}: {len(want)} {noun}s, {n_round} cases in "
                    f"{time.monotonic() - t0:.1f} s" + (f", {failed} failed" if failed else "")
                    + f"; {done} cases done, ETA ~{format_seconds(eta)}"
                )  # fmt: skip
    return ran, skipped


def gap_decision(phase: str, x: int, upstream: str, why: str) -> Decision:
    """A point without a verdict in its family's decisions: no winner, ``why`` its reason."""
    nan = math.nan
    return Decision(
        phase=phase, depth=x, upstream_kernel=upstream, winner=None, effect_pct=0.0, ci=(nan, nan), noise_pct=nan,
        reason=f"no verdict: {why}",
    )  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdicts(Generic[F]):
    """Per family: its points' stats, the points without a verdict and why, and every point's decision."""

    stats: Mapping[F, Mapping[int, CellStats]]
    no_verdict: Mapping[F, Mapping[int, str]]
    decisions: Mapping[F, Sequence[Decision]]

    @property
    def n_gaps(self) -> int:
        return sum(len(v) for v in self.no_verdict.values())


def judge(
    spec: Spec[P, K, F], points: Sequence[P], samples: Iterable[Sample[K]], *, limits: tuple[int, int]
) -> Verdicts[F]:
    """Verdicts and decisions from the stored samples of rounds ``0 .. max_rounds-1`` (module doc)."""
    stats, gaps = point_verdicts(spec, points, samples, limits=limits)
    upstream = {(spec.family(p), spec.x(p)): spec.upstream(p) for p in points}
    decisions: dict[F, list[Decision]] = {}
    for f in sorted(set(stats) | set(gaps)):
        ds = compose_phase(spec.phase(f), stats[f]) if f in stats else []
        ds += [gap_decision(spec.phase(f), x, upstream[(f, x)], why) for x, why in gaps.get(f, {}).items()]
        decisions[f] = sorted(ds, key=lambda d: d.depth)
    return Verdicts(stats=stats, no_verdict=gaps, decisions=decisions)

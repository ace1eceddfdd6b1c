"""The FlashAttention sweep measured for real: batched kernel timings through test-backend-ops, kept in SQLite.

The timer of :mod:`tuner.sweep.rounds` is called once per cell, config and round; a
``test-backend-ops`` process costs seconds of CUDA initialisation, so here one process times many
cells. The cells are packed, whole shapes at a time, into *chunks*; per chunk and round, one
:func:`tuner.measure.kernel_bench.run_round` process runs per config: upstream's choice (empty
environment), its A/A twin (upstream again, a second process) and each forced kernel over the cells
where it is a candidate (legal there and not upstream's choice; the other cells are not given to that
process). The configs' order is rotated from round to round (:func:`tuner.measure.paired.rotated`), as
:func:`tuner.sweep.rounds.paired_rounds` rotates it per cell.

Each sample, one (cell, config, round), goes into a SQLite table as soon as its process ends; a rerun with the
same storage skips the rounds whose samples are all recorded, so an interrupted sweep resumes where it
stopped; a round it left partly recorded is measured again whole (:func:`tuner.sweep.store.whole_round`: a
round's configs are paired, so they run back to back). A sample *fails* when its process errored or timed out,
the case printed no time, or the kernel that ran (the build's FA log, :mod:`tuner.measure.falog`) is not the
one asked for: a forced kernel the hook did not run, or upstream's config running another kernel than
:func:`tuner.sweep.grid.upstream_kernel` says. A failed sample is stored with its reason and never as a time;
a cell with any failed or missing sample gets no verdict and breaks the n_kv intervals of its shape's rules
(:func:`compose`), so no rule spans a point that was not measured.

A cell's value per config and round is its throughput, ``1 / us_per_run``; composition goes through
:func:`tuner.sweep.rounds.cell_stats` and :func:`tuner.sweep.rounds.decide`, as a fake timer's rounds do.

**Head counts.** The sweep's shape names a GQA ratio, not head counts; the test file needs both. The
KV head count is fixed at :data:`N_HEAD_KV` (8, as in Llama 3 8B and 70B and Mistral 7B) and the query
heads are ``8 * gqa``. Kernels parallelise over heads, so a model with far fewer KV heads may rank
kernels differently at small n_kv; the sweep measures this one count.
"""

from __future__ import annotations

__all__ = [
    "LABELS",
    "N_HEAD_KV",
    "OPEN_SHARE",
    "Outcome",
    "Sample",
    "SampleStore",
    "bench_shape",
    "cell_values",
    "cell_verdicts",
    "chunk_cells",
    "compose",
    "estimate_seconds",
    "estimate_text",
    "fa_bench_case_s",
    "judge_sample",
    "no_rules_text",
    "open_cells",
    "report_text",
    "round_processes",
    "rounds_text",
    "run_sweep",
]

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner import log
from tuner.measure import kernel_bench as kb
from tuner.measure.fa_bench import TARGET_MS
from tuner.measure.paired import rotated
from tuner.progress import format_seconds
from tuner.rounds.budget import SweepBudget
from tuner.rounds.compose import Decision, Shape, rules_from
from tuner.rounds.stats import CellStats
from tuner.sweep.grid import AA, DEFAULT, Cell, FaShape, duration_text
from tuner.sweep.rounds import cell_stats, check_limits, decide, open_for_round, pack_groups
from tuner.sweep.store import open_store, read_limits, whole_round, write_limits
from tuner.sweep.table import TableRule

N_HEAD_KV = 8
"""KV heads of every timed call (module doc); query heads are ``N_HEAD_KV * gqa``."""

LABELS = {DEFAULT: "upstream", AA: "AA", "VEC": "VEC", "TILE": "TILE", "MMA": "MMA"}
"""Config -> the label of its test-backend-ops process and log (``A/A`` is no file name)."""

PROCESS_S = 2.5
"""Estimate: seconds a test-backend-ops process costs besides its cases on an H100 (CUDA initialisation;
docs/sweep.md says where the figure comes from)."""
CASE_S = 1.0
"""Estimate: seconds per case: perf mode repeats each case's graph for at least one second."""
FA_BENCH_PROCESS_S = 1.0
"""Estimate: seconds an fa-bench process costs besides its cases: one H100 run (docs/data/h100-sweep-first/)
took 1.0-1.2 s a whole process of 18 head-128 decode cases, start included, so its start is at most this."""
FA_BENCH_SETUP_S = 0.06
"""Estimate: seconds per fa-bench case besides its target's runs: that run's 0.06 s a case all told (the
inputs' fill and upload and two graphs of 50 ops, process start included), before fa-bench had a target."""
FA_BENCH_TARGET_RUNS = 4.0
"""Estimate: a case with a target costs about this many runs of ``target_ms``: two warm-ups and the timed
run of a graph of 1-1.5 x the target (the op count is rounded up to 2^k or 3 * 2^k), plus the calibration's
three runs of ``iters`` ops, which are short for short ops and up to about three targets for ops just
under target / iters."""

OPEN_SHARE = 0.5
"""Assumption: the share of cells whose verdict is still open after ``min_rounds`` and that then take every
round up to ``max_rounds``; the plan's estimate of the sequential rounds. Replayed on the only recorded H100
sweep (docs/data/h100-sweep-first/, 18 cells, 50 ops a case, before the target): 14 of 18 cells open after 3
rounds, 5 of the 9 from n_kv 8192 up, where the A/A noise was already the lower one the target aims at."""

_SCHEMA = 1
_NO_HOOK = "not run: the backend prints no FA log (no tuner hook), so a forced kernel can be neither run nor confirmed"

RunRound = Callable[..., list[kb.KernelTime]]


def bench_shape(shape: FaShape, n_kv: int) -> kb.FaShape:
    """The test-backend-ops shape of one cell: D = DV, :data:`N_HEAD_KV` KV heads, ``ne1`` query columns."""
    return kb.FaShape(
        head_dim=shape.D,
        head_dim_v=shape.D,
        n_head=N_HEAD_KV * shape.gqa,
        n_head_kv=N_HEAD_KV,
        n_kv=n_kv,
        n_batch=shape.ne1,
        kv_type=shape.kv,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sample:
    """One (cell, config, round): microseconds per run, or None with the reason it failed."""

    shape: FaShape
    n_kv: int
    config: str
    round: int
    us_per_run: float | None
    kernel: str | None
    error: str

    @property
    def ok(self) -> bool:
        return self.us_per_run is not None and not self.error


def judge_sample(cell: Cell, config: str, kt: kb.KernelTime, *, expect_log: bool) -> tuple[float | None, str]:
    """(microseconds or None, reason it failed or ""): a time counts only if the kernel asked for ran.

    ``expect_log``: the backend prints the tuner hook's FA log (a CUDA build); without it (CPU) a forced
    kernel cannot be confirmed, so it fails, and upstream's config is taken as it comes.
    """
    want = cell.upstream if config in (DEFAULT, AA) else config
    us = kt.us_per_run
    if kt.error or us is None:
        return None, kt.error or "no time printed"
    if not (math.isfinite(us) and us > 0):
        return None, f"time {us!r} us is not a positive number"
    if kt.kernel is None:
        if expect_log or config not in (DEFAULT, AA):
            return None, f"no FA log line: cannot confirm that {want} ran"
        return us, ""
    if kt.kernel != want:
        return None, f"{kt.kernel} ran ({kt.why}), not {want}"
    return us, ""


class SampleStore:
    """Samples in a SQLite file (one row per cell, config and round) and the identity of the run they belong to.

    The identity (arch, backend, build, head counts) is written by the first run; a later run with
    another identity is refused, so one file never mixes two builds' timings.
    """

    def __init__(self, path: Path, identity: Mapping[str, str]) -> None:
        self.path = Path(path)
        self.db = open_store(
            self.path,
            {"schema": str(_SCHEMA), **identity},
            table_sql="CREATE TABLE IF NOT EXISTS samples (shape TEXT NOT NULL, n_kv INTEGER NOT NULL, "
            "config TEXT NOT NULL, round INTEGER NOT NULL, us_per_run REAL, kernel TEXT, error TEXT NOT NULL, "
            "D INTEGER NOT NULL, gqa INTEGER NOT NULL, kv TEXT NOT NULL, ne1 INTEGER NOT NULL, "
            "at REAL NOT NULL, PRIMARY KEY (shape, n_kv, config, round))",
            what="a sweep storage",
            fix="Pass another --storage, or the same build and backend.",
            strict=False,
        )

    def close(self) -> None:
        self.db.close()

    def set_limits(self, limits: tuple[int, int]) -> None:
        """Record the round limits of this run (:func:`tuner.sweep.store.write_limits`)."""
        write_limits(self.db, limits)

    def limits(self) -> tuple[int, int]:
        """The round limits of the last run; (n, n) for a file made before they were recorded, with n rounds."""
        return read_limits(self.db, "samples")

    def recorded(self, config: str, round_index: int) -> set[tuple[str, int]]:
        """(shape key, n_kv) of every sample of ``config`` in round ``round_index``, failed ones included."""
        rows = self.db.execute("SELECT shape, n_kv FROM samples WHERE config = ? AND round = ?", (config, round_index))
        return {(str(s), int(n)) for s, n in rows}

    def forget(self, round_index: int, keys: Iterable[tuple[str, int]]) -> None:
        """Delete every config's sample of round ``round_index`` at the cells ``keys`` (a round to measure again)."""
        with self.db:
            self.db.executemany(
                "DELETE FROM samples WHERE shape = ? AND n_kv = ? AND round = ?", [(*key, round_index) for key in keys]
            )

    def add(self, samples: Iterable[Sample]) -> None:
        now = time.time()
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        s.shape.key,
                        s.n_kv,
                        s.config,
                        s.round,
                        s.us_per_run,
                        s.kernel,
                        s.error,
                        s.shape.D,
                        s.shape.gqa,
                        s.shape.kv,
                        s.shape.ne1,
                        now,
                    )
                    for s in samples
                ],
            )

    def samples(self, shape_keys: Iterable[str] | None = None) -> list[Sample]:
        """Every stored sample (of the shapes ``shape_keys`` where given)."""
        keys = None if shape_keys is None else sorted(set(shape_keys))
        where = "" if keys is None else f" WHERE shape IN ({', '.join('?' * len(keys))})"
        rows = self.db.execute(
            "SELECT D, gqa, kv, ne1, n_kv, config, round, us_per_run, kernel, error FROM samples"
            + where
            + " ORDER BY shape, n_kv, config, round",
            keys or (),
        )
        return [
            Sample(
                shape=FaShape(D=int(D), gqa=int(g), kv=str(kv), ne1=int(ne1)),
                n_kv=int(n),
                config=str(c),
                round=int(r),
                us_per_run=None if us is None else float(us),
                kernel=None if k is None else str(k),
                error=str(e),
            )
            for D, g, kv, ne1, n, c, r, us, k, e in rows
        ]


def chunk_cells(cells: Sequence[Cell], size: int) -> list[list[Cell]]:
    """The cells packed, whole shapes at a time in the given order, into chunks of about ``size`` cells
    (a shape with more cells than ``size`` is a chunk of its own)."""
    return pack_groups(cells, lambda c: c.shape, size)


def round_processes(chunk: Sequence[Cell], round_index: int) -> list[tuple[str, list[Cell]]]:
    """One round of a chunk: (config, its cells) per process, configs in the round's rotated order."""
    base = [DEFAULT, AA] + [k for k in LABELS if k not in (DEFAULT, AA) and any(k in c.candidates for c in chunk)]
    return [
        (cfg, [c for c in chunk if cfg in (DEFAULT, AA) or cfg in c.candidates]) for cfg in rotated(base, round_index)
    ]


def fa_bench_case_s(target_ms: int) -> float:
    """Estimate: seconds per fa-bench case with ``-m target_ms`` (0: none): :data:`FA_BENCH_SETUP_S` plus
    :data:`FA_BENCH_TARGET_RUNS` runs of the target. Not measured on a GPU with a target yet."""
    return FA_BENCH_SETUP_S + FA_BENCH_TARGET_RUNS * target_ms / 1000


def estimate_seconds(n_processes: int, n_cases: int, case_s: float = CASE_S, process_s: float = PROCESS_S) -> float:
    """The time of ``n_processes`` timer processes over ``n_cases`` cases in all, at ``process_s`` and
    ``case_s`` (:data:`PROCESS_S` and :data:`CASE_S` for test-backend-ops, :data:`FA_BENCH_PROCESS_S` and
    :func:`fa_bench_case_s` for fa-bench; an estimate)."""
    return n_processes * process_s + n_cases * case_s


def estimate_text(
    cells: Sequence[Cell],
    *,
    limits: tuple[int, int],
    chunk_size: int,
    target_ms: int = TARGET_MS,
    open_share: float = OPEN_SHARE,
) -> str:
    """What ``tuner sweep run`` would start for ``cells`` and its estimated time with either timer (fa-bench
    at ``target_ms``): ``min_rounds`` rounds of every cell, then up to ``max_rounds`` for an assumed
    ``open_share`` of the cells (each of them taking every further round; every chunk's processes counted in
    every further round, an upper figure where whole chunks settle)."""
    lo, hi = limits
    chunks = chunk_cells(cells, chunk_size)
    per_round = sum(len(c.configs) for c in cells)
    procs = sum(len(round_processes(ch, r)) for ch in chunks for r in range(lo))
    cases = lo * per_round
    more_procs = sum(len(round_processes(ch, r)) for ch in chunks for r in range(lo, hi))
    more_cases = round((hi - lo) * open_share * per_round)
    case_s = fa_bench_case_s(target_ms)
    fa = estimate_seconds(procs + more_procs, cases + more_cases, case_s, FA_BENCH_PROCESS_S)
    tbo = estimate_seconds(procs + more_procs, cases + more_cases)
    head = f"sweep run: {len(chunks)} chunks of up to {chunk_size} cells; {rounds_text(limits)}: "
    if hi > lo:
        head += (
            f"{procs} processes and {cases} cases for the first {lo} rounds, then about {more_procs} processes and "
            f"{more_cases} cases (assumed: {open_share:.0%} of the cells still open after {lo} rounds, each to "
            f"{hi}); fixed {hi} rounds would be {hi * per_round} cases, "
            f"{duration_text(estimate_seconds(procs + more_procs, hi * per_round, case_s, FA_BENCH_PROCESS_S))} with fa-bench"
        )
    else:
        head += f"{procs} processes, {cases} cases"
    return (
        head + f"\nestimated {duration_text(fa)} with fa-bench (the default) at {FA_BENCH_PROCESS_S:g} s a process and "
        f"{case_s:.3f} s a case with --target-ms {target_ms} (an estimate: {FA_BENCH_SETUP_S:g} s a case of "
        f"setup, from H100 processes before the target, plus about {FA_BENCH_TARGET_RUNS:g} runs of the target); "
        f"{duration_text(tbo)} with --timer test-backend-ops at {PROCESS_S:g} s a process and {CASE_S:g} s a case\n"
    )


def run_sweep(
    cells: Sequence[Cell],
    *,
    limits: tuple[int, int],
    store: SampleStore,
    bin_dir: Path,
    backend: str,
    log_dir: Path,
    chunk_size: int = 72,
    run_round: RunRound = kb.run_round,
    expect_log: bool = True,
    case_s: float = CASE_S,
    process_s: float = PROCESS_S,
    budget: SweepBudget | None = None,
) -> tuple[int, int]:
    """Measure what ``store`` does not hold yet: per chunk, sequential rounds (:func:`open_cells`), one
    process per config and round over the cells that get the round; with ``budget``, none that would end past
    its deadline (:class:`tuner.search.screen.BudgetReached`).

    ``limits``: (min_rounds, max_rounds). Prints a line per chunk and round with the time it took and the
    ETA of the rest. Without the FA log (``expect_log`` False: a CPU build, which has no tuner hook) a
    forced kernel cannot run, so its samples are stored as failed without starting a process. Returns
    (processes run, processes skipped as already recorded).
    """
    lo, hi = check_limits(limits)
    store.set_limits(limits)
    chunks = chunk_cells(cells, chunk_size)
    first = [
        (cfg, [c for c in cs if (c.shape.key, c.n_kv) not in store.recorded(cfg, r)])
        for chunk in chunks
        for r in range(lo)
        for cfg, cs in round_processes(chunk, r)
    ]
    first_cases = sum(len(cs) for cfg, cs in first if expect_log or cfg in (DEFAULT, AA))
    first_procs = sum(1 for cfg, cs in first if cs and (expect_log or cfg in (DEFAULT, AA)))
    later = (hi - lo) * OPEN_SHARE * sum(len(c.configs) for c in cells)
    log.info(
        f"sweep: {len(cells)} cells in {len(chunks)} chunks, {rounds_text(limits)}; first {lo} rounds: "
        f"{first_procs} processes ({first_cases} cases) to run, {sum(1 for _, cs in first if not cs)} already "
        f"recorded; estimated at H100 rates {duration_text(estimate_seconds(first_procs, first_cases, case_s, process_s))}"
        + (f", and about {round(later)} cases more if {OPEN_SHARE:.0%} of the cells stay open" if hi > lo else "")
    )
    ran = skipped = done = 0
    start = time.monotonic()
    for ci, chunk in enumerate(chunks):
        for r in range(hi):
            want = open_cells(chunk, store.samples({c.shape.key for c in chunk}), r, limits)
            if not want:
                break
            t0, n_round, failed = time.monotonic(), 0, 0
            procs = round_processes(want, r)
            todo = whole_round(
                store, {cfg: [(c.shape.key, c.n_kv) for c in cs] for cfg, cs in procs}, r,
                f"chunk {ci + 1} round {r + 1}",
            )  # fmt: skip
            runs = [ks for cfg, ks in todo if ks and (expect_log or cfg in (DEFAULT, AA))]
            est = estimate_seconds(len(runs), sum(len(ks) for ks in runs), case_s, process_s)
            t_r = budget.start(est, f"chunk {ci + 1} round {r + 1}") if budget and runs else 0.0
            for (cfg, ks), (_, cs) in zip(todo, procs, strict=True):
                missing = [c for c in cs if (c.shape.key, c.n_kv) in ks]
                if not missing:
                    skipped += 1
                elif expect_log or cfg in (DEFAULT, AA):
                    failed += _measure(missing, cfg, r, ci, store=store, run_round=run_round, bin_dir=bin_dir,
                                       backend=backend, log_dir=log_dir, expect_log=expect_log)  # fmt: skip
                    ran += 1
                    n_round += len(missing)
                else:
                    store.add(
                        Sample(
                            shape=c.shape,
                            n_kv=c.n_kv,
                            config=cfg,
                            round=r,
                            us_per_run=None,
                            kernel=None,
                            error=_NO_HOOK,
                        )
                        for c in missing
                    )
            if budget and runs:
                budget.done(est, t_r)
            if n_round:
                done += n_round
                rate = (time.monotonic() - start) / done
                eta = rate * max(0.0, first_cases + later - done)
                log.info(
                    f"chunk {ci + 1}/{len(chunks)} round {r + 1}/{hi}: {len(want)} cells, {n_round} cases in "
                    f"{time.monotonic() - t0:.1f} s" + (f", {failed} failed" if failed else "")
                    + f"; {done} cases done, ETA ~{format_seconds(eta)}"
                )  # fmt: skip
    return ran, skipped


def _measure(
    cs: list[Cell],
    cfg: str,
    r: int,
    ci: int,
    *,
    store: SampleStore,
    run_round: RunRound,
    bin_dir: Path,
    backend: str,
    log_dir: Path,
    expect_log: bool,
) -> int:
    """One process: ``cfg`` over ``cs`` in round ``r`` of chunk ``ci``, its samples stored; returns the failed."""
    out = run_round(
        bin_dir,
        [bench_shape(c.shape, c.n_kv) for c in cs],
        {LABELS[cfg]: {} if cfg in (DEFAULT, AA) else kb.force_kernel_env(cfg)},
        log_dir=log_dir / f"chunk{ci:04d}" / f"r{r}" / LABELS[cfg],
        backend=backend,
        timeout=kb.process_timeout(len(cs)),
    )
    samples = []
    for c, kt in zip(cs, out, strict=True):
        us, err = judge_sample(c, cfg, kt, expect_log=expect_log)
        samples.append(
            Sample(shape=c.shape, n_kv=c.n_kv, config=cfg, round=r, us_per_run=us, kernel=kt.kernel, error=err)
        )
    store.add(samples)
    return sum(1 for smp in samples if smp.error)


def rounds_text(limits: tuple[int, int]) -> str:
    lo, hi = limits
    if lo == hi:
        return f"{lo} rounds"
    return f"{lo} rounds for every cell, up to {hi} for the cells whose verdict is still open"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """A measured sweep: the stats of the cells with a verdict, the cells without one and why, the rules."""

    stats: Mapping[FaShape, Mapping[int, CellStats]]
    no_verdict: Mapping[FaShape, Mapping[int, str]]
    decisions: Mapping[FaShape, Sequence[Decision]]
    rules: tuple[TableRule, ...]


def _gap(shape: FaShape, n_kv: int, upstream: str, why: str) -> Decision:
    return Decision(
        phase=shape.phase.bench,
        depth=n_kv,
        upstream_kernel=upstream,
        winner=None,
        effect_pct=0.0,
        ci=(math.nan, math.nan),
        noise_pct=math.nan,
        reason=f"no verdict: {why}",
    )


def cell_values(
    c: Cell, got: Mapping[tuple[FaShape, int, str, int], Sample], max_rounds: int
) -> tuple[dict[str, list[float]], str]:
    """One cell's throughput per config over its complete rounds, and why it has no verdict ("" if it has one).

    The cell's rounds are the leading rounds ``0 .. n-1`` (``n <= max_rounds``) in which every config has a
    sample: a cell that stopped early (settled) has fewer than the others. A failed sample among them
    leaves the cell without a verdict, with the first such reason."""
    n = 0
    while n < max_rounds and all((c.shape, c.n_kv, cfg, n) in got for cfg in c.configs):
        n += 1
    values: dict[str, list[float]] = {}
    why = ""
    for r in range(n):
        for cfg in c.configs:
            s = got[(c.shape, c.n_kv, cfg, r)]
            if not s.ok or s.us_per_run is None:
                why = why or f"{cfg} round {r + 1}: {s.error}"
                continue
            values.setdefault(cfg, []).append(1e6 / s.us_per_run)
    return values, why


def _sample_map(samples: Iterable[Sample], below: int) -> dict[tuple[FaShape, int, str, int], Sample]:
    return {(s.shape, s.n_kv, s.config, s.round): s for s in samples if s.round < below}


def cell_verdicts(
    cells: Sequence[Cell], samples: Iterable[Sample], *, limits: tuple[int, int], below: int | None = None
) -> tuple[dict[FaShape, dict[int, CellStats]], dict[FaShape, dict[int, str]]]:
    """(stats of the cells with enough rounds for a verdict, by shape and n_kv; the others and why), from
    the samples of rounds ``< below`` (default ``max_rounds``). A cell needs ``min_rounds`` complete rounds;
    its looks are ``limits`` (:func:`tuner.sweep.rounds.cell_stats`)."""
    lo, hi = limits
    got = _sample_map(samples, hi if below is None else min(below, hi))
    stats: dict[FaShape, dict[int, CellStats]] = {}
    gaps: dict[FaShape, dict[int, str]] = {}
    for c in cells:
        values, why = cell_values(c, got, hi if below is None else min(below, hi))
        n = len(values.get(DEFAULT, ()))
        if not why and n < lo:
            cfg = next((x for x in c.configs if (c.shape, c.n_kv, x, n) not in got), DEFAULT)
            why = f"{cfg} round {n + 1}: not measured"
        if why:
            gaps.setdefault(c.shape, {})[c.n_kv] = why
        else:
            stats.setdefault(c.shape, {})[c.n_kv] = cell_stats(c.n_kv, c.upstream, values, limits)
    return stats, gaps


def open_cells(chunk: Sequence[Cell], samples: Iterable[Sample], r: int, limits: tuple[int, int]) -> list[Cell]:
    """The cells of ``chunk`` that get round ``r`` (0-based): every cell below ``min_rounds``; from there the
    cells with all ``r`` rounds (none failed) whose point is still open by the decision rule over their
    shape's points (:func:`tuner.sweep.rounds.open_in_round`), judged on the samples of rounds ``< r`` only, so
    that a resumed run takes the same decisions. A settled cell, or one that stopped, gets no more rounds."""
    return open_for_round(
        chunk,
        r,
        limits,
        lambda below: cell_verdicts(chunk, samples, limits=limits, below=below)[0],
        lambda shape: shape.phase.bench,
        lambda c: (c.shape, c.n_kv),
    )


def compose(cells: Sequence[Cell], samples: Iterable[Sample], *, limits: tuple[int, int]) -> Outcome:
    """Verdicts and rules from the stored samples of rounds ``0 .. max_rounds-1`` (module doc).

    A cell has a verdict when every config has a good sample in each of its rounds and it has at least
    ``min_rounds`` of them (:func:`cell_verdicts`); the others are listed with the first reason, and stand
    in their shape's decisions as points without a winner.
    """
    stats, gaps = cell_verdicts(cells, samples, limits=limits)
    upstream = {(c.shape, c.n_kv): c.upstream for c in cells}
    rules: list[TableRule] = []
    decisions: dict[FaShape, list[Decision]] = {}
    for shape in sorted(set(stats) | set(gaps)):
        ds = decide(shape.phase.bench, stats[shape]) if shape in stats else []
        ds += [_gap(shape, n, upstream[(shape, n)], w) for n, w in gaps.get(shape, {}).items()]
        ds.sort(key=lambda d: d.depth)
        decisions[shape] = ds
        rules += [TableRule.of(r, ne1=shape.ne1) for r in rules_from(ds, Shape(D=shape.D, gqa=shape.gqa, kv=shape.kv))]
    return Outcome(stats=stats, no_verdict=gaps, decisions=decisions, rules=tuple(rules))


def no_rules_text(outcome: Outcome) -> str:
    """Why the table is empty, in words."""
    if not outcome.stats:
        return "no cell has a verdict"
    return "upstream's choice stays in every cell with a verdict"


_TIMER_TEXT = {
    "fa-bench": "fa-bench (`tuner/data/fa_bench.cpp`, cold K/V, at least 50 ops a case and, with a target_ms above, "
    "enough ops for the timed graph to last that long)",
    "test-backend-ops": "`test-backend-ops perf -o FLASH_ATTN_EXT --test-file`",
}


def _cell_tables(outcome: Outcome) -> list[str]:
    """Per shape, a row per n_kv: upstream's kernel and time, the A/A noise, each forced kernel's speed
    relative to upstream (time upstream / time forced) with its 95% CI, and the decision."""
    lines: list[str] = []
    for shape in sorted(outcome.decisions):
        cells = outcome.stats.get(shape, {})
        kernels = sorted({k for st in cells.values() for k in st.effects})
        lines += ["", f"## {shape.key}", ""]
        lines += ["| n_kv | upstream | us upstream | A/A noise | " + " | ".join(kernels) + " | decision |"]
        lines += ["|---:|---|---:|---:|" + "---|" * len(kernels) + "---|"]
        for d in outcome.decisions[shape]:
            st = cells.get(d.depth)
            if st is None:
                lines.append(
                    f"| {d.depth} | {d.upstream_kernel} | - | - |" + " - |" * len(kernels) + " no verdict (below) |"
                )
                continue
            us = f"{1e6 / st.upstream_ts:.1f}" if st.upstream_ts > 0 else "-"
            row = [str(d.depth), str(st.upstream_kernel), us, f"±{st.noise_pct:.1f}%"]
            for k in kernels:
                e = st.effects.get(k)
                ci = f" [{e.ci_low:.3f}, {e.ci_high:.3f}]" if e is not None and math.isfinite(e.ci_low) else ""
                row.append("-" if e is None else f"{e.ratio:.3f}{ci}")
            row.append(f"{d.winner} ({d.effect_pct:+.1f}%)" if d.winner else d.reason)
            lines.append("| " + " | ".join(row) + " |")
    return lines


def report_text(
    outcome: Outcome, cells: Sequence[Cell], *, limits: tuple[int, int], identity: Mapping[str, Any], patch: bool
) -> str:
    """report.md: what was measured, the table, and every cell without a verdict."""
    n_gap = sum(len(v) for v in outcome.no_verdict.values())
    lines = [
        "# FlashAttention sweep",
        "",
        *(f"- {k}: {v}" for k, v in identity.items()),
        f"- cells: {len(cells)} over {len({c.shape for c in cells})} shapes, paired rounds: {rounds_text(limits)} "
        f"(upstream's choice, its A/A twin and every other legal kernel forced; {N_HEAD_KV} KV heads, "
        f"{N_HEAD_KV} x GQA query heads)",
        f"- cells with a verdict: {len(cells) - n_gap}; without one: {n_gap}",
        "",
        f"Each config of a chunk of cells ran as one {_TIMER_TEXT.get(str(identity.get('timer')), 'timer')} "
        "process per round, configs in an order rotated from round to round; a sample counts only where the FA "
        "log names the kernel asked for. A forced kernel wins a cell only when its paired effect clears the "
        "decision rule (A/A-controlled, at least the phase's noise floor); consecutive winning n_kv points form "
        "one rule.",
        "",
        "## Rules",
        "",
        *([f"- {r.text}" for r in outcome.rules] or [f"None: {no_rules_text(outcome)}."]),
        "",
        ("`upstream.patch` adds them to `ggml_cuda_get_best_fattn_kernel`." if patch else "No `upstream.patch`."),
    ]
    lines += _cell_tables(outcome)
    if n_gap:
        lines += ["", "## Cells without a verdict", ""]
        for shape in sorted(outcome.no_verdict):
            for n, why in sorted(outcome.no_verdict[shape].items()):
                lines.append(f"- {shape.key} n_kv {n}: {why}")
    return "\n".join(lines) + "\n"

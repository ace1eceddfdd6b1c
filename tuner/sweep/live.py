"""The FlashAttention sweep measured for real: batched kernel timings through test-backend-ops, kept in SQLite.

The timer of :mod:`tuner.sweep.rounds` is called once per cell, config and round; a
``test-backend-ops`` process costs seconds of CUDA initialisation, so here one process times many
cells. The cells are packed, whole shapes at a time, into *chunks*; per chunk and round, one
:func:`tuner.measure.kernel_bench.run_round` process runs per config: upstream's choice (empty
environment), its A/A twin (upstream again, a second process) and each forced kernel over the cells
where it is a candidate (legal there and not upstream's choice; the other cells are not given to that
process). The configs' order is rotated from round to round (:func:`tuner.measure.paired.rotated`), as
:func:`tuner.sweep.rounds.paired_rounds` rotates it per cell.

Each sample, one (cell, config, round), goes into a SQLite table as soon as its process ends; a rerun
with the same storage skips the processes whose samples are all recorded, so an interrupted sweep
resumes where it stopped. A sample *fails* when its process errored or timed out, the case printed
no time, or the kernel that ran (the build's FA log, :mod:`tuner.measure.falog`) is not the one asked
for: a forced kernel the hook did not run, or upstream's config running another kernel than
:func:`tuner.sweep.grid.upstream_kernel` says. A failed sample is stored with its reason and never as
a time; a cell with any failed or missing sample gets no verdict and breaks the n_kv intervals of its
shape's rules (:func:`compose`), so no rule spans a point that was not measured.

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
    "Outcome",
    "Sample",
    "SampleStore",
    "bench_shape",
    "chunk_cells",
    "compose",
    "estimate_seconds",
    "estimate_text",
    "fa_bench_case_s",
    "judge_sample",
    "no_rules_text",
    "report_text",
    "round_processes",
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
from tuner.search.compose import Decision, Shape, rules_from
from tuner.search.screen import CellStats
from tuner.sweep.grid import AA, DEFAULT, Cell, FaShape
from tuner.sweep.rounds import cell_stats, decide, pack_groups, run_processes
from tuner.sweep.store import open_store
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

    def recorded(self, config: str, round_index: int) -> set[tuple[str, int]]:
        """(shape key, n_kv) of every sample of ``config`` in round ``round_index``, failed ones included."""
        rows = self.db.execute("SELECT shape, n_kv FROM samples WHERE config = ? AND round = ?", (config, round_index))
        return {(str(s), int(n)) for s, n in rows}

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

    def samples(self) -> list[Sample]:
        rows = self.db.execute(
            "SELECT D, gqa, kv, ne1, n_kv, config, round, us_per_run, kernel, error FROM samples "
            "ORDER BY shape, n_kv, config, round"
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


def _hours(seconds: float) -> str:
    h, rem = divmod(round(seconds), 3600)
    return f"{h} h {rem // 60:02d} min" if h else f"{rem // 60} min {rem % 60:02d} s"


def estimate_text(cells: Sequence[Cell], *, rounds: int, chunk_size: int, target_ms: int = TARGET_MS) -> str:
    """What ``tuner sweep run`` would start for ``cells``: processes, cases and the estimated time with
    either timer (fa-bench at ``target_ms``)."""
    chunks = chunk_cells(cells, chunk_size)
    procs = sum(len(round_processes(ch, r)) for ch in chunks for r in range(rounds))
    cases = rounds * sum(len(c.configs) for c in cells)
    case_s = fa_bench_case_s(target_ms)
    return (
        f"sweep run: {len(chunks)} chunks of up to {chunk_size} cells x {rounds} rounds = {procs} "
        f"processes, {cases} cases; estimated {_hours(estimate_seconds(procs, cases))} "
        f"at {PROCESS_S:g} s a process and {CASE_S:g} s a case on an H100 with --timer test-backend-ops; "
        f"{_hours(estimate_seconds(procs, cases, case_s, FA_BENCH_PROCESS_S))} with fa-bench (the default) "
        f"at {FA_BENCH_PROCESS_S:g} s a process and {case_s:.2f} s a case with --target-ms {target_ms} "
        f"(an estimate: {FA_BENCH_SETUP_S:g} s a case measured on an H100 before the target, plus about "
        f"{FA_BENCH_TARGET_RUNS:g} runs of the target)\n"
    )


def run_sweep(
    cells: Sequence[Cell],
    *,
    rounds: int,
    store: SampleStore,
    bin_dir: Path,
    backend: str,
    log_dir: Path,
    chunk_size: int = 72,
    run_round: RunRound = kb.run_round,
    expect_log: bool = True,
    case_s: float = CASE_S,
    process_s: float = PROCESS_S,
) -> tuple[int, int]:
    """Measure what ``store`` does not hold yet: per chunk, ``rounds`` rounds, one process per config.

    Prints a line per chunk and round with the time it took and the ETA of the rest. Without the FA log
    (``expect_log`` False: a CPU build, which has no tuner hook) a forced kernel cannot run, so its
    samples are stored as failed without starting a process. Returns (processes run, processes skipped
    as already recorded).
    """
    chunks = chunk_cells(cells, chunk_size)
    todo: list[tuple[int, int, str, list[Cell]]] = []
    skipped = 0
    for ci, chunk in enumerate(chunks):
        for r in range(rounds):
            for cfg, cs in round_processes(chunk, r):
                have = store.recorded(cfg, r)
                missing = [c for c in cs if (c.shape.key, c.n_kv) not in have]
                if not missing:
                    skipped += 1
                elif expect_log or cfg in (DEFAULT, AA):
                    todo.append((ci, r, cfg, missing))
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
    total_cases = sum(len(cs) for *_, cs in todo)
    log.info(
        f"sweep: {len(cells)} cells in {len(chunks)} chunks x {rounds} rounds; {len(todo)} processes "
        f"({total_cases} cases) to run, {skipped} already recorded; estimated at H100 rates "
        f"{_hours(estimate_seconds(len(todo), total_cases, case_s, process_s))}"
    )

    def measure(ci: int, r: int, cfg: str, cs: list[Cell]) -> int:
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

    run_processes(todo, chunks=len(chunks), rounds=rounds, cases=len, measure=measure)
    return len(todo), skipped


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


def compose(cells: Sequence[Cell], samples: Iterable[Sample], *, rounds: int) -> Outcome:
    """Verdicts and rules from the stored samples of rounds ``0 .. rounds-1`` (module doc).

    A cell has a verdict only when every config has a good sample in every round; the others are
    listed with the first reason, and stand in their shape's decisions as points without a winner.
    """
    got: dict[tuple[FaShape, int, str, int], Sample] = {
        (s.shape, s.n_kv, s.config, s.round): s for s in samples if s.round < rounds
    }
    stats: dict[FaShape, dict[int, CellStats]] = {}
    gaps: dict[FaShape, dict[int, str]] = {}
    upstream: dict[tuple[FaShape, int], str] = {}
    for c in cells:
        upstream[(c.shape, c.n_kv)] = c.upstream
        values: dict[str, list[float]] = {}
        why = ""
        for cfg in c.configs:
            for r in range(rounds):
                s = got.get((c.shape, c.n_kv, cfg, r))
                if s is None or not s.ok or s.us_per_run is None:
                    why = why or (f"{cfg} round {r + 1}: " + ("not measured" if s is None else s.error))
                    continue
                values.setdefault(cfg, []).append(1e6 / s.us_per_run)
        if why:
            gaps.setdefault(c.shape, {})[c.n_kv] = why
        else:
            stats.setdefault(c.shape, {})[c.n_kv] = cell_stats(c.n_kv, c.upstream, values)
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
    outcome: Outcome, cells: Sequence[Cell], *, rounds: int, identity: Mapping[str, Any], patch: bool
) -> str:
    """report.md: what was measured, the table, and every cell without a verdict."""
    n_gap = sum(len(v) for v in outcome.no_verdict.values())
    lines = [
        "# FlashAttention sweep",
        "",
        *(f"- {k}: {v}" for k, v in identity.items()),
        f"- cells: {len(cells)} over {len({c.shape for c in cells})} shapes, {rounds} paired rounds each "
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

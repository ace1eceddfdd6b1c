"""The FlashAttention sweep: its cells' spec of the round engine, their timer processes, composition and report.

A sample fails where its process errored, no time was printed or the FA log shows another kernel than asked
(:func:`judge_sample`); its cell then gets no verdict and breaks its shape's n_kv intervals (:func:`compose`).
The KV head count is fixed at :data:`N_HEAD_KV`; a model with far fewer KV heads may rank kernels differently at
small n_kv. See docs/sweep.md ("Running it: `tuner sweep run`").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner.measure import kernel_bench as kb
from tuner.measure.fa_bench import TARGET_MS
from tuner.rounds.budget import Budget
from tuner.rounds.compose import Shape, rules_from
from tuner.rounds.engine import (
    AA,
    DEFAULT,
    Spec,
    Verdicts,
    judge,
    pack_groups,
    round_processes,
    rounds_text,
    run_rounds,
)
from tuner.rounds.store import Column, Sample, SampleStore, Table
from tuner.sweep.grid import Cell, FaShape, duration_text
from tuner.sweep.table import TableRule

N_HEAD_KV = 8
"""KV heads of every timed call (module doc); query heads are ``N_HEAD_KV * gqa``."""

LABELS = {DEFAULT: "upstream", AA: "AA", "VEC": "VEC", "TILE": "TILE", "MMA": "MMA"}
"""Config -> the label of its test-backend-ops process and log (``A/A`` is no file name)."""

PROCESS_S = 2.5
"""Estimate: a test-backend-ops process's cost besides its cases on an H100 (docs/sweep.md)."""
CASE_S = 1.0
"""Estimate: seconds per case: perf mode repeats each case's graph for at least one second."""
FA_BENCH_PROCESS_S = 1.0
"""Estimate: an fa-bench process besides its cases (H100, docs/data/h100-sweep-first/)."""
FA_BENCH_SETUP_S = 0.06
"""Estimate: per fa-bench case besides its target's runs (that run's 0.06 s a case all told)."""
FA_BENCH_TARGET_RUNS = 4.0
"""Estimate: runs of ``target_ms`` a case costs (warm-ups, timed run, calibration)."""

OPEN_SHARE = 0.5
"""Assumption: the share of cells still open after ``min_rounds`` (H100 replay: 14 of 18 after 3 rounds)."""

_NO_HOOK = "not run: the backend prints no FA log (no tuner hook), so a forced kernel can be neither run nor confirmed"

RunRound = Callable[..., list[kb.KernelTime]]
FaKey = tuple[FaShape, int]
"""A cell's sample key: its shape and n_kv."""


def _encode(key: FaKey) -> tuple[Column, ...]:
    s, n_kv = key
    return (s.key, n_kv, s.D, s.gqa, s.kv, s.ne1)


def _decode(row: Sequence[Any]) -> FaKey:
    _, n_kv, D, gqa, kv, ne1 = row
    return FaShape(D=int(D), gqa=int(gqa), kv=str(kv), ne1=int(ne1)), int(n_kv)


TABLE = Table[FaKey](
    name="samples",
    create="CREATE TABLE IF NOT EXISTS samples (shape TEXT NOT NULL, n_kv INTEGER NOT NULL, "
    "config TEXT NOT NULL, round INTEGER NOT NULL, us_per_run REAL, kernel TEXT, error TEXT NOT NULL, "
    "D INTEGER NOT NULL, gqa INTEGER NOT NULL, kv TEXT NOT NULL, ne1 INTEGER NOT NULL, "
    "at REAL NOT NULL, PRIMARY KEY (shape, n_kv, config, round))",
    columns=("shape", "n_kv", "D", "gqa", "kv", "ne1"),
    n_key=2,
    encode=_encode,
    decode=_decode,
    value="us_per_run",
    kernel=True,
    identity={"schema": "1"},
    what="a sweep storage",
    fix="Pass another --storage, or the same build and backend.",
    # files made before a key of the identity was added resume: only the keys a file records are compared
    strict=False,
)
"""The FlashAttention sweep's samples (``sweep.sqlite3``); a run of another identity is refused."""

FA = Spec[Cell, FaKey, FaShape](
    name="sweep",
    noun="cell",
    configs=tuple(LABELS),
    labels=LABELS,
    key=lambda c: (c.shape, c.n_kv),
    family=lambda c: c.shape,
    x=lambda c: c.n_kv,
    group=lambda c: c.shape,
    phase=lambda shape: shape.phase.bench,
    upstream=lambda c: c.upstream,
    configs_of=lambda c: c.configs,
    open_share=OPEN_SHARE,
)
"""The cells' spec of the round engine: a shape's n_kv points are one family, chunks keep shapes whole."""


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


def judge_sample(cell: Cell, config: str, kt: kb.KernelTime, *, expect_log: bool) -> tuple[float | None, str]:
    """(microseconds or None, why it failed or ""): a time counts only if the kernel asked for ran."""
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


def fa_bench_case_s(target_ms: int) -> float:
    """Estimate: seconds per fa-bench case with ``-m target_ms`` (not measured with a target on a GPU yet)."""
    return FA_BENCH_SETUP_S + FA_BENCH_TARGET_RUNS * target_ms / 1000


def estimate_text(
    cells: Sequence[Cell],
    *,
    limits: tuple[int, int],
    chunk_size: int,
    target_ms: int = TARGET_MS,
    open_share: float = OPEN_SHARE,
) -> str:
    """What ``tuner sweep run`` would start for ``cells`` and its estimated time with either timer."""
    lo, hi = limits
    chunks = pack_groups(cells, FA.group, chunk_size)
    per_round = sum(len(c.configs) for c in cells)
    procs = sum(len(round_processes(FA, ch, r)) for ch in chunks for r in range(lo))
    cases = lo * per_round
    more_procs = sum(len(round_processes(FA, ch, r)) for ch in chunks for r in range(lo, hi))
    more_cases = round((hi - lo) * open_share * per_round)
    case_s = fa_bench_case_s(target_ms)
    every = procs + more_procs  # the estimates: processes at their cost, plus cases at theirs
    fa = every * FA_BENCH_PROCESS_S + (cases + more_cases) * case_s
    tbo = every * PROCESS_S + (cases + more_cases) * CASE_S
    head = f"sweep run: {len(chunks)} chunks of up to {chunk_size} cells; {rounds_text(limits)}: "
    if hi > lo:
        head += (
            f"{procs} processes and {cases} cases for the first {lo} rounds, then about {more_procs} processes and "
            f"{more_cases} cases (assumed: {open_share:.0%} of the cells still open after {lo} rounds, each to "
            f"{hi}); fixed {hi} rounds would be {hi * per_round} cases, "
            f"{duration_text(every * FA_BENCH_PROCESS_S + hi * per_round * case_s)} with fa-bench"
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
    store: SampleStore[FaKey],
    bin_dir: Path,
    backend: str,
    log_dir: Path,
    chunk_size: int = 72,
    run_round: RunRound = kb.run_round,
    expect_log: bool = True,
    case_s: float = CASE_S,
    process_s: float = PROCESS_S,
    budget: Budget | None = None,
) -> tuple[int, int]:
    """Measure what ``store`` lacks; without the FA log forced kernels are stored failed. Returns (run, skipped)."""

    def measure(cs: Sequence[Cell], cfg: str, r: int, logs: Path) -> list[Sample[FaKey]]:
        out = run_round(
            bin_dir,
            [bench_shape(c.shape, c.n_kv) for c in cs],
            {LABELS[cfg]: {} if cfg in (DEFAULT, AA) else kb.force_kernel_env(cfg)},
            log_dir=logs,
            backend=backend,
            timeout=kb.process_timeout(len(cs)),
        )
        samples = []
        for c, kt in zip(cs, out, strict=True):
            us, err = judge_sample(c, cfg, kt, expect_log=expect_log)
            samples.append(Sample(key=(c.shape, c.n_kv), config=cfg, round=r, us=us, kernel=kt.kernel, error=err))
        return samples

    return run_rounds(
        FA, cells, limits=limits, store=store, measure=measure, log_dir=log_dir, chunk_size=chunk_size,
        cost=(process_s, case_s), forced_reason="" if expect_log else _NO_HOOK, budget=budget,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome(Verdicts[FaShape]):
    """A measured sweep: per shape its cells' stats and decisions, the cells without a verdict and why, the rules."""

    rules: tuple[TableRule, ...]


def compose(cells: Sequence[Cell], samples: Iterable[Sample[FaKey]], *, limits: tuple[int, int]) -> Outcome:
    """Verdicts and rules from the stored samples: per shape, consecutive winning n_kv points form one rule."""
    v = judge(FA, cells, samples, limits=limits)
    rules = [
        TableRule.of(r, ne1=shape.ne1)
        for shape, ds in v.decisions.items()
        for r in rules_from(ds, Shape(D=shape.D, gqa=shape.gqa, kv=shape.kv))
    ]
    return Outcome(stats=v.stats, no_verdict=v.no_verdict, decisions=v.decisions, rules=tuple(rules))


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
    """Per shape, a row per n_kv: upstream's kernel and time, A/A noise, each kernel's ratio with CI, decision."""
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
    outcome: Outcome, cells: Sequence[Cell], *, limits: tuple[int, int], identity: Mapping[str, str], patch: bool
) -> str:
    """report.md: what was measured, the table, and every cell without a verdict."""
    n_gap = outcome.n_gaps
    lines = [
        "# FlashAttention sweep",
        "",
        *(f"- {k}: {v}" for k, v in identity.items()),
        f"- cells: {len(cells)} over {len({c.shape for c in cells})} shapes, paired rounds: {rounds_text(limits)} "
        f"(upstream's choice, its A/A twin and every other legal kernel forced; {N_HEAD_KV} KV heads, "
        f"{N_HEAD_KV} x GQA query heads)",
        f"- cells with a verdict: {len(cells) - n_gap}; without one: {n_gap}",
        "",
        f"Each config of a chunk of cells ran as one {_TIMER_TEXT.get(identity.get('timer', ''), 'timer')} "
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
        gaps = sorted(outcome.no_verdict.items())
        lines += [f"- {shape.key} n_kv {n}: {why}" for shape, xs in gaps for n, why in sorted(xs.items())]
    return "\n".join(lines) + "\n"

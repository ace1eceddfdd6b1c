"""The MMQ-vs-cuBLAS sweep measured for real: batched mm-bench processes, samples kept in SQLite.

A point is one quant type, one weight size ``m x k`` (weights ``W`` [k, m] in ggml terms: ``k`` values a
row, ``m`` rows, :class:`tuner.measure.mm_bench.MmShape`) and one batch size ``ne11``. The sizes are the
dense projections of real models (:func:`projection_sizes`): attention Q and O, K and V, FFN gate/up and
down, deduplicated over the models asked for.

An mm-bench process costs seconds of CUDA start, so per round one process per config runs over the
points of a chunk (by default all of them) that get the round: upstream's choice (:data:`tuner.sweep.mmq.ENV` unset), its
A/A twin (unset again, a second process) and cuBLAS forced for every swept type (``q4_0:0..=BLAS,...``),
configs in an order rotated from round to round (:func:`tuner.measure.paired.rotated`), as
:func:`tuner.sweep.rounds.paired_rounds` rotates them for one cell. Upstream's backend on an NVIDIA arch
with Turing tensor cores is MMQ everywhere (:func:`tuner.sweep.mmq.plan_mmq`).

**Sequential rounds**, as ``tuner sweep run`` has them (:mod:`tuner.sweep.rounds`): every point gets
``min_rounds`` rounds; after that a round goes only to the points whose verdict is still open by the
search's settle rule (:func:`tuner.sweep.rounds.open_points` over a type and size's batch sizes, the family
its Holm correction runs over: :func:`open_chunk_points`), so later rounds' processes carry fewer cases. A
point's p-value is divided by the share of alpha of the round count it stopped at
(:func:`tuner.measure.decide.look_weight` over ``limits``), which keeps the family-wise error of fixed
rounds; ``min_rounds == max_rounds`` is the fixed-round sweep (one look).

Each process's samples, one (point, config, round) each, go into SQLite as it ends (:class:`MmqStore`),
with the round limits of the run; a rerun skips the rounds whose samples are recorded and measures a round an
earlier call left partly recorded again whole (:func:`tuner.sweep.store.whole_round`). The points open
in round r are decided from the stored rounds before r only, so a resumed run takes the same decisions,
and a rerun with a higher ``max_rounds`` adds rounds to the points open at the old maximum. A file made
before the limits were recorded holds fixed rounds (:meth:`MmqStore.limits`). A case printed with an error, or the case a process
died in (the process's other printed cases keep their times, and a new process runs the rest:
:func:`tuner.measure.mm_bench.run_cases`), is a failed sample with its reason, never a time; its point
gets no verdict.

**Composition.** Per type and size, over its batch sizes, the sweep's verdicts (:func:`tuner.sweep.rounds.decide`).
A batch size counts as cuBLAS-faster for a type only where cuBLAS was decided faster at *every* swept
size of that type: a size that kept MMQ, or has no verdict there, blocks it. The per-type points then
compose into batch-size intervals (:func:`tuner.search.compose.rules_from`, as the FlashAttention sweep's
n_kv points do), so a blocked point splits an interval.

**CUDA graphs.** Each case is one ggml graph of many multiplications, run three times (two warm-ups, then
the timed run: ``tuner/data/bench_common.h``). The pinned llama.cpp captures any repeated graph as a CUDA
graph, batched multiplications included: ``ggml_cuda_graph_check_compability`` in
``ggml/src/ggml-cuda/ggml-cuda.cu`` turns graphs off only for a ``MUL_MAT_ID`` whose fallback path
synchronizes, and ``ggml_backend_cuda_graph_compute`` captures a graph on its second call with unchanged
node properties. (Older trees turned them off for any batch above 1: ``check_node_graph_compatibility_and_refresh_copy_ops``
in llama.cpp 4227c9b, llama-cpp-python 0.3.16, on an ``ADD`` whose ``src[1]->ne[1] > 1``.) So llama-bench's
prompt test, which runs the same graph every repetition, runs its multiplications in a CUDA graph, while
the ubatches of one long prompt, whose K/V views grow from one to the next, run directly. The sweep keeps
graphs on by default, as llama.cpp does; ``cuda_graphs=False`` (``tuner sweep mmq --no-cuda-graphs``) runs
every config with ``GGML_CUDA_DISABLE_GRAPHS=1``, which ``ggml_cuda_graph::is_enabled`` (``common.cuh``)
reads, and the storage's identity and the report say which was used.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_LIKE",
    "LABELS",
    "MAX_CASES",
    "MmqOutcome",
    "MmqPoint",
    "MmqSample",
    "MmqStore",
    "blas_env",
    "chunk_points",
    "compose_live",
    "like_sizes",
    "no_choice_text",
    "open_chunk_points",
    "parse_size",
    "plan_points",
    "point_values",
    "point_verdicts",
    "projection_sizes",
    "report_text",
    "round_configs",
    "rounds_text",
    "run_mmq_live",
]

import dataclasses
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner import log
from tuner.errors import UsageError
from tuner.measure import mm_bench
from tuner.measure.paired import NOISE_CEILING_PCT, TOO_NOISY, rotated
from tuner.progress import format_seconds
from tuner.rounds.budget import SweepBudget
from tuner.rounds.compose import Decision, Shape, rules_from
from tuner.rounds.stats import UPSTREAM, CellStats
from tuner.sweep.grid import AA, DEFAULT
from tuner.sweep.mmq import OPEN_SHARE, PROCESS_CASES, PROCESS_S, START_S, MmqCell, MmqChoice, block_size, mmq_env
from tuner.sweep.rounds import cell_stats, check_limits, decide, open_for_round, pack_groups
from tuner.sweep.store import open_store, read_limits, whole_round, write_limits
from tuner.targets.models import ModelShape, load_model_shape

DEFAULT_LIKE = ("llama-3.2-1b", "llama-3.1-8b", "qwen2.5-0.5b")
"""The models whose projection sizes the sweep times unless ``--like`` or ``--size`` says otherwise."""
LABELS = {DEFAULT: "upstream", AA: "AA", "BLAS": "BLAS"}
"""Config -> the label of its process and log folder (``A/A`` is no file name)."""
CONFIGS = (DEFAULT, AA, "BLAS")
MAX_CASES = 2000
"""Cases per process above which the points are split, whole sizes at a time, into chunks."""

_SCHEMA = 1
_SIZE = re.compile(r"([0-9]{1,7})x([0-9]{1,7})")

RunCases = Callable[..., list[mm_bench.MmBenchCase]]


# ------------------------------------------------------------------------------------------------ plan


def projection_sizes(shape: ModelShape) -> list[tuple[int, int]]:
    """The (m, k) of a model's dense projections, ``W`` [k, m]: attention Q (n_heads*head_dim x d_model),
    O (d_model x n_heads*head_dim), K/V (n_kv_heads*head_dim x d_model), FFN gate/up (d_ff x d_model)
    and down (d_model x d_ff); deduplicated, sorted."""
    q = shape.n_heads * shape.head_dim
    kv = shape.n_kv_heads * shape.head_dim
    d, ff = shape.d_model, shape.d_ff
    return sorted({(q, d), (d, q), (kv, d), (ff, d), (d, ff)})


def like_sizes(names: Iterable[str]) -> list[tuple[int, int]]:
    """The projection sizes of the named models (``tuner/data/models.toml``), deduplicated, sorted.

    Raises:
        UsageError: An unknown model name.
    """
    return sorted({s for n in names for s in projection_sizes(load_model_shape(n))})


def parse_size(text: str) -> tuple[int, int]:
    """``MxK`` (e.g. ``4096x14336``: m rows of k values) as (m, k).

    Raises:
        UsageError: Not ``MxK`` with both in [1, 1048576].
    """
    m = _SIZE.fullmatch(text.strip().lower())
    if not m or not all(1 <= int(v) <= 1 << 20 for v in m.groups()):
        raise UsageError(f"Size {text!r} is not MxK with m and k in [1, 1048576] (e.g. 4096x14336).")
    return int(m.group(1)), int(m.group(2))


@dataclasses.dataclass(frozen=True, order=True, kw_only=True)
class MmqPoint:
    """One quant type, weight size and batch size; upstream's backend there."""

    type: str
    m: int
    k: int
    ne11: int
    upstream: str = "MMQ"

    @property
    def size(self) -> tuple[int, int]:
        return (self.m, self.k)

    @property
    def key(self) -> tuple[str, int, int, int]:
        return (self.type, self.m, self.k, self.ne11)

    @property
    def shape(self) -> mm_bench.MmShape:
        return mm_bench.MmShape(type=self.type, m=self.m, k=self.k, ne11=self.ne11)


def plan_points(
    cells: Sequence[MmqCell], sizes: Sequence[tuple[int, int]]
) -> tuple[list[MmqPoint], list[tuple[str, int, int]]]:
    """Every cell (type, ne11 from :func:`tuner.sweep.mmq.plan_mmq`) at every size, sizes outermost; and
    the (type, m, k) left out because ``k`` is no multiple of the type's block (llama.cpp stores such a
    tensor in another type)."""
    points, skipped = [], []
    for m, k in sorted(set(sizes)):
        for c in cells:
            if k % block_size(c.type) == 0:
                points.append(MmqPoint(type=c.type, m=m, k=k, ne11=c.ne11, upstream=c.upstream))
            elif (c.type, m, k) not in skipped:
                skipped.append((c.type, m, k))
    return points, skipped


def chunk_points(points: Sequence[MmqPoint], max_cases: int = MAX_CASES) -> list[list[MmqPoint]]:
    """The points packed, whole sizes at a time in the given order, into chunks of at most ``max_cases``
    (a size with more points is a chunk of its own); one chunk when everything fits."""
    return pack_groups(points, lambda p: p.size, max_cases)


def round_configs(round_index: int) -> list[str]:
    """The configs of one round in its rotated order (one process each per chunk)."""
    return rotated(list(CONFIGS), round_index)


def blas_env(types: Iterable[str]) -> dict[str, str]:
    """The environment forcing cuBLAS for every one of ``types`` at every batch size."""
    choices = [MmqChoice(type=t, lo=0, hi=None, backend="BLAS") for t in sorted(set(types))]
    return {mm_bench.ENV: mmq_env(choices)}


# --------------------------------------------------------------------------------------------- storage


@dataclasses.dataclass(frozen=True, kw_only=True)
class MmqSample:
    """One (point, config, round): microseconds per multiplication, or None with the reason it failed."""

    type: str
    m: int
    k: int
    ne11: int
    config: str
    round: int
    us_per_op: float | None
    error: str

    @property
    def ok(self) -> bool:
        return self.us_per_op is not None and not self.error

    @property
    def key(self) -> tuple[str, int, int, int]:
        return (self.type, self.m, self.k, self.ne11)


class MmqStore:
    """Samples in a SQLite file (one row per point, config and round) and the identity of the run
    (arch, backend, build, timer, ops, ``target_ms``, cache size and ``cuda_graphs``): a later run with another identity
    is refused."""

    def __init__(self, path: Path, identity: Mapping[str, str]) -> None:
        self.path = Path(path)
        self.db = open_store(
            self.path,
            {"schema": str(_SCHEMA), "sweep": "mmq", **identity},
            table_sql="CREATE TABLE IF NOT EXISTS mm_samples (type TEXT NOT NULL, m INTEGER NOT NULL, "
            "k INTEGER NOT NULL, ne11 INTEGER NOT NULL, config TEXT NOT NULL, round INTEGER NOT NULL, "
            "us_per_op REAL, error TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (type, m, k, ne11, config, round))",
            what="an MMQ sweep storage",
            fix="Pass another --storage, or the same build, backend, --iters, --cache-mb and CUDA graph setting.",
            strict=True,
            # files made before these options were measured with graphs on and ITERS ops a case
            legacy={"cuda_graphs": "on", "target_ms": "0"},
        )

    def close(self) -> None:
        self.db.close()

    def set_limits(self, limits: tuple[int, int]) -> None:
        """Record the round limits of this run (:func:`tuner.sweep.store.write_limits`)."""
        write_limits(self.db, limits)

    def limits(self) -> tuple[int, int]:
        """The round limits of the last run; (n, n) for a file made before they were recorded (fixed rounds:
        every one of its n rounds, one look)."""
        return read_limits(self.db, "mm_samples")

    def recorded(self, config: str, round_index: int) -> set[tuple[str, int, int, int]]:
        """(type, m, k, ne11) of every sample of ``config`` in round ``round_index``, failed ones included."""
        rows = self.db.execute(
            "SELECT type, m, k, ne11 FROM mm_samples WHERE config = ? AND round = ?", (config, round_index)
        )
        return {(str(t), int(m), int(k), int(n)) for t, m, k, n in rows}

    def forget(self, round_index: int, keys: Iterable[tuple[str, int, int, int]]) -> None:
        """Delete every config's sample of round ``round_index`` at the points ``keys`` (a round to measure again)."""
        with self.db:
            self.db.executemany(
                "DELETE FROM mm_samples WHERE type = ? AND m = ? AND k = ? AND ne11 = ? AND round = ?",
                [(*key, round_index) for key in keys],
            )

    def add(self, samples: Iterable[MmqSample]) -> None:
        now = time.time()
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO mm_samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(s.type, s.m, s.k, s.ne11, s.config, s.round, s.us_per_op, s.error, now) for s in samples],
            )

    def samples(self) -> list[MmqSample]:
        rows = self.db.execute(
            "SELECT type, m, k, ne11, config, round, us_per_op, error FROM mm_samples "
            "ORDER BY type, m, k, ne11, config, round"
        )
        return [
            MmqSample(
                type=str(t), m=int(m), k=int(k), ne11=int(n), config=str(c), round=int(r),
                us_per_op=None if us is None else float(us), error=str(e),
            )
            for t, m, k, n, c, r, us, e in rows
        ]  # fmt: skip


# --------------------------------------------------------------------------------------------- measure


def _failed(p: MmqPoint, cfg: str, r: int, why: str) -> MmqSample:
    return MmqSample(type=p.type, m=p.m, k=p.k, ne11=p.ne11, config=cfg, round=r, us_per_op=None, error=why)


def _first_rounds(chunks: Sequence[Sequence[MmqPoint]], lo: int, store: MmqStore) -> list[tuple[str, list[MmqPoint]]]:
    """(config, its points not recorded yet) of every process of the first ``lo`` rounds, which every point gets."""
    out = []
    for chunk in chunks:
        for r in range(lo):
            for cfg in round_configs(r):
                have = store.recorded(cfg, r)
                out.append((cfg, [p for p in chunk if p.key not in have]))
    return out


def run_mmq_live(
    points: Sequence[MmqPoint],
    *,
    limits: tuple[int, int],
    store: MmqStore,
    bin_dir: Path,
    backend: str,
    log_dir: Path,
    run_cases: RunCases | None = None,
    iters: int = 50,
    cache_mb: int = 128,
    max_cases: int = MAX_CASES,
    forced_reason: str = "",
    cuda_graphs: bool = True,
    target_ms: int = 0,
    budget: SweepBudget | None = None,
) -> tuple[int, int]:
    """Measure what ``store`` does not hold yet: per chunk, sequential rounds (:func:`open_chunk_points`),
    one process per config and round over the points that get the round (module doc); with ``budget``, none
    that would end past its deadline (:class:`tuner.search.screen.BudgetReached`).

    ``limits``: (min_rounds, max_rounds), recorded in ``store``. ``run_cases``: what runs one process
    (:func:`tuner.measure.mm_bench.run_cases`, the default; tests pass a fake). ``forced_reason``: why the
    forced config cannot run (a build without the MMQ hook); its samples are then stored failed with it, no
    process started. ``cuda_graphs`` False runs every config's process with ggml's CUDA graphs off
    (:data:`tuner.measure.mm_bench.GRAPHS_ENV`); ``target_ms`` is mm-bench's ``-m`` (0: ``iters`` ops a
    case). Prints a line per chunk and round with its time and the
    ETA. Returns (processes run, processes skipped as already recorded).
    """
    lo, hi = check_limits(limits)
    store.set_limits(limits)
    run = run_cases or mm_bench.run_cases
    chunks = chunk_points(points, max_cases)
    env = blas_env(p.type for p in points)

    def runs(cfg: str) -> bool:
        return not forced_reason or cfg in (DEFAULT, AA)

    first = _first_rounds(chunks, lo, store)
    first_cases = sum(len(ps) for cfg, ps in first if runs(cfg))
    first_procs = sum(1 for cfg, ps in first if ps and runs(cfg))
    later = (hi - lo) * OPEN_SHARE * len(points) * len(CONFIGS)
    per_case = (PROCESS_S - START_S) / PROCESS_CASES
    log.info(
        f"sweep mmq: {len(points)} points in {len(chunks)} chunk(s), {rounds_text(limits)}; first {lo} rounds: "
        f"{first_procs} processes ({first_cases} cases) to run, {sum(1 for _, ps in first if not ps)} already "
        f"recorded; estimated at the H100 sweep's rate {format_seconds(first_procs * START_S + first_cases * per_case)}"
        + (f", and about {round(later)} cases more if {OPEN_SHARE:.0%} of the points stay open" if hi > lo else "")
    )

    def measure(ci: int, r: int, cfg: str, ps: list[MmqPoint]) -> int:
        out = run(
            bin_dir,
            [p.shape for p in ps],
            {} if cfg in (DEFAULT, AA) else env,
            log_dir=log_dir / f"chunk{ci:04d}" / f"r{r}" / LABELS[cfg],
            backend=backend,
            iters=iters,
            cache_mb=cache_mb,
            timeout=120.0 + 5.0 * len(ps),
            cuda_graphs=cuda_graphs,
            target_ms=target_ms,
        )
        samples = []
        for p, c in zip(ps, out, strict=True):
            us = c.us_per_op if c.us_per_op is not None and not c.error else None
            bad = us is None or not (math.isfinite(us) and us > 0)
            why = (c.error or f"time {c.us_per_op!r} us is not a positive number") if bad else ""
            samples.append(
                MmqSample(type=p.type, m=p.m, k=p.k, ne11=p.ne11, config=cfg, round=r, us_per_op=us, error=why)
            )
        store.add(samples)
        return sum(1 for smp in samples if smp.error)

    ran = skipped = done = 0
    start = time.monotonic()
    for ci, chunk in enumerate(chunks):
        for r in range(hi):
            want = open_chunk_points(chunk, store.samples(), r, limits)
            if not want:
                break
            t0, n_round, failed = time.monotonic(), 0, 0
            keys = [p.key for p in want]
            todo = whole_round(store, dict.fromkeys(round_configs(r), keys), r, f"chunk {ci + 1} round {r + 1}")
            est = sum(START_S + len(ks) * per_case for cfg, ks in todo if ks and runs(cfg))
            t_r = budget.start(est, f"chunk {ci + 1} round {r + 1}") if budget and est else 0.0
            for cfg, ks in todo:
                missing = [p for p in want if p.key in ks]
                if not missing:
                    skipped += 1
                elif not runs(cfg):
                    store.add(_failed(p, cfg, r, forced_reason) for p in missing)
                else:
                    failed += measure(ci, r, cfg, missing)
                    ran += 1
                    n_round += len(missing)
            if budget and est:
                budget.done(est, t_r)
            if n_round:
                done += n_round
                eta = (time.monotonic() - start) / done * max(0.0, first_cases + later - done)
                log.info(
                    f"chunk {ci + 1}/{len(chunks)} round {r + 1}/{hi}: {len(want)} points, {n_round} cases in "
                    f"{time.monotonic() - t0:.1f} s" + (f", {failed} failed" if failed else "")
                    + f"; {done} cases done, ETA ~{format_seconds(eta)}"
                )  # fmt: skip
    return ran, skipped


def rounds_text(limits: tuple[int, int]) -> str:
    """The round limits in words (the report's, the log's and the patch note's)."""
    lo, hi = limits
    if lo == hi:
        return f"{lo} rounds"
    return f"{lo} rounds for every point, up to {hi} for the points whose verdict is still open"


# ----------------------------------------------------------------------------------------------- rounds

SampleMap = Mapping[tuple[tuple[str, int, int, int], str, int], MmqSample]


def point_values(p: MmqPoint, got: SampleMap, max_rounds: int) -> tuple[dict[str, list[float]], str]:
    """One point's throughput per config over its complete rounds, and why it has no verdict ("" if none).

    The point's rounds are the leading rounds ``0 .. n-1`` (``n <= max_rounds``) in which every config has a
    sample: a point that stopped early (settled) has fewer than the others. A failed sample among them
    leaves the point without a verdict, with the first such reason."""
    n = 0
    while n < max_rounds and all((p.key, cfg, n) in got for cfg in CONFIGS):
        n += 1
    values: dict[str, list[float]] = {}
    why = ""
    for r in range(n):
        for cfg in CONFIGS:
            s = got[(p.key, cfg, r)]
            if not s.ok or s.us_per_op is None:
                why = why or f"{LABELS[cfg]} round {r + 1}: {s.error}"
                continue
            values.setdefault(cfg, []).append(1e6 / s.us_per_op)
    return values, why


def point_verdicts(
    points: Sequence[MmqPoint], samples: Iterable[MmqSample], *, limits: tuple[int, int], below: int | None = None
) -> tuple[dict[tuple[str, tuple[int, int]], dict[int, CellStats]], dict[tuple[str, int, int, int], str]]:
    """(stats of the points with enough rounds for a verdict, by (type, size) and ne11; the others and why),
    from the samples of rounds ``< below`` (default ``max_rounds``). A point needs ``min_rounds`` complete
    rounds; its looks are ``limits`` (:func:`tuner.sweep.rounds.cell_stats`)."""
    lo, hi = limits
    top = hi if below is None else min(below, hi)
    got = {(s.key, s.config, s.round): s for s in samples if s.round < top}
    stats: dict[tuple[str, tuple[int, int]], dict[int, CellStats]] = {}
    gaps: dict[tuple[str, int, int, int], str] = {}
    for p in points:
        values, why = point_values(p, got, top)
        n = len(values.get(DEFAULT, ()))
        if not why and n < lo:
            cfg = next((x for x in CONFIGS if (p.key, x, n) not in got), DEFAULT)
            why = f"{LABELS[cfg]} round {n + 1}: not measured"
        if why:
            gaps[p.key] = why
        else:
            stats.setdefault((p.type, p.size), {})[p.ne11] = cell_stats(p.ne11, p.upstream, values, limits)
    return stats, gaps


def open_chunk_points(
    chunk: Sequence[MmqPoint], samples: Iterable[MmqSample], r: int, limits: tuple[int, int]
) -> list[MmqPoint]:
    """The points of ``chunk`` (whole (type, size) families: :func:`chunk_points`) that get round ``r``
    (0-based), in the chunk's order: every point below ``min_rounds``; from there the points with all ``r``
    rounds (none failed) whose batch size is still open by the decision rule over their type and size's
    batch sizes (:func:`tuner.sweep.rounds.open_in_round`), judged on the samples of rounds ``< r`` only, so
    that a resumed run takes the same decisions. A settled point, or one that stopped, gets no more rounds."""
    return open_for_round(
        chunk,
        r,
        limits,
        lambda below: point_verdicts(chunk, samples, limits=limits, below=below)[0],
        lambda _: "pp",
        lambda p: ((p.type, p.size), p.ne11),
    )


# --------------------------------------------------------------------------------------------- compose


@dataclasses.dataclass(frozen=True, kw_only=True)
class MmqOutcome:
    """A measured MMQ sweep: per (type, size) its cells' stats and decisions, the points without a
    verdict and why, per type the batch-size decisions over all its sizes, and the composed choices."""

    stats: Mapping[tuple[str, tuple[int, int]], Mapping[int, CellStats]]
    decisions: Mapping[tuple[str, tuple[int, int]], Sequence[Decision]]
    no_verdict: Mapping[tuple[str, int, int, int], str]
    type_decisions: Mapping[str, Sequence[Decision]]
    choices: tuple[MmqChoice, ...]
    withheld: str = ""
    """Why no choice is composed whatever the verdicts (a backend without the choice), else empty."""


def _gap(ne11: int, upstream: str, why: str) -> Decision:
    nan = math.nan
    return Decision(
        phase="pp", depth=ne11, upstream_kernel=upstream, winner=None, effect_pct=0.0, ci=(nan, nan),
        noise_pct=nan, reason=f"no verdict: {why}",
    )  # fmt: skip


def _type_decision(t: str, ne11: int, sizes: Sequence[tuple[int, int]], outcome_ds: Mapping[Any, Any]) -> Decision:
    """cuBLAS wins ``ne11`` for type ``t`` only where it won at every size (module doc)."""
    won: list[Decision] = []
    blocked = []
    for size in sizes:
        d = next((x for x in outcome_ds.get((t, size), ()) if x.depth == ne11), None)
        if d is None or d.winner != "BLAS":
            why = "not measured" if d is None else ("no verdict" if "no verdict" in d.reason else "MMQ stays")
            why = "too noisy" if d is not None and TOO_NOISY in d.reason else why
            blocked.append(f"{size[0]}x{size[1]} ({why})")
        else:
            won.append(d)
    if blocked or not won:
        return _gap(ne11, "MMQ", "cuBLAS not faster at every size: " + ", ".join(blocked))
    worst = min(won, key=lambda d: d.effect_pct)
    return dataclasses.replace(
        worst, reason=f"cuBLAS faster at all {len(won)} sizes (smallest gain {worst.effect_pct:+.1f}%)"
    )


def compose_live(
    points: Sequence[MmqPoint], samples: Iterable[MmqSample], *, limits: tuple[int, int], withhold: str = ""
) -> MmqOutcome:
    """Verdicts and choices from the stored samples of rounds ``0 .. max_rounds-1`` (module doc).

    A point has a verdict when every config has a good sample in each of its rounds and it has at least
    ``min_rounds`` of them (:func:`point_verdicts`). ``withhold``: a reason to compose no choice (the backend
    has no MMQ-vs-cuBLAS choice); verdicts are still reported.
    """
    stats, gaps = point_verdicts(points, samples, limits=limits)
    decisions: dict[tuple[str, tuple[int, int]], list[Decision]] = {}
    for key in sorted({(p.type, p.size) for p in points}):
        ds = decide("pp", stats[key]) if key in stats else []
        ds += [_gap(n, "MMQ", w) for (t, m, k, n), w in gaps.items() if (t, (m, k)) == key]
        decisions[key] = sorted(ds, key=lambda d: d.depth)
    type_ds: dict[str, list[Decision]] = {}
    choices: list[MmqChoice] = []
    for t in sorted({p.type for p in points}):
        sizes = sorted({p.size for p in points if p.type == t})
        type_ds[t] = [_type_decision(t, n, sizes, decisions) for n in sorted({p.ne11 for p in points if p.type == t})]
        if not withhold:
            choices += [
                MmqChoice(type=t, lo=r.lo, hi=r.hi, backend=r.kernel) for r in rules_from(type_ds[t], Shape(kv=None))
            ]
    return MmqOutcome(
        stats=stats, decisions=decisions, no_verdict=gaps, type_decisions=type_ds, choices=tuple(choices),
        withheld=withhold,
    )  # fmt: skip


def no_choice_text(outcome: MmqOutcome) -> str:
    """Why nothing was composed, in words."""
    if outcome.withheld:
        return f"withheld: {outcome.withheld}"
    if not outcome.stats:
        return "no point has a verdict"
    return "MMQ (upstream's choice) stays: at no batch size was cuBLAS faster at every size of a type"


def _cell_text(st: CellStats | None, d: Decision | None, why: str | None) -> str:
    """One point in the report: cuBLAS's speed over MMQ (MMQ time / cuBLAS time) with its 95% CI, the A/A
    noise, the verdict."""
    if why is not None:
        return "no verdict"
    e = None if st is None else st.effects.get("BLAS")
    if st is None or e is None:
        return "-"
    ci = f"[{e.ci_low:.3f}, {e.ci_high:.3f}]" if math.isfinite(e.ci_low) else "[n/a]"
    verdict = "cuBLAS" if d is not None and d.winner == "BLAS" else "MMQ"
    if d is not None and d.winner is None and TOO_NOISY in d.reason:
        verdict += " (size too noisy)"  # its own interval may look clear; the size's A/A noise decides (legend)
    return f"{e.ratio:.3f} {ci} ±{st.noise_pct:.1f}% {verdict}"


def _type_table(outcome: MmqOutcome, t: str, points: Sequence[MmqPoint]) -> list[str]:
    sizes = sorted({p.size for p in points if p.type == t})
    lines = [
        f"### {t}",
        "",
        "| ne11 | " + " | ".join(f"{m}x{k}" for m, k in sizes) + " | over all sizes |",
        "|---:|" + "---|" * (len(sizes) + 1),
    ]
    for td in outcome.type_decisions.get(t, ()):
        n = td.depth
        row = []
        for size in sizes:
            st = outcome.stats.get((t, size), {}).get(n)
            d = next((x for x in outcome.decisions.get((t, size), ()) if x.depth == n), None)
            row.append(_cell_text(st, d, outcome.no_verdict.get((t, size[0], size[1], n))))
        verdict = "**cuBLAS**" if td.winner == "BLAS" else "MMQ stays"
        lines.append(f"| {n} | " + " | ".join(row) + f" | {verdict}: {td.reason.removeprefix('no verdict: ')} |")
    return [*lines, ""]


def _graphs_text(setting: Any) -> list[str]:
    """The report's sentence on CUDA graphs, from the identity's ``cuda_graphs``."""
    if setting == "off":
        return [
            "",
            "CUDA graphs were off in every process (`GGML_CUDA_DISABLE_GRAPHS=1`): each case's graph of "
            "multiplications ran directly, kernel by kernel.",
        ]
    if setting == "on":
        return [
            "",
            "CUDA graphs were on in every process, as in llama.cpp's CUDA builds: ggml's CUDA backend captured each "
            "case's graph of multiplications in its second warm-up run and the timed run replayed it.",
        ]
    return []


def _rounds_line(outcome: MmqOutcome, limits: tuple[int, int]) -> list[str]:
    """The report's count of points per number of rounds they got (sequential rounds only)."""
    if limits[1] == limits[0]:
        return []
    by_n: dict[int, int] = {}
    for st in outcome.stats.values():
        for c in st.values():
            n = len(c.series[UPSTREAM])
            by_n[n] = by_n.get(n, 0) + 1
    return ["- rounds a point with a verdict got: " + ", ".join(f"{n}: {k} points" for n, k in sorted(by_n.items()))]


def report_text(
    outcome: MmqOutcome,
    points: Sequence[MmqPoint],
    *,
    limits: tuple[int, int],
    identity: Mapping[str, Any],
    skipped: Sequence[tuple[str, int, int]] = (),
    patch: bool,
) -> str:
    """report.md: what was measured, the composed choices, per type and batch size every size's ratio, and
    every point without a verdict."""
    n_gap = len(outcome.no_verdict)
    types = sorted({p.type for p in points})
    sizes = sorted({p.size for p in points})
    lines = [
        "# MMQ vs cuBLAS sweep",
        "",
        *(f"- {k}: {v}" for k, v in identity.items()),
        f"- points: {len(points)} ({len(types)} types, {len(sizes)} sizes m x k: "
        f"{', '.join(f'{m}x{k}' for m, k in sizes)}; batch sizes {sorted({p.ne11 for p in points})}), "
        f"paired rounds: {rounds_text(limits)}",
        f"- points with a verdict: {len(points) - n_gap}; without one: {n_gap}",
        *_rounds_line(outcome, limits),
        *(
            [f"- not swept (k not a multiple of the type's block): {', '.join(f'{t} {m}x{k}' for t, m, k in skipped)}"]
            if skipped
            else []
        ),
        "",
        "Per round, one mm-bench process per config over every point that gets the round: upstream's choice (MMQ), "
        "the same again (the A/A pair) and cuBLAS forced through `GGML_TUNER_MMQ_CHOICES`, in an order rotated from "
        "round to round. "
        + (
            f"Every point gets {limits[0]} rounds; a further round, up to {limits[1]}, goes only to the points whose "
            "verdict is still open (neither claimed nor settled by futility, the search's settle rule), and a "
            "point's p-value is divided by the share of alpha of the round count it stopped at before Holm over "
            "its type and size's batch sizes. "
            if limits[1] > limits[0]
            else ""
        )
        + "A cell below is `MMQ time / cuBLAS time` (above 1: cuBLAS faster) with its 95% CI, the A/A noise and the "
        "verdict there (cuBLAS only where the decision rule, A/A-controlled, calls it faster; `MMQ (size too noisy)` "
        f"where the size's A/A noise, the median over its batch sizes, is above the {NOISE_CEILING_PCT:g}% ceiling, so "
        "none of its batch sizes claims anything, whatever its own interval). A batch size goes "
        "to cuBLAS for a type only where cuBLAS won at every size of that type; consecutive such batch sizes form "
        "one choice, `TYPE:LO..HI=BLAS` (ne11 in [LO, HI)).",
        *_graphs_text(identity.get("cuda_graphs")),
        "",
        "## Composed choices",
        "",
        *([f"- `{c.text}`" for c in outcome.choices] or [f"None: {no_choice_text(outcome)}."]),
        "",
        "`upstream.patch` adds them to `ggml_cuda_should_use_mmq`." if patch else "No `upstream.patch`.",
        "",
        "## Per type and batch size",
        "",
    ]
    for t in types:
        lines += _type_table(outcome, t, points)
    if n_gap:
        lines += ["## Points without a verdict", ""]
        lines += [f"- {t} {m}x{k} ne11 {n}: {why}" for (t, m, k, n), why in sorted(outcome.no_verdict.items())]
    return "\n".join(lines).rstrip("\n") + "\n"

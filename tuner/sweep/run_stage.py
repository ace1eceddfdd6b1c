"""The stages of ``tuner sweep run`` (:func:`run_fa`) and ``tuner sweep mmq`` (:func:`run_mmq`).

A ``--time-budget`` stop is a :class:`tuner.rounds.budget.BudgetReached` out of the rounds, every sample stored.
:func:`default_build` is the sweeps' default build: the one ``tuner sweep run``, ``mmq`` and ``confirm`` use without
``--build``.
"""

from __future__ import annotations

import dataclasses
import functools
from contextlib import closing
from pathlib import Path
from typing import ClassVar

from tuner import log, source
from tuner.builder.cmake import build_variant, ensure_targets
from tuner.errors import TunerError, UsageError
from tuner.measure import fa_bench, mm_bench
from tuner.measure import kernel_bench as kb
from tuner.measure.exe import find_bin_dir
from tuner.plan.render import render_variant
from tuner.rounds.budget import Budget
from tuner.rounds.engine import pack_groups, rounds_text
from tuner.rounds.store import SampleStore, device_identity
from tuner.sweep import grid, live, mmq
from tuner.sweep.grid import Cell
from tuner.sweep.table import render_table_patch
from tuner.targets.archs import Arch, detect_local_archs, load_arch
from tuner.targets.target import resolve_target


@dataclasses.dataclass(frozen=True, kw_only=True)
class Grid:
    """The FlashAttention grid's flags as given; empty: the grid's default (decode at octave n_kv points)."""

    head_sizes: tuple[int, ...] = ()
    gqa_ratios: tuple[int, ...] = ()
    kv_types: tuple[str, ...] = ()
    query_batches: tuple[int, ...] = ()
    n_kv: tuple[int, ...] | None = None

    def cells(self, arch: Arch) -> list[Cell]:
        """The grid's cells on ``arch`` (:func:`tuner.sweep.grid.plan`; its UsageError for bad input)."""
        return grid.plan(
            arch,
            head_sizes=self.head_sizes or grid.HEAD_SIZES,
            gqa_ratios=self.gqa_ratios or grid.GQA_RATIOS,
            kv_types=self.kv_types or grid.KV_TYPES,
            query_batches=self.query_batches or grid.DEFAULT_QUERY_BATCHES,
            n_kv=self.n_kv or grid.DEFAULT_N_KV,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Request:
    """What both sweeps take; ``build_dir`` None: the default build; ``target_ms`` None: 20 on GPU, 0 on CPU."""

    arch: str
    limits: tuple[int, int]
    build_dir: Path | None
    backend: str
    spec: str | None
    storage: Path | None
    out: Path
    target_ms: int | None
    time_budget: float | None

    STORE: ClassVar[str]
    EXE: ClassVar[str]

    @property
    def storage_path(self) -> Path:
        return self.storage or self.out / self.STORE

    @property
    def target(self) -> int:
        # the target only where the ops are a GPU's: the CPU backend (the tests' build) times 50 ops a case
        if self.target_ms is not None:
            return self.target_ms
        return 0 if self.backend.upper().startswith("CPU") else fa_bench.TARGET_MS

    def bin_dir(self) -> Path:
        """``--build``'s bin dir, or the sweeps' default build (:func:`default_build`)."""
        if self.build_dir is None:
            return default_build(self.arch, self.spec)
        return find_bin_dir(self.build_dir, self.EXE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaRequest(_Request):
    """``tuner sweep run``'s flags; ``timer`` None: fa-bench where it compiles."""

    STORE = "sweep.sqlite3"
    EXE = "test-backend-ops"
    grid: Grid
    chunk_cells: int
    timer: str | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class MmqRequest(_Request):
    """``tuner sweep mmq``'s flags (empty: the defaults; ``sizes``: ``MxK`` instead of ``like``'s)."""

    STORE = "mmq.sqlite3"
    EXE = "libggml.so"
    types: tuple[str, ...]
    batches: tuple[int, ...]
    like: tuple[str, ...]
    sizes: tuple[str, ...]
    iters: int
    cache_mb: int
    cuda_graphs: bool


def dry_run_fa(req: FaRequest) -> str:
    """What ``tuner sweep run`` would time for ``req``, with its estimate; nothing built or run."""
    arch = load_arch(req.arch)
    cells = req.grid.cells(arch)
    text = grid.dry_run_text(cells, rounds=req.limits[0], max_rounds=req.limits[1])
    text += live.estimate_text(cells, limits=req.limits, chunk_size=req.chunk_cells, target_ms=req.target)
    if arch.vendor == "amd":
        text += f"No {arch.name} GPU was timed here: the times above are estimated from an H100's processes.\n"
    return text


def dry_run_mmq(req: MmqRequest) -> str:
    """What ``tuner sweep mmq`` would time for ``req``, with its estimate; nothing built or run."""
    arch = load_arch(req.arch)
    points, _ = _mmq_points(req, arch)
    cells = mmq.plan_mmq(arch, req.types or mmq.MMQ_TYPES, req.batches or mmq.MMQ_BATCHES)
    sizes = sorted({(p.m, p.k) for p in points})
    chunks = len(pack_groups(points, mmq.MMQ.group, mmq.MAX_CASES))
    text = mmq.mmq_dry_run_text(cells, limits=req.limits, sizes=sizes, chunks=chunks)
    if arch.vendor == "amd":
        text += f"No {arch.name} GPU was timed here: the times above are an H100's.\n"
    return text


def pick_timer(timer: str | None, bin_dir: Path, target_ms: int = 0) -> tuple[live.RunRound, str]:
    """(run_round, name): fa-bench unless test-backend-ops is asked for or fa-bench does not compile."""
    if timer == "test-backend-ops":
        return kb.run_round, timer
    try:
        fa_bench.build_fa_bench(bin_dir)
    except TunerError as err:  # UsageError included: no shared libraries, headers or compiler
        if timer == "fa-bench":
            raise
        log.warning(f"fa-bench is not usable with this build: {err} Timing with test-backend-ops instead.")
        return kb.run_round, "test-backend-ops"
    if target_ms:
        return functools.partial(fa_bench.run_round_fast, target_ms=target_ms), "fa-bench"
    return fa_bench.run_round_fast, "fa-bench"


def _write(out: Path, patch: str | None, report: str) -> str:
    """report.md and, where given, upstream.patch in ``out`` (an older patch removed); the summary's last line."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "upstream.patch").unlink(missing_ok=True)
    if patch:
        (out / "upstream.patch").write_text(patch)
    (out / "report.md").write_text(report)
    return f"report: {out / 'report.md'}" + (f"\npatch: {out / 'upstream.patch'}" if patch else "")


def _summary(title: str, entries: list[str], none: str, n: int, n_gap: int, *, fa: bool) -> list[str]:
    """The summary's entries (or why there are none) and its counts of cells (``fa``) or points with a verdict."""
    noun, bad = ("cell", "mismatched") if fa else ("point", "missing")
    lines = [f"{title} ({len(entries)}):", *(f"  {e}" for e in entries)]
    lines += [] if entries else [f"  none: {none}"]
    lines.append(f"{noun}s with a verdict: {n - n_gap} of {n}")
    if n_gap:
        lines.append(f"{noun}s without a verdict: {n_gap} (a failed or {bad} sample; report.md lists each and why)")
    return lines


def run_fa(req: FaRequest) -> str:
    """``tuner sweep run``'s stage (module doc); UsageError (nothing measured) for bad input."""
    budget = Budget.counted_from(None, req.time_budget)  # the clock starts first
    arch = load_arch(req.arch)
    req = dataclasses.replace(req, backend=gpu_backend(arch, req.backend))  # as ggml names it on arch
    cells = req.grid.cells(arch)
    require_gpu(arch, req.backend, f"tuner sweep run --arch {arch.name} --dry-run")
    bin_dir, target_ms = req.bin_dir(), req.target
    run_round, timer = pick_timer(req.timer, bin_dir, target_ms)
    identity = {
        "arch": arch.name, "backend": req.backend, "build": str(bin_dir.resolve()), "n_head_kv": str(live.N_HEAD_KV),
        "timer": timer, **device_identity(bin_dir, req.backend),
    }  # fmt: skip
    fa = timer == "fa-bench"
    if fa:
        identity["target_ms"] = str(target_ms)
    with closing(SampleStore(live.TABLE, req.storage_path, identity)) as store:
        live.run_sweep(
            cells, limits=req.limits, store=store, bin_dir=bin_dir, backend=req.backend,
            log_dir=req.out / "logs", chunk_size=req.chunk_cells, run_round=run_round,
            case_s=live.fa_bench_case_s(target_ms) if fa else live.CASE_S,
            process_s=live.FA_BENCH_PROCESS_S if fa else live.PROCESS_S,
            expect_log=not req.backend.upper().startswith("CPU"), budget=budget,
        )  # fmt: skip
        outcome = live.compose(cells, store.samples(), limits=req.limits)
    patch = None
    if outcome.rules:
        note = (
            f"Kernel choices measured on {arch.name}: FLASH_ATTN_EXT per forced kernel, "
            f"{rounds_text(req.limits)} (paired)."
        )
        patch = render_table_patch(source.fetch_source(req.spec).root, outcome.rules, arch, note=note)
    paths = _write(
        req.out, patch, live.report_text(outcome, cells, limits=req.limits, identity=identity, patch=bool(patch))
    )
    rules = [r.text for r in outcome.rules]
    lines = _summary("rules", rules, live.no_rules_text(outcome), len(cells), outcome.n_gaps, fa=True)
    return "\n".join([*lines, paths])


def _mmq_points(req: MmqRequest, arch: Arch) -> tuple[list[mmq.MmqPoint], list[tuple[str, int, int]]]:
    """The request's points and the type/size pairs left out; UsageError for bad input or no point."""
    cells = mmq.plan_mmq(arch, req.types or mmq.MMQ_TYPES, req.batches or mmq.MMQ_BATCHES)
    sizes = [mmq.parse_size(t) for t in req.sizes] if req.sizes else mmq.like_sizes(req.like or mmq.DEFAULT_LIKE)
    points, skipped = mmq.plan_points(cells, sizes)
    upstream_blas = [p for p in points if p.upstream != "MMQ"]
    if upstream_blas:  # the sweep forces cuBLAS/hipBLAS against upstream's MMQ; the reverse is not swept yet
        log.warning(
            f"{len(upstream_blas)} point(s) where upstream already runs hipBLAS on {arch.name} "
            f"({', '.join(sorted({p.type for p in upstream_blas}))}) are left out: this sweep times hipBLAS "
            "against upstream's MMQ only."
        )
        points = [p for p in points if p.upstream == "MMQ"]
    if not points:
        raise UsageError(
            f"No point to time: every size's k ({sorted({k for _, k in sizes})}) is a multiple of none of the types' "
            "blocks (32 or 256 values). Pass other --size or --type values."
        )
    return points, skipped


def run_mmq(req: MmqRequest) -> str:
    """``tuner sweep mmq``'s stage (module doc); UsageError (nothing measured) for bad input."""
    budget = Budget.counted_from(None, req.time_budget)  # the clock starts first
    arch = load_arch(req.arch)
    req = dataclasses.replace(req, backend=gpu_backend(arch, req.backend))  # as ggml names it on arch
    points, skipped = _mmq_points(req, arch)
    require_gpu(arch, req.backend, f"tuner sweep mmq --arch {arch.name} --dry-run")
    bin_dir, cuda = req.bin_dir(), req.backend.upper().startswith(("CUDA", "ROCM"))  # a GPU backend: a choice
    identity = {
        "arch": arch.name, "backend": req.backend, "build": str(bin_dir.resolve()), "timer": "mm-bench",
        "iters": str(req.iters), "target_ms": str(req.target), "cache_mb": str(req.cache_mb),
        "cuda_graphs": "on" if req.cuda_graphs else "off", **device_identity(bin_dir, req.backend),
    }  # fmt: skip
    with closing(SampleStore(mmq.MMQ_TABLE, req.storage_path, identity)) as store:
        forced_reason, probe = "", req.out / "logs" / "hook-probe"  # why the forced config cannot run, if it cannot
        if cuda and not mm_bench.mmq_hook_present(bin_dir, log_dir=probe, backend=req.backend):
            log.warning(
                f"The build in {bin_dir} ignores GGML_TUNER_MMQ_CHOICES on {req.backend} (no MMQ hook in its mmq.cu; "
                f"probe log in {probe}): cuBLAS cannot be forced, so only upstream's config and its A/A twin run and "
                "no point gets a verdict. Build a variant with the hook and pass it to --build."
            )
            forced_reason = (
                "not run: the build has no MMQ hook (GGML_TUNER_MMQ_CHOICES is ignored), so cuBLAS cannot be forced"
            )
        mmq.run_mmq(
            points, limits=req.limits, store=store, bin_dir=bin_dir, backend=req.backend,
            log_dir=req.out / "logs", iters=req.iters, cache_mb=req.cache_mb, forced_reason=forced_reason,
            cuda_graphs=req.cuda_graphs, target_ms=req.target, budget=budget,
        )  # fmt: skip
        withhold = (
            "" if cuda else f"the {req.backend} backend has no MMQ-vs-cuBLAS choice (both configs ran the same code)"
        )
        outcome = mmq.compose_mmq(points, store.samples(), limits=req.limits, withhold=withhold)
    patch = None
    if outcome.choices:
        note = (
            f"cuBLAS is faster than MMQ for these types and batch sizes on {arch.name}: mm-bench, "
            f"{rounds_text(req.limits, 'point')} (paired), at every swept weight size."
        )
        patch = mmq.render_mmq_patch(source.fetch_source(req.spec).root, outcome.choices, arch, note=note)
    report = mmq.mmq_report_text(
        outcome, points, limits=req.limits, identity=identity, skipped=skipped, patch=bool(patch)
    )
    paths = _write(req.out, patch, report)
    choices = [c.text for c in outcome.choices]
    lines = _summary("choices", choices, mmq.no_choice_text(outcome), len(points), outcome.n_gaps, fa=False)
    if skipped:
        lines.append(f"type/size pairs not swept (k not a multiple of the type's block): {len(skipped)}")
    return "\n".join([*lines, paths])


def default_build(arch: str, spec: str | None, extra: tuple[str, ...] = ()) -> Path:
    """The bin dir of the arch's default variant of ``spec`` with the opt-in MMQ hook (one build for both sweeps)."""
    src = source.fetch_source(spec) if spec else source.fetch_source()
    variant = "hip" if load_arch(arch).vendor == "amd" else "cuda"
    rv = render_variant(src, arch, variant, local_archs=detect_local_archs(), hooks=("mmq",))
    with log.step(f"Building {rv.short} from {src.spec}"):
        b = build_variant(rv)
    if extra:
        b = ensure_targets(b, list(extra))
    return Path(b.bin_dir)


def gpu_backend(arch: Arch, backend: str) -> str:
    """``backend`` as ggml names it on ``arch``: the default ``CUDA0`` means ``ROCm0`` on an AMD arch."""
    return "ROCm0" if arch.vendor == "amd" and backend == "CUDA0" else backend


def require_gpu(arch: Arch, backend: str, dry_run: str) -> None:
    """An AMD sweep needs that GPU here, else the search's refusal (exit 2) naming ``dry_run``; CPU runs anywhere."""
    if arch.vendor != "amd" or backend.upper().startswith("CPU"):
        return
    resolve_target(
        arch.name,
        instead=f"`{dry_run}` to print what it would run and an estimate of its time (README, 'Tuning a Strix Halo')",
    )

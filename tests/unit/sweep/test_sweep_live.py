"""The measured FlashAttention sweep (tuner/sweep/live.py, a spec of tuner/rounds/engine.py) on a fake run_round: batching, rotation, resume, failed samples."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tuner.errors import UsageError
from tuner.measure import kernel_bench as kb
from tuner.measure.paired import rotated
from tuner.rounds.engine import pack_groups, round_processes
from tuner.rounds.store import SampleStore
from tuner.sweep import live
from tuner.sweep.grid import AA, DEFAULT, Cell, FaShape, plan, upstream_kernel
from tuner.targets.archs import load_arch

SM90 = load_arch("sm_90")
WIN = FaShape(D=64, gqa=4, kv="f16", ne1=1)  # upstream VEC everywhere; MMA planted faster
OTHER = FaShape(D=80, gqa=2, kv="f16", ne1=2)  # TILE/MMA only: no VEC process for it
N_KV = (2048, 4096, 8192, 16384)
SPEEDUP = 1.25
IDENT = {"arch": "sm_90", "backend": "CUDA0", "build": "/b", "n_head_kv": "8"}


def _cells(shapes: Sequence[FaShape] = (WIN, OTHER)) -> list[Cell]:
    return [c for c in plan(SM90, n_kv=N_KV) if c.shape in set(shapes)]


def _back(s: kb.FaShape) -> FaShape:
    return FaShape(D=s.head_dim, gqa=s.gqa, kv=s.kv_type, ne1=s.n_batch)


class FakeRunRound:
    """run_round's signature; records each call. MMA is SPEEDUP faster on WIN, every other forced kernel
    slower; ``wrong``: (shape, n_kv, label, call index) whose log names another kernel."""

    def __init__(self, *, wrong: set[tuple[FaShape, int, str]] = frozenset(), seed: int = 3) -> None:  # type: ignore[assignment]
        self.calls: list[tuple[str, list[kb.FaShape], Path]] = []
        self.wrong = wrong
        self.rng = random.Random(seed)

    def __call__(
        self,
        bin_dir: Path,
        shapes: Sequence[kb.FaShape],
        candidates: Mapping[str, Mapping[str, str]],
        *,
        log_dir: Path,
        backend: str,
        timeout: float,
    ) -> list[kb.KernelTime]:
        assert len(candidates) == 1, "one config per process"
        ((label, env),) = candidates.items()
        self.calls.append((label, list(shapes), log_dir))
        forced = None if not env else next(k for k in ("VEC", "TILE", "MMA") if env == kb.force_kernel_env(k))
        assert (forced is None) == (label in ("upstream", "AA"))
        drift = math.exp(self.rng.gauss(0, 0.01))  # per process: cancelled by pairing
        out = []
        for s in shapes:
            shape = _back(s)
            up = upstream_kernel(SM90, shape, s.n_kv)
            kernel = forced or up
            factor = 1.0 if kernel == up else (1 / SPEEDUP if (shape, kernel) == (WIN, "MMA") else 1.3)
            if (shape, s.n_kv, label) in self.wrong:
                kernel = "TILE" if kernel != "TILE" else "VEC"
            us = 10.0 * (1 + s.n_kv / 4096) * factor * drift * math.exp(self.rng.gauss(0, 0.002))
            out.append(
                kb.KernelTime(
                    label=label,
                    shape=s,
                    us_per_run=us,
                    runs=100,
                    kernel=kernel,
                    why="rule" if forced else "default",
                    backend=backend,
                )
            )
        return out


def _run(
    fake: FakeRunRound, store: SampleStore[live.FaKey], cells: Sequence[Cell], rounds: int, **kw: Any
) -> tuple[int, int]:
    return live.run_sweep(
        cells, limits=(rounds, rounds), store=store, bin_dir=Path("/b"), backend="CUDA0", log_dir=Path("/nonexistent"),
        run_round=fake, **kw,
    )  # fmt: skip


def test_bench_shape_maps_the_sweep_shape() -> None:
    s = live.bench_shape(FaShape(D=128, gqa=6, kv="q8_0", ne1=4), 8192)
    assert (s.head_dim, s.head_dim_v, s.n_kv, s.n_batch, s.kv_type) == (128, 128, 8192, 4, "q8_0")
    assert s.n_head_kv == live.N_HEAD_KV and s.gqa == 6


def test_one_process_per_config_round_and_chunk_with_its_legal_cells_only(tmp_path: Path) -> None:
    cells = _cells()
    fake = FakeRunRound()
    store = SampleStore(live.TABLE, tmp_path / "s.db", IDENT)
    ran, skipped = _run(fake, store, cells, 3, chunk_size=len(N_KV))  # one shape per chunk
    chunks = pack_groups(cells, live.FA.group, len(N_KV))
    assert len(chunks) == 2 and all(len({c.shape for c in ch}) == 1 for ch in chunks)
    expect = [
        (ci, r, cfg) for ci, ch in enumerate(chunks) for r in range(3) for cfg, _ in round_processes(live.FA, ch, r)
    ]
    assert (ran, skipped) == (len(expect), 0) and len(fake.calls) == len(expect)
    for (ci, r, cfg), (label, shapes, log_dir) in zip(expect, fake.calls, strict=True):
        assert label == live.LABELS[cfg] and log_dir.parts[-3:] == (f"chunk{ci:04d}", f"r{r}", label)
        want = [c for c in chunks[ci] if cfg in (DEFAULT, AA) or cfg in c.candidates]
        assert [(_back(s), s.n_kv) for s in shapes] == [(c.shape, c.n_kv) for c in want]
    # OTHER has no vector kernel: no VEC process in its chunk; each forced process covers only candidates
    assert not any(lbl == "VEC" and _back(sh[0]) == OTHER for lbl, sh, _ in fake.calls)
    samples = store.samples()
    assert len(samples) == 3 * sum(len(c.configs) for c in cells) and all(s.ok for s in samples)


def test_config_order_rotates_from_round_to_round(tmp_path: Path) -> None:
    cells = _cells([WIN])
    fake = FakeRunRound()
    _run(fake, SampleStore(live.TABLE, tmp_path / "s.db", IDENT), cells, 3)
    base = [live.LABELS[c] for c in cells[0].configs]  # default, A/A, TILE, MMA
    got = [lbl for lbl, _, _ in fake.calls]
    assert got == [x for r in range(3) for x in rotated(base, r)]
    assert got[: len(base)] != got[len(base) : 2 * len(base)]


def test_a_rerun_skips_recorded_rounds_and_resumes_the_rest(tmp_path: Path) -> None:
    cells = _cells()
    store = SampleStore(live.TABLE, tmp_path / "s.db", IDENT)
    first = FakeRunRound()
    ran2, _ = _run(first, store, cells, 2)
    again = FakeRunRound()
    assert _run(again, store, cells, 2) == (0, ran2) and again.calls == []
    more = FakeRunRound()
    ran3, skipped3 = _run(more, store, cells, 3)
    assert skipped3 == ran2 and ran3 == len(more.calls) > 0
    rounds_run = {int(log_dir.parts[-2][1:]) for _, _, log_dir in more.calls}
    assert rounds_run == {2}
    store.close()
    # a new process finds the file and resumes too
    reopened = SampleStore(live.TABLE, tmp_path / "s.db", IDENT)
    assert _run(FakeRunRound(), reopened, cells, 3) == (0, ran3 + skipped3)


def test_storage_of_another_build_is_refused(tmp_path: Path) -> None:
    SampleStore(live.TABLE, tmp_path / "s.db", IDENT).close()
    with pytest.raises(UsageError, match="another build"):
        SampleStore(live.TABLE, tmp_path / "s.db", {**IDENT, "build": "/other"})


def test_storage_of_another_device_is_refused_and_an_older_one_records_it(tmp_path: Path) -> None:
    """An H100 run resumed on an H200 (both lent as "one GPU") would mix two devices' timings in one file."""
    h100, h200 = {**IDENT, "device": "NVIDIA H100 80GB HBM3"}, {**IDENT, "device": "NVIDIA H200"}
    SampleStore(live.TABLE, tmp_path / "s.db", h100).close()
    with pytest.raises(
        UsageError, match=r"measured on NVIDIA H100 80GB HBM3, but this machine measures on NVIDIA H200"
    ):
        SampleStore(live.TABLE, tmp_path / "s.db", h200)
    SampleStore(live.TABLE, tmp_path / "s.db", h100).close()  # the same device resumes
    SampleStore(live.TABLE, tmp_path / "old.db", IDENT).close()  # made before the device was recorded
    SampleStore(live.TABLE, tmp_path / "old.db", h200).close()  # resumes, and records the device from now on
    with pytest.raises(UsageError, match="measured on NVIDIA H200"):
        SampleStore(live.TABLE, tmp_path / "old.db", h100)


def test_planted_winner_composes_and_a_mismatch_leaves_its_cell_without_a_verdict(tmp_path: Path) -> None:
    cells = _cells([WIN])
    store = SampleStore(live.TABLE, tmp_path / "s.db", IDENT)
    _run(FakeRunRound(), store, cells, 5)
    clean = live.compose(cells, store.samples(), limits=(5, 5))
    assert not clean.no_verdict
    assert [(r.lo, r.hi, r.kernel) for r in clean.rules] == [(0, None, "MMA")]

    store2 = SampleStore(live.TABLE, tmp_path / "s2.db", IDENT)
    _run(FakeRunRound(wrong={(WIN, N_KV[1], "MMA")}), store2, cells, 5)
    bad = [s for s in store2.samples() if s.error]
    assert bad and all(s.us is None and (s.key[1], s.config) == (N_KV[1], "MMA") for s in bad)
    assert all("TILE ran (rule), not MMA" in s.error for s in bad)
    out = live.compose(cells, store2.samples(), limits=(5, 5))
    assert set(out.no_verdict[WIN]) == {N_KV[1]} and N_KV[1] not in out.stats[WIN]
    # the gap splits the interval: no rule covers the point that was not measured
    assert [(r.lo, r.hi) for r in out.rules] == [(0, N_KV[1]), (N_KV[2], None)]
    assert not any(r.covers(N_KV[1]) for r in out.rules)
    text = live.report_text(out, cells, limits=(5, 5), identity=IDENT, patch=False)
    assert f"{WIN.key} n_kv {N_KV[1]}: MMA round 1: TILE ran (rule), not MMA" in text
    # the per-cell table: the measured points with the forced kernel's speed and the decision, the gap named
    rows = [ln for ln in text.splitlines() if ln.startswith(f"| {N_KV[0]} |") or ln.startswith(f"| {N_KV[1]} |")]
    assert len(rows) == 2 and "MMA (+" in rows[0] and "no verdict (below)" in rows[1]
    assert "one timer process per round" in text  # IDENT names no timer: nothing is claimed about which ran
    named = live.report_text(out, cells, limits=(5, 5), identity={**IDENT, "timer": "fa-bench"}, patch=False)
    assert "one fa-bench (`tuner/data/fa_bench.cpp`" in named and "test-backend-ops" not in named


def test_rounds_not_measured_leave_cells_without_a_verdict(tmp_path: Path) -> None:
    cells = _cells([WIN])
    store = SampleStore(live.TABLE, tmp_path / "s.db", IDENT)
    _run(FakeRunRound(), store, cells, 2)
    out = live.compose(cells, store.samples(), limits=(3, 3))
    assert set(out.no_verdict[WIN]) == set(N_KV) and not out.rules
    assert all("round 3: not measured" in w for w in out.no_verdict[WIN].values())


def test_judge_sample_needs_the_asked_kernel() -> None:
    cell = next(c for c in _cells([WIN]) if c.n_kv == N_KV[0])
    s = live.bench_shape(cell.shape, cell.n_kv)

    def kt(us: float | None, kernel: str | None, error: str = "") -> kb.KernelTime:
        return kb.KernelTime(
            label="x", shape=s, us_per_run=us, runs=1, kernel=kernel, why=None, backend="B", error=error
        )

    assert live.judge_sample(cell, DEFAULT, kt(5.0, cell.upstream), expect_log=True) == (5.0, "")
    assert live.judge_sample(cell, "MMA", kt(5.0, "MMA"), expect_log=True) == (5.0, "")
    assert live.judge_sample(cell, "MMA", kt(5.0, cell.upstream), expect_log=True)[0] is None
    assert live.judge_sample(cell, DEFAULT, kt(5.0, None), expect_log=True)[0] is None
    assert live.judge_sample(cell, AA, kt(5.0, None), expect_log=False) == (5.0, "")  # CPU: nothing to check
    assert live.judge_sample(cell, "MMA", kt(5.0, None), expect_log=False)[0] is None  # cannot confirm a force
    assert live.judge_sample(cell, DEFAULT, kt(None, None, "timed out"), expect_log=False) == (None, "timed out")
    assert live.judge_sample(cell, DEFAULT, kt(0.0, cell.upstream), expect_log=True)[0] is None


def test_chunks_keep_shapes_whole() -> None:
    cells = _cells()
    for size in (1, 3, len(N_KV), len(cells)):
        chunks = pack_groups(cells, live.FA.group, size)
        assert [c for ch in chunks for c in ch] == cells
        shapes = [{c.shape for c in ch} for ch in chunks]
        assert all(not (a & b) for i, a in enumerate(shapes) for b in shapes[i + 1 :])


def test_without_the_fa_log_forced_kernels_are_stored_failed_and_not_run(tmp_path: Path) -> None:
    cells = _cells([WIN])
    store = SampleStore(live.TABLE, tmp_path / "s.db", IDENT)
    fake = FakeRunRound()
    ran, _ = _run(fake, store, cells, 2, expect_log=False)
    assert ran == len(fake.calls) == 2 * 2 and {lbl for lbl, _, _ in fake.calls} == {"upstream", "AA"}
    samples = store.samples()
    forced = [s for s in samples if s.config not in (DEFAULT, AA)]
    assert len(samples) == 2 * sum(len(c.configs) for c in cells)
    assert forced and all(s.us is None and s.error.startswith("not run") for s in forced)
    out = live.compose(cells, samples, limits=(2, 2))
    assert not out.stats and set(out.no_verdict[WIN]) == set(N_KV) and not out.rules
    assert live.no_rules_text(out) == "no cell has a verdict"


def test_a_time_budget_stops_between_rounds_and_the_rerun_measures_the_rest(tmp_path: Path, clock: Any) -> None:
    from tuner.rounds.budget import Budget, BudgetReached

    class Slow(FakeRunRound):  # each process 60 s, four a round
        def __call__(self, *args: Any, **kw: Any) -> Any:
            clock.now += 60.0
            return super().__call__(*args, **kw)

    cells = _cells()
    store = SampleStore(live.TABLE, tmp_path / "s.db", IDENT)
    first = Slow()
    with pytest.raises(BudgetReached):
        _run(first, store, cells, 2, budget=Budget.counted_from(None, 250))
    # round 1's four processes end at 240 s; round 2 is started whole or not at all, and would end at 480 s
    assert len(first.calls) == 4 and clock.now - 1000.0 <= 250
    rest = Slow()
    ran, skipped = _run(rest, store, cells, 2)
    assert skipped == 4 and ran == len(rest.calls) > 0
    ref = FakeRunRound()
    _run(ref, SampleStore(live.TABLE, tmp_path / "ref.db", IDENT), cells, 2)
    assert len(first.calls) + len(rest.calls) == len(ref.calls)  # nothing measured twice, nothing left out

"""The sweep's plan, and its composition through the round engine on fake kernel timings whose truth is planted."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from tuner.errors import TunerError
from tuner.measure import kernel_bench as kb
from tuner.measure.decide import DEFAULT_LIMITS
from tuner.rounds.compose import bisect_depths
from tuner.rounds.store import SampleStore
from tuner.sweep import live
from tuner.sweep.grid import (
    GQA_RATIOS,
    HEAD_SIZES,
    KV_TYPES,
    N_KV,
    QUERY_BATCHES,
    STRIDE,
    Cell,
    FaShape,
    dry_run_text,
    legal_kernels,
    nkv_grid,
    plan,
    upstream_kernel,
)
from tuner.sweep.table import TableRule, match_table
from tuner.targets.archs import load_arch

SM90 = load_arch("sm_90")


def S(D: int, gqa: int, kv: str, ne1: int) -> FaShape:
    return FaShape(D=D, gqa=gqa, kv=kv, ne1=ne1)


# Planted truth: each entry is legal and differs from upstream's choice at every grid point it covers
# (checked by test_planted_rules_are_real_changes), with boundaries on grid points.
PLANTED = (
    TableRule(D=64, gqa=4, kv="f16", ne1=1, lo=32768, hi=None, kernel="MMA"),
    TableRule(D=128, gqa=8, kv="f16", ne1=1, lo=2048, hi=8192, kernel="MMA"),
    TableRule(D=128, gqa=8, kv="f16", ne1=1, lo=8192, hi=32768, kernel="VEC"),
    TableRule(D=96, gqa=2, kv="q8_0", ne1=4, lo=0, hi=3072, kernel="TILE"),
    TableRule(D=256, gqa=1, kv="q8_0", ne1=2, lo=12288, hi=None, kernel="MMA"),
)
OTHER = (S(80, 6, "f16", 8), S(112, 1, "f16", 1))  # shapes where nothing was planted
SPEEDUP = 1.25  # the planted winner's speed over upstream
SLOWDOWN = 1.3  # every other forced kernel's slowness


def _truth(cell_shape: FaShape, n_kv: int) -> str | None:
    hit = [
        r.kernel
        for r in PLANTED
        if (r.D, r.gqa, r.kv, r.ne1) == (cell_shape.D, cell_shape.gqa, cell_shape.kv, cell_shape.ne1) and r.covers(n_kv)
    ]
    return hit[0] if hit else None


class PlantedRunRound:
    """run_round's signature: microseconds per run growing with n_kv, the planted winner SPEEDUP faster, every
    other forced kernel SLOWDOWN slower, lognormal noise per process and per case from a seeded generator;
    ``aa_only``: every kernel as fast as upstream."""

    def __init__(self, *, sigma: float = 0.004, aa_only: bool = False, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.sigma, self.aa_only = sigma, aa_only
        self.cases = 0

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
        ((label, env),) = candidates.items()
        forced = None if not env else next(k for k in ("VEC", "TILE", "MMA") if env == kb.force_kernel_env(k))
        drift = math.exp(self.rng.gauss(0, 0.01))  # per process: the same for all its cases
        out = []
        for s in shapes:
            self.cases += 1
            shape = FaShape(D=s.head_dim, gqa=s.gqa, kv=s.kv_type, ne1=s.n_batch)
            up = upstream_kernel(SM90, shape, s.n_kv)
            assert forced is None or forced in legal_kernels(SM90, shape.D, s.n_kv)
            factor = 1.0
            if not self.aa_only and forced not in (None, up):
                factor = 1 / SPEEDUP if forced == _truth(shape, s.n_kv) else SLOWDOWN
            us = 10.0 * (1 + s.n_kv / 4096) * shape.D / 64 * factor * drift * math.exp(self.rng.gauss(0, self.sigma))
            kernel = forced or up
            why = "rule" if forced else "default"
            out.append(
                kb.KernelTime(label=label, shape=s, us_per_run=us, runs=100, kernel=kernel, why=why, backend=backend)
            )
        return out


def _sweep(tmp_path: Path, fake: PlantedRunRound, cells: Sequence[Cell], limits: tuple[int, int]) -> live.Outcome:
    """``cells`` measured through the sweep's engine on ``fake``, composed."""
    store = SampleStore(live.TABLE, tmp_path / "s.db", {"arch": "sm_90", "backend": "CUDA0", "build": "/b"})
    live.run_sweep(
        cells, limits=limits, store=store, bin_dir=Path("/b"), backend="CUDA0", log_dir=tmp_path / "logs",
        run_round=fake,
    )  # fmt: skip
    try:
        return live.compose(cells, store.samples(), limits=limits)
    finally:
        store.close()


def _cells(shapes: Sequence[FaShape]) -> list[Cell]:
    return [c for c in plan(SM90) if c.shape in set(shapes)]


def _planted_shapes() -> list[FaShape]:
    return sorted({S(r.D, r.gqa, r.kv, r.ne1) for r in PLANTED} | set(OTHER))


def test_nkv_grid_is_half_octaves_of_the_stride() -> None:
    assert nkv_grid() == N_KV
    assert N_KV[0] == STRIDE and N_KV[-1] == 131072
    assert all(x % STRIDE == 0 for x in N_KV)
    assert N_KV[1] == 2 * STRIDE  # 1.5 x 256 is no multiple of the stride
    assert all(1.3 < b / a <= 1.5 for a, b in itertools.pairwise(N_KV[1:]))
    assert len(N_KV) == 2 * int(math.log2(131072 / STRIDE))  # two points per octave, the first octave one


def test_plan_counts() -> None:
    cells = plan(SM90)
    # quantized K/V only where its block size (q8_0: 32) divides the head size: llama refuses the others
    shapes = [
        s for s in itertools.product(HEAD_SIZES, GQA_RATIOS, KV_TYPES, QUERY_BATCHES) if s[2] == "f16" or s[0] % 32 == 0
    ]
    assert len(cells) == len(shapes) * len(N_KV)
    assert {(c.shape.D, c.shape.kv) for c in cells} == {(D, kv) for D, _, kv, _ in shapes}
    assert not any(c.shape.kv == "q8_0" and c.shape.D % 32 for c in cells)
    vec_heads = [D for D in HEAD_SIZES if D % 64 == 0 and D <= 256]
    per_shape_vec = len(GQA_RATIOS) * len(KV_TYPES) * len(QUERY_BATCHES) * len(N_KV)
    assert sum("VEC" in c.legal for c in cells) == len(vec_heads) * per_shape_vec
    assert all(c.upstream in c.legal and c.upstream not in c.candidates for c in cells)
    per_round = sum(len(c.legal) + 1 for c in cells)
    text = dry_run_text(cells, rounds=5, per_call_s=0.05)
    assert f"= {len(cells)} cells" in text
    assert f"{per_round} per round x 5 rounds = {per_round * 5}" in text


def test_upstream_choice_on_hopper_follows_the_selector() -> None:
    # docs/selector.md worked example: D=64 GQA 4 f16 decodes with VEC at every depth, prefills with MMA
    assert {upstream_kernel(SM90, S(64, 4, "f16", 1), x) for x in N_KV} == {"VEC"}
    assert {upstream_kernel(SM90, S(64, 4, "f16", 8), x) for x in N_KV} == {"MMA"}
    # GQA > 4: VEC below n_kv 8192 (T3), MMA from there; D=256 always MMA
    assert [upstream_kernel(SM90, S(128, 8, "f16", 1), x) for x in (4096, 6144, 8192)] == ["VEC", "VEC", "MMA"]
    assert upstream_kernel(SM90, S(256, 8, "f16", 1), 256) == "MMA"
    # quantized KV on Ada+: VEC up to 2 columns (T4); no vector kernel for D=96
    assert upstream_kernel(SM90, S(128, 4, "q8_0", 2), 256) == "VEC"
    assert upstream_kernel(SM90, S(128, 4, "q8_0", 4), 256) == "MMA"
    assert upstream_kernel(SM90, S(96, 1, "f16", 1), 256) == "MMA"
    with pytest.raises(TunerError, match="Turing"):
        plan(load_arch("sm_70"))


def test_planted_rules_are_real_changes() -> None:
    for r in PLANTED:
        for x in N_KV:
            if r.covers(x):
                shape = S(r.D, r.gqa, r.kv, r.ne1)
                assert r.kernel in legal_kernels(SM90, r.D, x) and r.kernel != upstream_kernel(SM90, shape, x)


def test_fake_timings_compose_exactly_the_planted_rules(tmp_path: Path) -> None:
    fake = PlantedRunRound()
    cells = _cells(_planted_shapes())
    result = _sweep(tmp_path, fake, cells, (5, 5))
    assert fake.cases == 5 * sum(len(c.configs) for c in cells)
    assert result.rules == tuple(sorted(PLANTED))
    for shape, ds in result.decisions.items():
        assert [d.winner for d in ds] == [_truth(shape, x) for x in N_KV]
    # a second pass would go halfway between the neighbours that straddle each planted boundary
    mids = {s: m for s, ds in result.decisions.items() if (m := bisect_depths(ds, sorted(result.stats[s])))}
    assert set(mids) == {S(r.D, r.gqa, r.kv, r.ne1) for r in PLANTED if r.lo or r.hi}
    for shape, ms in mids.items():
        for m in ms:
            a, b = max(x for x in N_KV if x < m), min(x for x in N_KV if x > m)
            assert m % STRIDE == 0 and _truth(shape, a) != _truth(shape, b)
    # the composed table answers the planted truth at every swept cell
    for c in cells:
        got = match_table(
            result.rules,
            D=c.shape.D,
            gqa=c.shape.gqa,
            type_k=c.shape.kv,
            type_v=c.shape.kv,
            ne1=c.shape.ne1,
            n_kv=c.n_kv,
            can_use_vector_kernel="VEC" in c.legal,
            gqa_opt_applies=c.shape.gqa >= 2,
        )
        assert got == _truth(c.shape, c.n_kv)


@pytest.mark.parametrize(("limits", "n_kv"), [((5, 5), N_KV), (DEFAULT_LIMITS, (1024, 4096, 16384))])
def test_an_aa_only_grid_composes_nothing(tmp_path: Path, limits: tuple[int, int], n_kv: Sequence[int]) -> None:
    shapes = [S(*s) for s in itertools.product((64, 96), (1, 8), KV_TYPES, (1, 4))]
    cells = [c for c in plan(SM90, n_kv=n_kv) if c.shape in set(shapes)]
    result = _sweep(tmp_path, PlantedRunRound(aa_only=True, seed=7), cells, limits)
    assert result.rules == ()
    assert all(d.winner is None for ds in result.decisions.values() for d in ds)

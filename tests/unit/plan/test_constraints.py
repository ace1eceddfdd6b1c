"""tuner.plan.constraints: kernel rules, shared-memory formulas, and the upstream self-check."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from tuner.errors import UsageError
from tuner.plan import constraints as c
from tuner.plan import space

DATA = Path(__file__).resolve().parents[2] / "data" / "render"
CUDA = DATA / "treeA" / "ggml" / "src" / "ggml-cuda"
TILE = c.parse_tile_tables((CUDA / "fattn-tile.cuh").read_text())
MMA = c.parse_mma_tables((CUDA / "fattn-mma-f16.cuh").read_text())
INSTANCES = sorted(
    (int(a), int(b))
    for a, b in (
        re.search(r"ncols1_(\d+)-ncols2_(\d+)", p.name).groups()  # type: ignore[union-attr]
        for p in (CUDA / "template-instances").glob("fattn-mma*.cu")
    )
)


def test_tables_parse_with_upstream_counts() -> None:
    # knobs.md 3.1/3.2: 53/53/62/62 tile rows; MMA tables ampere..cdna.
    assert {k: len(v) for k, v in TILE.items()} == {"nvidia_fp16": 53, "nvidia_fp32": 53, "amd": 62, "amd_rdna": 62}
    assert set(MMA) == {"ampere", "turing", "volta", "rdna", "cdna"}
    assert TILE["amd_rdna"][(64, 64, 4)] == c.TileRow(
        dkq=64, dv=64, ncols=4, nthreads=64, occupancy=8, nbatch_fa=32, nbatch_K=64
    )
    assert (
        MMA["ampere"][(64, 64, 64)].render()
        == "GGML_CUDA_FATTN_MMA_CONFIG_CASE(64, 64, 64, 128, 2, 64, 32, 32, 32, 2, true);"
    )


@pytest.mark.parametrize(
    ("table", "arch"),
    [
        ("nvidia_fp16", "sm_89"),
        ("nvidia_fp16", "sm_90"),
        ("nvidia_fp32", "sm_70"),
        ("amd", "gfx942"),
        ("amd_rdna", "gfx1151"),
        ("amd_rdna", "gfx1100"),
    ],
)
def test_every_upstream_tile_row_passes(table: str, arch: str) -> None:
    limits = c.load_arch_limits(arch)
    bad = [v.message for r in TILE[table].values() for v in c.check_tile_row(limits, table, r)]
    assert bad == []


@pytest.mark.parametrize(
    ("table", "arch"),
    [("ampere", "sm_89"), ("ampere", "sm_90"), ("turing", "sm_75"), ("rdna", "gfx1151"), ("cdna", "gfx942")],
)
def test_every_upstream_mma_row_passes_for_its_instances(table: str, arch: str) -> None:
    limits = c.load_arch_limits(arch)
    bad = []
    for r in MMA[table].values():
        for n1, n2 in INSTANCES:
            if n1 * n2 == r.ncols:
                bad += [v.message for v in c.check_mma_row(limits, table, r, ncols2=n2)]
    assert bad == []


def test_upstream_maxima_match_knobs_md() -> None:
    """knobs.md 3.1/3.2 report these maxima for the shipped tables."""
    fp16 = max(_tile_smem(r, "nvidia_fp16", "sm_90") for r in TILE["nvidia_fp16"].values())
    rdna = max(_tile_smem(r, "amd_rdna", "gfx1151") for r in TILE["amd_rdna"].values())
    assert (fp16, rdna) == (31808, 63488)
    ampere = max(
        c.mma_smem_bytes(c.load_arch_limits("sm_89"), r, n2)
        for r in MMA["ampere"].values()
        for n1, n2 in INSTANCES
        if n1 * n2 == r.ncols
    )
    assert ampere == 100352


def _tile_smem(row: c.TileRow, table: str, arch: str) -> int:
    # an arch with a 1-byte limit turns the smem figure into the violation message
    limits = dataclasses.replace(c.load_arch_limits(arch), smem_static=1, smem_optin=1)
    msgs = [v.message for v in c.check_tile_row(limits, table, row) if v.rule == "tile.smem"]
    return int(re.search(r"smem (\d+) B", msgs[0]).group(1))  # type: ignore[union-attr]


def test_lds_overflowing_tile_row_rejected_on_gfx1151() -> None:
    row = dataclasses.replace(TILE["amd_rdna"][(576, 512, 32)], nbatch_K=128)
    v = c.check_tile_row(c.load_arch_limits("gfx1151"), "amd_rdna", row)
    assert [x.rule for x in v] == ["tile.smem"]
    assert re.fullmatch(
        r"tile amd_rdna \(576,512,ncols 32\): tile smem \d+ B > 65536 B LDS on gfx1151 \(fattn-tile.cuh L884-894\)",
        v[0].message,
    )


def test_tile_static_asserts() -> None:
    base = TILE["amd_rdna"][(64, 64, 4)]
    limits = c.load_arch_limits("gfx1151")
    rules = lambda **kw: {v.rule for v in c.check_tile_row(limits, "amd_rdna", dataclasses.replace(base, **kw))}  # noqa: E731
    assert rules(occupancy=9) == {"tile.occupancy"}
    assert rules(nthreads=1024) == {"tile.nthreads"}
    assert "tile.nbatch_fa" in rules(nthreads=256, nbatch_fa=32)  # np = 2 needs nbatch_fa % 64 == 0
    assert "tile.nbatch_K_DV" in rules(nbatch_K=40)
    assert "tile.nbatch_K_DV" not in rules(nbatch_K=48)  # 48 % 3 == 0 and DV % 32 == 0 is allowed (L714-715)


def test_mma_rules() -> None:
    base = MMA["ampere"][(64, 64, 64)]
    h100 = c.load_arch_limits("sm_90")
    rules = lambda **kw: {v.rule for v in c.check_mma_row(h100, "ampere", dataclasses.replace(base, **kw), ncols2=4)}  # noqa: E731
    assert rules() == set()
    assert rules(nstages_target=3) == {"mma.nstages"}
    assert rules(nbatch_K2=16) == {"mma.nstages_K2"}  # 2 stages need nbatch_K2 == DKQ/2
    assert rules(nbatch_K2=16, nstages_target=1) == set()
    assert rules(nbatch_fa=48) == {"mma.nbatch_fa"}
    assert rules(nbatch_combine=12) == {"mma.nbatch_combine"}
    big = MMA["ampere"][(576, 512, 64)]
    ada = c.load_arch_limits("sm_89")
    assert [v.rule for v in c.check_mma_row(ada, "ampere", dataclasses.replace(big, nbatch_fa=64), ncols2=16)] == [
        "mma.smem"
    ]


@pytest.mark.parametrize(
    ("nthreads", "nbatch_fa", "builds"),
    [
        # the decode row (ncols 8) the H100 tune compiled (results/sm_90/llama-3.2-1b-q4_k_m-decode-tune): these
        # three failed to compile ("zero-sized variable KQ_C", "bad loop size"); the others built and ran
        (256, 32, False),
        (256, 64, False),
        (256, 128, True),
        (128, 128, True),
        (64, 64, True),
        (128, 64, True),
    ],
)
def test_mma_decode_row_nbatch_fa_steps_np_times_16(nthreads: int, nbatch_fa: int, builds: bool) -> None:
    base = MMA["ampere"][(64, 64, 8)]
    h100 = c.load_arch_limits("sm_90")
    row = dataclasses.replace(base, nthreads=nthreads, nbatch_fa=nbatch_fa)
    rules = {v.rule for v in c.check_mma_row(h100, "ampere", row, ncols2=4)}
    assert ("mma.nbatch_fa" not in rules) == builds, rules


def test_wmma_rules() -> None:
    rdna = c.load_arch_limits("gfx1151")
    assert c.check_wmma(rdna, nwarps=4, min_blocks=1, kq_stride=256) == []
    assert c.check_wmma(rdna, nwarps=8, min_blocks=2, kq_stride=128) == []  # lhl's PR #16827 setting
    assert {v.rule for v in c.check_wmma(c.load_arch_limits("sm_70"), nwarps=8, min_blocks=1, kq_stride=128)} == {
        "wmma.kq_stride_tc"
    }
    assert {v.rule for v in c.check_wmma(c.load_arch_limits("gfx942"), nwarps=32, min_blocks=1, kq_stride=256)} == {
        "wmma.nwarps"
    }
    assert {v.rule for v in c.check_wmma(rdna, nwarps=4, min_blocks=1, kq_stride=64, head_dims=(128,))} == {"wmma.D"}


def test_check_constraints_through_space() -> None:
    assert space.check_constraints("gfx1151", "mma", {}) == []
    assert space.check_constraints("gfx1151", "mma", {"tile.amd_rdna.d64.c4.nthreads": 128}) == []
    v = space.check_constraints("sm_90", "mma", {"mma.ampere.d64.c64.nbatch_K2": 16})
    assert [x.rule for x in v] == ["mma.nstages_K2"]
    v = space.check_constraints(
        "sm_70", "rocwmma", {"wmma.nwarps": 8, "wmma.kq_stride": 128}, space=_wmma_space_for("sm_70")
    )
    assert [x.rule for x in v] == ["wmma.kq_stride_tc"]
    with pytest.raises(UsageError, match="Did you mean"):
        space.check_constraints("sm_90", "mma", {"mma.ampere.d64.c64.nthread": 1})


def _wmma_space_for(arch: str):  # the gfx1151 WMMA knobs, checked against another arch's limits
    return dataclasses.replace(space.load_space("gfx1151", "rocwmma"), arch=arch)


def test_unknown_arch() -> None:
    with pytest.raises(UsageError, match="Unknown arch"):
        c.load_arch_limits("sm_9000")


@pytest.mark.parametrize(
    ("d", "ncols", "stride", "expected"),
    [
        (64, 16, 256, 19200),
        (64, 32, 256, 38400),
        (128, 16, 256, 21248),
        (128, 32, 256, 42496),
        (64, 16, 128, 11008),
        (64, 32, 128, 22016),
        (128, 16, 128, 13056),
        (128, 32, 128, 26112),
    ],
)
def test_wmma_smem_formula_matches_knobs_md_table(d: int, ncols: int, stride: int, expected: int) -> None:
    """knobs.md 2.3 table (upstream vs PR #16827); ptxas -v reported the same bytes for the patched TU."""
    assert c.wmma_smem_bytes(d, ncols, nwarps=4, kq_stride=stride) == expected

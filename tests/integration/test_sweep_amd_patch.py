"""An AMD selection table end to end short of a GPU (none exists here: nothing is timed): fake timings of known
truth on gfx1151's grid compose the table the sweep's own code composes, the patch renders keyed on RDNA3.5
as upstream's AMD branches are (``GGML_CUDA_CC_IS_RDNA3_5(cc)``), applies to the pristine tree with an MMQ
choice beside it, and the patched fattn.cu and mmq.cu compile for gfx1151 with the HIP toolchain."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from tuner._run import run
from tuner.builder.cmake import build_variant
from tuner.builder.hip import find_hip_toolchain, parse_offload_targets
from tuner.plan.variant import RenderedVariant
from tuner.result.upstream_patch import FATTN, whitespace_only_hunks
from tuner.rounds.engine import AA, DEFAULT
from tuner.rounds.store import Sample
from tuner.sweep import live
from tuner.sweep.grid import FaShape, plan
from tuner.sweep.mmq import MMQ_FILE, MmqChoice, patched_mmq_condition, render_mmq_patch
from tuner.sweep.table import amd_family_condition, patched_fattn_table, render_table_patch
from tuner.targets.archs import load_arch

pytestmark = pytest.mark.integration

GFX1151 = load_arch("gfx1151")
SHAPE = FaShape(D=128, gqa=4, kv="f16", ne1=1)  # Llama-3.1-8B's decode: upstream runs TILE on RDNA3.5
NOTE = "Fake timings of known truth (a test): MMA faster than TILE from n_kv 16384."


def _composed() -> list:
    """The sweep's composition over gfx1151's cells of SHAPE, MMA 20% faster from n_kv 16384 and slower below."""
    cells = plan(GFX1151, head_sizes=(128,), gqa_ratios=(4,), kv_types=("f16",), query_batches=(1,))
    assert {c.upstream for c in cells} == {"TILE"} and all("MMA" in c.legal for c in cells)
    rng = random.Random(3)
    samples = []
    for c in cells:
        for r in range(3):
            for cfg in c.configs:
                us = 100.0 * (1 + rng.uniform(-0.002, 0.002))
                if cfg == "MMA":
                    us *= 0.8 if c.n_kv >= 16384 else 1.3
                elif cfg not in (DEFAULT, AA):
                    us *= 1.5
                samples.append(Sample(key=(c.shape, c.n_kv), config=cfg, round=r, us=us))
    return list(live.compose(cells, samples, limits=(3, 3)).rules)


def test_an_amd_table_from_fake_timings_patches_the_pristine_tree_keyed_on_its_family(tree_a, tmp_path: Path) -> None:
    rules = _composed()
    assert [r.text for r in rules] == ["D128 gqa4 f16 ne1 1, n_kv in [16384, inf) -> MMA"]
    patch = render_table_patch(tree_a.root, rules, GFX1151, note=NOTE)
    choice = MmqChoice(type="q4_K", lo=1024, hi=None, backend="BLAS")
    mmq_patch = render_mmq_patch(tree_a.root, [choice], GFX1151, note=NOTE)
    assert patch and mmq_patch and whitespace_only_hunks(patch + mmq_patch) == []
    assert "+    if (GGML_CUDA_CC_IS_RDNA3_5(cc) && Q->ne[3] == 1) {" in patch
    assert "+    if (GGML_CUDA_CC_IS_RDNA3_5(cc) && n_experts == 0) {" in mmq_patch
    # the lookup comes before the Turing branch, which an AMD device never enters
    fattn = patched_fattn_table(tree_a.root, rules, GFX1151, note=NOTE)
    assert fattn is not None
    fn = fattn.index("static best_fattn_kernel ggml_cuda_get_best_fattn_kernel(")
    assert fattn.index("GGML_CUDA_CC_IS_RDNA3_5(cc) && Q->ne[3]", fn) < fattn.index("if (turing_mma_available(cc)", fn)
    repo = tmp_path / "repo"
    for rel in (FATTN, MMQ_FILE):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tree_a.root / rel, repo / rel)
    run(["git", "init", "-q"], cwd=repo, what="git init")
    (tmp_path / "upstream.patch").write_text(patch + mmq_patch)
    run(["git", "apply", str(tmp_path / "upstream.patch")], cwd=repo, what="git apply")
    assert (repo / FATTN).read_text() == fattn
    assert amd_family_condition(load_arch("gfx942")) == "GGML_CUDA_CC_IS_CDNA3(cc)"


@pytest.mark.slow
def test_the_amd_patch_compiles_for_gfx1151(hip_toolchain, tree_a) -> None:
    assert find_hip_toolchain() is not None
    rules = _composed()
    choice = MmqChoice(type="q4_K", lo=1024, hi=None, backend="BLAS")
    fattn = patched_fattn_table(tree_a.root, rules, GFX1151, note=NOTE)
    cond = amd_family_condition(GFX1151)
    mmq_text = patched_mmq_condition(tree_a.root, [choice], GFX1151, cond, note=NOTE)
    assert fattn is not None and mmq_text is not None
    patch = render_table_patch(tree_a.root, rules, GFX1151, note=NOTE) or ""
    rv = RenderedVariant(
        arch="gfx1151",
        variant="hip+amd-table",
        era="mma",
        source_id=tree_a.source_id,
        source_root=tree_a.root,
        defines={
            "GGML_HIP": "ON", "GGML_NATIVE": "OFF", "GPU_TARGETS": "gfx1151", "LLAMA_CURL": "OFF",
            "LLAMA_OPENSSL": "OFF", "LLAMA_BUILD_TESTS": "OFF", "LLAMA_BUILD_TOOLS": "OFF",
            "LLAMA_BUILD_EXAMPLES": "OFF", "LLAMA_BUILD_SERVER": "OFF",
        },
        patch=patch + (render_mmq_patch(tree_a.root, [choice], GFX1151, note=NOTE) or ""),
        files={FATTN: fattn, MMQ_FILE: mmq_text},
    )  # fmt: skip
    b = build_variant(rv, compile_only=True, objects=[FATTN, MMQ_FILE], jobs=os.cpu_count())
    assert b.compile_only and b.meta["status"] == "ok"
    objs = {Path(o).name: o for o in b.meta["offload_targets"]}
    assert set(objs) == {"fattn.cu.o", "mmq.cu.o"}
    got = {name: parse_offload_targets((b.build_dir / obj).read_bytes()) for name, obj in objs.items()}
    # fattn.cu holds gfx1151 device code; mmq.cu's condition is host code (its kernels are in template instances)
    assert got["fattn.cu.o"] == ["gfx1151"] and got["mmq.cu.o"] in ([], ["gfx1151"]), got


@pytest.mark.slow
def test_the_sweeps_default_build_for_gfx1151_has_both_hooks_and_they_compile(hip_toolchain, tree_a) -> None:
    """The build `tuner sweep run/mmq/confirm --arch gfx1151` makes: the hip variant with the FlashAttention
    hook (GGML_TUNER_FA_RULES) and the MMQ hook (GGML_TUNER_MMQ_CHOICES), compile-checked for gfx1151."""
    from tuner.plan.render import render_variant

    rv = render_variant(tree_a, "gfx1151", "hip", local_archs=[], hooks=("mmq",))
    assert "GGML_TUNER_FA_RULES" in rv.files[FATTN] and "GGML_TUNER_MMQ_CHOICES" in rv.files[MMQ_FILE]
    b = build_variant(rv, compile_only=True, objects=[FATTN, MMQ_FILE], jobs=os.cpu_count())
    assert b.meta["status"] == "ok"
    got = {Path(o).name: parse_offload_targets((b.build_dir / o).read_bytes()) for o in b.meta["offload_targets"]}
    assert got["fattn.cu.o"] == ["gfx1151"] and "mmq.cu.o" in got, got


@pytest.mark.slow
def test_the_two_timers_compile_with_the_hip_toolchain(hip_toolchain, tree_a, tmp_path: Path) -> None:
    """fa-bench and mm-bench are host programs on ggml's backend API (they time whatever backend the build has):
    compiled, as `tuner sweep run/mmq` compiles them against a build, with the HIP toolchain's clang++ and the
    pinned tree's headers, to object files (there is no ROCm build of libggml here to link against)."""
    from tuner.paths import package_data

    tc = find_hip_toolchain()
    assert tc is not None
    inc = tree_a.root / "ggml" / "include"
    for name in ("fa_bench.cpp", "mm_bench.cpp"):
        obj = tmp_path / f"{name}.o"
        run([str(tc.clangxx), "-O2", "-std=c++17", f"-I{inc}", "-c", str(package_data(name)), "-o", str(obj)],
            what=f"{name} with {tc.clangxx.name}")  # fmt: skip
        assert obj.stat().st_size > 0

"""The sweep's upstream.patch against the pinned tree: it applies, its C++ lookup answers as the Python matcher,
and the patched fattn.cu and mmq.cu compile for sm_90 where nvcc and cuBLAS headers are at hand."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.oracles import parse_mmq_choices
from tuner._run import run
from tuner.result.upstream_patch import COMMON, FATTN, arch_condition, whitespace_only_hunks
from tuner.sweep.grid import KV_TYPES, N_KV, STRIDE, plan
from tuner.sweep.mmq import patched_mmq_condition, patched_mmq_hook
from tuner.sweep.table import TableRule, harness_source, match_table, patched_fattn_table, render_table_patch
from tuner.targets.archs import load_arch

pytestmark = pytest.mark.integration

SM90 = load_arch("sm_90")
NOTE = "Kernel choices measured on NVIDIA H100 (sm_90): FLASH_ATTN_EXT timed per forced kernel, paired rounds."


def _table() -> list[TableRule]:
    """Entries over many shapes: each shape gets up to two n_kv ranges, kernels cycling through VEC/TILE/MMA."""
    shapes = sorted({c.shape for c in plan(SM90)})
    out = []
    kernels = itertools.cycle(("MMA", "TILE", "VEC"))
    for i, s in enumerate(shapes[::3]):
        a, b = N_KV[i % 7], N_KV[7 + i % 9]
        for lo, hi in ((0 if i % 2 else a, b), (b, None if i % 4 else N_KV[-1])):
            k = next(kernels)
            k = "TILE" if k == "VEC" and s.D % 64 else k
            out.append(TableRule(D=s.D, gqa=s.gqa, kv=s.kv, ne1=s.ne1, lo=lo, hi=hi, kernel=k))
    return out


def _repo(tree_a, tmp: Path) -> Path:
    repo = tmp / "repo"
    (repo / FATTN).parent.mkdir(parents=True)
    shutil.copyfile(tree_a.root / FATTN, repo / FATTN)
    run(["git", "init", "-q"], cwd=repo, what="git init")
    return repo


def test_table_patch_applies_to_pristine_tree(tree_a, tmp_path: Path) -> None:
    rules = _table()
    patch = render_table_patch(tree_a.root, rules, SM90, note=NOTE)
    assert patch is not None and patch.endswith("\n")
    assert whitespace_only_hunks(patch) == []
    assert "if (cc == GGML_CUDA_CC_HOPPER && Q->ne[3] == 1) {" in patch
    repo = _repo(tree_a, tmp_path)
    (tmp_path / "upstream.patch").write_text(patch)
    out = run(["git", "apply", "--check", "-v", str(tmp_path / "upstream.patch")], cwd=repo, what="git apply").output
    assert "Checking patch ggml/src/ggml-cuda/fattn.cu" in out
    run(["git", "apply", str(tmp_path / "upstream.patch")], cwd=repo, what="git apply")
    assert (repo / FATTN).read_text() == patched_fattn_table(tree_a.root, rules, SM90, note=NOTE)
    assert render_table_patch(tree_a.root, [], SM90) is None


def _queries() -> list[tuple[int, int, str, str, int, int, bool, bool]]:
    """Every swept cell as llama calls it, then off-grid variations: other Q->ne[1], unpadded and longer n_kv,
    K and V of different types, no GQA optimisation."""
    out = []
    for c in plan(SM90):
        s = c.shape
        out.append((s.D, s.gqa, s.kv, s.kv, s.ne1, c.n_kv, "VEC" in c.legal, s.gqa >= 2))
    for c in plan(SM90, n_kv=(STRIDE, 8192, 32768)):
        s = c.shape
        other = next(t for t in KV_TYPES if t != s.kv)
        for ne1, n_kv in ((3, c.n_kv), (16, c.n_kv), (s.ne1, c.n_kv + 100), (s.ne1, 4 * N_KV[-1])):
            out.append((s.D, s.gqa, s.kv, s.kv, ne1, n_kv, n_kv % STRIDE == 0 and "VEC" in c.legal, s.gqa >= 2))
        out.append((s.D, s.gqa, s.kv, other, s.ne1, c.n_kv, "VEC" in c.legal, s.gqa >= 2))
        out.append((s.D, s.gqa, s.kv, s.kv, s.ne1, c.n_kv, "VEC" in c.legal, False))
    return out


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not on PATH")
def test_cpp_lookup_agrees_with_python_matcher(tree_a, tmp_path: Path) -> None:
    rules = _table()
    patched = patched_fattn_table(tree_a.root, rules, SM90, note=NOTE)
    assert patched is not None
    src = tmp_path / "harness.cpp"
    src.write_text(harness_source(patched, KV_TYPES))
    exe = tmp_path / "harness"
    subprocess.run(["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", "-o", str(exe), str(src)], check=True)
    queries = _queries()
    text = "".join(
        f"{D} {g} {KV_TYPES.index(tk)} {KV_TYPES.index(tv)} {ne1} {n} {int(v)} {int(o)}\n"
        for D, g, tk, tv, ne1, n, v, o in queries
    )
    got = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True).stdout.split()
    want = [
        match_table(
            rules, D=D, gqa=g, type_k=tk, type_v=tv, ne1=ne1, n_kv=n, can_use_vector_kernel=v, gqa_opt_applies=o
        )
        or "NONE"
        for D, g, tk, tv, ne1, n, v, o in queries
    ]
    assert len(got) == len(queries)
    mismatches = [(q, g, w) for q, g, w in zip(queries, got, want) if g != w]
    assert mismatches == []
    assert {"VEC", "TILE", "MMA", "NONE"} <= set(want)  # every answer is exercised


def _cublas_include() -> Path | None:
    cands = [os.environ.get("TUNER_TEST_CUBLAS_INCLUDE", "")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = Path(nvcc).resolve().parent.parent
        cands += [str(real / "include"), "/usr/local/cuda/include", "/usr/local/cuda/targets/x86_64-linux/include"]
    return next((Path(c) for c in cands if c and (Path(c) / "cublas_v2.h").is_file()), None)


_FA_TYPES = ("F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16")
_FA_DEFAULT = {("Q4_0", "Q4_0"), ("Q8_0", "Q8_0"), ("F16", "F16"), ("BF16", "BF16")}


def nvcc_compile(tree_a, tmp: Path, name: str, text: str) -> None:
    """nvcc -c of a patched ggml-cuda file for sm_90 (as test_upstream_patch_tree.py compiles fattn.cu), no warnings in it."""
    inc = _cublas_include()
    if inc is None:
        pytest.skip("cublas_v2.h not found (set TUNER_TEST_CUBLAS_INCLUDE to a cuBLAS include dir)")
    overlay = tmp / name.replace(".", "_") / "ggml" / "src" / "ggml-cuda"
    overlay.mkdir(parents=True)
    (overlay / name).write_text(text)
    root = tree_a.root / "ggml"
    defs = [f"-DGGML_CUDA_FA_{k}_{v}={int((k, v) in _FA_DEFAULT)}" for k in _FA_TYPES for v in _FA_TYPES]
    # fmt: off
    cmd = [
        "nvcc", "-std=c++17", "-O3", "-DNDEBUG", "--generate-code=arch=compute_90,code=[sm_90]", "-use_fast_math",
        "-extended-lambda", "-DGGML_CUDA_USE_GRAPHS", "-DGGML_SHARED", "-DGGML_BACKEND_SHARED", "-DGGML_BACKEND_BUILD",
        *defs, f"-I{overlay}", f"-I{root / 'src' / 'ggml-cuda'}", f"-I{root / 'src'}", f"-I{root / 'include'}", f"-I{inc}",
        "-Xcompiler", "-Wall -Wextra -Wmissing-declarations -Wno-unused-function -Wno-pedantic",
        "-x", "cu", "-c", str(overlay / name), "-o", str(overlay / (name + ".o")),
    ]
    # fmt: on
    res = run(cmd, cwd=tmp, what=f"nvcc {name}", timeout=1800)
    assert (overlay / (name + ".o")).stat().st_size > 10_000
    assert [ln for ln in res.output.splitlines() if "warning" in ln and name in ln] == []


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_patched_fattn_table_compiles_for_sm90(tree_a, tmp_path: Path) -> None:
    nvcc_compile(tree_a, tmp_path, "fattn.cu", patched_fattn_table(tree_a.root, _table(), SM90, note=NOTE) or "")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_patched_mmq_hook_and_condition_compile_for_sm90(tree_a, tmp_path: Path) -> None:
    nvcc_compile(tree_a, tmp_path / "hook", "mmq.cu", patched_mmq_hook(tree_a.root))
    choices = parse_mmq_choices("q4_K:1024..=BLAS,q8_0:256..2048=BLAS,iq4_xs:0..64=BLAS")
    cond = arch_condition(SM90, (tree_a.root / COMMON).read_text())
    nvcc_compile(tree_a, tmp_path / "cond", "mmq.cu", patched_mmq_condition(tree_a.root, choices, SM90, cond) or "")

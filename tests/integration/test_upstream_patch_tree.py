"""upstream.patch against the real pinned tree (llama-cpp-python==0.3.36): applies, is minimal, compiles."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from tuner._run import run
from tuner.plan.fa_rules import FaRule, Phase
from tuner.result.upstream_patch import FATTN, patched_fattn, render_upstream_patch, whitespace_only_hunks
from tuner.targets.archs import load_arch

pytestmark = pytest.mark.integration


def Rule(
    phase: str,
    lo: int,
    hi: int | None,
    kernel: str,
    D: int | None = None,
    gqa: int | None = None,
    kv: str | None = None,
) -> FaRule:
    return FaRule(phase=Phase(phase), lo=lo, hi=hi, kernel=kernel, D=D, gqa=gqa, kv=kv)


EXAMPLE = [Rule("decode", 32768, None, "MMA", 64, 4, "f16")]
MANY = [*EXAMPLE, Rule("decode", 0, 8192, "VEC", 128, 8, "q8_0"), Rule("prefill", 0, 4096, "TILE", 128, 8, "f16")]
NOTE = "NVIDIA H100 80GB HBM3, llama 8B Q4_K_M: tg128@d32768 +5.1% (95% CI +4.1..+6.3%), paired interleaved rounds."


def _apply(tree_a, patch: str, tmp: Path, *, check: bool) -> str:
    repo = tmp / "repo"
    (repo / FATTN).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tree_a.root / FATTN, repo / FATTN)
    run(["git", "init", "-q"], cwd=repo, what="git init")
    (tmp / "upstream.patch").write_text(patch)
    args = ["git", "apply", *(["--check"] if check else []), "-v", str(tmp / "upstream.patch")]
    return run(args, cwd=repo, what="git apply").output


@pytest.mark.parametrize("arch", ["sm_90", "sm_89", "sm_70", "gfx1151", "gfx942"])
def test_applies_to_pristine_tree(tree_a, tmp_path: Path, arch: str) -> None:
    rules = EXAMPLE if arch == "sm_70" else MANY
    patch = render_upstream_patch(tree_a, rules, load_arch(arch), note=NOTE)
    assert patch is not None and patch.endswith("\n")
    assert "Checking patch ggml/src/ggml-cuda/fattn.cu" in _apply(tree_a, patch, tmp_path, check=True)
    assert whitespace_only_hunks(patch) == []
    assert set(re.findall(r"^(?:---|\+\+\+) [ab]/(\S+)$", patch, re.M)) == {FATTN}
    _apply(tree_a, patch, tmp_path, check=False)
    assert (tmp_path / "repo" / FATTN).read_text() == patched_fattn(tree_a, rules, load_arch(arch), note=NOTE)


def test_sm90_example(tree_a) -> None:
    patch = render_upstream_patch(tree_a, EXAMPLE, load_arch("sm_90"), note=NOTE)
    flat = " ".join(patch.replace("\n+", "\n").split())
    assert (
        "if (cc == GGML_CUDA_CC_HOPPER) { if (Q->ne[1] == 1 && Q->ne[0] == 64 && gqa_ratio == 4 && "
        "K->type == GGML_TYPE_F16 && V->type == GGML_TYPE_F16 && K->ne[1] >= 32768 && gqa_opt_applies) { "
        "return BEST_FATTN_KERNEL_MMA_F16; } }"
    ) in flat
    assert patch.count("\n@@ ") == 1
    assert "@@ static best_fattn_kernel ggml_cuda_get_best_fattn_kernel(" in patch
    # inside upstream's Turing branch: after the head-size/type/mask gates, where MMA has device code
    new = patched_fattn(tree_a, EXAMPLE, load_arch("sm_90"), note=NOTE)
    fn = new[new.index("static best_fattn_kernel ggml_cuda_get_best_fattn_kernel(") :]
    at = fn.index("if (cc == GGML_CUDA_CC_HOPPER)")
    assert fn.rindex("return BEST_FATTN_KERNEL_NONE;", 0, at) < fn.index("if (turing_mma_available(cc)") < at


def _cublas_include() -> Path | None:
    cands = [os.environ.get("TUNER_TEST_CUBLAS_INCLUDE", "")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = Path(nvcc).resolve().parent.parent
        cands += [str(real / "include"), "/usr/local/cuda/include", "/usr/local/cuda/targets/x86_64-linux/include"]
    return next((Path(c) for c in cands if c and (Path(c) / "cublas_v2.h").is_file()), None)


_FA_TYPES = ("F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16")
_FA_DEFAULT = {("Q4_0", "Q4_0"), ("Q8_0", "Q8_0"), ("F16", "F16"), ("BF16", "BF16")}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_patched_fattn_compiles_for_sm90(tree_a, tmp_path: Path) -> None:
    """nvcc -c of the patched fattn.cu for sm_90 (as tests/integration/test_render_compile.py), no new warnings."""
    inc = _cublas_include()
    if inc is None:
        pytest.skip(
            "cublas_v2.h not found (set TUNER_TEST_CUBLAS_INCLUDE to a cuBLAS include dir, e.g. the "
            "nvidia/cu13/include of the nvidia-cublas wheel)"
        )
    overlay = tmp_path / "ggml" / "src" / "ggml-cuda"
    overlay.mkdir(parents=True)
    (overlay / "fattn.cu").write_text(patched_fattn(tree_a, MANY, load_arch("sm_90"), note=NOTE))
    root = tree_a.root / "ggml"
    defs = [f"-DGGML_CUDA_FA_{k}_{v}={int((k, v) in _FA_DEFAULT)}" for k in _FA_TYPES for v in _FA_TYPES]
    cmd = [
        "nvcc",
        "-std=c++17",
        "-O3",
        "-DNDEBUG",
        "--generate-code=arch=compute_90,code=[sm_90]",
        "-use_fast_math",
        "-extended-lambda",
        "-DGGML_CUDA_USE_GRAPHS",
        "-DGGML_SHARED",
        "-DGGML_BACKEND_SHARED",
        "-DGGML_BACKEND_BUILD",
        *defs,
        f"-I{overlay}",
        f"-I{root / 'src' / 'ggml-cuda'}",
        f"-I{root / 'src'}",
        f"-I{root / 'include'}",
        f"-I{inc}",
        "-Xcompiler",
        "-Wall -Wextra -Wmissing-declarations -Wno-unused-function -Wno-pedantic",
        "-x",
        "cu",
        "-c",
        str(overlay / "fattn.cu"),
        "-o",
        str(tmp_path / "fattn.o"),
    ]
    res = run(cmd, cwd=tmp_path, what="nvcc fattn.cu", timeout=900)
    assert (tmp_path / "fattn.o").stat().st_size > 100_000
    assert [ln for ln in res.output.splitlines() if "warning" in ln and "fattn.cu" in ln] == []


def test_validate_upstream_patch_on_stored_result(tree_a, tmp_path: Path) -> None:
    """tuner validate: a good upstream.patch passes, a corrupted one fails naming the check."""
    from tuner.result.validate import validate_result

    src = Path(__file__).resolve().parents[2] / "results" / "sm_90" / "llama-3.2-1b-q4_k_m"
    dst = tmp_path / "result"
    shutil.copytree(src, dst)
    patch = render_upstream_patch(tree_a, EXAMPLE, load_arch("sm_90"), note=NOTE)
    (dst / "upstream.patch").write_text(patch)
    found = {f.check: f for f in validate_result(dst).findings}
    assert found["upstream.patch applies"].ok and found["upstream.patch whitespace"].ok
    # EXAMPLE is not the stored config's rules: the patch applies cleanly but is not its re-render
    rerender = found.pop("upstream.patch re-render")
    assert not rerender.ok and "not what tuner renders from config.toml" in rerender.detail
    assert all(f.ok for f in found.values()), [f for f in found.values() if not f.ok]

    (dst / "upstream.patch").write_text(
        patch.replace("     if (turing_mma_available(cc)", "     if (volta_mma_available(cc)", 1)
    )
    bad = {f.check: f.detail for f in validate_result(dst).findings if not f.ok}
    assert list(bad) == ["upstream.patch applies", "upstream.patch re-render"]
    assert "git apply --check" in bad["upstream.patch applies"]

    hunk = "@@ -720,2 +728,3 @@ static best_fattn_kernel ggml_cuda_get_best_fattn_kernel(const int device, const\n"
    (dst / "upstream.patch").write_text(patch + hunk + "     return BEST_FATTN_KERNEL_TILE;\n+\n }\n")
    bad = {f.check: f.detail for f in validate_result(dst).findings if not f.ok}
    assert "upstream.patch whitespace" in bad and "whitespace-only" in bad["upstream.patch whitespace"]

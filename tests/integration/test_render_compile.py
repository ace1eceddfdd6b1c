"""render against the real fetched trees: `git apply --check` of every patch, and one real nvcc compile."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tuner._run import run
from tuner.plan import render

pytestmark = [pytest.mark.integration]

SPEC_A = "pypi:llama-cpp-python==0.3.36"
SPEC_B = "pypi:llama-cpp-python==0.3.16"


@pytest.fixture(scope="session")
def tree_a(tuner_home: Path):  # type: ignore[no-untyped-def]
    from tuner.source import fetch_source

    return fetch_source(SPEC_A)


@pytest.fixture(scope="session")
def tree_b(tuner_home: Path):  # type: ignore[no-untyped-def]
    from tuner.source import fetch_source

    return fetch_source(SPEC_B)


def _git_apply_check(rv: render.RenderedVariant, work: Path) -> str:
    """Copy the pristine files the patch touches into a fresh git repo and `git apply --check` there."""
    repo = work / "repo"
    for rel in rv.files:
        dst = repo / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(rv.source_root / rel, dst)
    run(["git", "init", "-q"], cwd=repo, what="git init")
    (work / "tuned.patch").write_text(rv.patch)
    res = run(["git", "apply", "--check", "-v", str(work / "tuned.patch")], cwd=repo, what="git apply --check")
    run(["git", "apply", str(work / "tuned.patch")], cwd=repo, what="git apply")
    for rel, text in rv.files.items():  # the patch reproduces exactly the rendered files
        assert (repo / rel).read_text() == text, rel
    return res.output


@pytest.mark.parametrize(
    ("arch", "variant", "values", "baked"),
    [
        ("sm_90", "cuda", {}, None),
        ("sm_89", "cuda-force-cublas", {"mma.ampere.d128.c64.nbatch_fa": 128}, None),
        ("gfx1151", "hip", {"tile.amd_rdna.d64.c4.occupancy": 4}, None),
        (
            "sm_90",
            "cuda",
            {"mma.ampere.d64.c64.nthreads": 256},
            {"GGML_TUNER_FA_RULES": "decode:8192-=MMA", "GGML_TUNER_FA_T3": 4096},
        ),
        ("sm_90", "cuda", {}, {"GGML_TUNER_FA_RULES": "decode/D64/gqa4/kvf16:32768-=MMA,prefill/kvq8_0:0-=TILE"}),
    ],
)
def test_patch_applies_to_tree_a(
    tree_a, tmp_path: Path, arch: str, variant: str, values: dict, baked: dict | None
) -> None:  # type: ignore[no-untyped-def]
    assert tree_a.era == "mma"
    rv = render.render_variant(tree_a, arch, variant, compile_values=values, baked_runtime=baked)
    out = _git_apply_check(rv, tmp_path)
    assert "ggml/src/ggml-cuda/fattn.cu" in out
    if baked is None:
        # CUDA: 12 tile instances + 126 per-head-size MMA TUs; HIP (hook not split): 12 tile + 21 MMA instances
        assert len(rv.tu_headers) == (138 if variant.startswith("cuda") else 33)
        assert sum(1 for t in rv.tu_headers.values() if t) == (1 if values else 0)


@pytest.mark.parametrize(("arch", "variant"), [("gfx1151", "hip-rocwmma"), ("gfx1100", "hip"), ("sm_90", "cuda")])
def test_patch_applies_to_tree_b(tree_b, tmp_path: Path, arch: str, variant: str) -> None:  # type: ignore[no-untyped-def]
    assert tree_b.era == "rocwmma"
    values = {"wmma.nwarps": 8, "wmma.kq_stride": 128} if arch.startswith("gfx") else {}
    rv = render.render_variant(tree_b, arch, variant, compile_values=values)
    out = _git_apply_check(rv, tmp_path)
    assert "ggml/src/ggml-cuda/fattn-wmma-f16.cu" in out
    assert "GGML_TUNER_WMMA_NWARPS 8" in rv.tu_headers["ggml/src/ggml-cuda/fattn-wmma-f16.cu"] or not values


def _cublas_include() -> Path | None:
    cands = [os.environ.get("TUNER_TEST_CUBLAS_INCLUDE", "")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = Path(nvcc).resolve().parent.parent
        cands += [str(real / "include"), "/usr/local/cuda/include", "/usr/local/cuda/targets/x86_64-linux/include"]
    for c in cands:
        if c and (Path(c) / "cublas_v2.h").is_file():
            return Path(c)
    return None


_FA_TYPES = ("F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16")
_FA_DEFAULT = {("Q4_0", "Q4_0"), ("Q8_0", "Q8_0"), ("F16", "F16"), ("BF16", "BF16")}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize(
    "baked",
    [None, {"GGML_TUNER_FA_RULES": "decode/D64/gqa4/kvf16:32768-=MMA,prefill/kvq8_0:0-=TILE"}],
    ids=["env", "baked-keyed-rules"],
)
def test_nvcc_compiles_patched_fattn_for_sm90(tree_a, tmp_path: Path, baked: dict | None) -> None:  # type: ignore[no-untyped-def]
    """The runtime hook compiles (env mode, and baked with shape-keyed rules): nvcc -c of the patched fattn.cu for sm_90, without new warnings."""
    inc = _cublas_include()
    if inc is None:
        pytest.skip("cublas_v2.h not found (set TUNER_TEST_CUBLAS_INCLUDE to a cuBLAS include dir)")
    rv = render.render_variant(tree_a, "sm_90", "cuda", baked_runtime=baked)
    # Overlay: the patched files in their own ggml-cuda dir, everything else from the pristine tree.
    overlay = tmp_path / "ggml" / "src" / "ggml-cuda"
    overlay.mkdir(parents=True)
    for rel, text in rv.files.items():
        if rel.startswith("ggml/src/ggml-cuda/") and rel.endswith((".cu", ".cuh")):
            (overlay / Path(rel).name).write_text(text)
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
    res = run(cmd, cwd=tmp_path, what="nvcc fattn.cu", timeout=600)
    assert (tmp_path / "fattn.o").stat().st_size > 100_000
    tuner_lines = [ln for ln in res.output.splitlines() if "warning" in ln and "fattn.cu" in ln]
    assert tuner_lines == []


def _cublas_cache_entries(inc: Path, nvcc: Path) -> dict[str, str] | None:
    """CMake cache entries that let FindCUDAToolkit resolve CUDA::cublas, cublasLt and cuda_driver for a
    configure without linking; None where no libcublas is found (the test then skips).

    The toolkit's own lib64 needs none; a pip-unpacked cuBLAS (``nvidia/cu13/{include,lib}``) is named
    explicitly. Without a libcuda (no driver, no stubs) a placeholder path stands in: nothing is linked here.
    """
    toolkit = nvcc.resolve().parent.parent
    libdirs = [toolkit / "lib64", *sorted(toolkit.glob("targets/*/lib"))]
    out: dict[str, str] = {}
    if not any(any(d.glob("libcublas.so*")) for d in libdirs):
        cands = [os.environ.get("TUNER_TEST_CUBLAS_LIB", ""), str(inc.parent / "lib"), str(inc.parent / "lib64")]
        for c in cands:
            blas = sorted(Path(c).glob("libcublas.so*")) if c else []
            blas_lt = sorted(Path(c).glob("libcublasLt.so*")) if c else []
            if blas and blas_lt:
                out |= {"CUDA_cublas_LIBRARY": str(blas[0]), "CUDA_cublasLt_LIBRARY": str(blas_lt[0])}
                break
        else:
            return None
    if not any(any(d.glob("libcuda.so*")) or any(d.glob("stubs/libcuda.so*")) for d in libdirs):
        out["CUDA_cuda_driver_LIBRARY"] = "libcuda-placeholder.so"
    return out


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_cuda_hook_configures_one_tu_per_mma_head_size(tree_a, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A real CMake configure (no compile) of the tune-mode CUDA tree: the 21 MMA instances are replaced by
    their 126 per-head-size TUs, each with its own header, under the names tuner's keys give them; a second
    configure leaves the generated files untouched (a reconfigure must not rebuild every instance)."""
    from tuner.builder import cmake as B
    from tuner.plan import tu_split

    nvcc = Path(shutil.which("nvcc") or "nvcc")
    inc = _cublas_include()
    entries = _cublas_cache_entries(inc, nvcc) if inc is not None else None
    if entries is None:
        pytest.skip(
            "cuBLAS not found: CMake's FindCUDAToolkit needs cublas_v2.h and libcublas/libcublasLt (set "
            "TUNER_TEST_CUBLAS_INCLUDE and TUNER_TEST_CUBLAS_LIB to a cuBLAS include and lib dir)"
        )
    if entries.get("CUDA_cuda_driver_LIBRARY"):
        entries["CUDA_cuda_driver_LIBRARY"] = str(tmp_path / entries["CUDA_cuda_driver_LIBRARY"])
        Path(entries["CUDA_cuda_driver_LIBRARY"]).touch()
    rv = render.render_variant(tree_a, "sm_90", "cuda", compile_values={"mma.ampere.d64.c8.occupancy": 1})
    src, build, tu = tmp_path / "src", tmp_path / "build", tmp_path / "tu"
    B._prepare_src(rv, src)
    B._write_tu_headers(rv, src, tu)
    defines = {
        **rv.defines,
        **entries,
        "GGML_TUNER_TU_DIR": str(tu),
        "CMAKE_EXPORT_COMPILE_COMMANDS": "ON",
        "GGML_CCACHE": "OFF",
    }
    cmd = [str(B.find_build_tools().cmake.cmake_path), f"-S{src}", f"-B{build}", "-GNinja"]
    cmd += [f"-D{k}={v}" for k, v in defines.items()]
    run(cmd, what="CMake configure", timeout=600)

    splits = tu_split.split_tus(tree_a.root)
    assert len(splits) == 126 and len(set(splits.values())) == 21
    compiled = {
        Path(os.path.relpath(Path(e["directory"], e["file"]), src)).as_posix(): e
        for e in json.loads((build / "compile_commands.json").read_text())
    }
    assert {k for k in compiled if "/split/" in k} == set(splits)
    assert not set(splits.values()) & set(compiled)  # the whole instances are not compiled
    assert "ggml/src/ggml-cuda/template-instances/fattn-tile-instance-dkq64-dv64.cu" in compiled
    d64 = "ggml/src/ggml-cuda/template-instances/split/fattn-mma-f16-instance-ncols1_2-ncols2_4-dkq64.cu"
    assert f"-include {tu}/fattn-mma-f16-instance-ncols1_2-ncols2_4-dkq64.h" in compiled[d64]["command"]
    generated = (src / d64).read_text()
    assert generated.endswith('#include "../../fattn-mma-f16.cuh"\n\nDECL_FATTN_MMA_F16_CASE(64, 64, 2, 4);\n')
    assert "(64, 64, 8, 128, 1," in (tu / "fattn-mma-f16-instance-ncols1_2-ncols2_4-dkq64.h").read_text()
    assert B._object_targets(build, src, B.default_check_objects(rv))  # the default check TUs are compiled

    mtimes = {k: (src / k).stat().st_mtime_ns for k in splits}
    run([*cmd, "--fresh"], what="CMake configure again", timeout=600)
    assert {k: (src / k).stat().st_mtime_ns for k in splits} == mtimes

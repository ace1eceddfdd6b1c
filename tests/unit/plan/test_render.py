"""tuner.plan.render: CMake defines, patch manifests, per-TU headers, baked mode, and the CLI."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

import tuner._run
from tuner.errors import TunerError, UsageError
from tuner.plan import fa_rules, patch, render, tu_split

DATA = Path(__file__).resolve().parents[2] / "data" / "render"
TREE_A = DATA / "treeA"
TREE_B = DATA / "treeB"
MMA_16_4 = "ggml/src/ggml-cuda/template-instances/fattn-mma-f16-instance-ncols1_16-ncols2_4.cu"
SPLIT = "ggml/src/ggml-cuda/template-instances/split"
MMA_16_4_D64 = f"{SPLIT}/fattn-mma-f16-instance-ncols1_16-ncols2_4-dkq64.cu"


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*a: object, **k: object) -> None:
        raise AssertionError("unit tests must not start processes")

    monkeypatch.setattr(tuner._run, "run", fail)


def src(root: Path, era: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(root=root, era=era, source_id="0" * 16, commit=None, spec="test")


# ---------------------------------------------------------------- defines


def test_cuda_defines_sm90() -> None:
    rv = render.render_variant(src(TREE_A, "mma"), "sm_90", "cuda")
    d = rv.defines
    assert d["CMAKE_CUDA_ARCHITECTURES"] == "90-real" and d["GGML_CUDA"] == "ON" and d["GGML_NATIVE"] == "OFF"
    assert d["CMAKE_BUILD_TYPE"] == "Release" and d["LLAMA_BUILD_TESTS"] == "ON" and d["LLAMA_BUILD_TOOLS"] == "ON"
    assert (
        d["LLAMA_OPENSSL"] == "OFF" and d["LLAMA_BUILD_SERVER"] == "OFF" and d["CMAKE_BUILD_RPATH_USE_ORIGIN"] == "ON"
    )
    assert "LLAMA_CURL" not in d  # tree A only keeps it as a deprecated name, not an option
    assert rv.warnings == ()


def test_sm89_on_hopper_becomes_virtual_with_warning() -> None:
    rv = render.render_variant(src(TREE_A, "mma"), "sm_89", "cuda", local_archs=["sm_90"])
    assert rv.defines["CMAKE_CUDA_ARCHITECTURES"] == "89-virtual"
    assert len(rv.warnings) == 1 and "89-virtual" in rv.warnings[0]
    assert (
        render.render_variant(src(TREE_A, "mma"), "sm_89", "cuda", local_archs=["sm_89"]).defines[
            "CMAKE_CUDA_ARCHITECTURES"
        ]
        == "89-real"
    )
    assert render.render_variant(src(TREE_A, "mma"), "sm_89", "cuda").defines["CMAKE_CUDA_ARCHITECTURES"] == "89-real"


@pytest.mark.parametrize(
    ("variant", "key", "value"),
    [
        ("cuda-force-mmq", "GGML_CUDA_FORCE_MMQ", "ON"),
        ("cuda-force-cublas", "GGML_CUDA_FORCE_CUBLAS", "ON"),
        ("cuda-no-graphs", "GGML_CUDA_GRAPHS", "OFF"),
    ],
)
def test_cuda_variant_defines(variant: str, key: str, value: str) -> None:
    assert render.render_variant(src(TREE_A, "mma"), "sm_90", variant).defines[key] == value


def test_hip_targets_per_era() -> None:
    a = render.render_variant(src(TREE_A, "mma"), "gfx1151", "hip").defines
    b = render.render_variant(src(TREE_B, "rocwmma"), "gfx1151", "hip").defines
    assert a["GPU_TARGETS"] == "gfx1151" and "AMDGPU_TARGETS" not in a
    assert b["AMDGPU_TARGETS"] == "gfx1151" and "GPU_TARGETS" not in b
    assert render.render_variant(src(TREE_A, "mma"), "gfx1151", "hip-no-mmq-mfma").defines["GGML_HIP_MMQ_MFMA"] == "OFF"
    assert (
        render.render_variant(src(TREE_B, "rocwmma"), "gfx1151", "hip-rocwmma").defines["GGML_HIP_ROCWMMA_FATTN"]
        == "ON"
    )


def test_rocwmma_on_era_mma_explains_removal() -> None:
    with pytest.raises(TunerError) as e:
        render.render_variant(src(TREE_A, "mma"), "gfx1151", "hip-rocwmma")
    assert "#26046" in str(e.value) and "pypi:llama-cpp-python==0.3.16" in str(e.value)


def test_cpu_variant_has_no_patch() -> None:
    rv = render.render_variant(src(TREE_A, "mma"), "cpu", "cpu")
    assert rv.patch == "" and rv.files == {} and rv.tu_headers == {}
    assert rv.defines["GGML_NATIVE"] == "ON" and "GGML_CUDA" not in rv.defines
    assert render.render_variant(src(TREE_A, "mma"), "cpu", "cpu-no-native").defines["GGML_NATIVE"] == "OFF"


def test_bad_variant_and_vendor_mismatch() -> None:
    with pytest.raises(UsageError, match="Did you mean.*'cuda'"):
        render.render_variant(src(TREE_A, "mma"), "sm_90", "cudaa")
    with pytest.raises(UsageError, match="builds for amd"):
        render.render_variant(src(TREE_A, "mma"), "sm_90", "hip")


def test_undeclared_option_in_template_is_an_error(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "ggml").mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text('option(LLAMA_BUILD_TESTS "" ON)\n')  # declares almost nothing
    with pytest.raises(TunerError, match=r"sets LLAMA_BUILD_SERVER, which the llama.cpp tree .* does not declare"):
        render.render_defines(tree, "cpu", "cpu", "mma")


# ---------------------------------------------------------------- patches


def test_mma_patch_touches_the_hooked_files() -> None:
    rv = render.render_variant(src(TREE_A, "mma"), "sm_90", "cuda")
    assert sorted(rv.files) == sorted(
        [
            "ggml/src/ggml-cuda/fattn.cu",
            "ggml/src/ggml-cuda/fattn-tile.cuh",
            "ggml/src/ggml-cuda/fattn-mma-f16.cuh",
            "ggml/src/ggml-cuda/CMakeLists.txt",
            "ggml/src/ggml-hip/CMakeLists.txt",
        ]
    )
    fattn = rv.files["ggml/src/ggml-cuda/fattn.cu"]
    assert "static best_fattn_kernel ggml_cuda_get_best_fattn_kernel_default(const int device" in fattn
    assert fattn.count("static best_fattn_kernel ggml_cuda_get_best_fattn_kernel(const int device") == 1
    assert 'getenv("GGML_TUNER_FA_RULES")' in fattn and 'ggml_tuner_fa_env_int("GGML_TUNER_FA_T3", 8192)' in fattn
    assert "!(gqa_ratio > 4 && (Q->ne[0] >= 256 || K->ne[1] >= 8192))" not in fattn  # T1-T3 literals replaced
    assert "K->ne[1] >= ggml_tuner_fa_get_knobs().t[8]" in fattn
    for t in ("NVIDIA_FP16", "NVIDIA_FP32", "AMD", "AMD_RDNA"):
        assert f"#ifdef GGML_TUNER_TILE_ROWS_{t}\n" in rv.files["ggml/src/ggml-cuda/fattn-tile.cuh"]
    for t in ("AMPERE", "TURING", "VOLTA", "RDNA", "CDNA"):
        assert f"#ifdef GGML_TUNER_MMA_ROWS_{t}\n" in rv.files["ggml/src/ggml-cuda/fattn-mma-f16.cuh"]
    assert '"../ggml-cuda/template-instances/fattn-mma*.cu"' in rv.files["ggml/src/ggml-hip/CMakeLists.txt"]
    assert rv.patch.startswith("--- a/ggml/src/ggml-cuda/CMakeLists.txt\n+++ b/ggml/src/ggml-cuda/CMakeLists.txt\n")


def test_ampere_hook_hunk_matches_golden() -> None:
    rv = render.render_variant(src(TREE_A, "mma"), "sm_90", "cuda")
    mma_part = rv.patch.split("+++ b/ggml/src/ggml-cuda/fattn-mma-f16.cuh\n", 1)[1]
    assert mma_part.startswith((DATA / "ampere-hook.hunk").read_text())


def test_tu_headers_for_one_mma_candidate_match_golden() -> None:
    rv = render.render_variant(
        src(TREE_A, "mma"),
        "sm_90",
        "cuda",
        compile_values={"mma.ampere.d64.c64.nthreads": 256, "mma.ampere.d64.c64.occupancy": 1},
    )
    overrides = {k: v for k, v in rv.tu_headers.items() if v}
    assert list(overrides) == [MMA_16_4_D64]  # the D64 instantiation of ncols1_16-ncols2_4 alone
    assert overrides[MMA_16_4_D64] == (DATA / "expected-mma-16-4.h").read_text()
    # 12 tile instances + 126 MMA head-size TUs (the DECLs of the 21 MMA instances), all listed so
    # stale headers get cleared; the whole MMA instances are not compiled in a split build
    assert len(rv.tu_headers) == 138 and MMA_16_4 not in rv.tu_headers
    base = render.render_variant(src(TREE_A, "mma"), "sm_90", "cuda")
    assert rv.key == base.key and rv.artifact_key != base.artifact_key  # same build dir, other binaries
    same = render.render_variant(
        src(TREE_A, "mma"), "sm_90", "cuda", compile_values={"mma.ampere.d64.c64.nthreads": 128}
    )
    assert same.artifact_key == base.artifact_key  # upstream value: no override, shared binaries


def test_tile_candidate_targets_the_head_size_instance() -> None:
    rv = render.render_variant(
        src(TREE_A, "mma"), "gfx1151", "hip", compile_values={"tile.amd_rdna.d64.c4.occupancy": 4}
    )
    overrides = {k: v for k, v in rv.tu_headers.items() if v}
    assert list(overrides) == ["ggml/src/ggml-cuda/template-instances/fattn-tile-instance-dkq64-dv64.cu"]
    assert (
        "#define GGML_TUNER_TILE_ROWS_AMD_RDNA GGML_CUDA_FATTN_TILE_CONFIG_CASE(64, 64, 4, 64, 4, 32, 64)"
        in overrides["ggml/src/ggml-cuda/template-instances/fattn-tile-instance-dkq64-dv64.cu"]
    )
    assert render.tu_header_name("a/b/fattn-tile-instance-dkq64-dv64.cu") == "fattn-tile-instance-dkq64-dv64.h"


def test_illegal_candidate_is_rejected_before_compiling() -> None:
    with pytest.raises(UsageError) as e:  # 8 warps for 4 columns: np = 2 needs nbatch_fa % 64 == 0
        render.render_variant(
            src(TREE_A, "mma"), "gfx1151", "hip", compile_values={"tile.amd_rdna.d64.c4.nthreads": 256}
        )
    assert "nbatch_fa 32 % (np 2 * 32) != 0" in str(e.value)
    assert "illegal on gfx1151" in str(e.value) and "nothing was compiled" in str(e.value)
    with pytest.raises(UsageError, match=r"tile smem 73728 B > 65536 B LDS on gfx1151 \(fattn-tile.cuh L884-894\)"):
        render.render_variant(
            src(TREE_A, "mma"), "gfx1151", "hip", compile_values={"tile.amd_rdna.d256.c8.nbatch_fa": 128}
        )
    with pytest.raises(UsageError, match="Allowed: 128, 64, 256"):
        render.render_variant(src(TREE_A, "mma"), "sm_90", "cuda", compile_values={"mma.ampere.d64.c64.nthreads": 100})


def test_baked_mode_compiles_values_in() -> None:
    rv = render.render_variant(
        src(TREE_A, "mma"),
        "sm_90",
        "cuda",
        compile_values={"mma.ampere.d64.c64.nthreads": 256},
        baked_runtime={"GGML_TUNER_FA_RULES": "decode:16384-=MMA", "GGML_TUNER_FA_T3": 4096},
    )
    fattn = rv.files["ggml/src/ggml-cuda/fattn.cu"]
    assert "getenv" not in fattn.split("ggml_cuda_get_best_fattn_kernel_default")[0]
    assert "{0, 4, 256, 4096, 2, 8, 16, 2, 2147483647}" in fattn
    assert "{0, 16384, -1, BEST_FATTN_KERNEL_MMA_F16, -1, -1, -1},  // decode:16384-=MMA" in fattn  # any shape
    # no rule has a batch key: the baked patch has none either (exports made before the key keep their bytes)
    assert "int     nb;" not in fattn and "rule.nb" not in fattn
    mma = rv.files["ggml/src/ggml-cuda/fattn-mma-f16.cuh"]
    assert "GGML_CUDA_FATTN_MMA_CONFIG_CASE(64, 64, 64, 256, 2, 64, 32, 32, 32, 2, true); // tuner" in mma
    assert "GGML_TUNER_MMA_ROWS" not in mma and "GGML_TUNER_TU_DIR" not in rv.patch
    assert rv.tu_headers == {}
    with pytest.raises(UsageError, match="cannot be compiled in"):
        render.render_variant(src(TREE_A, "mma"), "sm_90", "cuda", baked_runtime={"GGML_CUDA_GRAPH_OPT": "1"})
    with pytest.raises(UsageError, match="phase:lo-hi=KERNEL"):
        render.render_variant(src(TREE_A, "mma"), "sm_90", "cuda", baked_runtime={"GGML_TUNER_FA_RULES": "decode=VEC"})


def test_baked_keyed_rule_is_compiled_in() -> None:
    rv = render.render_variant(
        src(TREE_A, "mma"),
        "sm_90",
        "cuda",
        baked_runtime={
            "GGML_TUNER_FA_RULES": "decode/kvq8_0/D128/gqa4:32768-=MMA,decode/D64:0-4096=TILE,prefill:0-=MMA,prefill/nb4/D64:0-=VEC"
        },
    )
    fattn = rv.files["ggml/src/ggml-cuda/fattn.cu"]
    knobs = fattn.split("static best_fattn_kernel ggml_cuda_get_best_fattn_kernel_default")[0]
    assert "getenv" not in knobs
    assert "        4,\n" in knobs  # n_rules
    assert (
        "{0, 32768, -1, BEST_FATTN_KERNEL_MMA_F16, 128, 4, GGML_TYPE_Q8_0, -1},  // decode/D128/gqa4/kvq8_0:32768-=MMA"
        in knobs
    )
    assert "{0, 0, 4096, BEST_FATTN_KERNEL_TILE, 64, -1, -1, -1},  // decode/D64:0-4096=TILE" in knobs
    assert "{1, 0, -1, BEST_FATTN_KERNEL_MMA_F16, -1, -1, -1, -1},  // prefill:0-=MMA" in knobs
    assert "{1, 0, -1, BEST_FATTN_KERNEL_VEC, 64, -1, -1, 4},  // prefill/D64/nb4:0-=VEC" in knobs
    assert "(rule.nb >= 0 && rule.nb != Q->ne[1])" in fattn
    # the matcher skips a rule whose keys do not match the tensors
    assert "(rule.kv >= 0 && ((int) K->type != rule.kv || (int) V->type != rule.kv))" in fattn
    for bad, msg in (
        ("decode/D5000:0-=MMA", r"D must be in \[1, 4096\]"),
        ("decode/kvq4_k:0-=MMA", "is not one of f32"),
        ("decode/hd64:0-=MMA", "is not D<int>, gqa<int>, kv<type> or nb<int>"),
    ):
        with pytest.raises(UsageError, match=msg):
            render.render_variant(src(TREE_A, "mma"), "sm_90", "cuda", baked_runtime={"GGML_TUNER_FA_RULES": bad})


def test_baked_rule_values_are_rechecked() -> None:
    # a FaRule built in code (not parsed) is still range- and allow-list-checked before it becomes C++
    for bad in (
        fa_rules.FaRule(phase="decode", lo=0, hi=None, kernel="MMA", D=0),
        fa_rules.FaRule(phase="decode", lo=0, hi=None, kernel="MMA", gqa=True),
        fa_rules.FaRule(phase="decode", lo=0, hi=None, kernel="MMA", kv="f16); abort(); //"),
        fa_rules.FaRule(phase="decode", lo=5, hi=5, kernel="MMA"),
    ):
        with pytest.raises(UsageError):
            render._baked_rule(bad)


def test_env_parser_accepts_shape_keys() -> None:
    fattn = render.render_variant(src(TREE_A, "mma"), "sm_90", "cuda").files["ggml/src/ggml-cuda/fattn.cu"]
    parser = fattn.split("static void ggml_tuner_fa_parse_rules", 1)[1].split("// Read once per process", 1)[0]
    assert "head.find('/')" in parser and "ggml_tuner_fa_parse_key(" in parser
    keys = fattn.split("static void ggml_tuner_fa_parse_key", 1)[1].split("static void ggml_tuner_fa_parse_rules", 1)[0]
    for needle in (
        'key.compare(0, 3, "gqa")',
        'key.compare(0, 2, "kv")',
        'key.compare(0, 1, "D")',
        'parse_int(key.substr(3), "gqa", 1, 256)',
        'parse_int(key.substr(1), "D", 1, 4096)',
        "for (int t = 0; t < GGML_TYPE_COUNT; ++t)",
        "ggml_type_name((ggml_type) t)",
        "unknown shape key",
        "given twice",
    ):
        assert needle in keys, needle
    assert "int     D;" in fattn and "int     gqa;" in fattn and "int     kv;" in fattn


def test_rocwmma_patch_and_headers() -> None:
    rv = render.render_variant(
        src(TREE_B, "rocwmma"),
        "gfx1151",
        "hip-rocwmma",
        compile_values={"wmma.nwarps": 8, "wmma.min_blocks": 2, "wmma.kq_stride": 128},
    )
    wmma = rv.files["ggml/src/ggml-cuda/fattn-wmma-f16.cu"]
    assert "#define GGML_TUNER_WMMA_NWARPS 4\n" in wmma  # upstream default stays in the patch
    assert "__launch_bounds__(nwarps*ggml_cuda_get_physical_warp_size(), GGML_TUNER_WMMA_MIN_BLOCKS)" in wmma
    assert (
        wmma.count('#pragma push_macro("FATTN_KQ_STRIDE")') == 1
        and wmma.count('#pragma pop_macro("FATTN_KQ_STRIDE")') == 1
    )
    assert "ggml_tuner_wmma_kq_stride(D), true, true, false, warp_size);" in wmma
    assert rv.tu_headers == {
        "ggml/src/ggml-cuda/fattn-wmma-f16.cu": (
            "// generated by tuner: WMMA FlashAttention parameters (fattn-wmma-f16.cu)\n"
            "#define GGML_TUNER_WMMA_KQ_STRIDE 128\n#define GGML_TUNER_WMMA_MIN_BLOCKS 2\n#define GGML_TUNER_WMMA_NWARPS 8\n"
        )
    }
    fattn = rv.files["ggml/src/ggml-cuda/fattn.cu"]
    assert 'ggml_tuner_wmma_env_int("GGML_TUNER_WMMA_DECODE", 0)' in fattn and "GGML_TUNER_WMMA_DECODE_MIN_KV" in fattn
    baked = render.render_variant(
        src(TREE_B, "rocwmma"),
        "gfx1151",
        "hip-rocwmma",
        compile_values={"wmma.nwarps": 8},
        baked_runtime={"GGML_TUNER_WMMA_DECODE": 1, "GGML_TUNER_WMMA_DECODE_MIN_KV": 4096},
    )
    assert "#define GGML_TUNER_WMMA_NWARPS 8\n" in baked.files["ggml/src/ggml-cuda/fattn-wmma-f16.cu"]
    assert "{ 1, 4096, false }" in baked.files["ggml/src/ggml-cuda/fattn.cu"]


def _bad_templates(tmp_path: Path, anchor: str) -> Path:
    base = tmp_path / "templates"
    (base / "patches" / "mma").mkdir(parents=True)
    (base / "patches" / "mma" / "frag.j2").write_text("x\n")
    (base / "patches" / "mma" / "broken.toml").write_text(
        f'families = ["cuda"]\n[[edit]]\nfile = "ggml/src/ggml-cuda/fattn.cu"\nmode = "insert_after"\nanchor = """{anchor}"""\ntemplate = "frag.j2"\n'
    )
    return base


def test_anchor_mismatch_names_template_file_and_era(tmp_path: Path) -> None:
    base = _bad_templates(tmp_path, "this text is not in fattn.cu")
    with pytest.raises(TunerError) as e:
        render.render_patch(TREE_A, "mma", "cuda", {}, templates=base)
    msg = str(e.value)
    assert "'broken'" in msg and "era mma" in msg and "ggml/src/ggml-cuda/fattn.cu" in msg and "occurs 0 times" in msg
    base = _bad_templates(tmp_path / "2", "#include")  # occurs many times
    with pytest.raises(TunerError, match="occurs [0-9]+ times"):
        render.render_patch(TREE_A, "mma", "cuda", {}, templates=base)


def test_manifest_unknown_key(tmp_path: Path) -> None:
    base = _bad_templates(tmp_path, "x")
    p = base / "patches" / "mma" / "broken.toml"
    p.write_text(p.read_text().replace("mode =", "mdoe = 1\nmode ="))
    with pytest.raises(TunerError, match="Did you mean 'mode'"):
        patch.load_manifests("mma", base=base)


def test_unified_diff_handles_missing_final_newline() -> None:
    d = patch.unified_diff("f.txt", "a\nb", "a\nc")
    assert d.endswith("+c\n\\ No newline at end of file\n")


def test_preset_inherits_tree_presets() -> None:
    rv = render.render_variant(src(TREE_A, "mma"), "sm_90", "cuda-no-graphs")
    doc = render.render_preset(rv)
    assert doc["version"] == json.loads((TREE_A / "CMakePresets.json").read_text())["version"]
    p = doc["configurePresets"][0]
    assert p["name"] == "tuner-sm_90-cuda-no-graphs" and p["inherits"] == ["base", "release"]
    assert p["cacheVariables"]["GGML_CUDA_GRAPHS"] == "OFF"
    assert json.loads(render.render_presets(rv, name="x"))["configurePresets"][0]["name"] == "x"


# ---------------------------------------------------------------- real trees (skipped when absent)


@pytest.mark.integration
@pytest.mark.parametrize("variant", ["cuda", "hip"])
def test_anchors_match_real_tree_a(variant: str, tree_a) -> None:
    arch = "sm_90" if variant == "cuda" else "gfx1151"
    rv = render.render_variant(src(tree_a.root, "mma"), arch, variant)
    assert len(rv.files) == 5
    fixture = render.render_variant(src(TREE_A, "mma"), arch, variant)
    assert rv.files["ggml/src/ggml-cuda/fattn.cu"] == fixture.files["ggml/src/ggml-cuda/fattn.cu"]


@pytest.mark.integration
def test_anchors_match_real_tree_b(tree_b) -> None:
    REAL_B = tree_b.root
    rv = render.render_variant(src(REAL_B, "rocwmma"), "gfx1151", "hip-rocwmma")
    assert len(rv.files) == 4
    with pytest.raises(TunerError, match="occurs 0 times|lacks"):
        render.render_patch(
            REAL_B, "mma", "cuda", {"baked": False, "defaults": {}, "t": {}, "rules": [], "baked_rows": {}}
        )


# ---------------------------------------------------------------- CLI


@pytest.fixture()
def cli_source(monkeypatch: pytest.MonkeyPatch) -> None:
    import tuner.source

    monkeypatch.setattr(tuner.source, "fetch_source", lambda spec: src(TREE_A, "mma"))


def _invoke(args: list[str]) -> tuple[int, str]:
    from tuner.cli import cli, main  # noqa: F401

    runner = CliRunner()
    res = runner.invoke(cli, args, standalone_mode=False, catch_exceptions=True)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        from tuner.errors import TunerError as TE

        assert isinstance(res.exception, TE), res.exception
        return res.exception.exit_code, str(res.exception)
    return 0, res.output


def test_cli_dry_run(cli_source: None) -> None:
    code, out = _invoke(
        ["render", "--arch", "sm_90", "--set", "T3=4096", "--set", "mma.ampere.d64.c64.nthreads=256", "--dry-run"]
    )
    assert code == 0
    assert "-DCMAKE_CUDA_ARCHITECTURES=90-real" in out and "GGML_TUNER_FA_T3=4096" in out
    assert "## fattn-mma-f16-instance-ncols1_16-ncols2_4-dkq64.h" in out and "--- a/ggml/src/ggml-cuda/fattn.cu" in out


def test_cli_writes_files(cli_source: None, tmp_path: Path) -> None:
    code, _ = _invoke(
        [
            "render",
            "--arch",
            "sm_90",
            "--set",
            "ubatch=1024",
            "--set",
            "mma.ampere.d64.c64.occupancy=1",
            "-o",
            str(tmp_path / "o"),
        ]
    )
    assert code == 0
    o = tmp_path / "o"
    assert (o / "tuned.patch").read_text().startswith("--- a/")
    assert "-DGGML_CUDA=ON" in (o / "cmake-args.txt").read_text().splitlines()
    assert json.loads((o / "CMakeUserPresets.json").read_text())["configurePresets"][0]["name"] == "tuner-sm_90-cuda"
    assert (o / "bench-args.txt").read_text().strip() == "-ub 1024"
    assert len(list((o / "tu").glob("*.h"))) == 138
    header = (o / "tu" / "fattn-mma-f16-instance-ncols1_16-ncols2_4-dkq64.h").read_text()
    assert "occupancy" not in header and ", 1, 64, 32, 32, 32, 2, true);" in header


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--set", "mma.ampere.d64.c64.nthread=256"], "Did you mean"),
        (["--set", "T3=123"], "Allowed:"),
        (["--set", "mma.ampere.d64.c64.nbatch_K2=16"], "nstages 2 needs nbatch_K2 == DKQ/2"),
    ],
)
def test_cli_bad_values_exit_2(cli_source: None, args: list[str], text: str) -> None:
    code, out = _invoke(["render", "--arch", "sm_90", "--dry-run", *args])
    assert code == 2 and text in out


def test_a_decode_mma_row_targets_the_ncols1_2_instance() -> None:
    # batch-1 decode at GQA 4 runs ncols1 2 x ncols2 4 (ncols 8): its row overrides that TU alone
    rv = render.render_variant(src(TREE_A, "mma"), "sm_90", "cuda", compile_values={"mma.ampere.d64.c8.occupancy": 1})
    overrides = {k: v for k, v in rv.tu_headers.items() if v}
    tu = f"{SPLIT}/fattn-mma-f16-instance-ncols1_2-ncols2_4-dkq64.cu"
    assert list(overrides) == [tu]
    # upstream's row (64, 64, 8: 128, 2, 128, 32, 32, 32, 2, true) with occupancy 1
    assert "GGML_CUDA_FATTN_MMA_CONFIG_CASE(64, 64, 8, 128, 1, 128, 32, 32, 32, 2, true);" in overrides[tu]


# ---------------------------------------------------------------- per-head-size MMA split


def test_split_tus_of_the_pinned_instances() -> None:
    """126 DECL lines over the 21 MMA instances (treeA holds the pinned tree's instance files verbatim)."""
    splits = tu_split.split_tus(TREE_A)
    assert len(splits) == 126 and len(set(splits.values())) == 21
    inst = "ggml/src/ggml-cuda/template-instances/fattn-mma-f16-instance-ncols1_2-ncols2_4.cu"
    assert sorted(k for k, v in splits.items() if v == inst) == [
        f"{SPLIT}/fattn-mma-f16-instance-ncols1_2-ncols2_4-dkq{d}.cu" for d in (112, 128, 256, 512, 576, 64, 80, 96)
    ]
    assert tu_split.split_tu_of(TREE_A, inst, 64) == f"{SPLIT}/fattn-mma-f16-instance-ncols1_2-ncols2_4-dkq64.cu"
    assert tu_split.split_tu_of(TREE_A, inst, 40) is None
    assert render.tu_header_name(tu_split.split_tu(inst, 64)) == "fattn-mma-f16-instance-ncols1_2-ncols2_4-dkq64.h"


def test_decode_and_prefill_rows_land_in_their_head_size_only() -> None:
    rv = render.render_variant(
        src(TREE_A, "mma"),
        "sm_90",
        "cuda",
        compile_values={"mma.ampere.d64.c8.occupancy": 1, "mma.ampere.d128.c64.occupancy": 1},
    )
    overrides = {k: v for k, v in rv.tu_headers.items() if v}
    d64 = f"{SPLIT}/fattn-mma-f16-instance-ncols1_2-ncols2_4-dkq64.cu"
    d128 = f"{SPLIT}/fattn-mma-f16-instance-ncols1_16-ncols2_4-dkq128.cu"
    assert sorted(overrides) == sorted([d64, d128])
    assert "(64, 64, 8, 128, 1," in overrides[d64] and "(128, 128," not in overrides[d64]
    assert "(128, 128, 64," in overrides[d128] and "(64, 64," not in overrides[d128]
    for k in rv.tu_headers:
        assert "/template-instances/fattn-mma" not in k  # no whole MMA instance is hooked in a CUDA build


def test_hip_keeps_whole_mma_instances() -> None:
    """ggml-hip/CMakeLists.txt's hook is not split: a HIP build hooks the whole instance TUs."""
    rv = render.render_variant(src(TREE_A, "mma"), "gfx1151", "hip", compile_values={"mma.rdna.d64.c64.occupancy": 1})
    assert len(rv.tu_headers) == 33 and not any("/split/" in k for k in rv.tu_headers)
    assert [k for k, v in rv.tu_headers.items() if v] == [MMA_16_4]
    assert "template-instances/split/" not in rv.files["ggml/src/ggml-hip/CMakeLists.txt"]


def test_split_row_for_a_head_size_the_instance_lacks_is_refused(tmp_path: Path) -> None:
    import shutil

    tree = tmp_path / "treeA"
    shutil.copytree(TREE_A, tree)
    (tree / MMA_16_4).write_text('#include "../fattn-mma-f16.cuh"\n\nDECL_FATTN_MMA_F16_CASE(128, 128, 16, 4);\n')
    with pytest.raises(UsageError, match=r"instantiates no DECL_FATTN_MMA_F16_CASE\(64, \.\.\.\)"):
        render.render_variant(src(tree, "mma"), "sm_90", "cuda", compile_values={"mma.ampere.d64.c64.occupancy": 1})


def test_cuda_tune_hook_splits_and_baked_patch_does_not() -> None:
    """The split is tune-mode CMake only: a baked (export) patch carries no hook at all, as before."""
    tuned = render.render_variant(src(TREE_A, "mma"), "sm_90", "cuda")
    cuda_cmake = tuned.files["ggml/src/ggml-cuda/CMakeLists.txt"]
    cmake_pattern = tu_split.DECL_RE.pattern.replace("([0-9]+)", "[0-9]+").replace("\\", "\\\\")
    assert f'string(REGEX MATCHALL "{cmake_pattern}"' in cuda_cmake  # Python names TUs with the hook's pattern
    assert "HEADER_FILE_ONLY ON" in cuda_cmake and "file(CONFIGURE OUTPUT" in cuda_cmake
    assert tu_split.has_mma_split(tuned.files, era="mma", family="cuda")
    assert not tu_split.has_mma_split(tuned.files, era="mma", family="hip")
    baked = render.render_variant(
        src(TREE_A, "mma"),
        "sm_90",
        "cuda",
        compile_values={"mma.ampere.d64.c8.occupancy": 1},
        baked_runtime={"GGML_TUNER_FA_T3": 4096},
    )
    assert baked.tu_headers == {} and "split" not in baked.patch and "GGML_TUNER_TU_DIR" not in baked.patch
    assert "ggml/src/ggml-cuda/CMakeLists.txt" not in baked.files


def test_cli_o_replaces_links_and_refuses_a_linked_tu_folder(cli_source: None, tmp_path: Path) -> None:
    # render -o wrote through links already in the folder: into the file or folder they point at.
    o, victim, elsewhere = tmp_path / "o", tmp_path / "victim.txt", tmp_path / "elsewhere"
    o.mkdir()
    elsewhere.mkdir()
    victim.write_text("someone else's file")
    (o / "tuned.patch").symlink_to(victim)
    (o / "tu").symlink_to(elsewhere)
    code, text = _invoke(["render", "--arch", "sm_90", "-o", str(o)])
    assert code == 2 and "tu is a link" in text, text
    assert victim.read_text() == "someone else's file" and not any(elsewhere.iterdir())
    (o / "tu").unlink()
    code, text = _invoke(["render", "--arch", "sm_90", "-o", str(o)])
    assert code == 0, text
    assert victim.read_text() == "someone else's file" and not (o / "tuned.patch").is_symlink()
    assert (o / "tuned.patch").read_text().startswith("--- a/") and len(list((o / "tu").glob("*.h"))) > 0

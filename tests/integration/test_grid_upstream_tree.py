"""The sweep's model of upstream's FlashAttention kernel choice (tuner.sweep.grid.upstream_kernel) against the
pinned tree's own code: ``ggml_cuda_get_best_fattn_kernel`` and the compute-capability macros and helpers it
uses are cut out of fattn.cu and common.cuh, compiled for the host with g++ against a stub of the ggml types,
and asked at every cell of the grid with each arch's ``cc``, for the calls llama makes (a mask, no ALiBi,
aligned strides, KV padded to 256, one sequence). The two must agree everywhere, on the four AMD archs the
AMD table flow targets and on three NVIDIA ones.

The stubs: ``ggml_cuda_highest_compiled_arch(cc)`` is ``cc`` (a build for that arch), and the MMA kernel's
sparse-gather test answers no (it needs the kernel's launch parameters; on these grids it could only fire at
D = 256 with GQA > 4 on NVIDIA, where the VEC condition already fails).
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tuner.sweep import grid
from tuner.targets.archs import load_arch

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not on PATH")]

ARCHS = ("gfx1151", "gfx1100", "gfx1201", "gfx942", "sm_75", "sm_89", "sm_90")

PRELUDE = r"""
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#define GGML_MAX_DIMS 4
#define FATTN_KQ_STRIDE 256
#define FLASH_ATTN_AVAILABLE
#define GGML_UNUSED(x) (void)(x)
#define GGML_ASSERT(x) do { if (!(x)) { fprintf(stderr, "assert: %s\n", #x); exit(3); } } while (0)
enum ggml_type { GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1, GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q4_1 = 3, GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7, GGML_TYPE_Q8_0 = 8, GGML_TYPE_BF16 = 30 };
static bool ggml_is_quantized(ggml_type t) { return t != GGML_TYPE_F32 && t != GGML_TYPE_F16 && t != GGML_TYPE_BF16; }
struct ggml_tensor { int64_t ne[4]; size_t nb[4]; ggml_type type; ggml_tensor * src[4]; int32_t op_params[16]; };
struct stub_device { int cc; };
struct stub_info { stub_device devices[1]; };
static int g_cc = 0;
static stub_info ggml_cuda_info() { stub_info i; i.devices[0].cc = g_cc; return i; }
static int ggml_cuda_highest_compiled_arch(const int cc) { return cc; }
static bool ggml_cuda_flash_attn_ext_mma_f16_may_use_sparse(int, int, int, int) { return false; }
static bool ggml_cuda_flash_attn_ext_mma_f16_shall_use_sparse(int, const ggml_tensor *, int, int) { return false; }
"""

MAIN = r"""
int main() {
    long long cc, D, gqa, ne1, n_kv;
    char kv[8];
    while (scanf("%lld %lld %lld %7s %lld %lld", &cc, &D, &gqa, kv, &ne1, &n_kv) == 6) {
        g_cc = (int) cc;
        const ggml_type t = strcmp(kv, "f16") == 0 ? GGML_TYPE_F16 : GGML_TYPE_Q8_0;
        ggml_tensor Q = {}, K = {}, V = {}, mask = {}, dst = {};
        Q.ne[0] = D; Q.ne[1] = ne1; Q.ne[2] = 2*gqa; Q.ne[3] = 1; Q.type = GGML_TYPE_F32;
        K.ne[0] = D; K.ne[1] = n_kv; K.ne[2] = 2; K.ne[3] = 1; K.type = t;
        V = K;
        mask.ne[0] = n_kv; mask.ne[1] = ne1; mask.ne[2] = 1; mask.ne[3] = 1; mask.type = GGML_TYPE_F16;
        for (ggml_tensor * x : {&Q, &K, &V, &mask}) {
            for (int i = 0; i < 4; ++i) { x->nb[i] = 256 * (i + 1); }  // 16-byte aligned, as llama's are
        }
        dst.src[0] = &Q; dst.src[1] = &K; dst.src[2] = &V; dst.src[3] = &mask;  // op_params zero: no ALiBi
        const best_fattn_kernel k = ggml_cuda_get_best_fattn_kernel(0, &dst);
        printf("%s\n", k == BEST_FATTN_KERNEL_VEC ? "VEC" : k == BEST_FATTN_KERNEL_TILE ? "TILE"
                     : k == BEST_FATTN_KERNEL_MMA_F16 ? "MMA" : "OTHER");
    }
    return 0;
}
"""


def _function(text: str, head: str) -> str:
    """The definition that starts with ``head``, to its closing brace at column 0."""
    start = text.index(head)
    return text[start : text.index("\n}\n", start) + 3]


def _harness(root: Path) -> str:
    cuda = root / "ggml" / "src" / "ggml-cuda"
    common = (cuda / "common.cuh").read_text()
    fattn = (cuda / "fattn.cu").read_text()
    defines = "\n".join(ln for ln in common.splitlines() if ln.startswith("#define GGML_CUDA_CC_"))
    helpers = [
        _function(common, f"static bool {name}(const int cc) {{")
        for name in ("amd_mfma_available", "amd_wmma_available", "volta_mma_available", "turing_mma_available")
    ]
    enum = re.search(r"enum best_fattn_kernel \{.*?\};", fattn, re.S)
    assert enum is not None, "fattn.cu no longer defines enum best_fattn_kernel"
    return "\n".join(
        [
            PRELUDE,
            defines,
            *helpers,
            enum.group(),
            _function(fattn, "static bool ggml_cuda_fattn_kv_type_supported("),
            _function(fattn, "static best_fattn_kernel ggml_cuda_get_best_fattn_kernel("),
            MAIN,
        ]
    )


def _ask(source: str, lines: list[str], exe: Path) -> list[str]:
    """``source`` compiled for the host as ``exe``, fed ``lines``: its one answer per line."""
    exe.with_suffix(".cpp").write_text(source)
    cmd = ["g++", "-std=c++17", "-O1", "-w", str(exe.with_suffix(".cpp")), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    out = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = out.stdout.split()
    assert len(got) == len(lines)
    return got


def test_the_sweeps_model_of_upstreams_choice_is_the_trees_code(tree_a, tmp_path: Path) -> None:
    cases = []
    for name in ARCHS:
        arch = load_arch(name)
        for D, gqa, kv, ne1 in itertools.product(grid.HEAD_SIZES, grid.GQA_RATIOS, grid.KV_TYPES, grid.QUERY_BATCHES):
            if kv == "q8_0" and D % 32:
                continue  # a shape llama never makes (grid's module doc)
            shape = grid.FaShape(D=D, gqa=gqa, kv=kv, ne1=ne1)
            cases += [(name, grid.cc_of(arch), shape, n) for n in grid.N_KV]
    lines = [f"{cc} {s.D} {s.gqa} {s.kv} {s.ne1} {n}" for _, cc, s, n in cases]
    got = _ask(_harness(tree_a.root), lines, tmp_path / "select")
    wrong = [
        f"{name} {s.key} n_kv {n}: tree {k}, model {grid.upstream_kernel(load_arch(name), s, n)}"
        for (name, _, s, n), k in zip(cases, got)
        if k != grid.upstream_kernel(load_arch(name), s, n)
    ]
    assert not wrong, f"{len(wrong)} of {len(cases)} cells differ, e.g. {wrong[:5]}"
    # every arch reaches more than one kernel on this grid: the comparison is not vacuous
    for name in ARCHS:
        assert len({k for (a, _, _, _), k in zip(cases, got) if a == name}) >= 2, name


MMQ_MAIN = r"""
int main() {
    long long cc, ne11;
    char name[16];
    while (scanf("%lld %15s %lld", &cc, name, &ne11) == 3) {
        g_cc = (int) cc;
        const ggml_type t = type_of(name);
        printf("%s\n", ggml_cuda_should_use_mmq(t, (int) cc, ne11, 0) ? "MMQ" : "BLAS");
    }
    return 0;
}
"""


def _mmq_harness(root: Path) -> str:
    cuda = root / "ggml" / "src" / "ggml-cuda"
    common = (cuda / "common.cuh").read_text()
    body = _function((cuda / "mmq.cu").read_text(), "bool ggml_cuda_should_use_mmq(")
    types = sorted(set(re.findall(r"GGML_TYPE_(\w+)", body)))
    names = "\n".join(f'    if (strcasecmp(s, "{t}") == 0) {{ return GGML_TYPE_{t}; }}' for t in types)
    helpers = [
        _function(common, f"static bool {name}(const int cc) {{")
        for name in ("amd_mfma_available", "amd_wmma_available", "turing_mma_available", "fp16_mma_hardware_available")
    ]
    return "\n".join(
        [
            "#include <cstdint>\n#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n#include <strings.h>",
            "enum ggml_type { " + ", ".join(f"GGML_TYPE_{t}" for t in types) + " };",
            f'static ggml_type type_of(const char * s) {{\n{names}\n    fprintf(stderr, "type %s\\n", s); exit(3);\n}}',
            "struct stub_device { int cc; size_t smpbo; };\nstruct stub_info { stub_device devices[1]; };",
            "static int g_cc = 0;",
            "static stub_info ggml_cuda_info() { stub_info i; i.devices[0].cc = g_cc; i.devices[0].smpbo = 65536; return i; }",
            "static int ggml_cuda_get_device() { return 0; }",
            "static int ggml_cuda_highest_compiled_arch(const int cc) { return cc; }",
            "#define MMQ_DP4A_MAX_BATCH_SIZE 64",
            "\n".join(ln for ln in common.splitlines() if ln.startswith("#define GGML_CUDA_CC_")),
            *helpers,
            body,
            MMQ_MAIN,
        ]
    )


def test_the_mmq_sweeps_model_of_upstreams_backend_is_the_trees_code(tree_a, tmp_path: Path) -> None:
    from tuner.sweep import mmq

    batches = sorted({*mmq.MMQ_BATCHES, 1, 64, 127, 128, 129, 255, 256, 257, 8192})
    cases = [(a, t, n) for a in ARCHS for t in mmq.MMQ_SUPPORTED for n in batches]
    got = _ask(
        _mmq_harness(tree_a.root), [f"{grid.cc_of(load_arch(a))} {t} {n}" for a, t, n in cases], tmp_path / "mmq"
    )
    wrong = [
        f"{a} {t} ne11 {n}: tree {k}, model {mmq.upstream_backend(load_arch(a), t, n)}"
        for (a, t, n), k in zip(cases, got, strict=True)
        if k != mmq.upstream_backend(load_arch(a), t, n)
    ]
    assert not wrong, f"{len(wrong)} of {len(cases)} points differ, e.g. {wrong[:5]}"
    assert {k for (a, _, _), k in zip(cases, got) if a == "gfx1151"} == {"MMQ", "BLAS"}  # not vacuous

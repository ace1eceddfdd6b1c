"""The rendered FA-rule parser and matcher (C++) agree with tests.oracles.match_rules, compiled for the host.

The knob block (fattn-knobs.cu.j2) and the selection wrapper (fattn-tail.cu.j2) are cut out of a rendered
fattn.cu and compiled with g++ against a small stub of the ggml types they use; upstream's own choice is
stubbed as a kernel no rule can force (WMMA), so "UPSTREAM" in the output means no rule applied. Both the
env mode (GGML_TUNER_FA_RULES read at run time) and the baked mode (`tuner export`) are checked.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import types
from pathlib import Path

import pytest

from tests.oracles import match_rules
from tuner.errors import UsageError
from tuner.plan import fa_rules, render

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not on PATH")]

TREE_A = Path(__file__).resolve().parent.parent / "data" / "render" / "treeA"

# Stub of what the hook needs from ggml.h / common.cuh / fattn.cu. Type values are ggml.h's; 4 and 5 are
# the removed types ("DEPRECATED") and 11 has no name, to exercise the parser's guards.
PRELUDE = r"""
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#define GGML_MAX_DIMS 4
#define GGML_ABORT(...) do { fprintf(stderr, "ABORT: "); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); exit(3); } while (0)
enum ggml_type { GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1, GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q4_1 = 3, GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7, GGML_TYPE_Q8_0 = 8, GGML_TYPE_Q4_K = 12, GGML_TYPE_IQ4_NL = 20, GGML_TYPE_BF16 = 30,
    GGML_TYPE_COUNT = 31 };
static const char * ggml_type_name(enum ggml_type t) {
    static const char * names[GGML_TYPE_COUNT] = {"f32", "f16", "q4_0", "q4_1", "DEPRECATED", "DEPRECATED", "q5_0",
        "q5_1", "q8_0", "q8_1", "q2_K", nullptr, "q4_K"};
    if (t == GGML_TYPE_IQ4_NL) { return "iq4_nl"; }
    if (t == GGML_TYPE_BF16) { return "bf16"; }
    return names[t];
}
struct ggml_tensor { int64_t ne[4]; ggml_type type; ggml_tensor * src[4]; };
enum best_fattn_kernel { BEST_FATTN_KERNEL_NONE = 0, BEST_FATTN_KERNEL_TILE = 100, BEST_FATTN_KERNEL_VEC = 200,
    BEST_FATTN_KERNEL_WMMA_F16 = 300, BEST_FATTN_KERNEL_MMA_F16 = 400 };
// upstream's choice, stubbed as a kernel no rule can force
static best_fattn_kernel ggml_cuda_get_best_fattn_kernel_default(const int, const ggml_tensor *) {
    return BEST_FATTN_KERNEL_WMMA_F16;
}
// legality, stubbed: MMA has no device code for D=72 (as in the real hook)
static bool ggml_tuner_fa_kernel_legal(const int kernel, const int, const ggml_tensor * dst) {
    return !(kernel == BEST_FATTN_KERNEL_MMA_F16 && dst->src[0]->ne[0] == 72);
}
"""

MAIN = r"""
static ggml_type type_of(const std::string & s) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char * n = ggml_type_name((ggml_type) t);
        if (n != nullptr && s == n) { return (ggml_type) t; }
    }
    GGML_ABORT("harness: unknown type %s", s.c_str());
}
int main() {
    char phase[16], kt[16], vt[16];
    long long n_kv, D, gqa;
    while (scanf("%15s %lld %lld %lld %15s %15s", phase, &n_kv, &D, &gqa, kt, vt) == 6) {
        ggml_tensor Q = {}, K = {}, V = {}, dst = {};
        K.ne[0] = D; K.ne[1] = n_kv; K.ne[2] = 2; K.ne[3] = 1; K.type = type_of(kt);
        V.ne[0] = D; V.ne[1] = n_kv; V.ne[2] = 2; V.ne[3] = 1; V.type = type_of(vt);
        // "decode": Q->ne[1] 1; "prefill": 512; "prefillN": N (a small batch)
        const std::string ph(phase);
        const long long ne1 = ph == "decode" ? 1 : ph == "prefill" ? 512 : atoll(ph.c_str() + 7);
        Q.ne[0] = D; Q.ne[1] = ne1; Q.ne[2] = 2*gqa; Q.ne[3] = 1; Q.type = GGML_TYPE_F32;
        dst.src[0] = &Q; dst.src[1] = &K; dst.src[2] = &V;
        const best_fattn_kernel k = ggml_cuda_get_best_fattn_kernel(0, &dst);
        printf("%s\n", k == BEST_FATTN_KERNEL_WMMA_F16 ? "UPSTREAM" : ggml_tuner_fa_kernel_name(k));
    }
    return 0;
}
"""


def _hook_source(baked: dict[str, str] | None) -> str:
    src = types.SimpleNamespace(root=TREE_A, era="mma", source_id="0" * 16, commit=None, spec="test")
    fattn = render.render_variant(src, "sm_90", "cuda", baked_runtime=baked).files["ggml/src/ggml-cuda/fattn.cu"]
    start = fattn.index("// ---- tuner: FlashAttention selection knobs")
    knobs = fattn[start : fattn.index("static best_fattn_kernel ggml_cuda_get_best_fattn_kernel_default(", start)]
    tail = fattn[fattn.index("static const char * ggml_tuner_fa_kernel_name(") :]
    wrapper = "static best_fattn_kernel ggml_cuda_get_best_fattn_kernel(const int device, const ggml_tensor * dst) {"
    end = tail.index("\n}\n", tail.index(wrapper)) + 3
    return PRELUDE + knobs + tail[:end] + MAIN


def _compile(tmp_path: Path, baked: dict[str, str] | None, name: str) -> Path:
    (tmp_path / f"{name}.cpp").write_text(_hook_source(baked))
    exe = tmp_path / name
    res = subprocess.run(
        [
            "g++",
            "-std=c++17",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wno-unused-function",
            str(tmp_path / f"{name}.cpp"),
            "-o",
            str(exe),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    return exe


def _run(exe: Path, shapes: list[tuple], rules: str | None = None, log: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGML_TUNER_")}
    if rules is not None:
        env["GGML_TUNER_FA_RULES"] = rules
    if log:
        env["GGML_TUNER_FA_LOG"] = "1"
    stdin = "".join(" ".join(str(x) for x in s) + "\n" for s in shapes)
    return subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, env=env, timeout=60)


RULES = (
    "decode/D64/gqa4/kvf16:32768-=MMA,decode/D128/kvq8_0:0-16384=VEC,prefill/gqa8:4096-=TILE,"
    "decode/D72:0-=MMA,decode/kvbf16/gqa1:0-=TILE,prefill/kviq4_nl:0-=VEC,decode:65536-=TILE,"
    "prefill/D128/gqa4/kvf16/nb4:16384-=VEC,prefill/nb2:0-4096=MMA,prefill/nb2/D64:0-=VEC"
)
KINDS = ("f16", "q8_0", "bf16", "iq4_nl", "q4_0")
SHAPES = [
    (phase, n_kv, D, gqa, kt, vt)
    for phase, n_kv, D, gqa, (kt, vt) in itertools.product(
        ("decode", "prefill", "prefill2", "prefill4", "prefill8"),
        (0, 4095, 4096, 16383, 16384, 32767, 32768, 65535, 65536, 131072),
        (64, 72, 128, 256),
        (1, 4, 8),
        [(k, k) for k in KINDS] + [("q8_0", "f16"), ("f16", "q8_0")],
    )
]


def _expected(rules: list[fa_rules.FaRule], shape: tuple) -> str:
    phase, n_kv, D, gqa, kt, vt = shape
    ne1 = 1 if phase == "decode" else 512 if phase == "prefill" else int(phase[7:])
    r = match_rules(rules, phase[:7] if ne1 > 1 else phase, n_kv, D, gqa, kt, kv_v=vt, ne1=ne1)
    if r is None or (r.kernel == "MMA" and D == 72):  # no rule, or an illegal forced kernel (fallback)
        return "UPSTREAM"
    return r.kernel


@pytest.fixture(scope="module")
def env_exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _compile(tmp_path_factory.mktemp("fa-env"), None, "env")


def test_env_mode_matches_python_mirror(env_exe: Path) -> None:
    parsed = fa_rules.parse_fa_rules(RULES)
    res = _run(env_exe, SHAPES, RULES)
    assert res.returncode == 0, res.stderr
    got = res.stdout.split()
    assert len(got) == len(SHAPES)
    want = [_expected(parsed, s) for s in SHAPES]
    assert got == want
    assert {"UPSTREAM", "MMA", "VEC", "TILE"} <= set(got)  # every branch was exercised
    # an nb key fires at its batch only: VEC at Q->ne[1] 4, not at 8 or a prompt's 512
    at = {s: g for s, g in zip(SHAPES, got, strict=True)}
    assert at[("prefill4", 16384, 128, 4, "f16", "f16")] == "VEC"
    assert at[("prefill8", 16384, 128, 4, "f16", "f16")] != "VEC"
    assert at[("prefill", 16384, 128, 4, "f16", "f16")] != "VEC"
    # no rules (or only rules for other shapes): every call keeps upstream's choice
    assert set(_run(env_exe, SHAPES).stdout.split()) == {"UPSTREAM"}
    assert set(_run(env_exe, SHAPES, "decode/D96:0-=TILE,prefill/gqa3/kvf16:0-=MMA").stdout.split()) == {"UPSTREAM"}


def test_env_mode_log_names_the_key_fields(env_exe: Path) -> None:
    res = _run(
        env_exe,
        [
            ("decode", 32768, 64, 4, "f16", "f16"),
            ("decode", 32768, 72, 4, "f16", "f16"),
            ("decode", 32768, 64, 4, "f16", "f16"),
        ],
        RULES,
        log=True,
    )
    assert res.stdout.split() == ["MMA", "UPSTREAM", "MMA"]
    assert res.stderr.splitlines() == [
        "tuner-fa: D=64 DV=64 ne1=1 gqa=4 n_kv=32768 type_k=f16 type_v=f16 kernel=MMA (rule)",
        "tuner-fa: D=72 DV=72 ne1=1 gqa=4 n_kv=32768 type_k=f16 type_v=f16 kernel=NONE (fallback)",
    ]


@pytest.mark.parametrize(
    ("bad", "msg"),
    [
        ("decode/hd64:0-=MMA", "unknown shape key 'hd64'"),
        ("decode/:0-=MMA", "unknown shape key ''"),
        ("decode/D0:0-=MMA", "key 'D0': D must be an integer in [1, 4096]"),
        ("decode/D4097:0-=MMA", "D must be an integer in [1, 4096]"),
        ("decode/D-1:0-=MMA", "key 'D-1': D must be an integer in [1, 4096]"),
        ("decode/D:0-=MMA", "key 'D': D must be an integer"),
        ("decode/gqa257:0-=MMA", "gqa must be an integer in [1, 256]"),
        ("decode/gqa4x:0-=MMA", "gqa must be an integer in [1, 256]"),
        ("decode/D99999999999999999999:0-=MMA", "D must be an integer in [1, 4096]"),
        ("decode/kvf61:0-=MMA", "'f61' is not a ggml type name"),
        ("decode/kvDEPRECATED:0-=MMA", "'DEPRECATED' is not a ggml type name"),
        ("decode/D64/D64:0-=MMA", "shape key 'D64' given twice"),
        ("prefill/nb1:0-=MMA", "nb must be an integer in [2, 65536]"),
        ("prefill/nb4/nb4:0-=MMA", "shape key 'nb4' given twice"),
        ("decode/nb2:0-=MMA", "a decode rule runs at Q->ne[1] = 1"),
        ("decoder/D64:0-=MMA", "phase must be decode or prefill"),
        ("decode/D64=MMA", "is not phase[/key...]:lo-hi=KERNEL"),
    ],
)
def test_env_mode_rejects_bad_keys(env_exe: Path, bad: str, msg: str) -> None:
    res = _run(env_exe, [("decode", 0, 64, 4, "f16", "f16")], bad)
    assert res.returncode == 3 and msg in res.stderr, res.stderr
    assert f"entry '{bad}'" in res.stderr
    with pytest.raises(UsageError):
        fa_rules.parse_fa_rules(bad)  # the Python grammar rejects the same strings


def test_env_mode_accepts_any_ggml_type_name(env_exe: Path) -> None:
    # C++ knows every ggml type name; Python allows only FlashAttention K/V types (FA_RULE_KV_TYPES).
    res = _run(
        env_exe, [("decode", 0, 64, 4, "q4_K", "q4_K"), ("decode", 0, 64, 4, "f16", "f16")], "decode/kvq4_K:0-=TILE"
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["TILE", "UPSTREAM"]


def test_baked_mode_matches_python_mirror(tmp_path: Path) -> None:
    exe = _compile(tmp_path, {"GGML_TUNER_FA_RULES": RULES}, "baked")
    res = _run(exe, SHAPES, "decode:0-=VEC,prefill:0-=VEC")  # a baked build reads no env
    assert res.returncode == 0, res.stderr
    parsed = fa_rules.parse_fa_rules(RULES)
    assert res.stdout.split() == [_expected(parsed, s) for s in SHAPES]

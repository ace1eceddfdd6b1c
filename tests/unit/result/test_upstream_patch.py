"""upstream.patch and PR.md: rules as plain conditions in upstream's selection function (issue 16, item 1).

These run on a miniature tree with the same structure as fattn.cu's ggml_cuda_get_best_fattn_kernel;
tests/integration/test_upstream_patch_tree.py runs the same checks on the real pinned tree.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tuner.errors import TunerError
from tuner.plan.fa_rules import FaRule, Phase
from tuner.result.upstream_patch import (
    FATTN,
    arch_condition,
    patched_fattn,
    render_pr_body,
    render_upstream_patch,
    whitespace_only_hunks,
)
from tuner.targets.archs import load_arch

COMMON = """\
#define GGML_CUDA_CC_VOLTA           700
#define GGML_CUDA_CC_TURING          750
#define GGML_CUDA_CC_AMPERE          800
#define GGML_CUDA_CC_ADA_LOVELACE    890
#define GGML_CUDA_CC_HOPPER          900
#define GGML_CUDA_CC_BLACKWELL       1200
#define GGML_CUDA_CC_OFFSET_AMD      0x1000000
#define GGML_CUDA_CC_RDNA3      (GGML_CUDA_CC_OFFSET_AMD + 0x1100) // RX 7000, minimum for WMMA
#define GGML_CUDA_CC_CDNA3      (GGML_CUDA_CC_OFFSET_AMD + 0x942)  // MI300
"""

FATTN_TEXT = """\
// head of file

static best_fattn_kernel ggml_cuda_get_best_fattn_kernel(const int device, const ggml_tensor * dst) {
    const ggml_tensor * Q     = dst->src[0];
    const ggml_tensor * K     = dst->src[1];

    const int gqa_ratio = Q->ne[2] / K->ne[2];
    bool gqa_opt_applies = gqa_ratio >= 2 && K->ne[1] % FATTN_KQ_STRIDE == 0;

    const int cc = ggml_cuda_info().devices[device].cc;

    if (mask && mask->ne[2] != 1) {
        return BEST_FATTN_KERNEL_NONE;
    }

    const bool can_use_vector_kernel = Q->ne[0] <= 256 && Q->ne[0] % 64 == 0 && K->ne[1] % FATTN_KQ_STRIDE == 0;

    // If Turing tensor cores are available, use them:
    if (turing_mma_available(cc) && Q->ne[0] != 40 && Q->ne[0] != 72) {
        if (can_use_vector_kernel) {
            if (Q->ne[1] == 1) {
                return BEST_FATTN_KERNEL_VEC;
            }
        }
        return BEST_FATTN_KERNEL_MMA_F16;
    }

    return BEST_FATTN_KERNEL_TILE;
}

size_t ggml_cuda_flash_attn_ext_get_alloc_size(int device, const ggml_tensor * dst) {
    return 0;
}
"""


def Rule(
    phase: str,
    lo: int,
    hi: int | None,
    kernel: str,
    D: int | None = None,
    gqa: int | None = None,
    kv: str | None = None,
) -> FaRule:
    """A rule built in code (positional, as the cases below read), not parsed: its values are not checked."""
    return FaRule(phase=Phase(phase), lo=lo, hi=hi, kernel=kernel, D=D, gqa=gqa, kv=kv)


EXAMPLE = [Rule("decode", 32768, None, "MMA", 64, 4, "f16")]
NOTE = "NVIDIA H100 80GB HBM3: tg128 decode +5.1% at d32768 (95% CI +4.1..+6.3%), paired interleaved rounds."


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "llama.cpp"
    (root / "ggml/src/ggml-cuda").mkdir(parents=True)
    (root / FATTN).write_text(FATTN_TEXT)
    (root / "ggml/src/ggml-cuda/common.cuh").write_text(COMMON)
    return root


def git_apply_check(root: Path, patch: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    work = tmp / "apply"
    (work / FATTN).parent.mkdir(parents=True)
    shutil.copy(root / FATTN, work / FATTN)
    (tmp / "up.patch").write_text(patch)
    return subprocess.run(
        ["git", "apply", "--check", "-v", str(tmp / "up.patch")], cwd=work, capture_output=True, text=True, check=False
    )


def test_empty_rules_no_patch(tree: Path) -> None:
    assert render_upstream_patch(tree, [], load_arch("sm_90"), note=NOTE) is None


def test_sm90_patch_shape_and_applies(tree: Path, tmp_path: Path) -> None:
    patch = render_upstream_patch(tree, EXAMPLE, load_arch("sm_90"), note=NOTE)
    assert patch is not None and patch.endswith("\n") and not patch.endswith("\n\n")
    res = git_apply_check(tree, patch, tmp_path)
    assert res.returncode == 0, res.stderr
    # only fattn.cu, git format
    assert re.findall(r"^diff --git (\S+) (\S+)$", patch, re.M) == [(f"a/{FATTN}", f"b/{FATTN}")]
    assert re.findall(r"^(?:---|\+\+\+) (\S+)$", patch, re.M) == [f"a/{FATTN}", f"b/{FATTN}"]
    assert re.search(r"^index [0-9a-f]{7}\.\.[0-9a-f]{7} 100644$", patch, re.M)
    assert whitespace_only_hunks(patch) == []
    assert patch.count("\n@@ ") == 1  # one hunk
    added = [ln[1:] for ln in patch.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    cond = " ".join(ln.strip() for ln in added)
    assert "if (cc == GGML_CUDA_CC_HOPPER) {" in cond
    assert (
        "Q->ne[1] == 1 && Q->ne[0] == 64 && gqa_ratio == 4 && K->type == GGML_TYPE_F16 && "
        "V->type == GGML_TYPE_F16 && K->ne[1] >= 32768 && gqa_opt_applies) {"
    ) in cond
    assert "return BEST_FATTN_KERNEL_MMA_F16;" in cond
    # no tuner hook, no env parsing, upstream style
    assert not re.search(r"getenv|GGML_TUNER|tuner_", "\n".join(added))
    assert all(ln == ln.rstrip() for ln in added)
    assert all((len(ln) - len(ln.lstrip(" "))) % 4 == 0 and "\t" not in ln for ln in added if ln.strip())
    # inside upstream's Turing branch, i.e. after the gates and where MMA has device code
    new = patched_fattn(tree, EXAMPLE, load_arch("sm_90"), note=NOTE)
    assert new.index("if (cc == GGML_CUDA_CC_HOPPER)") > new.index("if (turing_mma_available(cc)")
    assert new.index("if (cc == GGML_CUDA_CC_HOPPER)") > new.index("return BEST_FATTN_KERNEL_NONE;")
    # hunk header names the function, as git prints it
    assert re.search(r"^@@ .* @@ static best_fattn_kernel ggml_cuda_get_best_fattn_kernel\(", patch, re.M)
    assert "NVIDIA H100 80GB HBM3" in patch


def test_applied_patch_reproduces_patched_text(tree: Path, tmp_path: Path) -> None:
    rules = [
        Rule("decode", 0, 8192, "VEC"),
        Rule("decode", 8192, None, "MMA", None, 8, None),
        Rule("prefill", 0, 4096, "TILE", 128, 4, "q8_0"),
    ]
    arch = load_arch("sm_90")
    patch = render_upstream_patch(tree, rules, arch, note=NOTE)
    work = tmp_path / "w"
    (work / FATTN).parent.mkdir(parents=True)
    shutil.copy(tree / FATTN, work / FATTN)
    (tmp_path / "p").write_text(patch)
    subprocess.run(["git", "apply", str(tmp_path / "p")], cwd=work, check=True)
    assert (work / FATTN).read_text() == patched_fattn(tree, rules, arch, note=NOTE)
    text = (work / FATTN).read_text()
    assert "Q->ne[1] == 1 && K->ne[1] < 8192 && can_use_vector_kernel) {" in text  # VEC legality
    assert "Q->ne[1] > 1 && Q->ne[0] == 128 && gqa_ratio == 4 && K->type == GGML_TYPE_Q8_0" in text
    assert all(len(ln) <= 120 for ln in text.splitlines()[-60:])


@pytest.mark.parametrize(
    ("arch", "want"),
    [
        ("sm_90", "cc == GGML_CUDA_CC_HOPPER"),
        ("sm_89", "cc == GGML_CUDA_CC_ADA_LOVELACE"),
        ("sm_86", "cc == 860"),
        ("gfx1100", "cc == GGML_CUDA_CC_RDNA3"),
        ("gfx942", "cc == GGML_CUDA_CC_CDNA3"),
        ("gfx1151", "cc == GGML_CUDA_CC_OFFSET_AMD + 0x1151"),
    ],
)
def test_arch_condition_is_exact(arch: str, want: str) -> None:
    assert arch_condition(load_arch(arch), COMMON) == want


def test_cpu_arch_refused(tree: Path) -> None:
    with pytest.raises(TunerError, match="CUDA/HIP"):
        render_upstream_patch(tree, EXAMPLE, load_arch("cpu"))


def test_non_turing_block_states_legality(tree: Path, tmp_path: Path) -> None:
    arch = load_arch("gfx1100")
    text = patched_fattn(tree, [Rule("decode", 0, None, "MMA")], arch)
    flat = " ".join(text.split())
    assert "amd_wmma_available(cc) && gqa_opt_applies && Q->ne[0] != 40 && Q->ne[0] != 72 && Q->ne[0] <= 256" in flat
    assert text.index("if (cc == GGML_CUDA_CC_RDNA3)") < text.index("// If Turing tensor cores")
    assert (
        git_apply_check(tree, render_upstream_patch(tree, [Rule("decode", 0, None, "MMA")], arch), tmp_path).returncode
        == 0
    )


@pytest.mark.parametrize(
    "rule",
    [
        Rule("decode", 0, None, "VEC", 192),
        Rule("decode", 0, None, "VEC", 576),
        Rule("decode", 0, None, "MMA", 72),
        Rule("decode", 0, None, "VEC", 64, 4, "q2_k"),
        Rule("decode", 10, 5, "VEC"),
    ],
)
def test_illegal_rules_refused(tree: Path, rule: Rule) -> None:
    with pytest.raises(TunerError):
        render_upstream_patch(tree, [rule], load_arch("sm_90"))


def test_a_rule_has_a_phase_upstream_knows() -> None:
    with pytest.raises(ValueError, match="both"):
        FaRule(phase="both", lo=0, hi=None, kernel="VEC")  # type: ignore[arg-type]


def test_mma_refused_without_mma_hardware(tree: Path) -> None:
    with pytest.raises(TunerError, match="no MMA"):
        render_upstream_patch(tree, [Rule("decode", 0, None, "MMA")], load_arch("sm_61"))


def test_overlapping_rules_refused(tree: Path) -> None:
    with pytest.raises(TunerError, match="overlap"):
        render_upstream_patch(
            tree, [Rule("decode", 0, 8192, "VEC", 64), Rule("decode", 4096, None, "MMA")], load_arch("sm_90")
        )
    # disjoint shapes or phases are fine
    assert render_upstream_patch(
        tree,
        [Rule("decode", 0, None, "VEC", 64), Rule("decode", 0, None, "MMA", 128), Rule("prefill", 0, None, "TILE", 64)],
        load_arch("sm_90"),
    )


def test_rule_without_shape_keys(tree: Path) -> None:
    """A FaRule without shape keys is a rule for every shape."""
    text = patched_fattn(tree, [FaRule(phase="decode", lo=8192, hi=None, kernel="MMA")], load_arch("sm_90"))
    assert "if (Q->ne[1] == 1 && K->ne[1] >= 8192) {" in text


def test_unknown_structure_is_a_clear_error(tree: Path) -> None:
    (tree / FATTN).write_text(FATTN_TEXT.replace("const bool can_use_vector_kernel", "const bool can_vec"))
    with pytest.raises(TunerError, match="structure"):
        render_upstream_patch(tree, EXAMPLE, load_arch("sm_90"))


def test_whitespace_only_hunks_detected() -> None:
    ws = (
        f"diff --git a/{FATTN} b/{FATTN}\n--- a/{FATTN}\n+++ b/{FATTN}\n"
        "@@ -1,3 +1,4 @@ static void f() {\n a\n+\n b\n c\n"
        "@@ -10,3 +11,3 @@\n x\n-    y;\n+        y;\n z\n"
        "@@ -20,3 +21,3 @@\n x\n-    y;\n+    w;\n z\n"
    )
    assert whitespace_only_hunks(ws) == [f"{FATTN} -1,3 +1,4", f"{FATTN} -10,3 +11,3"]


def test_validate_check_on_mini_tree(tree: Path, tmp_path: Path) -> None:
    from tuner.result.validate import _upstream_patch_checks

    good = tmp_path / "upstream.patch"
    good.write_text(render_upstream_patch(tree, EXAMPLE, load_arch("sm_90"), note=NOTE))
    assert all(f.ok for f in _upstream_patch_checks(good, tree))
    bad = tmp_path / "bad" / "upstream.patch"
    bad.parent.mkdir()
    bad.write_text(good.read_text().replace(" \n     // If Turing", " \n     // If Volta", 1))
    found = {f.check: f for f in _upstream_patch_checks(bad, tree)}
    assert not found["upstream.patch applies"].ok
    assert "git apply --check" in found["upstream.patch applies"].detail
    bad.write_text(good.read_text() + "@@ -30,2 +39,3 @@\n }\n+\n \n")
    found = {f.check: f for f in _upstream_patch_checks(bad, tree)}
    assert not found["upstream.patch whitespace"].ok and "whitespace-only" in found["upstream.patch whitespace"].detail


POINTS = [
    dict(
        phase="tg",
        depth=16384,
        test="tg128",
        base_ts=210.4,
        tuned_ts=211.0,
        speedup=1.003,
        ci_low=0.992,
        ci_high=1.012,
        aa_noise_pct=1.1,
        verdict="no difference",
        upstream_kernel="VEC",
        kernel="VEC",
        rounds=12,
    ),
    dict(
        phase="tg",
        depth=32768,
        test="tg128",
        base_ts=150.0,
        tuned_ts=157.65,
        speedup=1.061,
        ci_low=1.041,
        ci_high=1.063,
        aa_noise_pct=1.2,
        verdict="faster",
        upstream_kernel="VEC",
        kernel="MMA",
        rounds=12,
    ),
]


def test_pr_body() -> None:
    cmds = ["tuner search --arch sm_90 --like llama-3.1-8b", "tuner compare a.jsonl b.jsonl --aa a.jsonl a2.jsonl"]
    md = render_pr_body(
        EXAMPLE,
        load_arch("sm_90"),
        gpu="NVIDIA H100 80GB HBM3",
        model="llama 8B Q4_K_M",
        points=POINTS,
        commands=cmds,
        source="llama.cpp 0c1e570",
        rounds=12,
    )
    lines = md.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("| Model "))
    cols = [c.strip() for c in lines[head].strip("|").split("|")]
    assert cols[:5] == ["Model", "Test", "t/s upstream", "t/s patched", "Speedup"] and "95% CI" in cols
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[head + 2 : head + 4]]
    # the depth is in the test name, and Speedup is 157.65 / 150.00, not the paired estimate 1.061
    assert rows[1][:7] == ["llama 8B Q4_K_M", "tg128@d32768", "150.00", "157.65", "1.05", "1.041–1.063", "±1.2% A/A"]
    assert "VEC → MMA" in rows[1] and "✓ faster" in rows[1]
    assert "decode, head size 64, GQA ratio 4, K/V f16, n_kv >= 32768: **MMA** (upstream: VEC)" in md
    assert "paired, interleaved" in md and "12 rounds" in md and "geometric mean of the per-round ratios" in md
    assert "bootstrap" not in md
    assert all(c in md for c in cmds) and "```sh" in md
    assert md.endswith("\n")

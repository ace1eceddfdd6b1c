"""The MMQ hook and the MMQ condition against the pinned tree: both apply; the hook's C++ reads its
environment as the Python parser does and answers as the Python matcher."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.oracles import match_mmq, mmq_harness_source, parse_mmq_choices
from tuner._run import run
from tuner.errors import UsageError
from tuner.result.upstream_patch import COMMON, arch_condition, git_diff, whitespace_only_hunks
from tuner.sweep.mmq import (
    MMQ_BATCHES,
    MMQ_FILE,
    MMQ_SUPPORTED,
    MMQ_TYPES,
    MmqChoice,
    patched_mmq_condition,
    patched_mmq_hook,
    render_mmq_patch,
)
from tuner.targets.archs import load_arch

pytestmark = pytest.mark.integration

SM90 = load_arch("sm_90")
CHOICES = (
    MmqChoice(type="q4_K", lo=1024, hi=None, backend="BLAS"),
    MmqChoice(type="q8_0", lo=256, hi=2048, backend="BLAS"),
    MmqChoice(type="q8_0", lo=0, hi=256, backend="MMQ"),
    MmqChoice(type="iq4_xs", lo=0, hi=64, backend="BLAS"),
)
HARNESS_TYPES = ("f16", *MMQ_SUPPORTED)  # f16: a ggml type MMQ does not support, still a name the hook knows


def _apply(tree_a, patch: str, tmp: Path) -> None:
    repo = tmp / "repo"
    (repo / MMQ_FILE).parent.mkdir(parents=True)
    shutil.copyfile(tree_a.root / MMQ_FILE, repo / MMQ_FILE)
    run(["git", "init", "-q"], cwd=repo, what="git init")
    (tmp / "mmq.patch").write_text(patch)
    out = run(["git", "apply", "--check", "-v", str(tmp / "mmq.patch")], cwd=repo, what="git apply").output
    assert f"Checking patch {MMQ_FILE}" in out
    run(["git", "apply", str(tmp / "mmq.patch")], cwd=repo, what="git apply")


def test_hook_patch_applies_to_pristine_tree(tree_a, tmp_path: Path) -> None:
    new = patched_mmq_hook(tree_a.root)
    patch = git_diff(MMQ_FILE, (tree_a.root / MMQ_FILE).read_text(), new)
    assert whitespace_only_hunks(patch) == []
    _apply(tree_a, patch, tmp_path)
    assert (tmp_path / "repo" / MMQ_FILE).read_text() == new
    fn = new[new.index("bool ggml_cuda_should_use_mmq(") :]
    # after upstream's support and shared-memory checks, before the arch branches
    assert (
        fn.index("smpbo < 48 * 1024") < fn.index("ggml_tuner_mmq_choose(type, ne11)") < fn.index("turing_mma_available")
    )


def test_condition_patch_applies_to_pristine_tree(tree_a, tmp_path: Path) -> None:
    cond = arch_condition(SM90, (tree_a.root / COMMON).read_text())
    new = patched_mmq_condition(tree_a.root, CHOICES, SM90, cond, note="Measured on NVIDIA H100.")
    assert new is not None
    flat = " ".join(new.split())
    assert (
        "if (cc == GGML_CUDA_CC_HOPPER && n_experts == 0) { switch (type) { case GGML_TYPE_IQ4_XS: "
        "if (ne11 < 64) { return false; } break; case GGML_TYPE_Q4_K: if (ne11 >= 1024) { return false; } break; "
        "case GGML_TYPE_Q8_0: if (ne11 >= 256 && ne11 < 2048) { return false; } break; default: break; } }"
    ) in flat
    patch = git_diff(MMQ_FILE, (tree_a.root / MMQ_FILE).read_text(), new)
    assert whitespace_only_hunks(patch) == []
    # what `tuner sweep mmq` writes as upstream.patch: the same diff, the arch condition read from the tree
    assert render_mmq_patch(tree_a.root, CHOICES, SM90, note="Measured on NVIDIA H100.") == patch
    _apply(tree_a, patch, tmp_path)
    assert patched_mmq_condition(tree_a.root, [c for c in CHOICES if c.backend == "MMQ"], SM90, cond) is None
    assert render_mmq_patch(tree_a.root, [c for c in CHOICES if c.backend == "MMQ"], SM90) is None


def _harness(tree_a, tmp: Path) -> Path:
    src = tmp / "mmq_harness.cpp"
    src.write_text(mmq_harness_source(patched_mmq_hook(tree_a.root), HARNESS_TYPES))
    exe = tmp / "mmq_harness"
    subprocess.run(["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", "-o", str(exe), str(src)], check=True)
    return exe


def _ask(exe: Path, env: str, queries: list[tuple[str, int]]) -> subprocess.CompletedProcess[str]:
    text = "".join(f"{HARNESS_TYPES.index(t)} {n}\n" for t, n in queries)
    return subprocess.run(
        [str(exe)], input=text, capture_output=True, text=True, env={**os.environ, "GGML_TUNER_MMQ_CHOICES": env}
    )


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not on PATH")
def test_cpp_hook_agrees_with_python(tree_a, tmp_path: Path) -> None:
    exe = _harness(tree_a, tmp_path)
    batches = sorted({*MMQ_BATCHES, 1, 15, 17, 255, 257, 5000, 1 << 40})
    queries = [(t, n) for t in HARNESS_TYPES for n in batches]
    answers = set()
    for env in (",".join(c.text for c in CHOICES), "", ",q6_K:16..17=BLAS,,q4_0:0..=MMQ,"):
        res = _ask(exe, env, queries)
        assert res.returncode == 0, res.stderr
        want = [match_mmq(parse_mmq_choices(env), t, n) or "NONE" for t, n in queries]
        assert res.stdout.split() == want
        answers |= set(want)
    assert answers == {"MMQ", "BLAS", "NONE"}  # every answer is exercised
    assert set(MMQ_TYPES) <= set(HARNESS_TYPES)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not on PATH")
@pytest.mark.parametrize(
    "env",
    [
        "q4_K:1024-=BLAS",
        "q4_K:..=BLAS",
        "q4_K:1...3=MMQ",
        "q4_K:0..=cublas",
        " q4_K:0..=BLAS",
        "q4_K:9..9=BLAS",
        "x:0..=MMQ",
    ],
)
def test_cpp_hook_aborts_where_python_refuses(tree_a, tmp_path: Path, env: str) -> None:
    with pytest.raises(UsageError):
        parse_mmq_choices(env)
    res = _ask(_harness(tree_a, tmp_path), env, [("q4_K", 16)])
    assert res.returncode == 3 and "is not TYPE:LO..HI=MMQ|BLAS" in res.stderr


def test_only_a_build_that_asks_for_the_hook_carries_it(tree_a) -> None:
    """The hook is opt-in: a search's build (and so its tuned.patch and build id) has no MMQ hook; the
    sweep's build (``hooks=("mmq",)``) carries exactly the text patched_mmq_hook makes, in another build directory."""
    from tuner.plan.render import render_variant

    plain = render_variant(tree_a, "sm_90", "cuda")
    hooked = render_variant(tree_a, "sm_90", "cuda", hooks=("mmq",))
    assert MMQ_FILE not in plain.files and "GGML_TUNER_MMQ_CHOICES" not in plain.patch
    assert hooked.files[MMQ_FILE] == patched_mmq_hook(tree_a.root)
    assert {k: v for k, v in hooked.files.items() if k != MMQ_FILE} == dict(plain.files)
    assert hooked.key != plain.key
    assert "+mmq-hook@" in hooked.short and "+mmq" not in plain.short
    with pytest.raises(UsageError, match="No opt-in hook 'mqm'.*mmq"):
        render_variant(tree_a, "sm_90", "cuda", hooks=("mqm",))
    with pytest.raises(UsageError, match="CPU build has no opt-in hooks"):
        render_variant(tree_a, "cpu", "cpu", hooks=("mmq",))

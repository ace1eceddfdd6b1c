"""`tuner search --arch gfx1151 --dry-run` for both eras (real HIP compile-checks), and the refusal."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import UsageError

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("spec", ["pypi:llama-cpp-python==0.3.36", "pypi:llama-cpp-python==0.3.16"])
def test_gfx1151_dry_run_both_eras(spec: str, hip_toolchain, tree_a, tree_b) -> None:
    from tuner.search.dryrun import run_dry_run
    from tuner.targets.target import resolve_target

    rep = run_dry_run(target=resolve_target("gfx1151", dry_run=True), source_spec=spec)
    assert rep.total >= rep.legal > 0
    if rep.era == "mma":
        # illegal candidates are counted with the rule they break, never compiled
        assert rep.total > rep.legal and any("tile.smem" in r["illegal_rules"] for r in rep.rows)
    else:
        # the seed-003 WMMA knobs: nwarps {4,8} x min blocks {1,2} x KQ stride {128,256}, all legal at wave 32
        assert rep.total == 8
    assert rep.compile_checks and all(c["status"] == "ok" for c in rep.compile_checks), rep.compile_checks
    # every compiled object with device code holds real gfx1151 code
    for c in rep.compile_checks:
        assert all(t in ([], ["gfx1151"]) for t in c["offload"].values()), c
        assert any(t == ["gfx1151"] for t in c["offload"].values())
    if rep.era == "rocwmma":
        assert rep.variants["hip-rocwmma"] == "ok"
    else:
        assert rep.variants["hip"] == "ok" and "hip-rocwmma" not in rep.variants


def test_illegal_pinned_value_is_rejected_before_compiling(tree_a, monkeypatch: pytest.MonkeyPatch) -> None:
    import tuner.builder.cmake

    def no_build(*a, **k):
        raise AssertionError("an illegal candidate must never reach the compiler")

    monkeypatch.setattr(tuner.builder.cmake, "build_variant", no_build)
    # a D=256 tile row whose shared memory overflows the 64 KiB LDS of gfx1151
    args = [
        "search",
        "--arch",
        "gfx1151",
        "--dry-run",
        "--set",
        "tile.amd_rdna.d256.c8.nbatch_fa=128",
        "--set",
        "tile.amd_rdna.d256.c8.nbatch_K=256",
    ]
    res = CliRunner().invoke(cli, args)
    assert isinstance(res.exception, UsageError), res.output
    assert "73728 B > 65536 B LDS" in str(res.exception) and "Nothing was compiled" in str(res.exception)
    # what a user sees: one paragraph, exit code 2, no traceback
    proc = subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "tile.smem" in proc.stderr


def test_search_for_absent_gpu_refuses(tree_a) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", "search", "--arch", "gfx1151"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "this machine has" in proc.stderr and "--dry-run" in proc.stderr


def test_dry_run_plan_is_stdout_progress_is_stderr(tree_a) -> None:
    """`tuner search --arch gfx1151 --dry-run > plan.md` captures the plan and only the plan."""
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", "search", "--arch", "gfx1151", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# Dry run: gfx1151") and "## Plan on the target" in proc.stdout
    for stage in (
        "| screen ",
        "| compose ",
        "| tune ",
        "| confirm ",
        "| output gate ",
        "| residency ",
        "| builds + test-backend-ops ",
    ):
        assert stage in proc.stdout
    assert "==>" not in proc.stdout and "Constraint-checking" in proc.stderr
    # a compile check either ran (✓ on stderr, "ok" in the plan) or says skipped and why, never both
    for line in proc.stdout.split("## Compile checks", 1)[1].split("## Plan", 1)[0].splitlines()[4:]:
        if line.startswith("| "):
            assert ("| ok " in line) != ("| skipped " in line), line

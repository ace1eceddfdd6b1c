"""``tuner sweep plan`` and ``run``: the dry run's counts, and bad input as a usage error."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tuner.cli.sweep_cmd import sweep
from tuner.errors import UsageError
from tuner.sweep.grid import N_KV, dry_run_text, plan
from tuner.sweep.live import estimate_text
from tuner.sweep.mmq import mmq_dry_run_text, plan_mmq
from tuner.sweep.mmq_live import DEFAULT_LIKE, like_sizes
from tuner.targets.archs import load_arch


def test_plan_prints_the_full_grid_and_its_time() -> None:
    res = CliRunner().invoke(sweep, ["plan", "--rounds", "4", "--per-call-s", "0.02"])
    assert res.exit_code == 0, res.output
    a = load_arch("sm_90")
    want = (
        dry_run_text(plan(a), rounds=4, per_call_s=0.02)
        + estimate_text(plan(a), rounds=4, chunk_size=72)
        + mmq_dry_run_text(plan_mmq(a), rounds=4, sizes=like_sizes(DEFAULT_LIKE), per_call_s=0.02)
    )
    assert res.output == want


def test_plan_takes_a_subset() -> None:
    res = CliRunner().invoke(sweep, ["plan", "--head-size", "64", "--gqa", "4", "--kv", "f16", "--ne1", "1"])
    assert res.exit_code == 0, res.output
    assert f"1 shapes x {len(N_KV)} n_kv points = {len(N_KV)} cells" in res.output


@pytest.mark.parametrize(("args", "why"), [(["--n-kv", "300"], "multiples of 256"), (["--arch", "sm_70"], "Turing")])
def test_plan_refuses_bad_input(args: list[str], why: str) -> None:
    with pytest.raises(UsageError, match=why):
        CliRunner().invoke(sweep, ["plan", *args], standalone_mode=False, catch_exceptions=False)


def test_run_refuses_a_storage_of_another_build(tmp_path) -> None:
    from tuner.sweep.live import SampleStore

    build = tmp_path / "bin"
    build.mkdir()
    (build / "test-backend-ops").write_text("")
    SampleStore(
        tmp_path / "s.db", {"arch": "sm_90", "backend": "CUDA0", "build": "/elsewhere", "n_head_kv": "8"}
    ).close()
    args = ["run", "--head-size", "64", "--gqa", "4", "--kv", "f16", "--ne1", "1", "--n-kv", "256"]
    args += ["--build", str(build), "--storage", str(tmp_path / "s.db"), "-o", str(tmp_path / "out")]
    with pytest.raises(UsageError, match="another build"):
        CliRunner().invoke(sweep, args, standalone_mode=False, catch_exceptions=False)


def test_timer_falls_back_to_test_backend_ops_only_by_default(tmp_path, capsys) -> None:
    from tuner.cli.sweep_cmd import _pick_timer
    from tuner.measure import kernel_bench

    bin_dir = tmp_path / "bin"  # no libggml*.so: fa-bench cannot be linked
    bin_dir.mkdir()
    assert _pick_timer("test-backend-ops", bin_dir) == (kernel_bench.run_round, "test-backend-ops")
    assert _pick_timer(None, bin_dir) == (kernel_bench.run_round, "test-backend-ops")
    assert "fa-bench is not usable with this build: No libggml.so" in capsys.readouterr().err
    with pytest.raises(UsageError, match="libggml"):
        _pick_timer("fa-bench", bin_dir)


def test_plan_prints_no_assumed_time_unless_asked() -> None:
    """The only estimate by default is the run's, from recorded costs; a per-call what-if needs the flag."""
    res = CliRunner().invoke(sweep, ["plan", "--head-size", "64", "--gqa", "4", "--kv", "f16", "--ne1", "1"])
    assert res.exit_code == 0, res.output
    assert "what-if" not in res.output and "sweep run:" in res.output
    assert "not runnable" not in res.output and "sweep mmq: 3 processes a round" in res.output
    asked = CliRunner().invoke(sweep, ["plan", "--head-size", "64", "--gqa", "4", "--per-call-s", "0.5"])
    assert "time at 0.5 s per call (what-if)" in asked.output
    assert "time at 0.5 s per case (what-if)" in asked.output

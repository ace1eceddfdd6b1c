"""``tuner sweep plan`` and ``run`` (its stage, tuner/sweep/run_stage.py): the dry run's counts, the timer, and bad
input as a usage error."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tests.unit.measure.test_fa_bench import REC, fake_bench_build
from tuner.cli.sweep_cmd import sweep
from tuner.errors import UsageError
from tuner.sweep.grid import DEFAULT_N_KV, DEFAULT_QUERY_BATCHES, N_KV, dry_run_text, plan
from tuner.sweep.live import estimate_text
from tuner.sweep.mmq import DEFAULT_LIKE, like_sizes, mmq_dry_run_text, plan_mmq
from tuner.targets.archs import load_arch


def test_plan_prints_the_default_grid_and_its_time() -> None:
    """The default: decode (Q->ne[1] = 1) at octave n_kv points; the grid's other points when asked."""
    res = CliRunner().invoke(sweep, ["plan", "--rounds", "4", "--per-call-s", "0.02"])
    assert res.exit_code == 0, res.output
    a = load_arch("sm_90")
    cells = plan(a, query_batches=DEFAULT_QUERY_BATCHES, n_kv=DEFAULT_N_KV)
    want = (
        dry_run_text(cells, rounds=4, per_call_s=0.02, max_rounds=4)
        + estimate_text(cells, limits=(4, 4), chunk_size=72)
        + mmq_dry_run_text(plan_mmq(a), limits=(4, 4), sizes=like_sizes(DEFAULT_LIKE), per_call_s=0.02)
    )
    assert res.output == want
    assert DEFAULT_N_KV == (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
    assert "50 shapes x 10 n_kv points = 500 cells" in res.output
    full = CliRunner().invoke(
        sweep, ["plan", "--ne1", "1", "--ne1", "2", "--ne1", "4", "--ne1", "8", "--n-kv", ",".join(map(str, N_KV))]
    )
    assert "200 shapes x 18 n_kv points = 3600 cells" in full.output  # the whole grid, when asked


def test_plan_takes_a_subset() -> None:
    res = CliRunner().invoke(sweep, ["plan", "--head-size", "64", "--gqa", "4", "--kv", "f16", "--ne1", "1"])
    assert res.exit_code == 0, res.output
    assert f"1 shapes x {len(DEFAULT_N_KV)} n_kv points = {len(DEFAULT_N_KV)} cells" in res.output


@pytest.mark.parametrize(("args", "why"), [(["--n-kv", "300"], "multiples of 256"), (["--arch", "sm_70"], "Turing")])
def test_plan_refuses_bad_input(args: list[str], why: str) -> None:
    with pytest.raises(UsageError, match=why):
        CliRunner().invoke(sweep, ["plan", *args], standalone_mode=False, catch_exceptions=False)


def test_run_refuses_a_storage_of_another_build(tmp_path) -> None:
    from tuner.rounds.store import SampleStore
    from tuner.sweep.live import TABLE

    build = tmp_path / "bin"
    build.mkdir()
    (build / "test-backend-ops").write_text("")
    SampleStore(
        TABLE, tmp_path / "s.db", {"arch": "sm_90", "backend": "CUDA0", "build": "/elsewhere", "n_head_kv": "8"}
    ).close()
    args = ["run", "--head-size", "64", "--gqa", "4", "--kv", "f16", "--ne1", "1", "--n-kv", "256"]
    args += ["--build", str(build), "--storage", str(tmp_path / "s.db"), "-o", str(tmp_path / "out")]
    with pytest.raises(UsageError, match="another build"):
        CliRunner().invoke(sweep, args, standalone_mode=False, catch_exceptions=False)


def test_timer_falls_back_to_test_backend_ops_only_by_default(tmp_path, capsys) -> None:
    from tuner.measure import kernel_bench
    from tuner.sweep.run_stage import pick_timer

    bin_dir = tmp_path / "bin"  # no libggml*.so: fa-bench cannot be linked
    bin_dir.mkdir()
    assert pick_timer("test-backend-ops", bin_dir) == (kernel_bench.run_round, "test-backend-ops")
    assert pick_timer(None, bin_dir) == (kernel_bench.run_round, "test-backend-ops")
    assert "fa-bench is not usable with this build: No libggml.so" in capsys.readouterr().err
    with pytest.raises(UsageError, match="libggml"):
        pick_timer("fa-bench", bin_dir)


def test_plan_prints_no_assumed_time_unless_asked() -> None:
    """The only estimate by default is the run's, from recorded costs; a per-call what-if needs the flag."""
    res = CliRunner().invoke(sweep, ["plan", "--head-size", "64", "--gqa", "4", "--kv", "f16", "--ne1", "1"])
    assert res.exit_code == 0, res.output
    assert "what-if" not in res.output and "sweep run:" in res.output
    assert "not runnable" not in res.output and "sweep mmq: 3 processes a round" in res.output
    asked = CliRunner().invoke(sweep, ["plan", "--head-size", "64", "--gqa", "4", "--per-call-s", "0.5"])
    assert "time at 0.5 s per call (what-if)" in asked.output
    assert "time at 0.5 s per case (what-if)" in asked.output


def test_plan_estimates_fa_bench_at_its_target() -> None:
    """The `sweep run` line prices fa-bench's cases at the target (default 20 ms; --target-ms 0: none)."""
    from tuner.sweep import live

    sub = ["plan", "--head-size", "64", "--gqa", "4", "--kv", "f16", "--ne1", "1"]
    default = CliRunner().invoke(sweep, sub)
    assert f"{live.fa_bench_case_s(20):.3f} s a case with --target-ms 20 (an estimate" in default.output
    none = CliRunner().invoke(sweep, [*sub, "--target-ms", "0"])
    assert f"{live.fa_bench_case_s(0):.3f} s a case with --target-ms 0" in none.output
    assert live.fa_bench_case_s(0) < live.fa_bench_case_s(20)


@pytest.mark.parametrize(
    ("backend", "extra", "target"), [("CUDA0", [], "20"), ("CPU", [], "0"), ("CUDA0", ["--target-ms", "7"], "7")]
)
def test_run_passes_the_target_to_fa_bench_on_a_gpu_backend_only(tmp_path, backend, extra, target) -> None:
    """fa-bench gets -m 20 on a GPU backend by default and none on CPU (the tests' backend stays at 50 ops a
    case); the store records the target, so a rerun with another one is refused."""
    import sqlite3

    from tuner.measure.fa_bench import EXE, SOURCE

    bin_dir = fake_bench_build(tmp_path, SOURCE, EXE, f'cat "{REC}"\n')
    (bin_dir / "test-backend-ops").write_text("")
    db, out = tmp_path / "s.db", tmp_path / "out"
    args = ["run", "--head-size", "64", "--gqa", "4", "--kv", "f16", "--ne1", "1", "--n-kv", "256", "--rounds", "2"]
    args += ["--build", str(bin_dir), "--backend", backend, "--storage", str(db), "-o", str(out), *extra]
    res = CliRunner().invoke(sweep, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    cmd = (out / "logs" / "chunk0000" / "r0" / "upstream" / "fabench-upstream.log").read_text().splitlines()[0]
    assert cmd.endswith(" -T 120" + ("" if target == "0" else f" -m {target}")), cmd
    with sqlite3.connect(db) as c:
        assert dict(c.execute("SELECT key, value FROM meta").fetchall())["target_ms"] == target
    other = "5" if target != "5" else "6"
    with pytest.raises(UsageError, match="target_ms"):
        CliRunner().invoke(sweep, [*args, "--target-ms", other], standalone_mode=False, catch_exceptions=False)

"""``tuner sweep run`` end to end on the real CPU build: its default timer (fa-bench, compiled against the
build) over the sweep's cells, samples stored in SQLite, a rerun resuming with nothing left to do. The CPU
backend has no tuner hook, so a forced kernel can neither run nor be confirmed there: its samples are
stored as failed without a process, and the cells get no verdict (upstream's config and its A/A twin
time fine). About a minute on 2 cores once the build is cached."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tuner.sweep.grid import plan
from tuner.targets.archs import load_arch

pytestmark = pytest.mark.integration

GRID = ["--head-size", "64", "--gqa", "4", "--kv", "f16", "--ne1", "1", "--n-kv", "256,512"]


def test_sweep_run_on_cpu_build_stores_rows_and_resumes(cpu_build, tuner, tmp_path: Path) -> None:
    if not (cpu_build.bin_dir / "test-backend-ops").is_file():
        pytest.skip(f"the CPU build at {cpu_build.bin_dir} has no test-backend-ops (tuner builds it by default)")
    out, db = tmp_path / "out", tmp_path / "sweep.sqlite3"
    args = ["sweep", "run", *GRID, "--rounds", "2", "--build", str(cpu_build.bin_dir), "--backend", "CPU"]
    args += ["--storage", str(db), "-o", str(out)]
    first = tuner(*args, home=tmp_path / "home")
    cells = [c for c in plan(load_arch("sm_90"), n_kv=(256, 512)) if c.shape.key == "D64/gqa4/kvf16/ne1_1"]
    configs = cells[0].configs  # default, A/A and the two forced kernels other than upstream's VEC
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT config, round, n_kv, us_per_run, kernel, error FROM samples").fetchall()
        meta = dict(c.execute("SELECT key, value FROM meta").fetchall())
    assert meta["timer"] == "fa-bench" and meta["target_ms"] == "0"  # no target on the CPU backend: 50 ops a case
    assert sorted((r[0], r[1], r[2]) for r in rows) == sorted(
        (cfg, r, cell.n_kv) for cfg in configs for r in range(2) for cell in cells
    )
    for cfg, _, _, us, kernel, error in rows:
        assert kernel is None  # no FA log on the CPU backend
        if cfg in ("default", "A/A"):
            assert error == "" and us is not None and us > 0
        else:  # a forced kernel cannot run there: a failed sample, never a time, and no process started
            assert us is None and error.startswith("not run: the backend prints no FA log")
    assert f"cells without a verdict: {len(cells)}" in first.stdout
    assert "rules (0)" in first.stdout and "none: no cell has a verdict" in first.stdout
    assert "4 processes (8 cases) to run" in first.stderr and "chunk 1/1 round 2/2" in first.stderr
    assert sorted(p.name for p in (out / "logs" / "chunk0000" / "r0").iterdir()) == ["AA", "upstream"]
    report = (out / "report.md").read_text()
    assert report.count("not run: the backend prints no FA log") == len(cells)
    assert not (out / "upstream.patch").exists()
    again = tuner(*args, home=tmp_path / "home")
    assert f"0 processes (0 cases) to run, {2 * len(configs)} already recorded" in again.stderr
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT count(*) FROM samples").fetchone()[0] == len(rows)

    # the store names the device its samples came from; resumed on another device model, it is refused
    assert meta["device"].startswith("CPU ") and f"- device: {meta['device']}" in report
    with sqlite3.connect(db) as c:
        c.execute("UPDATE meta SET value = 'NVIDIA H100 80GB HBM3' WHERE key = 'device'")
    other = tuner(*args, home=tmp_path / "home", check=False)
    assert other.returncode == 2, other.stderr
    assert "measured on NVIDIA H100 80GB HBM3, but this machine measures on CPU" in other.stderr
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT count(*) FROM samples").fetchone()[0] == len(rows)

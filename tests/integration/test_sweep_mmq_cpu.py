"""``tuner sweep mmq`` end to end on the real CPU build: mm-bench compiled against it, three processes a
round (upstream, its A/A twin, cuBLAS "forced") over every case, samples in SQLite, a rerun resuming with
nothing left to do. The CPU backend has no MMQ-vs-cuBLAS choice (the hook's variable is ignored), so both
configs time the same code and nothing is composed; the output says why. Seconds on 2 cores once the
build is cached."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ARGS = ["--backend", "CPU", "--type", "q8_0", "--ne11", "8", "--ne11", "16", "--size", "256x256", "--rounds", "2"]
ARGS += ["--iters", "8", "--cache-mb", "1"]


def test_sweep_mmq_on_cpu_build_stores_three_processes_a_round(cpu_shared_bin: Path, tuner, tmp_path: Path) -> None:
    out, db = tmp_path / "out", tmp_path / "mmq.sqlite3"
    args = ["sweep", "mmq", "--build", str(cpu_shared_bin), *ARGS, "--storage", str(db), "-o", str(out)]
    first = tuner(*args, home=tmp_path / "home")
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT type, m, k, ne11, config, round, us_per_op, error FROM mm_samples").fetchall()
        meta = dict(c.execute("SELECT key, value FROM meta").fetchall())
    assert meta["timer"] == "mm-bench" and meta["backend"] == "CPU" and meta["sweep"] == "mmq"
    assert meta["cuda_graphs"] == "on"  # the default (the CPU backend has no graphs to turn off)
    assert sorted((r[3], r[4], r[5]) for r in rows) == sorted(
        (n, cfg, r) for n in (8, 16) for cfg in ("default", "A/A", "BLAS") for r in range(2)
    )
    for t, m, k, _, _, _, us, error in rows:
        assert (t, m, k) == ("q8_0", 256, 256) and error == "" and us is not None and us > 0
    assert "6 processes (12 cases) to run, 0 already recorded" in first.stderr
    assert "chunk 1/1 round 2/2" in first.stderr
    for r in range(2):  # one process per config and round, each with its cases file and log
        assert sorted(p.name for p in (out / "logs" / "chunk0000" / f"r{r}").iterdir()) == ["AA", "BLAS", "upstream"]
    assert "choices (0):" in first.stdout
    assert "points with a verdict: 2 of 2" in first.stdout
    report = (out / "report.md").read_text()
    assert "### q8_0" in report and "| 8 | " in report and "| 16 | " in report
    assert "No `upstream.patch`." in report and not (out / "upstream.patch").exists()
    # a verdict the noise produced on CPU is never composed, and the output says why
    assert "none: withheld: the CPU backend has no MMQ-vs-cuBLAS choice" in first.stdout
    assert "withheld: the CPU backend has no MMQ-vs-cuBLAS choice" in report
    again = tuner(*args, home=tmp_path / "home")
    assert "0 processes (0 cases) to run, 6 already recorded" in again.stderr
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT count(*) FROM mm_samples").fetchone()[0] == len(rows)

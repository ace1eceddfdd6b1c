from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from tuner.errors import UsageError
from tuner.measure.bench import COLUMNS
from tuner.measure.frames import save_results
from tuner.result.plots import plot_depth
from tuner.result.report import render_report


def _frame(label: str, scale: dict[str, float], *, roof: float = float("nan"), seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for test, base in (("pp512", 1000.0), ("tg128", 100.0)):
        for depth in (0, 4096):
            s = list(base * scale[test[:2]] * (1 - depth / 20000) + rng.normal(0, base * 0.002, 6))
            med = float(np.median(s))
            row = {c: None for c in COLUMNS}
            row.update(
                label=label,
                test=test,
                phase=test[:2],
                depth=depth,
                n=6,
                median_ts=med,
                samples=s,
                ci_low=med * 0.99,
                ci_high=med * 1.01,
                ci_pct=1.0,
                mean_ts=med,
                min_ts=min(s),
                max_ts=max(s),
                status="ok",
                build_commit="0c1e570",
                backends="CUDA",
                gpu_info="NVIDIA H100",
                model_filename="m.gguf",
                model_size=800 * 2**20,
                n_params=1.24e9,
                roofline_pct=100 * med / roof,
                drift_corrected=False,
            )
            rows.append(row)
    return pd.DataFrame(rows, columns=list(COLUMNS))


def test_render_report_tables_marks_and_notes() -> None:
    frames = {
        "base": _frame("base", {"pp": 1.0, "tg": 1.0}),
        "tuned": _frame("tuned", {"pp": 1.2, "tg": 0.9}, seed=1),
        "same": _frame("same", {"pp": 1.0, "tg": 1.0}, seed=2),
    }
    md = render_report(frames, "base")
    assert "## tuned vs base" in md and "## same vs base" in md and "## Method" in md
    tuned = md.split("## tuned vs base")[1].split("## same vs base")[0]
    head = [c.strip() for c in next(ln for ln in tuned.splitlines() if ln.startswith("| Model")).strip("|").split("|")]
    assert head == ["Model", "Test", "t/s base", "t/s tuned", "Speedup", "Median ratio", "95% CI", "Noise", "Verdict"]
    # +20% prefill clears the CUDA prefill floor; -10% decode clears the CUDA decode floor
    pp_line = next(line for line in tuned.splitlines() if "| pp512@d4096 " in line)
    assert "1.20" in pp_line and "✓ faster" in pp_line and "floor" in pp_line
    tg_line = next(line for line in tuned.splitlines() if "| tg128 " in line)
    assert "0.90" in tg_line and "✗ slower" in tg_line
    same = md.split("## same vs base")[1].split("## Method")[0]
    assert "faster" not in same and "slower" not in same
    assert "run-to-run floor CUDA pp" in md and "docs/noise-floors.md" in md
    assert "roofline %: not available" in md and "0c1e570" in md


def test_render_report_aa_pair_and_json(tmp_path: Path) -> None:
    from tuner.cli.bench_cmd import report as report_cmd

    base, base2 = _frame("base", {"pp": 1.0, "tg": 1.0}), _frame("base", {"pp": 1.25, "tg": 1.0}, seed=5)
    tuned = _frame("tuned", {"pp": 1.2, "tg": 0.9}, seed=1)
    md = render_report({"base": base, "tuned": tuned}, "base", aa=(base, base2))
    pp_line = next(line for line in md.splitlines() if "| pp512@d4096 " in line)
    # the A/A pair differs by 25% in prefill, so +20% is within this machine's noise
    assert "A/A" in pp_line and "within noise" in pp_line
    save_results(base, tmp_path / "base")
    save_results(tuned, tmp_path / "tuned")
    r = CliRunner().invoke(report_cmd, [str(tmp_path / "base.jsonl"), str(tmp_path / "tuned.jsonl"), "--json"])
    assert r.exit_code == 0, r.output
    import json

    recs = json.loads(r.stdout)
    assert {x["test"] for x in recs} == {"pp512", "pp512@d4096", "tg128", "tg128@d4096"}
    assert {x["noise"] for x in recs} == {"floor"} and {x["name_b"] for x in recs} == {"tuned"}


def test_render_report_roofline_and_errors() -> None:
    frames = {"a": _frame("a", {"pp": 1, "tg": 1}, roof=200.0), "b": _frame("b", {"pp": 1, "tg": 1.1}, roof=200.0)}
    md = render_report(frames, "a")
    assert "roofline % a" in md and "model estimate" in md
    with pytest.raises(UsageError, match="Did you mean 'a'"):
        render_report(frames, "aa")
    with pytest.raises(UsageError):
        render_report({}, "a")


def test_plot_depth_writes_png(tmp_path: Path) -> None:
    frames = {"a": _frame("a", {"pp": 1, "tg": 1}), "b": _frame("b", {"pp": 1.1, "tg": 1})}
    png = plot_depth(frames, tmp_path / "d" / "depth.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_cli_compare_and_report(tmp_path: Path) -> None:
    from tuner.cli.bench_cmd import compare, report

    save_results(_frame("base", {"pp": 1, "tg": 1}), tmp_path / "base")
    save_results(_frame("new", {"pp": 1.2, "tg": 1}, seed=3), tmp_path / "new")
    r = CliRunner().invoke(compare, [str(tmp_path / "base.jsonl"), str(tmp_path / "new.jsonl")])
    assert r.exit_code == 0, r.output
    assert "✓ faster" in r.output and "no difference" in r.output
    r = CliRunner().invoke(
        report,
        [
            str(tmp_path / "base.jsonl"),
            str(tmp_path / "new.parquet"),
            "-o",
            str(tmp_path / "rep"),
            "--baseline",
            "base",
        ],
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "rep" / "report.md").read_text().startswith("# llama-bench results")
    assert (tmp_path / "rep" / "depth.png").is_file()


def test_cli_bad_input_exit_code_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "x.jsonl").write_text('{"a": 1}\n')
    p = subprocess.run(
        [sys.executable, "-m", "tuner", "report", str(tmp_path / "x.jsonl")], capture_output=True, text=True
    )
    assert p.returncode == 2 and "tuner: error:" in p.stderr and "Traceback" not in p.stderr

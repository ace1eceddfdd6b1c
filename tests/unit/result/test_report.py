from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from tuner.measure.bench import COLUMNS, save_results
from tuner.errors import UsageError
from tuner.result.report import plot_depth, render_report


def _frame(label: str, scale: dict[str, float], *, roof: float = float("nan"), seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for test, base in (("pp512", 1000.0), ("tg128", 100.0)):
        for depth in (0, 4096):
            s = list(base * scale[test[:2]] * (1 - depth / 20000) + rng.normal(0, base * 0.002, 6))
            med = float(np.median(s))
            row = {c: None for c in COLUMNS}
            row.update(label=label, test=test, phase=test[:2], depth=depth, n=6, median_ts=med, samples=s,
                       ci_low=med * 0.99, ci_high=med * 1.01, ci_pct=1.0, mean_ts=med, min_ts=min(s), max_ts=max(s),
                       status="ok", build_commit="0c1e570", backends="CUDA", gpu_info="NVIDIA H100",
                       model_filename="m.gguf", model_size=800 * 2**20, n_params=1.24e9,
                       roofline_pct=100 * med / roof, drift_corrected=False)
            rows.append(row)
    return pd.DataFrame(rows, columns=list(COLUMNS))


def test_render_report_tables_marks_and_notes() -> None:
    frames = {"base": _frame("base", {"pp": 1.0, "tg": 1.0}),
              "tuned": _frame("tuned", {"pp": 1.2, "tg": 0.9}, seed=1),
              "same": _frame("same", {"pp": 1.0, "tg": 1.0}, seed=2)}
    md = render_report(frames, "base")
    assert "## Prefill (pp)" in md and "## Decode (tg)" in md
    assert "| pp512 @ d4096" in md and "Δ% tuned" in md and "Δ% same" in md
    pp_line = next(line for line in md.splitlines() if line.startswith("| pp512 @ d4096"))
    assert re.search(r"\+(19|20)\.\d\d% ✓", pp_line)
    tg_line = next(line for line in md.splitlines() if line.startswith("| tg128 "))
    assert re.search(r"-(9|10)\.\d\d% ✗", tg_line) and "(n=6)" in tg_line and " ± " in tg_line
    assert "~" in next(line for line in md.splitlines() if line.startswith("| pp512 "))
    assert "roofline %: not available" in md and "0c1e570" in md


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
    r = CliRunner().invoke(report, [str(tmp_path / "base.jsonl"), str(tmp_path / "new.parquet"), "-o",
                                    str(tmp_path / "rep"), "--baseline", "base"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "rep" / "report.md").read_text().startswith("# llama-bench results")
    assert (tmp_path / "rep" / "depth.png").is_file()


def test_cli_bad_input_exit_code_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "x.jsonl").write_text('{"a": 1}\n')
    p = subprocess.run([sys.executable, "-m", "tuner", "report", str(tmp_path / "x.jsonl")],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "tuner: error:" in p.stderr and "Traceback" not in p.stderr

"""compare_table against llama.cpp's own scripts/compare-llama-bench.py on recorded llama-bench data."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from tuner.measure.bench import COLUMNS
from tuner.measure.frames import save_results
from tuner.measure.stats import compare
from tuner.result.tables import COMPARE_FIELDS, bench_test_name, compare_table, format_compare

DATA = Path(__file__).resolve().parents[2] / "data"
SCRIPT = DATA / "compare" / "compare-llama-bench.py"
H100 = DATA / "bench" / "h100"
# Two sides of equal name length: the script truncates build_commit to the shortest one.
NAME_A, NAME_B = "upstream", "tuned-fa"
SIDES = {
    NAME_A: ("llama-bench-pp-default.jsonl", "llama-bench-tg-default.jsonl"),
    NAME_B: ("llama-bench-pp-TILE.jsonl", "llama-bench-tg-TILE.jsonl"),
}


def _records() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for side, files in SIDES.items():
        out[side] = [json.loads(line) for f in files for line in (H100 / f).read_text().splitlines() if line.strip()]
    return out


def _points(recs: dict[str, list[dict]]) -> list[dict]:
    """Points as the search hands them over, from the same records the script reads (avg_ts)."""

    def key(r: dict) -> tuple[int, int, int]:
        return (int(r["n_prompt"]), int(r["n_gen"]), int(r["n_depth"]))

    b = {key(r): r for r in recs[NAME_B]}
    pts = []
    for ra in recs[NAME_A]:
        rb = b[key(ra)]
        phase = "pp" if int(ra["n_gen"]) == 0 else "tg"
        v = compare(ra["samples_ts"][1:], rb["samples_ts"][1:])
        pts.append(
            {
                "phase": phase,
                "depth": int(ra["n_depth"]),
                "test": f"pp{ra['n_prompt']}" if phase == "pp" else f"tg{ra['n_gen']}",
                "base_ts": ra["avg_ts"],
                "tuned_ts": rb["avg_ts"],
                "speedup": rb["avg_ts"] / ra["avg_ts"],
                "ci_low": 1 + v.ci_low / 100,
                "ci_high": 1 + v.ci_high / 100,
                "aa_noise_pct": 1.5,
                "verdict": v.verdict,
                "upstream_kernel": "VEC" if phase == "tg" else "MMA",
                "kernel": "TILE",
            }
        )
    return pts[::-1]  # order is compare_table's job


def _frame(label: str, scale: dict[str, float], *, seed: int = 0) -> pd.DataFrame:
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
                status="ok",
                model_filename="models/m.gguf",
            )
            rows.append(row)
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _split(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _align(rule: str) -> list[str]:
    return [
        "right" if c.strip().endswith(":") and not c.strip().startswith(":") else "left"
        for c in rule.strip().strip("|").split("|")
    ]


def test_bench_test_name_matches_script_convention() -> None:
    assert bench_test_name("pp512", 0) == "pp512"
    assert bench_test_name("pp512", 4096) == "pp512@d4096"
    assert bench_test_name("tg128", 32768) == "tg128@d32768"


def test_table_layout_matches_compare_llama_bench_run(tmp_path: Path) -> None:
    """Run the real script offline on recorded H100 JSONL and compare header, naming, numbers, alignment.

    The script reads a JSONL file directly (``-t llama-bench -i FILE -b A -c B``); with explicit
    ``-b``/``-c`` it needs no git checkout, only its imports (tabulate, GitPython).
    """
    pytest.importorskip("tabulate", reason="compare-llama-bench.py needs tabulate (pip install tabulate)")
    try:
        import git  # noqa: F401
    except ImportError as e:  # GitPython missing, or no git executable
        pytest.skip(f"compare-llama-bench.py needs GitPython and git: {e}")
    recs = _records()
    combined = tmp_path / "llama-bench.jsonl"
    with combined.open("w", encoding="utf-8") as fh:
        for side, rows in recs.items():
            for r in rows:
                fh.write(json.dumps({**r, "build_commit": side}) + "\n")
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "-t", "llama-bench", "-i", str(combined), "-b", NAME_A, "-c", NAME_B],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    theirs = [line for line in run.stdout.splitlines() if line.startswith("|")]
    ours = compare_table(_points(recs), name_a=NAME_A, name_b=NAME_B, model="llama 1B Q4_K_M").splitlines()

    t_head, o_head = _split(theirs[0]), _split(ours[0])
    # The script puts hardware columns (CPU/GPU, chosen by the data) before Model; from Model on, it's ours.
    start = t_head.index("Model")
    assert t_head[start:] == ["Model", "Test", f"t/s {NAME_A}", f"t/s {NAME_B}", "Speedup"]
    n = len(t_head) - start
    assert o_head[:n] == t_head[start:]
    assert o_head[n:] == ["95% CI", "Noise", "Verdict", "Kernel"]
    assert _align(ours[1])[:n] == _align(theirs[1])[start:]
    t_rows = [_split(line)[start:] for line in theirs[2:]]
    o_rows = [_split(line)[:n] for line in ours[2:]]
    assert [r[1] for r in t_rows] == [
        "pp512",
        "pp512@d4096",
        "pp512@d16384",
        "pp512@d32768",
        "tg128",
        "tg128@d4096",
        "tg128@d16384",
        "tg128@d32768",
    ]
    assert o_rows == t_rows  # same names, order, t/s and speedup at two decimals


def test_script_source_still_builds_the_same_header() -> None:
    """Runs without tabulate/GitPython too: the header and naming code our layout copies is still there."""
    src = SCRIPT.read_text(encoding="utf-8")
    assert 'headers += ["Test", f"t/s {name_baseline}", f"t/s {name_compare}", "Speedup"]' in src
    assert 'DEFAULT_SHOW_LLAMA_BENCH = ["model_type"]' in src and '"model_type": "Model"' in src
    for snippet in (
        'test_name = f"pp{n_prompt}"',
        'test_name = f"tg{n_gen}"',
        'test_name = f"{test_name}@d{n_depth}"',
        'floatfmt=".2f"',
        'default="pipe"',
    ):
        assert snippet in src, snippet


def test_vendored_script_matches_pinned_source() -> None:
    from tuner.paths import tuner_home

    homes = {tuner_home(), Path.home() / ".cache" / "tuner"}
    cands = [h / "sources" / "832db0699007f1be" / "llama.cpp" / "scripts" / "compare-llama-bench.py" for h in homes]
    found = [c for c in cands if c.is_file()]
    if not found:
        pytest.skip("pinned source not fetched here (tuner source fetch pypi:llama-cpp-python==0.3.36)")
    assert found[0].read_bytes() == SCRIPT.read_bytes()


def test_optional_columns_and_formats() -> None:
    pts = [
        {
            "phase": "tg",
            "depth": 4096,
            "test": "tg128",
            "base_ts": 100.0,
            "tuned_ts": 105.0,
            "speedup": 1.07,
            "ci_low": 1.02,
            "ci_high": 1.08,
            "aa_noise_pct": None,
            "verdict": "",
            "upstream_kernel": None,
            "kernel": None,
        },
        {
            "phase": "pp",
            "depth": 0,
            "test": "pp512",
            "base_ts": 1000.0,
            "tuned_ts": float("nan"),
            "speedup": float("nan"),
            "ci_low": float("nan"),
            "ci_high": float("nan"),
            "aa_noise_pct": 2.0,
            "noise_kind": "floor",
            "verdict": "missing",
            "upstream_kernel": "MMA",
            "kernel": "MMA",
        },
    ]
    md = compare_table(pts)
    head = _split(md.splitlines()[0])
    assert head == ["Model", "Test", "t/s upstream", "t/s tuned", "Speedup", "95% CI", "Noise", "Verdict"]
    assert _split(md.splitlines()[2])[1:] == ["pp512", "1000.00", "-", "-", "-", "±2.0% floor", "missing"]
    # Speedup is the ratio of the two t/s shown (1.05), not the point's own estimate (1.07); no noise -> "none"
    assert _split(md.splitlines()[3])[1:] == ["tg128@d4096", "100.00", "105.00", "1.05", "1.020–1.080", "none", ""]

    recs = json.loads(format_compare(pts, "json", model="m"))
    assert [r["test"] for r in recs] == ["pp512", "tg128@d4096"]
    assert set(recs[0]) == set(COMPARE_FIELDS) and recs[0]["ts_b"] is None and recs[1]["speedup"] == 1.05
    assert recs[0]["noise"] == "floor" and recs[1]["noise"] == "none" and recs[1]["noise_pct"] is None
    rows = list(csv.DictReader(io.StringIO(format_compare(pts, "csv", model="m"))))
    assert list(rows[0]) == list(COMPARE_FIELDS)
    assert [r["test"] for r in rows] == [r["test"] for r in recs] and rows[1]["ci_high"] == "1.08"
    with pytest.raises(Exception, match="md, csv or json"):
        format_compare(pts, "xml")


def test_cli_compare_formats_and_aa(tmp_path: Path) -> None:
    from tuner.cli.bench_cmd import compare as compare_cmd

    save_results(_frame("base", {"pp": 1, "tg": 1}), tmp_path / "base")
    save_results(_frame("base", {"pp": 1.01, "tg": 1}, seed=7), tmp_path / "base2")
    save_results(_frame("new", {"pp": 1.2, "tg": 1.004}, seed=3), tmp_path / "new")
    args = [str(tmp_path / "base.jsonl"), str(tmp_path / "new.jsonl")]
    r = CliRunner().invoke(compare_cmd, args)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert _split(lines[0]) == [
        "Model",
        "Test",
        "t/s base",
        "t/s new",
        "Speedup",
        "Median ratio",
        "95% CI",
        "Noise",
        "Verdict",
    ]
    # no backend recorded in these frames: no floor, so a +20% change claims nothing without --aa
    assert any(_split(line)[1] == "pp512@d4096" and "no noise reference" in line for line in lines)
    assert "no recorded run-to-run floor" in r.stderr

    aa = ["--aa", str(tmp_path / "base.jsonl"), str(tmp_path / "base2.jsonl")]
    r = CliRunner().invoke(compare_cmd, args + aa)
    assert r.exit_code == 0, r.output
    assert any(
        _split(line)[1] == "pp512@d4096" and "✓ faster" in line and "A/A" in line for line in r.stdout.splitlines()
    )
    r = CliRunner().invoke(compare_cmd, args + ["--format", "json", *aa, "--plot", str(tmp_path / "sp.png")])
    assert r.exit_code == 0, r.output
    recs = json.loads(r.stdout)
    assert len(recs) == 4 and all(rec["noise_pct"] is not None and rec["noise"] == "A/A" for rec in recs)
    assert {rec["model"] for rec in recs} == {"m"} and recs[0]["name_a"] == "base"
    assert (tmp_path / "sp.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads(CliRunner().invoke(compare_cmd, args + ["--json", *aa]).stdout) == recs
    r = CliRunner().invoke(compare_cmd, args + ["--format", "csv"])
    assert r.exit_code == 0 and r.stdout.splitlines()[0] == ",".join(COMPARE_FIELDS)

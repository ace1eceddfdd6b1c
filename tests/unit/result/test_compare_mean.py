"""`tuner compare`/`tuner report` print compare-llama-bench.py's t/s (llama-bench's mean) beside tuner's median CI.

compare-llama-bench.py selects ``AVG(tb.avg_ts), AVG(tc.avg_ts)`` over the rows of one test (joined on
the key properties), so a side's t/s is the mean over its rows of llama-bench's ``avg_ts``, itself the
mean of the row's ``samples_ts``. The fixture gives side A two rows of unequal length with slow outliers,
so that this mean, the pooled mean and the median all differ.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.measure.stats import compare as stats_compare

DATA = Path(__file__).resolve().parents[2] / "data"
SCRIPT = DATA / "compare" / "compare-llama-bench.py"
TEMPLATE = DATA / "bench" / "h100" / "llama-bench-pp-default.jsonl"

# (n_prompt, n_gen) -> per side, the samples_ts of each llama-bench row
SIDES: dict[str, dict[tuple[int, int], list[list[float]]]] = {
    "a": {
        (512, 0): [[1000.0, 3000.0, 3100.0], [2000.0, 2050.0, 2100.0, 2150.0, 9000.0]],
        (0, 128): [[50.0, 51.0, 80.0]],
    },
    "b": {(512, 0): [[4000.0, 4100.0, 1200.0, 4150.0]], (0, 128): [[55.0, 56.0, 90.0, 57.0], [54.0, 58.0]]},
}


def _record(n_prompt: int, n_gen: int, samples: list[float], commit: str) -> dict:
    rec = json.loads(TEMPLATE.read_text(encoding="utf-8").splitlines()[0])
    ntok = n_prompt + n_gen
    rec.update(
        build_commit=commit,
        n_prompt=n_prompt,
        n_gen=n_gen,
        n_depth=0,
        samples_ts=samples,
        samples_ns=[round(1e9 * ntok / s) for s in samples],
        avg_ts=statistics.fmean(samples),  # llama-bench: avg_ts() = avg(get_ts())
        stddev_ts=statistics.stdev(samples),
    )
    return rec


def _write(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for side, tests in SIDES.items():
        path = tmp_path / f"{side}.jsonl"
        lines = [json.dumps(_record(p, g, s, side)) for (p, g), rows in tests.items() for s in rows]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        out[side] = path
    return out


def _anchor_ts(side: str, key: tuple[int, int]) -> float:
    """compare-llama-bench.py's figure, from the raw samples: the mean over rows of each row's mean."""
    return statistics.fmean(statistics.fmean(s) for s in SIDES[side][key])


def _pooled(side: str, key: tuple[int, int]) -> list[float]:
    return [x for s in SIDES[side][key] for x in s]


def _split(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _row(lines: list[str], test: str) -> dict[str, str]:
    # the script puts hardware columns (CPU/GPU) before Model
    head = _split(next(ln for ln in lines if ln.startswith("|") and "Model" in _split(ln)))
    i = head.index("Test")
    row = _split(next(ln for ln in lines if ln.startswith("|") and _split(ln)[i] == test))
    return dict(zip(head, row))


KEYS = {"pp512": (512, 0), "tg128": (0, 128)}


def test_fixture_separates_the_estimators() -> None:
    for side in SIDES:
        for key in KEYS.values():
            assert abs(_anchor_ts(side, key) - statistics.median(_pooled(side, key))) > 1
    # rows of unequal length: the mean of the rows' avg_ts is not the mean of the pooled samples
    assert abs(_anchor_ts("a", (512, 0)) - statistics.fmean(_pooled("a", (512, 0)))) > 1


def test_compare_prints_compare_llama_bench_mean_beside_the_median_ci(tmp_path: Path) -> None:
    from tuner.cli.bench_cmd import compare

    files = _write(tmp_path)
    r = CliRunner().invoke(compare, [str(files["a"]), str(files["b"])])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert _split(lines[0])[:6] == ["Model", "Test", "t/s a", "t/s b", "Speedup", "Median ratio"]
    for test, key in KEYS.items():
        row = _row(lines, test)
        ma, mb = _anchor_ts("a", key), _anchor_ts("b", key)
        assert (row["t/s a"], row["t/s b"], row["Speedup"]) == (f"{ma:.2f}", f"{mb:.2f}", f"{mb / ma:.2f}")
        med = statistics.median(_pooled("b", key)) / statistics.median(_pooled("a", key))
        assert row["Median ratio"] == f"{med:.2f}"
        v = stats_compare(_pooled("a", key), _pooled("b", key))  # the CI as before: medians of all repetitions
        assert row["95% CI"] == f"{1 + v.ci_low / 100:.3f}–{1 + v.ci_high / 100:.3f}"
    assert "compare-llama-bench" in r.stderr and "median" in r.stderr  # says which column is which


def test_compare_json_carries_both(tmp_path: Path) -> None:
    from tuner.cli.bench_cmd import compare

    files = _write(tmp_path)
    r = CliRunner().invoke(compare, [str(files["a"]), str(files["b"]), "--json"])
    assert r.exit_code == 0, r.output
    recs = {rec["test"]: rec for rec in json.loads(r.stdout)}
    for test, key in KEYS.items():
        rec = recs[test]
        ma, mb = _anchor_ts("a", key), _anchor_ts("b", key)
        meda, medb = statistics.median(_pooled("a", key)), statistics.median(_pooled("b", key))
        assert rec["ts_a"] == pytest.approx(ma) and rec["ts_b"] == pytest.approx(mb)
        assert rec["speedup"] == pytest.approx(mb / ma)
        assert rec["median_a"] == pytest.approx(meda) and rec["median_b"] == pytest.approx(medb)
        assert rec["median_ratio"] == pytest.approx(medb / meda)
        v = stats_compare(_pooled("a", key), _pooled("b", key))
        assert (rec["ci_low"], rec["ci_high"]) == pytest.approx((1 + v.ci_low / 100, 1 + v.ci_high / 100))


def test_report_table_shows_the_same_figures(tmp_path: Path) -> None:
    from tuner.cli.bench_cmd import report

    files = _write(tmp_path)
    r = CliRunner().invoke(report, [str(files["a"]), str(files["b"])])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    row = _row(lines, "pp512")
    ma, mb = _anchor_ts("a", (512, 0)), _anchor_ts("b", (512, 0))
    assert (row["t/s a"], row["t/s b"], row["Speedup"]) == (f"{ma:.2f}", f"{mb:.2f}", f"{mb / ma:.2f}")
    assert any("compare-llama-bench" in ln and "median" in ln for ln in lines if not ln.startswith("|"))


def test_the_script_itself_prints_the_same_t_s(tmp_path: Path) -> None:
    """The vendored scripts/compare-llama-bench.py on the same records prints the same three columns."""
    pytest.importorskip("tabulate", reason="compare-llama-bench.py needs tabulate (pip install tabulate)")
    try:
        import git  # noqa: F401
    except ImportError as e:
        pytest.skip(f"compare-llama-bench.py needs GitPython and git: {e}")
    from tuner.cli.bench_cmd import compare

    files = _write(tmp_path)
    combined = tmp_path / "both.jsonl"
    combined.write_text(files["a"].read_text() + files["b"].read_text(), encoding="utf-8")
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "-t", "llama-bench", "-i", str(combined), "-b", "a", "-c", "b"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    theirs = [ln for ln in run.stdout.splitlines() if ln.startswith("|")]
    ours = CliRunner().invoke(compare, [str(files["a"]), str(files["b"])]).stdout.splitlines()
    for test in KEYS:
        t, o = _row(theirs, test), _row(ours, test)
        assert [t["t/s a"], t["t/s b"], t["Speedup"]] == [o["t/s a"], o["t/s b"], o["Speedup"]]

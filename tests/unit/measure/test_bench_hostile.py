"""Bench files from other machines are data: `tuner compare`/`report` parse them, check every field,
never execute them, never judge nonsense rates, and stay within bounded memory."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import UsageError
from tuner.measure import frames, stats
from tuner.measure.frames import read_llama_bench

UPSTREAM = (
    Path(__file__).resolve().parents[3]
    / "tests"
    / "data"
    / "bench"
    / "h100"
    / "confirm-l8b"
    / "confirm-tg+pp-r0-upstream+upstream-pp+tg.log"
)
SQL_FIELDS = ["build_commit", "backends", "model_type", "n_ubatch", "n_prompt", "n_gen", "n_depth", "avg_ts"]


def _records() -> list[dict[str, Any]]:
    return read_llama_bench(UPSTREAM)


def _invoke(*args: str) -> tuple[BaseException | None, str]:
    """The command's exception (None when it succeeded) and its stdout."""
    res = CliRunner().invoke(cli, list(args), standalone_mode=False)
    return res.exception, res.stdout


def _refused(*args: str) -> str:
    """The message of the exit-2 UsageError the command must end with."""
    exc, out = _invoke(*args)
    assert isinstance(exc, UsageError) and exc.exit_code == 2, (exc, out)
    return str(exc)


def _jsonl(path: Path, recs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))  # json.dumps writes NaN/Infinity literals
    return path


def _sql(recs: list[dict[str, Any]], extra: str = "", table: str = "llama_bench") -> str:
    """What llama-bench's sql_printer writes: CREATE TABLE, then one INSERT per test, every value quoted."""
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (\n"
        + ",\n".join(f"  {k} {'REAL' if k == 'avg_ts' else 'TEXT'}" for k in SQL_FIELDS)
        + "\n);\n\n"
        + "".join(
            f"INSERT INTO {table} ({', '.join(SQL_FIELDS)}) VALUES ("
            + ", ".join(f"'{r[k]}'" for k in SQL_FIELDS)
            + ");\n"
            for r in recs
        )
        + extra
    )


# --- -o sql is parsed, never executed -------------------------------------------------------------


def test_sql_as_llama_bench_writes_it_is_read(tmp_path: Path) -> None:
    a = tmp_path / "a.sql"
    a.write_text(_sql(_records()))
    b = tmp_path / "b.sql"
    b.write_text("ggml_cuda_init: found 1 CUDA devices:\n  Device 0: NVIDIA H100\n" + _sql(_records(), table="test"))
    exc, out = _invoke("compare", str(a), str(b))
    assert exc is None, out
    assert "pp512" in out and "tg128" in out


def test_sql_attach_creates_no_file_and_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "created-by-attach.db"
    a = tmp_path / "a.sql"
    a.write_text(_sql(_records(), extra=f"ATTACH DATABASE '{target}' AS x;\nCREATE TABLE x.t (a);\n"))
    msg = _refused("compare", str(a), str(a))
    assert not target.exists()
    n_line = _sql(_records()).count("\n") + 1
    assert f"{a}:{n_line}" in msg and "ATTACH" in msg


@pytest.mark.parametrize(
    "extra",
    [
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5) SELECT count(*) FROM c;\n",
        "INSERT INTO llama_bench (n_prompt, n_gen) SELECT 512, 0;\n",
        "CREATE TRIGGER t AFTER INSERT ON llama_bench BEGIN SELECT 1; END;\n",
        "INSERT INTO llama_bench (n_prompt, n_gen) VALUES (512, 0); DROP TABLE llama_bench;\n",
        "INSERT INTO llama_bench (n_prompt, n_gen) VALUES (512, 0), (128, 0);\n",
        "INSERT INTO other (n_prompt, n_gen) VALUES (512, 0);\n",
        "INSERT INTO llama_bench (n_prompt, n_gen) VALUES (512);\n",
        "INSERT INTO llama_bench (n_prompt, n_gen) VALUES ('512, 0);\n",
    ],
)
def test_sql_other_statements_are_refused_naming_the_line(tmp_path: Path, extra: str) -> None:
    a = tmp_path / "a.sql"
    a.write_text(_sql(_records(), extra=extra))
    msg = _refused("compare", str(a), str(a))
    assert f"{a}:{_sql(_records()).count(chr(10)) + 1}" in msg


def test_sql_recursive_cte_does_not_hang(tmp_path: Path) -> None:
    a = tmp_path / "a.sql"
    a.write_text(
        _sql(
            _records(),
            extra="WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c;\n",
        )
    )
    done: list[str] = []
    # A daemon thread so that a tree which executes the file fails this test instead of hanging it.
    t = threading.Thread(target=lambda: done.append(_refused("compare", str(a), str(a))), daemon=True)
    t.start()
    t.join(30)
    assert done and "WITH" in done[0]


# --- rates that are not rates ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, 0.0, -8517.06])
def test_nonsense_rates_give_no_verdict(tmp_path: Path, bad: float) -> None:
    recs = _records()
    a = _jsonl(tmp_path / "a.jsonl", recs)
    broken = [{**r, "samples_ts": [bad] * len(r["samples_ts"])} if r["n_gen"] == 0 else r for r in recs]
    b = _jsonl(tmp_path / "b.jsonl", broken)
    msg = _refused("compare", str(a), str(b))
    assert f"{b}:1" in msg and "samples_ts" in msg and "positive" in msg
    # avg_ts (the one rate CSV and SQL carry) the same way
    rows = [{k: v for k, v in r.items() if k not in ("samples_ts", "samples_ns")} for r in recs]
    c = _jsonl(tmp_path / "c.jsonl", [{**rows[0], "avg_ts": bad}, *rows[1:]])
    msg = _refused("report", str(a), str(c))
    assert f"{c}:1" in msg and "avg_ts" in msg


def test_tuner_files_with_nonsense_rates(tmp_path: Path) -> None:
    from tuner.measure.frames import load_results, save_results

    df = load_results(UPSTREAM)
    (good,) = (p for p in save_results(df, tmp_path / "good") if p.suffix == ".jsonl")
    bad = df.copy()
    bad["samples"] = [[-x for x in s] for s in bad["samples"]]
    bad["median_ts"] = -bad["median_ts"]
    (badf,) = (p for p in save_results(bad, tmp_path / "bad") if p.suffix == ".jsonl")
    msg = _refused("compare", str(good), str(badf))
    assert f"{badf}:1" in msg and "positive" in msg
    # A failed row (no samples, NaN statistics) is missing, not "no difference".
    failed = df.copy()
    failed["samples"] = [[] for _ in failed["samples"]]
    for c in ("median_ts", "ci_low", "ci_high"):
        failed[c] = math.nan
    failed["status"] = "failed"
    (failedf,) = (p for p in save_results(failed, tmp_path / "failed") if p.suffix == ".jsonl")
    exc, out = _invoke("compare", str(good), str(failedf), "--format", "json")
    assert exc is None, out
    verdicts = {p["verdict"] for p in json.loads(out)}
    assert verdicts == {"missing"}, verdicts


def test_stats_compare_of_empty_or_negative_sides_is_missing() -> None:
    assert stats.compare([math.nan] * 5, [math.nan] * 5).verdict == "missing"
    assert stats.compare([100.0, 101.0, 99.0], [-1.0, -2.0, -3.0]).verdict == "missing"


# --- field types ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n_prompt", "abc"),
        ("n_gen", 1.5),
        ("n_depth", -1),
        ("n_prompt", True),
        ("samples_ts", [[1.0, 2.0], [3.0]]),
        ("samples_ts", {"a": 1}),
        ("samples_ts", ["fast"]),
        ("model_type", {"x": 1}),
        ("n_ubatch", [512]),
        ("build_commit", [1, 2]),
    ],
)
def test_wrong_field_types_are_named(tmp_path: Path, field: str, value: object) -> None:
    recs = _records()
    a = _jsonl(tmp_path / "a.jsonl", recs)
    b = _jsonl(tmp_path / "b.jsonl", [*recs[:2], {**recs[2], field: value}, *recs[3:]])
    msg = _refused("compare", str(a), str(b))
    assert f"{b}:3" in msg and field in msg


def test_deeply_nested_line_is_refused(tmp_path: Path) -> None:
    a = _jsonl(tmp_path / "a.jsonl", _records())
    b = tmp_path / "b.jsonl"
    b.write_text(a.read_text() + '{"n_prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    msg = _refused("compare", str(a), str(b))
    assert f"{b}:{len(_records()) + 1}" in msg


def test_tuner_file_with_wrong_types(tmp_path: Path) -> None:
    from tuner.measure.frames import load_results, save_results

    df = load_results(UPSTREAM)
    (good,) = (p for p in save_results(df, tmp_path / "good") if p.suffix == ".jsonl")
    lines = good.read_text().splitlines()
    for field, value in (("depth", "abc"), ("samples", [[1.0]]), ("test", 5), ("n", "x")):
        rec = json.loads(lines[1])
        rec[field] = value
        bad = tmp_path / "bad.jsonl"
        bad.write_text("\n".join([lines[0], json.dumps(rec), *lines[2:]]) + "\n")
        msg = _refused("compare", str(good), str(bad))
        assert f"{bad}:2" in msg and field in msg, msg


# --- bounded memory -------------------------------------------------------------------------------


def test_too_many_samples_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real limit is 100 000 repetitions per row; a file over it is made cheap by lowering it.
    monkeypatch.setattr(frames, "MAX_SAMPLES", 50)
    recs = _records()
    a = _jsonl(tmp_path / "a.jsonl", recs)
    big = [{**recs[0], "samples_ts": [9000.0 + i for i in range(51)]}, *recs[1:]]
    b = _jsonl(tmp_path / "b.jsonl", big)
    msg = _refused("compare", str(a), str(b))
    assert f"{b}:1" in msg and "samples_ts" in msg and "51" in msg and "50" in msg
    # pooled over appended runs, each under the limit
    c = _jsonl(tmp_path / "c.jsonl", [{**recs[0], "samples_ts": [9000.0 + i for i in range(30)]}] * 2 + recs[1:])
    msg = _refused("report", str(c))
    assert "60" in msg and "50" in msg and "pp512" in msg


def test_bootstrap_memory_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 5 000 repetitions (under the limit): no resampling draw may hold more than stats.BOOT_CHUNK values.
    real = np.random.default_rng
    drawn: list[int] = []

    class Spy:
        def __init__(self, rng: np.random.Generator) -> None:
            self.rng = rng

        def integers(self, low: int, high: int, size: tuple[int, int]) -> np.ndarray:
            drawn.append(size[0] * size[1])
            assert size[0] * size[1] <= 1 << 22, size  # before allocating: the old code asked for 4000 x n
            return self.rng.integers(low, high, size=size)

    def spy(seed: object = None) -> object:  # the bootstrap seeds with an int; scipy's own calls pass through
        return Spy(real(seed)) if isinstance(seed, int) else real(seed)  # type: ignore[arg-type]

    import scipy.stats  # noqa: F401  # imported unpatched: its import draws example values with default_rng

    monkeypatch.setattr(np.random, "default_rng", spy)  # the one stats resamples with
    recs = _records()
    many = [9000.0 + (i % 97) for i in range(5_000)]
    a = _jsonl(tmp_path / "a.jsonl", [{**recs[0], "samples_ts": many}, *recs[1:]])
    b = _jsonl(tmp_path / "b.jsonl", [{**recs[0], "samples_ts": [x * 1.01 for x in many]}, *recs[1:]])
    exc, out = _invoke("compare", str(a), str(b))
    assert exc is None, out
    assert drawn and sum(drawn) >= 4000 * 5_000  # all 4000 resamples still drawn, in chunks

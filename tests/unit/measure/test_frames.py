"""Reading llama-bench's own output (-o jsonl, json, csv, sql) the way compare-llama-bench.py groups it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.errors import UsageError
from tuner.measure.frames import load_results, read_llama_bench

LOGS = Path(__file__).resolve().parents[3] / "tests" / "data" / "bench" / "h100" / "confirm-l8b"
UPSTREAM = LOGS / "confirm-tg+pp-r0-upstream+upstream-pp+tg.log"  # llama-bench -o jsonl with stderr lines mixed in


def _records() -> list[dict]:
    return read_llama_bench(UPSTREAM)


def test_raw_jsonl_with_log_lines() -> None:
    df = load_results(UPSTREAM)
    assert len(df) == 10 and set(df["model"]) == {"llama 8B Q4_K_M"}  # model_type as compare-llama-bench.py shows it
    assert set(df["test"]) == {"pp512", "tg128"} and sorted(set(df["depth"])) == [0, 16384, 32768, 49152, 65536]
    tg = df[(df["test"] == "tg128") & (df["depth"] == 65536)].iloc[0]
    rec = next(r for r in _records() if r["n_gen"] == 128 and r["n_depth"] == 65536)
    assert tg["n"] == len(rec["samples_ts"]) == 4 and tg["samples"] == rec["samples_ts"]
    assert tg["build_commit"] == "a6cad36" and tg["backends"] == "CUDA"


def test_raw_json_array(tmp_path: Path) -> None:
    f = tmp_path / "a.json"
    f.write_text(json.dumps(_records(), indent=2))  # -o json: one array
    assert load_results(f)["median_ts"].tolist() == load_results(UPSTREAM)["median_ts"].tolist()


FIELDS = [
    "build_commit",
    "build_number",
    "cpu_info",
    "gpu_info",
    "backends",
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "n_batch",
    "n_ubatch",
    "n_threads",
    "type_k",
    "type_v",
    "n_gpu_layers",
    "flash_attn",
    "n_prompt",
    "n_gen",
    "n_depth",
    "test_time",
    "avg_ns",
    "stddev_ns",
    "avg_ts",
    "stddev_ts",
]


def test_raw_csv_and_sql_carry_no_samples(tmp_path: Path) -> None:
    recs = _records()
    csv = tmp_path / "a.csv"  # llama-bench's csv_printer: header, then every value quoted
    csv.write_text(",".join(FIELDS) + "\n" + "".join(",".join(f'"{r[k]}"' for k in FIELDS) + "\n" for r in recs))
    sql = tmp_path / "a.sql"  # sql_printer: CREATE TABLE then one INSERT per test
    sql.write_text(
        "CREATE TABLE IF NOT EXISTS llama_bench (\n"
        + ",\n".join(f"  {k} TEXT" for k in FIELDS)
        + "\n);\n\n"
        + "".join(
            f"INSERT INTO llama_bench ({', '.join(FIELDS)}) VALUES (" + ", ".join(f"'{r[k]}'" for k in FIELDS) + ");\n"
            for r in recs
        )
    )
    for f in (csv, sql):
        df = load_results(f)
        assert len(df) == 10 and set(df["n"]) == {1} and not df["per_rep"].any()
        row = df[(df["test"] == "tg128") & (df["depth"] == 0)].iloc[0]
        assert row["median_ts"] == pytest.approx(
            next(r["avg_ts"] for r in recs if r["n_gen"] == 128 and r["n_depth"] == 0)
        )


def test_appended_runs_pool_and_mixed_settings_refuse(tmp_path: Path) -> None:
    f = tmp_path / "two.jsonl"
    f.write_text(UPSTREAM.read_text() + UPSTREAM.read_text())  # `>>` twice: one setting, twice the repetitions
    assert set(load_results(f)["n"]) == {8}
    other = [{**r, "n_ubatch": 1024} for r in _records()]
    f.write_text(UPSTREAM.read_text() + "".join(json.dumps(r) + "\n" for r in other))
    with pytest.raises(UsageError, match="n_ubatch 1024 vs 512|n_ubatch 512 vs 1024"):
        load_results(f)


def test_not_a_benchmark(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_text('{"hello": 1}\nplain text\n')
    with pytest.raises(UsageError, match="llama-bench -o jsonl"):
        load_results(f)

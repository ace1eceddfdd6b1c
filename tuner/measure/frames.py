"""Bench frames (the DataFrames :func:`tuner.measure.bench.run_bench` returns) on disk and as tables:
``.jsonl``/``.parquet`` files, a markdown summary, and A/B comparison.

:func:`load_results` also reads what llama-bench itself writes (``-o jsonl``, ``-o json``, ``-o csv``,
``-o sql``), grouped as llama.cpp's ``scripts/compare-llama-bench.py`` groups it: one row per model,
test (``pp512``, ``tg128``) and depth, rows of one group with the same settings pooled (a file of
several appended runs). JSON/JSONL carry every repetition (``samples_ts``); CSV and SQL carry only the
mean (``avg_ts``), so such a row has one sample and no verdict can come from it.
"""

from __future__ import annotations

__all__ = [
    "SETTING_FIELDS",
    "compare",
    "json_lines",
    "load_results",
    "read_llama_bench",
    "render_table",
    "same_build",
    "save_results",
]

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner import log
from tuner.errors import UsageError
from tuner.measure.stats import compare_frames

if TYPE_CHECKING:
    import pandas as pd


def compare(a: pd.DataFrame, b: pd.DataFrame, **kw: Any) -> pd.DataFrame:
    """Per (test, depth) comparison of two bench frames (design.md contract); see tuner.measure.stats."""
    return compare_frames(a, b, **kw)


def save_results(df: pd.DataFrame, stem: Path) -> list[Path]:
    """Write ``stem.jsonl`` (always) and ``stem.parquet`` (when pyarrow imports).

    Returns:
        The files written.
    """
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = [stem.with_suffix(".jsonl")]
    df.to_json(out[0], orient="records", lines=True, force_ascii=False)
    try:
        import pyarrow  # noqa: F401

        pq = stem.with_suffix(".parquet")
        df.to_parquet(pq, index=False)
        out.append(pq)
    except ImportError:
        pass
    return out


def load_results(path: Path) -> pd.DataFrame:
    """Read a bench frame written by :func:`save_results` (``.jsonl`` or ``.parquet``) or llama-bench's
    own output (``-o jsonl``/``json``/``csv``/``sql``, log lines mixed in are skipped).

    Raises:
        UsageError: Missing file, or a file that is neither.
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise UsageError(
            f"Bench results file {path} does not exist; pass a file `tuner bench` wrote or llama-bench's "
            "own output (`llama-bench -o jsonl ... > a.jsonl`)."
        )
    if path.suffix == ".parquet":
        try:
            df = pd.read_parquet(path)
        except (ValueError, OSError, ImportError) as err:
            raise UsageError(
                f"{path} is not a readable bench results file ({err}). Re-run `tuner bench` to produce one."
            ) from err
    else:
        text = path.read_text(encoding="utf-8", errors="replace")
        first = next((ln for ln in text.splitlines() if ln.strip().startswith("{")), "")
        try:
            is_tuner = first and "median_ts" in json.loads(first) and "label" in json.loads(first)
        except json.JSONDecodeError:
            is_tuner = False
        if not is_tuner:
            return _raw_frame(read_llama_bench(path, text), path)
        try:
            df = pd.read_json(path, orient="records", lines=True)
        except ValueError as err:
            raise UsageError(
                f"{path} is not a readable bench results file ({err}). Re-run `tuner bench` to produce one."
            ) from err
    missing = {"label", "test", "phase", "depth", "median_ts", "samples", "n"} - set(df.columns)
    if missing:
        raise UsageError(
            f"{path} lacks bench columns {sorted(missing)}: it is neither a file `tuner bench` wrote nor "
            "llama-bench's own output. Pass one of those."
        )
    df["samples"] = [list(s) if s is not None else [] for s in df["samples"]]
    df["depth"] = df["depth"].astype(int)
    if "timestamp" in df.columns and pd.api.types.is_datetime64_any_dtype(df["timestamp"]):
        # read_json parses a "timestamp" column; keep it the ISO text run_bench wrote (save_results warns on datetimes)
        df["timestamp"] = [t.isoformat() if not pd.isna(t) else None for t in df["timestamp"]]
    if "model" not in df.columns:
        df["model"] = [
            Path(str(f)).stem if isinstance(f, str) and f else "" for f in df.get("model_filename", [""] * len(df))
        ]
    return df


SETTING_FIELDS: tuple[str, ...] = (
    "backends",
    "n_gpu_layers",
    "n_cpu_moe",
    "tensor_buft_overrides",
    "n_batch",
    "n_ubatch",
    "embeddings",
    "cpu_mask",
    "cpu_strict",
    "poll",
    "n_threads",
    "type_k",
    "type_v",
    "load_mode",
    "no_kv_offload",
    "split_mode",
    "main_gpu",
    "tensor_split",
    "flash_attn",
    "fit_target",
    "fit_min_ctx",
)
"""llama-bench fields that make two rows of one model, test and depth different measurements: the key
properties of compare-llama-bench.py other than the model, the devices and the test itself."""

_FORMATS = "llama-bench -o jsonl, -o json, -o csv or -o sql"


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL stream, one per line from its first ``{``; other lines (log lines
    llama-bench mixes in) are skipped."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        start = line.find("{")
        if start < 0:
            continue
        try:
            rec = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def read_llama_bench(path: Path, text: str | None = None) -> list[dict[str, Any]]:
    """The records of a llama-bench output file, in any of its formats, as dicts of its field names.

    Raises:
        UsageError: Nothing in the file is a llama-bench record.
    """
    text = Path(path).read_text(encoding="utf-8", errors="replace") if text is None else text
    stripped = text.lstrip()
    recs: list[dict[str, Any]] = []
    if "INSERT INTO llama_bench" in text:
        recs = _read_sql(text)
    elif stripped.startswith("["):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError:
            data = []
        recs = [r for r in data if isinstance(r, dict)] if isinstance(data, list) else []
    elif "{" in text:
        recs = json_lines(text)
    else:
        recs = _read_csv(text)
    recs = [r for r in recs if "n_prompt" in r and "n_gen" in r]
    if not recs:
        raise UsageError(
            f"{path} holds no llama-bench results and is not a file `tuner bench` wrote. tuner compare/report "
            f"read `tuner bench` output and {_FORMATS} (e.g. `llama-bench -m M.gguf -o jsonl > a.jsonl`)."
        )
    return recs


def _read_csv(text: str) -> list[dict[str, Any]]:
    import csv
    import io

    lines = [ln for ln in text.splitlines() if ln.strip()]
    start = next(
        (i for i, ln in enumerate(lines) if ln.startswith("build_commit") or "n_prompt" in ln.split(",")), None
    )
    if start is None:
        return []
    return [dict(r) for r in csv.DictReader(io.StringIO("\n".join(lines[start:])))]


def _read_sql(text: str) -> list[dict[str, Any]]:
    """llama-bench's ``-o sql``: CREATE TABLE + INSERT statements, run in an in-memory SQLite."""
    import sqlite3

    stmts = "\n".join(ln for ln in text.splitlines() if not ln.startswith(("ggml_", "  Device", "load_backend")))
    con = sqlite3.connect(":memory:")
    try:
        con.executescript(stmts)
        cur = con.execute("SELECT * FROM llama_bench")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]
    except sqlite3.Error:
        return []
    finally:
        con.close()


def _model_name(rec: dict[str, Any]) -> str:
    """The Model column as compare-llama-bench.py prints it (``llama 8B Q4_K_M``), else the file's stem."""
    mt = str(rec.get("model_type") or "")
    for long, short in ((" - Small", "_S"), (" - Medium", "_M"), (" - Large", "_L")):
        mt = mt.replace(long, short)
    return mt or Path(str(rec.get("model_filename") or "")).stem


def _int(x: Any) -> int:
    return int(float(x))


def _raw_frame(recs: list[dict[str, Any]], path: Path) -> pd.DataFrame:
    """Raw llama-bench records -> a bench frame, one row per (model, test, depth)."""
    import pandas as pd

    from tuner.measure.stats import summarize_samples

    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in recs:
        n_prompt, n_gen = _int(r["n_prompt"]), _int(r.get("n_gen", 0))
        test = f"pp{n_prompt}" if n_gen == 0 else (f"tg{n_gen}" if n_prompt == 0 else f"pp{n_prompt}+tg{n_gen}")
        groups.setdefault((_model_name(r), test, _int(r.get("n_depth", 0))), []).append(r)
    rows = []
    for (model, test, depth), rs in groups.items():
        settings = {json.dumps({k: str(r.get(k)) for k in SETTING_FIELDS if k in r}, sort_keys=True) for r in rs}
        if len(settings) > 1:
            a, b = (json.loads(x) for x in sorted(settings)[:2])
            diff = ", ".join(f"{k} {a[k]} vs {b[k]}" for k in a if a.get(k) != b.get(k))
            raise UsageError(
                f"{path} has {len(rs)} rows for {model} {test} at depth {depth} measured with different "
                f"settings ({diff}); tuner compares one setting per side. Split the file, one setting each "
                "(or run llama-bench once per setting)."
            )
        samples: list[float] = []
        for r in rs:
            ts = r.get("samples_ts")
            if isinstance(ts, str):  # never written by llama-bench, but be lenient with hand-made CSVs
                ts = [float(x) for x in ts.replace(",", " ").split()]
            samples += (
                [float(x) for x in ts] if ts else [float(r["avg_ts"])] if r.get("avg_ts") not in (None, "") else []
            )
        first = rs[0]
        stats = summarize_samples(samples, confidence=0.95, seed=0)
        rows.append(
            {
                "label": path.stem,
                "model": model,
                "test": test,
                "phase": "pp"
                if test.startswith("pp") and "+" not in test
                else ("tg" if test.startswith("tg") else "pg"),
                "depth": depth,
                **stats,
                "n_batches": len(rs),
                "warmup_discarded": 0,
                "status": "ok",
                "error": "",
                "per_rep": any(r.get("samples_ts") for r in rs),
                "build_commit": first.get("build_commit"),
                "build_number": first.get("build_number"),
                "backends": first.get("backends"),
                "gpu_info": first.get("gpu_info"),
                "cpu_info": first.get("cpu_info"),
                "model_filename": first.get("model_filename"),
                "model_type": first.get("model_type"),
                "model_size": first.get("model_size"),
                "n_params": first.get("model_n_params"),
                "settings": next(iter(settings)),
                "source_format": "llama-bench",
            }
        )
    frame: pd.DataFrame = pd.DataFrame(rows)  # pandas-stubs types the constructor as Any before 3.11
    return frame


def _commands(df: pd.DataFrame) -> set[tuple[str, ...]]:
    """The llama-bench command lines of a `tuner bench` frame without what only sets which points ran
    and how often (``-d``, ``-r``: extra batches of a ``--target-ci`` run differ in those)."""
    out = set()
    for cmd in df["cmd"].dropna():
        words = str(cmd).split()
        keep = [
            w for i, w in enumerate(words) if w not in ("-d", "-r") and (i == 0 or words[i - 1] not in ("-d", "-r"))
        ]
        out.add(tuple(keep))
    return out


def same_build(a: pd.DataFrame, b: pd.DataFrame) -> str:
    """Why A and B look like one build measured twice (an A/A comparison), or ``""``.

    Compares what the files record: llama-bench's ``build_commit``/``build_number`` and settings, or for
    `tuner bench` files the llama-bench binary and arguments (``cmd``) and environment.
    """

    def col(df: pd.DataFrame, name: str) -> set[str]:
        return {str(x) for x in df[name].dropna()} if name in df.columns else set()

    if col(a, "cmd") and _commands(a) == _commands(b) and col(a, "env") == col(b, "env"):
        return (
            "A and B were run with the same llama-bench binary, arguments and environment (the files' cmd and env "
            "columns)"
        )
    commit_a = col(a, "build_commit") | col(a, "build_number")
    if (
        commit_a
        and commit_a == col(b, "build_commit") | col(b, "build_number")
        and not commit_a <= {"unknown", "None"}
        and col(a, "settings") == col(b, "settings")
    ):
        return (
            f"A and B report the same llama.cpp build ({', '.join(sorted(col(a, 'build_commit')))}, build "
            f"{', '.join(sorted(col(a, 'build_number'))) or '?'}) and the same llama-bench settings"
        )
    return ""


def _fmt(x: Any, spec: str = ".2f") -> str:
    try:
        xf = float(x)
    except (TypeError, ValueError):
        return "-"
    return format(xf, spec) if math.isfinite(xf) else "-"


def render_table(df: pd.DataFrame) -> str:
    """Markdown summary: one line per row with median ± CI, n, utilization and roofline."""
    headers = [
        "label",
        "test",
        "depth",
        "t/s (median)",
        "±CI %",
        "n",
        "min–max",
        "cpu %",
        "gpu %",
        "roofline %",
        "status",
    ]
    rows = []
    for _, r in df.sort_values(["label", "phase", "depth"]).iterrows():
        rows.append(
            [
                r["label"],
                r["test"],
                int(r["depth"]),
                _fmt(r["median_ts"]),
                _fmt(r["ci_pct"], ".1f"),
                int(r["n"]),
                f"{_fmt(r['min_ts'])}–{_fmt(r['max_ts'])}",
                _fmt(r["cpu_util_mean"], ".0f"),
                _fmt(r["gpu_util_mean"], ".0f"),
                _fmt(r["roofline_pct"], ".1f"),
                r["status"],
            ]
        )
    return log.table(headers, rows)

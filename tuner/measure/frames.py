"""Bench frames (the DataFrames :func:`tuner.measure.bench.run_bench` returns) on disk and as tables:
``.jsonl``/``.parquet`` files, a markdown summary, and A/B comparison."""

from __future__ import annotations

__all__ = ["compare", "load_results", "render_table", "save_results"]

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
    """Read a bench frame written by :func:`save_results` (``.jsonl`` or ``.parquet``).

    Raises:
        UsageError: Missing file, unknown suffix, or a file without the bench columns.
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"Bench results file {path} does not exist; pass a .jsonl/.parquet from `tuner bench`.")
    try:
        if path.suffix == ".parquet":
            df = pd.read_parquet(path)
        elif path.suffix in (".jsonl", ".json"):
            df = pd.read_json(path, orient="records", lines=True)
        else:
            raise UsageError(f"{path}: unknown results format {path.suffix!r}; use .jsonl or .parquet.")
    except (ValueError, OSError) as err:
        raise UsageError(f"{path} is not a readable bench results file ({err}). "
                         "Re-run `tuner bench` to produce one.") from err
    missing = {"label", "test", "phase", "depth", "median_ts", "samples", "n"} - set(df.columns)
    if missing:
        raise UsageError(f"{path} lacks bench columns {sorted(missing)}; is it llama-bench's raw output? "
                         "tuner compare/report read the files `tuner bench` writes.")
    df["samples"] = [list(s) if s is not None else [] for s in df["samples"]]
    df["depth"] = df["depth"].astype(int)
    return df


def _fmt(x: Any, spec: str = ".2f") -> str:
    try:
        xf = float(x)
    except (TypeError, ValueError):
        return "-"
    return format(xf, spec) if math.isfinite(xf) else "-"


def render_table(df: pd.DataFrame) -> str:
    """Markdown summary: one line per row with median ± CI, n, utilization and roofline."""
    headers = ["label", "test", "depth", "t/s (median)", "±CI %", "n", "min–max", "cpu %", "gpu %",
               "roofline %", "status"]
    rows = []
    for _, r in df.sort_values(["label", "phase", "depth"]).iterrows():
        rows.append([r["label"], r["test"], int(r["depth"]), _fmt(r["median_ts"]), _fmt(r["ci_pct"], ".1f"),
                     int(r["n"]), f"{_fmt(r['min_ts'])}–{_fmt(r['max_ts'])}", _fmt(r["cpu_util_mean"], ".0f"),
                     _fmt(r["gpu_util_mean"], ".0f"), _fmt(r["roofline_pct"], ".1f"), r["status"]])
    return log.table(headers, rows)

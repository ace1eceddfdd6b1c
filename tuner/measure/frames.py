"""Bench frames (the DataFrames :func:`tuner.measure.bench.run_bench` returns) on disk and as tables:
``.jsonl``/``.parquet`` files and a markdown summary (comparisons: :mod:`tuner.result.tables`).

:func:`load_results` also reads what llama-bench itself writes (``-o jsonl``, ``-o json``, ``-o csv``,
``-o sql``), grouped as llama.cpp's ``scripts/compare-llama-bench.py`` groups it: one row per model,
test (``pp512``, ``tg128``) and depth, rows of one group with the same settings pooled (a file of
several appended runs). JSON/JSONL carry every repetition (``samples_ts``); CSV and SQL carry only the
mean (``avg_ts``), so such a row has one sample and no verdict can come from it. The frame's ``avg_ts``
is the script's t/s: the mean over a group's rows of their ``avg_ts``.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import numbers
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np

from tuner import log
from tuner.errors import UsageError
from tuner.measure.stats import summarize_samples

if TYPE_CHECKING:
    import pandas as pd


def save_results(df: pd.DataFrame, stem: Path) -> list[Path]:
    """Write ``stem.jsonl`` (always) and ``stem.parquet`` (when pyarrow imports); returns the files written."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = [stem.with_suffix(".jsonl")]
    df.to_json(out[0], orient="records", lines=True, force_ascii=False)
    with contextlib.suppress(ImportError):
        import pyarrow  # noqa: F401

        pq = stem.with_suffix(".parquet")
        df.to_parquet(pq, index=False)
        out.append(pq)
    return out


MAX_SAMPLES = 100_000
"""Most repetitions one row (model, test, depth) may pool. tuner bench keeps at most 10 000 (--max-reps); a
file with more is not a benchmark, and its bootstrap would cost minutes (stats.BOOT_CHUNK bounds the memory)."""

MAX_FILE_BYTES = 1 << 30
"""Largest bench file read (read whole, then parsed; a larger one is refused before reading)."""

_Record = tuple[str, dict[str, Any]]
"""Where a record came from (``FILE:LINE`` or ``FILE: record N``) and its fields."""


def _read_text(path: Path) -> str:
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise UsageError(
            f"{path} is {size / 2**20:.0f} MiB; tuner compare/report read bench files of at most "
            f"{MAX_FILE_BYTES >> 20} MiB. Split it (one model or setting per file)."
        )
    return path.read_bytes().decode("utf-8", errors="replace")


def load_results(path: Path) -> pd.DataFrame:
    """Read a bench frame written by :func:`save_results` (``.jsonl`` or ``.parquet``) or llama-bench's
    own output (``-o jsonl``/``json``/``csv``/``sql``, log lines mixed in are skipped).

    Every field tuner reads is checked: a wrong type, a rate that is not a positive finite number of
    tokens/s or more than :data:`MAX_SAMPLES` repetitions in one row is refused naming the file, line
    and field. A failed row of a `tuner bench` file (``status`` not ``ok``) keeps no samples: it is
    missing, not measured.

    Raises:
        UsageError: Missing file, a file that is neither, or a record that fails those checks.
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
            raw = pd.read_parquet(path)
        except (ValueError, OSError, ImportError) as err:
            raise UsageError(
                f"{path} is not a readable bench results file ({err}). Re-run `tuner bench` to produce one."
            ) from err
        recs: list[_Record] = [
            (f"{path}: row {i + 1}", {str(k): v for k, v in r.items()}) for i, r in enumerate(raw.to_dict("records"))
        ]
    else:
        text = _read_text(path)
        first = next(((w, r) for w, r in _iter_json_lines(text, path, strict=False)), None)
        if first is None or "median_ts" not in first[1] or "label" not in first[1]:
            return _raw_frame(_records(path, text), path)
        recs = list(_iter_json_lines(text, path, strict=True))
    missing = {"label", "test", "phase", "depth", "median_ts", "samples", "n"} - set().union(*(r for _, r in recs))
    if missing:
        raise UsageError(
            f"{path} lacks bench columns {sorted(missing)}: it is neither a file `tuner bench` wrote nor "
            "llama-bench's own output. Pass one of those."
        )
    df: pd.DataFrame = pd.DataFrame([_tuner_row(where, r) for where, r in recs])  # (untyped in pandas-stubs < 3.11)
    if "timestamp" in df.columns and pd.api.types.is_datetime64_any_dtype(df["timestamp"]):
        # parquet may hold a datetime "timestamp" column; keep it the ISO text run_bench wrote
        df["timestamp"] = [t.isoformat() if not pd.isna(t) else None for t in df["timestamp"]]
    if "model" not in df.columns:
        df["model"] = [
            Path(str(f)).stem if isinstance(f, str) and f else "" for f in df.get("model_filename", [""] * len(df))
        ]
    return df


SETTING_FIELDS: tuple[str, ...] = (
    ("backends", "n_gpu_layers", "n_cpu_moe", "tensor_buft_overrides", "n_batch", "n_ubatch", "embeddings")
    + ("cpu_mask", "cpu_strict", "poll", "n_threads", "type_k", "type_v", "load_mode", "no_kv_offload")
    + ("split_mode", "main_gpu", "tensor_split", "flash_attn", "fit_target", "fit_min_ctx")
)
"""llama-bench fields that make two rows of one model, test and depth different measurements: the key
properties of compare-llama-bench.py other than the model, the devices and the test itself."""

_META_FIELDS = ("build_commit", "build_number", "gpu_info", "cpu_info") + (
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
)
_FORMATS = "llama-bench -o jsonl, -o json, -o csv or -o sql"
_MAX_TOKENS = (1 << 31) - 1  # llama-bench's n_prompt/n_gen/n_depth are C ints


def _iter_json_lines(text: str, path: Path | str, *, strict: bool) -> Iterator[_Record]:
    """The JSON objects of a JSONL stream with their line numbers, each from its line's first ``{``.
    ``strict``: every non-blank line must be one (a `tuner bench` file); else other lines (log lines
    llama-bench mixes in) are skipped. A line nested too deep for the parser is refused either way."""
    for no, line in enumerate(text.splitlines(), 1):
        start = line.find("{")
        if start < 0 and not (strict and line.strip()):
            continue
        try:
            rec = json.loads(line[max(start, 0) :])
        except RecursionError:
            raise UsageError(
                f"{path}:{no}: the record nests deeper than a JSON parser allows; llama-bench and tuner bench "
                "write flat records. Remove the line or re-run the benchmark."
            ) from None
        except json.JSONDecodeError as err:
            if strict:
                raise UsageError(f"{path}:{no}: not a JSON record ({err.msg}); re-run `tuner bench`.") from None
            continue
        if isinstance(rec, dict):
            yield (f"{path}:{no}", rec)
        elif strict:
            raise UsageError(f"{path}:{no}: a JSON {type(rec).__name__}, not a record; re-run `tuner bench`.")


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL stream, one per line from its first ``{``; other lines (log lines
    llama-bench mixes in) are skipped."""
    return [r for _, r in _iter_json_lines(text, "llama-bench output", strict=False)]


def read_llama_bench(path: Path, text: str | None = None) -> list[dict[str, Any]]:
    """The records of a llama-bench output file, in any of its formats, as dicts of its field names.

    Raises:
        UsageError: Nothing in the file is a llama-bench record, or its SQL is not what llama-bench writes.
    """
    return [r for _, r in _records(Path(path), text)]


_SQL_START = re.compile(r"^\s*(?:CREATE\s+TABLE|INSERT\s+INTO)\b", re.IGNORECASE | re.MULTILINE)


def _records(path: Path, text: str | None = None) -> list[_Record]:
    text = _read_text(path) if text is None else text
    stripped = text.lstrip()
    recs: list[_Record] = []
    if _SQL_START.search(text):
        recs = _read_sql(text, path)
    elif stripped.startswith("["):
        try:
            data = json.loads(stripped)
        except RecursionError:
            raise UsageError(
                f"{path}: nests deeper than a JSON parser allows; llama-bench writes flat records."
            ) from None
        except json.JSONDecodeError:
            data = []
        if isinstance(data, list):
            recs = [(f"{path}: record {i + 1}", r) for i, r in enumerate(data) if isinstance(r, dict)]
    elif "{" in text:
        recs = list(_iter_json_lines(text, path, strict=False))
    else:
        recs = _read_csv(text, path)
    recs = [(w, r) for w, r in recs if "n_prompt" in r and "n_gen" in r]
    if not recs:
        raise UsageError(
            f"{path} holds no llama-bench results and is not a file `tuner bench` wrote. tuner compare/report "
            f"read `tuner bench` output and {_FORMATS} (e.g. `llama-bench -m M.gguf -o jsonl > a.jsonl`)."
        )
    return recs


def _read_csv(text: str, path: Path) -> list[_Record]:
    lines = [(no, ln) for no, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    start = next(
        (i for i, (_, ln) in enumerate(lines) if ln.startswith("build_commit") or "n_prompt" in ln.split(",")), None
    )
    if start is None:
        return []
    body = lines[start:]
    reader = csv.DictReader(ln for _, ln in body)
    out: list[_Record] = []
    for rec in reader:
        extra = rec.pop(None, None)  # DictReader files surplus values under None
        if extra:
            raise UsageError(f"{path}:{body[reader.line_num - 1][0]}: more values than the header has columns.")
        out.append((f"{path}:{body[reader.line_num - 1][0]}", dict(rec)))
    return out


# llama-bench's sql_printer: `CREATE TABLE IF NOT EXISTS llama_bench (name TYPE, ...);` then per test
# `INSERT INTO llama_bench (names) VALUES ('v', ...);` (older builds named the table `test`). Parsed, never
# executed: SQLite would run whatever else a file holds (ATTACH creates files, a recursive CTE never ends).
_SQL_TABLES = ("llama_bench", "test")
_SQL_TYPES = ("TEXT", "INTEGER", "REAL")
_SQL_TOKEN = re.compile(
    r"(?P<ws>\s+)|(?P<str>'(?:[^']+|'')*')|(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<punct>[(),;])"
)
_LOG_PREFIXES = ("ggml_", "  Device", "load_backend")


class _SqlRefused(Exception):
    def __init__(self, line: int, why: str) -> None:
        super().__init__(why)
        self.line, self.why = line, why


def _sql_tokens(text: str) -> Iterator[tuple[int, str, str]]:
    """(line, kind, text) of each token; kind is ``str``, ``num``, ``name`` or ``punct``."""
    pos, line = 0, 1
    while pos < len(text):
        m = _SQL_TOKEN.match(text, pos)
        if m is None:
            raise _SqlRefused(line, f"unexpected {text[pos]!r} (llama-bench writes no such SQL)")
        kind, tok = m.lastgroup or "", m.group()
        if kind != "ws":
            yield line, kind, tok
        line += tok.count("\n")
        pos = m.end()


def _sql_statements(text: str) -> Iterator[list[tuple[int, str, str]]]:
    stmt: list[tuple[int, str, str]] = []
    for tok in _sql_tokens(text):
        stmt.append(tok)
        if tok[2] == ";":
            yield stmt
            stmt = []
    if stmt:
        raise _SqlRefused(stmt[0][0], "a statement without its closing ';' (a truncated file?)")


def _sql_value(kind: str, tok: str, col_type: str) -> int | float | str | None:
    """A literal as SQLite stores it in a column of ``col_type`` (its type affinity); NULL is None."""
    if kind == "name":
        return None
    val = tok[1:-1].replace("''", "'") if kind == "str" else tok
    convs: tuple[type[int] | type[float], ...] = {"INTEGER": (int, float), "REAL": (float,)}.get(col_type, ())
    for conv in convs:
        with contextlib.suppress(ValueError):
            return conv(val)
    return val


class _Stmt:
    """One statement's tokens, read left to right."""

    def __init__(self, toks: list[tuple[int, str, str]]) -> None:
        self.toks, self.line = toks, toks[0][0]
        self.words = [t.upper() if k == "name" else t for _, k, t in toks]

    def at(self, i: int) -> str:
        return self.words[i] if i < len(self.words) else ""

    def expect(self, i: int, want: str, what: str) -> None:
        if self.at(i) != want:
            got = self.toks[i][2] if i < len(self.toks) else "the end"
            raise _SqlRefused(self.toks[min(i, len(self.toks) - 1)][0], f"expected {what}, got {got!r}")

    def items(self, i: int) -> tuple[list[tuple[int, str, str]], int]:
        """The comma-separated single tokens of the parenthesised list at ``i``, and the index after it."""
        self.expect(i, "(", "'('")
        out, i = [], i + 1
        while True:
            out.append(self.toks[i] if i < len(self.toks) else (self.line, "", ""))
            i += 1
            if self.at(i) != ",":
                self.expect(i, ")", "',' or ')'")
                return out, i + 1
            i += 1


def _sql_create(st: _Stmt, tables: dict[str, dict[str, str]]) -> None:
    i = 5 if st.words[2:5] == ["IF", "NOT", "EXISTS"] else 2
    table = st.toks[i][2] if i < len(st.toks) else ""
    if table not in _SQL_TABLES:
        raise _SqlRefused(st.line, f"CREATE TABLE of a table llama-bench does not write ({table or '?'})")
    cols: dict[str, str] = {}
    st.expect(i + 1, "(", "'('")
    i += 2
    while True:
        if i + 1 >= len(st.toks) or st.toks[i][1] != "name" or st.words[i + 1] not in _SQL_TYPES:
            raise _SqlRefused(st.toks[min(i, len(st.toks) - 1)][0], "a column that is not `name TEXT|INTEGER|REAL`")
        cols[st.toks[i][2]] = st.words[i + 1]
        i += 2
        if st.at(i) != ",":
            break
        i += 1
    st.expect(i, ")", "',' or ')'")
    st.expect(i + 1, ";", "';'")
    if tables.setdefault(table, cols) != cols:
        raise _SqlRefused(st.line, f"a second CREATE TABLE {table} with other columns")


def _sql_insert(st: _Stmt, tables: dict[str, dict[str, str]]) -> dict[str, Any]:
    table = st.toks[2][2] if len(st.toks) > 2 and st.toks[2][1] == "name" else ""
    if table not in tables:
        raise _SqlRefused(st.line, f"INSERT INTO {table or '?'} before its CREATE TABLE")
    cols, i = st.items(3)
    bad = [t for _, k, t in cols if k != "name" or t not in tables[table]]
    if bad:
        raise _SqlRefused(st.line, f"INSERT of a column {bad[0]!r} its CREATE TABLE does not have")
    st.expect(i, "VALUES", "VALUES")
    vals, i = st.items(i + 1)
    st.expect(i, ";", "';' (llama-bench writes one row per INSERT)")
    if len(vals) != len(cols):
        raise _SqlRefused(st.line, f"{len(vals)} values for {len(cols)} columns")
    rec: dict[str, Any] = {}
    for (_, _, col), (_, kind, tok) in zip(cols, vals):
        if kind not in ("str", "num") and tok.upper() != "NULL":
            raise _SqlRefused(st.line, f"value {tok!r} of {col} is not a literal")
        rec[col] = _sql_value(kind, tok, tables[table][col])
    return rec


def _parse_sql(text: str) -> list[tuple[int, dict[str, Any]]]:
    tables: dict[str, dict[str, str]] = {}
    out: list[tuple[int, dict[str, Any]]] = []
    for toks in _sql_statements(text):
        st = _Stmt(toks)
        if st.words[:2] == ["CREATE", "TABLE"]:
            _sql_create(st, tables)
        elif st.words[:2] == ["INSERT", "INTO"]:
            out.append((st.line, _sql_insert(st, tables)))
        else:
            head = " ".join(t for _, _, t in toks[:4])
            raise _SqlRefused(st.line, f"`{head} ...` is not a statement llama-bench writes")
    return out


def _read_sql(text: str, path: Path) -> list[_Record]:
    """llama-bench's ``-o sql``, parsed into records (what SQLite would hold after its CREATE TABLE and
    INSERTs, column types applied); anything else in the file is refused, nothing of it is run."""
    # log lines llama-bench writes to stderr, if it was captured with 2>&1 (blanked: line numbers stay)
    body = "\n".join("" if ln.startswith(_LOG_PREFIXES) else ln for ln in text.splitlines())
    try:
        return [(f"{path}:{line}", rec) for line, rec in _parse_sql(body)]
    except _SqlRefused as err:
        snippet = text.splitlines()[err.line - 1].strip()[:80] if err.line <= len(text.splitlines()) else ""
        raise UsageError(
            f"{path}:{err.line}: {err.why} (`{snippet}`). tuner reads llama-bench's -o sql as llama-bench writes it "
            "(CREATE TABLE llama_bench, then one INSERT INTO llama_bench ... VALUES (...); per test) and executes "
            "none of it; pass the file llama-bench wrote, or its -o jsonl output."
        ) from None


def _bad(where: str, field: str, value: object, want: str) -> UsageError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return UsageError(
        f"{where}: field {field} is {shown}, expected {want}. The file is not llama-bench or tuner bench output "
        "as they write it; fix or drop the record (or re-run the benchmark)."
    )


def _is_num(x: object) -> TypeGuard[numbers.Real]:
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def _as_int(where: str, field: str, x: object, lo: int = 0, hi: int = _MAX_TOKENS) -> int:
    val: object = x
    if isinstance(x, str) and re.fullmatch(r"\s*[-+]?\d{1,19}(?:\.0*)?\s*", x):
        val = int(float(x))  # inexact only above 2**53, which every bound here refuses anyway
    elif _is_num(x) and math.isfinite(float(x)) and float(x).is_integer():
        val = int(float(x))  # an integral float: exact below 2**53, far beyond every bound here
    if not isinstance(val, int) or isinstance(val, bool) or not lo <= val <= hi:
        raise _bad(where, field, x, f"an integer from {lo} to {hi}")
    return val


def _as_rate(where: str, field: str, x: object) -> float:
    """A tokens/s value: a positive finite number (a zero, negative, NaN or infinite rate is no measurement)."""
    val: object = x
    if isinstance(x, str):
        try:
            val = float(x)
        except ValueError:
            raise _bad(where, field, x, "a positive finite number of tokens/s") from None
    if not _is_num(val) or not (math.isfinite(float(val)) and float(val) > 0):
        raise _bad(where, field, x, "a positive finite number of tokens/s")
    return float(val)


def _as_rates(where: str, field: str, x: object) -> list[float]:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return []
    if isinstance(x, str):  # never written by llama-bench, but be lenient with hand-made CSVs
        x = x.replace(",", " ").split()
    if isinstance(x, np.ndarray):  # parquet
        x = x.tolist()
    if not isinstance(x, (list, tuple)):
        raise _bad(where, field, x, "a list of tokens/s values")
    if len(x) > MAX_SAMPLES:
        raise UsageError(
            f"{where}: field {field} has {len(x)} values; tuner compares at most {MAX_SAMPLES} repetitions per "
            "row (tuner bench keeps at most 10000), so that its bootstrap stays seconds and megabytes. Split the run."
        )
    return [_as_rate(where, f"{field}[{i}]", v) for i, v in enumerate(x)]


def _scalar(where: str, field: str, x: object) -> object:
    if isinstance(x, (list, tuple, dict, np.ndarray)):
        raise _bad(where, field, x, "a single value (text or number)")
    return x


def _text(where: str, field: str, x: object) -> str | None:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    if not isinstance(x, str):
        raise _bad(where, field, x, "text")
    return x


def _checked_llama_bench(where: str, r: dict[str, Any]) -> dict[str, Any]:
    """A llama-bench record with every field tuner reads checked (and n_* as ints, rates as floats)."""
    out = dict(r)
    out |= {k: _as_int(where, k, r.get(k, 0)) for k in ("n_prompt", "n_gen", "n_depth")}
    out |= {k: _scalar(where, k, r[k]) for k in (*SETTING_FIELDS, *_META_FIELDS) if k in r}
    for k in ("model_type", "model_filename", "build_commit"):
        if k in r and r[k] is not None and not isinstance(r[k], str):
            raise _bad(where, k, r[k], "text")
    out["samples_ts"] = _as_rates(where, "samples_ts", r.get("samples_ts"))
    if not out["samples_ts"]:
        avg = r.get("avg_ts")
        out["avg_ts"] = None if avg in (None, "") else _as_rate(where, "avg_ts", avg)
    return out


def _tuner_row(where: str, r: dict[str, Any]) -> dict[str, Any]:
    """A `tuner bench` row with the fields compare/report read checked; a failed row keeps no samples."""
    out = dict(r)
    for k in ("label", "test", "phase"):
        if not isinstance(r.get(k), str):
            raise _bad(where, k, r.get(k), "text")
    if r["phase"] not in ("pp", "tg", "pg"):
        raise _bad(where, "phase", r["phase"], "pp, tg or pg")
    out["depth"] = _as_int(where, "depth", r.get("depth"))
    out["n"] = _as_int(where, "n", r.get("n"), hi=MAX_SAMPLES)
    status = r.get("status", "ok")
    if not isinstance(status, str):
        raise _bad(where, "status", status, "text (ok or failed)")
    out |= {k: _text(where, k, r[k]) for k in ("model", "model_filename") if k in r}
    for k in ("backends", "build_commit", "build_number", "settings", "cmd", "env"):
        if k in r:
            out[k] = _scalar(where, k, r[k])
    samples = _as_rates(where, "samples", r.get("samples"))
    med = r.get("median_ts")
    med_missing = med is None or (_is_num(med) and math.isnan(float(med)))
    if status != "ok" or (not samples and med_missing):
        # a failed measurement is missing: nothing of it may reach a verdict or a t/s column
        out.update(samples=[], median_ts=math.nan, n=0)
        return out
    if not samples:
        raise _bad(where, "samples", r.get("samples"), f"the repetitions behind median_ts {med!r}")
    out["samples"], out["median_ts"] = samples, _as_rate(where, "median_ts", med)
    return out


def test_phase(n_prompt: int, n_gen: int) -> tuple[str, str]:
    """llama-bench's test name (``pp512``, ``tg128``, ``pp512+tg128``) and tuner's phase (``pp``, ``tg``, ``pg``)."""
    if n_gen == 0:
        return f"pp{n_prompt}", "pp"
    if n_prompt == 0:
        return f"tg{n_gen}", "tg"
    return f"pp{n_prompt}+tg{n_gen}", "pg"


def _row_avg_ts(r: dict[str, Any]) -> float:
    """llama-bench's avg_ts of one record (the mean of its samples_ts), as recorded, else from the samples."""
    avg: object = r.get("avg_ts")
    if isinstance(avg, str) or _is_num(avg):
        try:
            val = float(avg)
        except ValueError:
            val = math.nan
        if math.isfinite(val) and val > 0:
            return val
    samples = r["samples_ts"]
    return sum(samples) / len(samples) if samples else math.nan


def _model_name(rec: dict[str, Any]) -> str:
    """The Model column as compare-llama-bench.py prints it (``llama 8B Q4_K_M``), else the file's stem."""
    mt = str(rec.get("model_type") or "")
    for long, short in ((" - Small", "_S"), (" - Medium", "_M"), (" - Large", "_L")):
        mt = mt.replace(long, short)
    return mt or Path(str(rec.get("model_filename") or "")).stem


def _raw_frame(records: list[_Record], path: Path) -> pd.DataFrame:
    """Raw llama-bench records -> a bench frame, one row per (model, test, depth)."""
    import pandas as pd

    recs = [_checked_llama_bench(where, r) for where, r in records]
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in recs:
        groups.setdefault((_model_name(r), test_phase(r["n_prompt"], r["n_gen"])[0], r["n_depth"]), []).append(r)
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
        samples = [x for r in rs for x in r["samples_ts"] or ([r["avg_ts"]] if r.get("avg_ts") is not None else [])]
        if len(samples) > MAX_SAMPLES:
            raise UsageError(
                f"{path} pools {len(samples)} repetitions for {model} {test} at depth {depth}; tuner compares at "
                f"most {MAX_SAMPLES} per row (MAX_SAMPLES; tuner bench keeps at most 10000). Split the file."
            )
        first = rs[0]
        stats = summarize_samples(samples, confidence=0.95, seed=0)
        # compare-llama-bench.py's t/s: AVG(avg_ts) over the rows of one test (not the pooled samples' mean)
        avgs = [a for r in rs if math.isfinite(a := _row_avg_ts(r))]
        rows.append(
            {
                "label": path.stem,
                "model": model,
                "test": test,
                "phase": test_phase(rs[0]["n_prompt"], rs[0]["n_gen"])[1],
                "depth": depth,
                **stats,
                "avg_ts": sum(avgs) / len(avgs) if avgs else math.nan,
                "n_batches": len(rs),
                "warmup_discarded": 0,
                "status": "ok",
                "error": "",
                "per_rep": any(r["samples_ts"] for r in rs),
                **{k: first.get(k) for k in ("build_commit", "build_number", "backends", "gpu_info", "cpu_info")},
                **{k: first.get(k) for k in ("model_filename", "model_type", "model_size")},
                "n_params": first.get("model_n_params"),
                "settings": next(iter(settings)),
                "source_format": "llama-bench",
            }
        )
    frame: pd.DataFrame = pd.DataFrame(rows)  # pandas-stubs leave the constructor untyped before 3.11
    return frame


def _commands(df: pd.DataFrame) -> set[tuple[str, ...]]:
    """The llama-bench command lines of a `tuner bench` frame without what only sets which points ran
    and how often (``-d``, ``-r``: extra batches of a ``--target-ci`` run differ in those)."""
    return {
        tuple(w for i, w in enumerate(ws) if w not in ("-d", "-r") and (i == 0 or ws[i - 1] not in ("-d", "-r")))
        for ws in (str(cmd).split() for cmd in df["cmd"].dropna())
    }


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
    head = ["label", "test", "depth", "t/s (median)", "±CI %", "n", "min–max", "cpu %", "gpu %", "roofline %", "status"]
    rows = [
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
        for _, r in df.sort_values(["label", "phase", "depth"]).iterrows()
    ]
    return log.table(head, rows)

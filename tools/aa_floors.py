"""Compute tuner's run-to-run noise floors from the A/A data recorded in this repository.

An A/A pair is two llama-bench runs of one build with one command. This script collects every such
pair the repo records and writes, per backend and phase, how far the second run's t/s strayed from
the first's: ``tuner/data/aa_floors.toml``. ``tuner compare`` and ``tuner report`` use the floor when
no A/A pair is given (docs/noise-floors.md).

Pairs, all t/s values of separate llama-bench processes:

* the search's rounds in every recorded study database (``screen_rounds``, ``confirm_rounds_*``):
  ``upstream`` vs ``upstream-aa`` in the same round (back to back), and ``upstream`` in one round vs
  ``upstream`` in the next round of the same stage (minutes apart). The databases are stored
  xz-compressed: earlier states of the studies in ``docs/data/noise-floors/`` (in the order they were
  written), then each result's own in ``results/<arch>/<model>/evidence/study.db.xz``; a round that an
  earlier file already held is counted once;
* ``tests/data/bench/h100/default-run1.jsonl`` vs ``default-run2.jsonl`` (two ``tuner bench`` runs of one
  H100 build, medians of their repetitions).

Run from the repository root: ``python tools/aa_floors.py`` (``--check`` exits 1 when the committed
file differs from what the data gives).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import math
import sqlite3
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tuner" / "data" / "aa_floors.toml"
QUANTILE = 0.95
"""The floor is this quantile of |Δ%| over a backend's and phase's pairs (see docs/noise-floors.md)."""
MIN_PAIRS = 30
"""Fewer pairs give no floor: their 95th percentile is in effect their largest pair, one outlier's value."""


def _backend(arch: str) -> str:
    if arch == "cpu":
        return "CPU"
    if arch.startswith("sm_"):
        return "CUDA"
    if arch.startswith("gfx"):
        return "ROCm"
    return arch


def _ok(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def study_pairs(db: Path, seen: set[str]) -> list[tuple[str, str, str, float]]:
    """(backend, phase, kind, Δ%) of every A/A pair in one Optuna SQLite study file (``.db`` or ``.db.xz``)."""
    if db.suffix == ".xz":  # SQLite reads only a plain file: decompress to a temporary one
        with tempfile.TemporaryDirectory() as tmp:
            plain = Path(tmp) / db.stem
            plain.write_bytes(lzma.decompress(db.read_bytes()))
            return study_pairs(plain, seen)
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    out = []
    try:
        for study_id, name in con.execute("select study_id, study_name from studies"):
            attrs = {
                k: v
                for k, v in con.execute(
                    "select key, value_json from study_user_attributes where study_id = ?", (study_id,)
                )
            }
            if "arch" not in attrs:
                continue
            backend = _backend(json.loads(attrs["arch"]))
            for key, raw in attrs.items():
                if not (key == "screen_rounds" or key.startswith("confirm_rounds")):
                    continue
                prev: dict[tuple[str, str], float] = {}
                for rec in json.loads(raw):
                    ident = hashlib.sha256(
                        json.dumps([name, key, rec.get("round"), rec["phase"], rec["values"]], sort_keys=True).encode()
                    ).hexdigest()
                    if ident in seen:  # later copies of a study database repeat its earlier rounds
                        continue
                    seen.add(ident)
                    vals = rec["values"]
                    up = vals.get("upstream", {})
                    for d, u in up.items():
                        a = vals.get("upstream-aa", {}).get(d)
                        if _ok(u) and _ok(a):
                            out.append((backend, rec["phase"], "in-round", 100.0 * (a / u - 1.0)))
                        p = prev.get((rec["phase"], d))
                        if _ok(u) and p is not None:
                            out.append((backend, rec["phase"], "across rounds", 100.0 * (u / p - 1.0)))
                        if _ok(u):
                            prev[(rec["phase"], d)] = u
    finally:
        con.close()
    return out


def bench_pairs() -> list[tuple[str, str, str, float]]:
    """The two ``tuner bench`` runs of one H100 build (medians of their repetitions)."""
    s1 = ROOT / "tests" / "data" / "bench" / "h100"
    runs = []
    for f in ("default-run1.jsonl", "default-run2.jsonl"):
        runs.append({(r["test"], r["depth"]): r for r in map(json.loads, (s1 / f).read_text().splitlines()) if r})
    out = []
    for key, a in runs[0].items():
        b = runs[1].get(key)
        if b and _ok(a["median_ts"]) and _ok(b["median_ts"]):
            out.append((a["backends"], a["phase"], "separate runs", 100.0 * (b["median_ts"] / a["median_ts"] - 1.0)))
    return out


def _quantile(xs: list[float], q: float) -> float:
    """The ``q`` quantile by linear interpolation between order statistics (numpy's default)."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def floors(dbs: list[Path]) -> dict[str, dict[str, dict[str, float | int]]]:
    seen: set[str] = set()
    pairs = bench_pairs()
    for db in dbs:
        pairs += study_pairs(db, seen)
    out: dict[str, dict[str, dict[str, float | int]]] = {}
    for backend in sorted({p[0] for p in pairs}):
        for phase in ("pp", "tg"):
            d = [abs(p[3]) for p in pairs if p[0] == backend and p[1] == phase]
            if not d:
                continue
            out.setdefault(backend, {})[phase] = {
                **({"floor_pct": round(_quantile(d, QUANTILE), 1)} if len(d) >= MIN_PAIRS else {}),
                "pairs": len(d),
                "median_pct": round(_quantile(d, 0.5), 2),
                "max_pct": round(max(d), 1),
            }
    return out


def render(data: dict[str, dict[str, dict[str, float | int]]], dbs: list[Path]) -> str:
    lines = [
        "# Generated by tools/aa_floors.py from the A/A pairs recorded in this repository (docs/noise-floors.md).",
        f"# floor_pct: the {int(QUANTILE * 100)}th percentile of |t/s of run 2 / t/s of run 1 - 1| over the pairs, percent.",
        f"# A backend and phase with fewer than {MIN_PAIRS} pairs has no floor_pct: nothing is claimed there without --aa.",
        f"quantile = {QUANTILE}",
        f"min_pairs = {MIN_PAIRS}",
        "# the study databases read, in this order (besides tests/data/bench/h100/default-run1.jsonl and default-run2.jsonl)",
        "sources = [" + ", ".join(f'"{db.relative_to(ROOT).as_posix()}"' for db in dbs) + "]",
        "",
    ]
    for backend, phases in data.items():
        for phase, v in phases.items():
            lines.append(f"[{backend}.{phase}]")
            lines += [f"{k} = {v[k]}" for k in ("floor_pct", "pairs", "median_pct", "max_pct") if k in v]
            lines.append("")
    return "\n".join(lines)


def sorted_sources() -> list[Path]:
    """Every recorded study database, earlier states first: a study's rounds are counted in the first file
    that holds them, and a pair across rounds only where that file also held the round before."""
    return sorted(ROOT.glob("docs/data/noise-floors/*.db.xz")) + sorted(ROOT.glob("results/*/*/evidence/study.db.xz"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed file is out of date")
    args = ap.parse_args()
    if args.check:  # recompute from the databases the committed file names: data added later does not fail it
        try:
            import tomllib
        except ImportError:  # Python 3.10
            import tomli as tomllib

        dbs = [ROOT / p for p in tomllib.loads(OUT.read_text())["sources"]]
        if OUT.read_text() != render(floors(dbs), dbs):
            print(f"{OUT} does not match its recorded sources; run python tools/aa_floors.py", file=sys.stderr)
            return 1
        return 0
    dbs = sorted_sources()
    text = render(floors(dbs), dbs)
    OUT.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

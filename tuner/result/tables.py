"""The one comparison table (``tuner compare``, ``tuner report``, report.md, PR.md): llama.cpp's
``scripts/compare-llama-bench.py`` shape plus the 95% CI, the noise reference, the verdict and, where kernels
were chosen, ``Kernel``. Speedup is always t/s B / t/s A of the row's two numbers; no faster/slower without a
noise reference (``A/A``, ``floor``: docs/noise-floors.md, or ``none``).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from tuner.errors import UsageError
from tuner.measure.decide import method_text as rule_text
from tuner.measure.paired import UPSTREAM_KEPT
from tuner.measure.paired import method_text as paired_text
from tuner.measure.stats import method_text
from tuner.plan.fa_rules import Phase

Points = Sequence[Mapping[str, object]]
"""Compared points, one dict per (model, test, depth): :func:`compare_records` says which keys are read."""

MARKS = {
    "faster": "✓",
    "slower": "✗",
    "no difference": "~",
    "within noise": "~",
    "too few samples": "?",
    "no noise reference": "?",
    "too noisy": "?",
    UPSTREAM_KEPT: "~",
}

_VERDICT_WORDS = {
    "too few samples": "too few samples to decide",
    "too noisy": "too noisy (A/A noise above the ceiling)",
}
"""The verdicts a table spells out longer (every other verdict is shown as it is)."""


class CompareRecord(TypedDict):
    model: str
    test: str
    phase: str
    depth: int
    name_a: str
    name_b: str
    ts_a: float | None
    ts_b: float | None
    speedup: float | None
    median_a: float | None
    median_b: float | None
    median_ratio: float | None
    ci_low: float | None
    ci_high: float | None
    noise_pct: float | None
    noise: object
    verdict: str
    upstream_kernel: object
    kernel: object


COMPARE_FIELDS: tuple[str, ...] = tuple(CompareRecord.__annotations__)
"""Fields of one row in the JSON and CSV forms of :func:`compare_table` (same fields in both).
``speedup`` = ``ts_b / ts_a``; ``median_a``/``median_b`` the medians of the repetitions where the
points carry them (``tuner compare``/``report``: then ``ts_a``/``ts_b`` are compare-llama-bench.py's mean
t/s) and ``median_ratio`` their ratio, the estimate the CI is of; ``ci_low``/``ci_high`` ratios B/A;
``noise_pct`` percent; ``noise`` its kind (``A/A``, ``floor``, ``none``)."""


ESTIMATORS = (
    "t/s and Speedup: llama-bench's mean t/s (avg_ts; over several rows of one test, the mean of their avg_ts), "
    "as llama.cpp's scripts/compare-llama-bench.py prints them. Median ratio and 95% CI: tuner's estimate, the "
    "ratio of the medians of the repetitions, which the verdict is judged on."
)
"""Which column of a :func:`compare_table` with a ``Median ratio`` column is which estimator (one line)."""


def bench_test_name(test: str, depth: int) -> str:
    """``compare-llama-bench.py``'s test name: ``pp512``, ``tg128@d32768`` (no ``@d0``)."""
    depth, test = int(depth), str(test)
    return test if depth == 0 or "@d" in test else f"{test}@d{depth}"


def as_float(x: Any) -> float:
    """``float(x)``, NaN where that fails (also used by the report's tables and the plots)."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _num(x: object) -> float | None:
    v = as_float(x)
    return v if math.isfinite(v) else None


def _phase(p: Mapping[str, object]) -> str:
    ph = str(p.get("phase") or str(p.get("test", ""))[:2])
    return Phase(ph).bench if ph in {p.value for p in Phase} else ph


def _sorted(points: Points) -> list[Mapping[str, Any]]:
    # compare-llama-bench.py orders by n_gen, n_prompt, n_depth: pp rows (n_gen 0) first.
    def key(p: Mapping[str, Any]) -> tuple[str, int, int, str, int]:
        test = str(p.get("test", ""))
        m = re.match(r"^(pp|tg)(\d+)$", test)
        return (
            str(p.get("model") or ""),
            0 if _phase(p) == "pp" else 1,
            int(m.group(2)) if m else 0,
            test,
            int(p.get("depth", 0)),
        )

    return sorted(points, key=key)


def compare_records(
    points: Points, *, name_a: str = "upstream", name_b: str = "tuned", model: str = ""
) -> list[CompareRecord]:
    """The rows of :func:`compare_table` as plain records (None where a number is missing). ``points``: dicts
    with ``phase``, ``depth``, ``test`` (``tg128``; the depth is added here), ``base_ts``/``tuned_ts``, optionally
    ``base_median_ts``/``tuned_median_ts`` (the medians the CI is of), ``ci_low``/``ci_high`` (ratios B/A),
    ``aa_noise_pct`` (percent), ``noise_kind`` (default ``A/A`` where a noise is given), ``verdict``, ``model``,
    ``upstream_kernel``, ``kernel``."""
    out: list[CompareRecord] = []
    for p in _sorted(points):
        a, b = _num(p.get("base_ts")), _num(p.get("tuned_ts"))
        ma, mb = _num(p.get("base_median_ts")), _num(p.get("tuned_median_ts"))
        noise = _num(p.get("aa_noise_pct"))
        kind = p.get("noise_kind") or ("A/A" if noise is not None else "none")
        out.append(
            {
                "model": str(p.get("model") or model),
                "test": bench_test_name(str(p["test"]), int(p["depth"])),
                "phase": _phase(p),
                "depth": int(p["depth"]),
                "name_a": name_a,
                "name_b": name_b,
                "ts_a": a,
                "ts_b": b,
                "speedup": b / a if a and b is not None and a > 0 else None,
                "median_a": ma,
                "median_b": mb,
                "median_ratio": mb / ma if ma and mb is not None and ma > 0 else None,
                "ci_low": _num(p.get("ci_low")),
                "ci_high": _num(p.get("ci_high")),
                "noise_pct": noise if kind != "none" else None,
                "noise": kind,
                "verdict": str(p.get("verdict") or ""),
                "upstream_kernel": p.get("upstream_kernel") or None,
                "kernel": p.get("kernel") or None,
            }
        )
    return out


def _f2(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def compare_table(points: Points, *, name_a: str = "upstream", name_b: str = "tuned", model: str = "") -> str:
    """The Markdown table: ``Model | Test | t/s <A> | t/s <B> | Speedup | 95% CI | Noise | Verdict`` (``Kernel``
    too where a kernel differs from upstream's; a ``Median ratio`` before the CI, the estimate it is of, where
    the points carry medians: :data:`ESTIMATORS`). Speedup at two decimals, as the script prints it."""
    recs = compare_records(points, name_a=name_a, name_b=name_b, model=model)
    show_kernel = any(r["kernel"] and r["kernel"] != r["upstream_kernel"] for r in recs)
    show_median = any(r["median_a"] is not None or r["median_b"] is not None for r in recs)
    cols = [("Model", False), ("Test", False), (f"t/s {name_a}", True), (f"t/s {name_b}", True), ("Speedup", True)]
    if show_median:
        cols.append(("Median ratio", True))
    cols += [("95% CI", True), ("Noise", True), ("Verdict", False)]
    if show_kernel:
        cols.append(("Kernel", False))
    rows = []
    for r in recs:
        ci = "-" if r["ci_low"] is None or r["ci_high"] is None else f"{r['ci_low']:.3f}–{r['ci_high']:.3f}"
        noise = "none" if r["noise"] == "none" or r["noise_pct"] is None else f"±{r['noise_pct']:.1f}% {r['noise']}"
        v = r["verdict"]
        row = [
            r["model"],
            r["test"],
            _f2(r["ts_a"]),
            _f2(r["ts_b"]),
            _f2(r["speedup"]),
            *([_f2(r["median_ratio"])] if show_median else []),
            ci,
            noise,
            f"{MARKS.get(v, '')} {_VERDICT_WORDS.get(v, v)}".strip(),
        ]
        if show_kernel:
            k, u = r["kernel"], r["upstream_kernel"]
            row.append(f"{u or '?'} → {k}" if k and k != u else (f"{k} (upstream)" if k else ""))
        rows.append(row)
    # laid out like tabulate's ``pipe`` format (compare-llama-bench.py's default)
    cells, right = [[h for h, _ in cols], *rows], [rt for _, rt in cols]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]

    def line(r: Sequence[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if rt else c.ljust(w) for c, w, rt in zip(r, widths, right)) + " |"

    rule = (
        "|" + "|".join((("-" * (w + 1)) + ":") if rt else (":" + "-" * (w + 1)) for w, rt in zip(widths, right)) + "|"
    )
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])


def format_compare(
    points: Points, fmt: str = "md", *, name_a: str = "upstream", name_b: str = "tuned", model: str = ""
) -> str:
    """:func:`compare_table` as ``md``, or its records (:data:`COMPARE_FIELDS`) as ``csv`` or ``json``."""
    if fmt == "md":
        return compare_table(points, name_a=name_a, name_b=name_b, model=model)
    recs = compare_records(points, name_a=name_a, name_b=name_b, model=model)
    if fmt == "json":
        return json.dumps(recs, indent=1, ensure_ascii=False)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(COMPARE_FIELDS), lineterminator="\n")
        w.writeheader()
        w.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in recs)
        return buf.getvalue()
    raise UsageError(f"Unknown format {fmt!r}; use md, csv or json.")


def method_paragraph(
    kind: str,
    *,
    confidence: float = 0.95,
    rounds: Sequence[int] = (),
    noise: str = "",
    ceiling_pct: float | None = None,
    rule: str | None = None,
) -> str:
    """How the table's numbers were computed, written by the code that computed them. ``kind``: ``separate
    runs`` (:func:`tuner.measure.stats.compare`) or ``paired rounds`` (:func:`tuner.measure.paired.block_effects`);
    ``noise``: what the Noise column holds; ``rule``: ``sequential`` where :mod:`tuner.measure.decide` gave the
    verdicts, else the whole CI beyond the noise reference (stored results, separate runs)."""
    if kind == "separate runs":
        text = method_text(confidence)
    elif kind == "paired rounds":
        text = paired_text(rounds, confidence)
    else:
        raise ValueError(f"unknown method {kind!r}")
    if rule == "sequential":
        text += " " + rule_text() + (f" Noise (shown, not a bar): {noise}" if noise else "")
    else:
        text += (
            " Verdict: faster or slower only when the whole CI lies beyond the noise reference; a row without one "
            "claims nothing." + (f" Noise: {noise}" if noise else "")
        )
    if ceiling_pct is not None:
        text += (
            f" A phase whose A/A noise exceeds {ceiling_pct:g}% claims nothing at all (the machine was too noisy "
            "to tell a kernel's effect from chance)."
        )
    return text

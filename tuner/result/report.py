"""Markdown reports and depth plots from bench frames.

Tables follow the shape of lhl's rocWMMA write-up (github.com/lhl/strix-halo-testing) and llama.cpp's
``compare-llama-bench.py``: one table per phase, one line per ``test @ depth``, one t/s column
per variant and a Δ% column per non-baseline variant, so they paste into a pull request. Each
t/s cell is ``median ± CI`` with the sample count; each Δ% carries a significance mark from
:func:`tuner.measure.stats.compare` (✓ faster, ✗ slower, ~ no difference at the chosen confidence).
Roofline percentages are model estimates (tuner.targets.roofline) and are labelled as such.

:func:`compare_table` renders two variants exactly in ``compare-llama-bench.py``'s shape (``Model |
Test | t/s A | t/s B | Speedup``, tests named ``pp512@d4096``) with the CI, the A/A noise and the
verdict in extra columns; :func:`plot_speedup` (:mod:`tuner.result.plots`) draws the speedup per depth with its CI band and the
kernel chosen per depth interval. :func:`dashboard_command` and :func:`importances_section` connect
a study to Optuna's own tools.
"""

from __future__ import annotations

__all__ = [
    "COMPARE_FIELDS",
    "MARKS",
    "compare_points",
    "compare_records",
    "compare_table",
    "dashboard_command",
    "format_compare",
    "importances_section",
    "plot_depth",
    "plot_speedup",
    "render_report",
    "bench_test_name",
]

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner import log
from tuner.errors import UsageError
from tuner.measure.stats import compare
from tuner.result.plots import _PHASES, _num, _phase_of, plot_depth, plot_speedup

if TYPE_CHECKING:
    import pandas as pd

MARKS = {"faster": "✓", "slower": "✗", "no difference": "~", "too few samples": "?"}

def _cell(row: Any) -> str:
    if row is None:
        return "-"
    med = _num(row["median_ts"])
    if not math.isfinite(med):
        return "failed" if str(row.get("status", "")) == "failed" else "-"
    half = (_num(row["ci_high"]) - _num(row["ci_low"])) / 2
    spread = f" ± {half:.2f}" if math.isfinite(half) else ""
    return f"{med:.2f}{spread} (n={int(row['n'])})"


def _test_name(test: str, depth: int) -> str:
    return test if depth == 0 else f"{test} @ d{depth}"


def _index(df: pd.DataFrame) -> dict[tuple[str, int], Any]:
    return {(str(r["test"]), int(r["depth"])): r for _, r in df.iterrows()}


def _report_intro(frames: Mapping[str, pd.DataFrame], labels: Sequence[str], baseline: str) -> list[str]:
    """Model, backend and GPU of the baseline's first row, and the variants with their commits."""
    base_df = frames[baseline]
    meta = base_df.iloc[0] if len(base_df) else None
    if meta is None:
        return []
    size = _num(meta.get("model_size"))
    params = _num(meta.get("n_params"))
    bits = [f"model `{meta.get('model_filename')}`"]
    if math.isfinite(size):
        bits.append(f"{size / 2**20:.2f} MiB")
    if math.isfinite(params):
        bits.append(f"{params / 1e9:.2f} B params")
    bits.append(f"backend {meta.get('backends') or '?'}")
    if meta.get("gpu_info"):
        bits.append(str(meta.get("gpu_info")))
    out = [", ".join(bits) + ".", ""]
    commits = {k: sorted({str(c) for c in frames[k]["build_commit"].dropna()}) for k in labels}
    out += ["Variants: " + "; ".join(f"**{k}**" + (f" (llama.cpp {', '.join(c)})" if c else "")
                                      for k, c in commits.items()) + f". Baseline: **{baseline}**.", ""]
    return out


def _phase_table(phase: str, heading: str, labels: Sequence[str], idx: Mapping[str, Mapping[tuple[str, int], Any]],
                 baseline: str, *, has_roof: bool, confidence: float, seed: int) -> list[str]:
    """One phase's section: a line per ``test @ depth``, t/s per variant, Δ% with its mark, roofline %."""
    keys = sorted({key for k in labels for key, r in idx[k].items() if r["phase"] == phase},
                  key=lambda t: (t[0], t[1]))
    if not keys:
        return []
    headers = ["test"] + [f"{k} t/s" for k in labels]
    headers += [f"Δ% {k}" for k in labels[1:]]
    if has_roof:
        headers += [f"roofline % {k}" for k in labels]
    rows = []
    for test, depth in keys:
        line = [_test_name(test, depth)] + [_cell(idx[k].get((test, depth))) for k in labels]
        b = idx[baseline].get((test, depth))
        for k in labels[1:]:
            r = idx[k].get((test, depth))
            if b is None or r is None or not (r["n"] and b["n"]):
                line.append("-")
                continue
            v = compare(list(b["samples"]), list(r["samples"]), confidence=confidence, seed=seed)
            line.append(f"{v.delta_pct:+.2f}% {MARKS[v.verdict]}" if math.isfinite(v.delta_pct) else "-")
        if has_roof:
            for k in labels:
                r = idx[k].get((test, depth))
                pct = _num(r["roofline_pct"]) if r is not None else math.nan
                line.append(f"{pct:.1f}" if math.isfinite(pct) else "-")
        rows.append(line)
    return [f"## {heading}", "", log.table(headers, rows), ""]


def _report_notes(frames: Mapping[str, pd.DataFrame], labels: Sequence[str], baseline: str, *, has_roof: bool,
                  confidence: float) -> list[str]:
    """The notes under the tables: what t/s, Δ% and roofline % mean, and which variants were drift-corrected."""
    level = f"{confidence * 100:g}%"
    notes = [
        f"t/s: median ± half-width of the {level} bootstrap CI of the median; n = kept repetitions "
        "(the first repetition of every llama-bench call is discarded as warm-up).",
        f"Δ%: median vs {baseline}; ✓ faster / ✗ slower / ~ no difference at {level} "
        "(bootstrap CI of the ratio of medians excludes 0 and Mann-Whitney U p < "
        f"{1 - confidence:.2g}); ? the CI excludes 0 but too few repetitions for the rank test to decide.",
    ]
    if has_roof:
        notes.append("roofline %: measured / model estimate (tg: bandwidth / bytes per token; "
                     "pp: compute peak). A model estimate, not a measurement.")
    else:
        notes.append("roofline %: not available (run `tuner bench` with --arch or --bandwidth).")
    drifted = [k for k in labels if "drift_corrected" in frames[k] and frames[k]["drift_corrected"].eq(True).any()]
    if drifted:
        notes.append("Drift-corrected by the interleaved baseline anchor: " + ", ".join(drifted) + ".")
    return ["Notes:", ""] + [f"- {n}" for n in notes] + [""]


def render_report(
    frames: Mapping[str, pd.DataFrame],
    baseline: str,
    *,
    confidence: float = 0.95,
    seed: int = 0,
    title: str = "llama-bench results",
) -> str:
    """Render Markdown tables comparing variants against a baseline.

    Args:
        frames: Variant label -> bench frame (tuner.measure.bench schema).
        baseline: Label of the reference variant (must be a key of ``frames``).
        confidence: Confidence level of the significance marks.
        seed: Bootstrap seed.
        title: Heading of the report.

    Returns:
        Markdown text.

    Raises:
        UsageError: Unknown baseline or no frames.
    """
    from tuner.errors import close_matches

    if not frames:
        raise UsageError("No bench results to report; pass at least one results file.")
    if baseline not in frames:
        raise UsageError(f"Baseline {baseline!r} is not among the variants {sorted(frames)}."
                         + close_matches(baseline, list(frames)))
    labels = [baseline] + [k for k in frames if k != baseline]
    idx = {k: _index(frames[k]) for k in labels}
    out = [f"# {title}", ""] + _report_intro(frames, labels, baseline)
    has_roof = any(
        "roofline_pct" in frames[k] and frames[k]["roofline_pct"].map(_num).map(math.isfinite).any()
        for k in labels
    )
    for phase, heading in _PHASES:
        out += _phase_table(phase, heading, labels, idx, baseline, has_roof=has_roof, confidence=confidence, seed=seed)
    out += _report_notes(frames, labels, baseline, has_roof=has_roof, confidence=confidence)
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# compare-llama-bench.py-shaped tables
# ---------------------------------------------------------------------------------------------

COMPARE_FIELDS: tuple[str, ...] = (
    "model", "test", "phase", "depth", "name_a", "name_b", "ts_a", "ts_b", "speedup", "ci_low",
    "ci_high", "aa_noise_pct", "verdict", "upstream_kernel", "kernel",
)
"""Fields of one row in the CSV and JSON forms of :func:`compare_table` (same fields in both)."""

_VERDICT_WORDS = {"faster": "faster", "slower": "slower", "no difference": "no difference",
                  "too few samples": "too few samples to decide",
                  "within noise": "within A/A noise", "missing": "missing"}


def bench_test_name(test: str, depth: int) -> str:
    """``compare-llama-bench.py``'s test name: ``pp512``, ``tg128@d32768`` (no ``@d0``)."""
    depth = int(depth)
    return str(test) if depth == 0 else f"{test}@d{depth}"




def _opt_num(x: Any) -> float | None:
    v = _num(x)
    return v if math.isfinite(v) else None


def _sorted_points(points: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    # compare-llama-bench.py orders by n_gen, n_prompt, n_depth: pp rows (n_gen 0) first.
    def key(p: Mapping[str, Any]) -> tuple[int, int, str, int]:
        test = str(p.get("test", ""))
        m = re.match(r"^(pp|tg)(\d+)$", test)
        n = int(m.group(2)) if m else 0
        return (0 if _phase_of(p) == "pp" else 1, n, test, int(p.get("depth", 0)))

    return sorted(points, key=key)


def compare_records(
    points: Sequence[Mapping[str, Any]], *, name_a: str = "upstream", name_b: str = "tuned", model: str = ""
) -> list[dict[str, Any]]:
    """The rows of :func:`compare_table` as plain records (fields :data:`COMPARE_FIELDS`).

    Numbers keep their full precision (None where missing); ``speedup``, ``ci_low`` and
    ``ci_high`` are ratios B/A, ``aa_noise_pct`` is in percent.
    """
    out = []
    for p in _sorted_points(points):
        out.append({
            "model": model,
            "test": bench_test_name(str(p["test"]), int(p["depth"])),
            "phase": _phase_of(p),
            "depth": int(p["depth"]),
            "name_a": name_a,
            "name_b": name_b,
            "ts_a": _opt_num(p.get("base_ts")),
            "ts_b": _opt_num(p.get("tuned_ts")),
            "speedup": _opt_num(p.get("speedup")),
            "ci_low": _opt_num(p.get("ci_low")),
            "ci_high": _opt_num(p.get("ci_high")),
            "aa_noise_pct": _opt_num(p.get("aa_noise_pct")),
            "verdict": str(p.get("verdict") or ""),
            "upstream_kernel": p.get("upstream_kernel") or None,
            "kernel": p.get("kernel") or None,
        })
    return out


def _f2(x: float | None) -> str:
    # tabulate(floatfmt=".2f") as compare-llama-bench.py prints it.
    return "-" if x is None else f"{x:.2f}"


def _pipe_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    """A GitHub pipe table laid out like tabulate's ``pipe`` format (compare-llama-bench.py's default)."""
    cells = [list(headers)] + [list(r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if rt else c.ljust(w) for c, w, rt in zip(r, widths, right)) + " |"

    rule = "|" + "|".join((("-" * (w + 1)) + ":") if rt else (":" + "-" * (w + 1))
                          for w, rt in zip(widths, right)) + "|"
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])


def compare_table(
    points: Sequence[Mapping[str, Any]], *, name_a: str = "upstream", name_b: str = "tuned", model: str = ""
) -> str:
    """A Markdown table in the shape of llama.cpp's ``scripts/compare-llama-bench.py``.

    One row per test named like that script does (``pp512``, ``pp512@d4096``, ``tg128@d32768``),
    columns ``Model | Test | t/s <name_a> | t/s <name_b> | Speedup`` with t/s and the speedup
    (B/A ratio) at two decimals, then the 95% CI of the speedup in its own column
    (``Speedup 95% CI``), and ``A/A noise`` / ``Verdict`` columns when any point carries them.
    Where a point's ``kernel`` differs from its ``upstream_kernel`` a ``Kernel`` column says
    ``upstream → chosen``.

    Args:
        points: Dicts with ``phase, depth, test, base_ts, tuned_ts, speedup, ci_low, ci_high``
            (ratios), ``aa_noise_pct`` (percent or None), ``verdict``, ``upstream_kernel``,
            ``kernel``.
        name_a: Reference side (the script's baseline commit name).
        name_b: Candidate side.
        model: Text of the Model column (the script prints llama-bench's ``model_type``).

    Returns:
        Markdown (GitHub pipe table, numeric columns right-aligned as tabulate does).
    """
    recs = compare_records(points, name_a=name_a, name_b=name_b, model=model)
    show_noise = any(r["aa_noise_pct"] is not None for r in recs)
    show_verdict = any(r["verdict"] for r in recs)
    show_kernel = any(r["kernel"] and r["kernel"] != r["upstream_kernel"] for r in recs)
    headers = ["Model", "Test", f"t/s {name_a}", f"t/s {name_b}", "Speedup", "Speedup 95% CI"]
    right = [False, False, True, True, True, True]
    if show_noise:
        headers.append("A/A noise")
        right.append(True)
    if show_verdict:
        headers.append("Verdict")
        right.append(False)
    if show_kernel:
        headers.append("Kernel")
        right.append(False)
    rows = []
    for r in recs:
        ci = "-" if r["ci_low"] is None or r["ci_high"] is None else f"{r['ci_low']:.3f}–{r['ci_high']:.3f}"
        row = [r["model"], r["test"], _f2(r["ts_a"]), _f2(r["ts_b"]), _f2(r["speedup"]), ci]
        if show_noise:
            row.append("-" if r["aa_noise_pct"] is None else f"±{r['aa_noise_pct']:.1f}%")
        if show_verdict:
            v = r["verdict"]
            mark = MARKS.get(v, "")
            row.append(f"{mark} {_VERDICT_WORDS.get(v, v)}".strip())
        if show_kernel:
            k, u = r["kernel"], r["upstream_kernel"]
            row.append(f"{u or '?'} → {k}" if k and k != u else (f"{k} (upstream)" if k else ""))
        rows.append(row)
    return _pipe_table(headers, rows, right)


def format_compare(
    points: Sequence[Mapping[str, Any]], fmt: str = "md", *, name_a: str = "upstream", name_b: str = "tuned",
    model: str = "",
) -> str:
    """:func:`compare_table` as ``md``, or its records (:data:`COMPARE_FIELDS`) as ``csv`` or ``json``."""
    if fmt == "md":
        return compare_table(points, name_a=name_a, name_b=name_b, model=model)
    recs = compare_records(points, name_a=name_a, name_b=name_b, model=model)
    if fmt == "json":
        import json

        return json.dumps(recs, indent=1, ensure_ascii=False)
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(COMPARE_FIELDS), lineterminator="\n")
        w.writeheader()
        for r in recs:
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})
        return buf.getvalue()
    raise UsageError(f"Unknown format {fmt!r}; use md, csv or json.")


def compare_points(
    df_a: pd.DataFrame,
    df_b: pd.DataFrame,
    *,
    df_aa: pd.DataFrame | None = None,
    confidence: float = 0.95,
    min_effect_pct: float = 0.0,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Points for :func:`compare_table` / :func:`plot_speedup` from two bench frames.

    ``df_aa`` is an optional second run of the A side (an A/A pair): its run-to-run difference
    |median(A')/median(A) - 1| per point becomes ``aa_noise_pct``, and a change whose CI does not
    clear ±that noise gets the verdict ``within noise`` instead of faster/slower.
    """
    from tuner.measure.stats import compare_frames

    res = compare_frames(df_a, df_b, confidence=confidence, seed=seed, min_effect_pct=min_effect_pct)
    noise: dict[tuple[str, int], float] = {}
    if df_aa is not None:
        aa = compare_frames(df_a, df_aa, confidence=confidence, seed=seed)
        for _, r in aa.iterrows():
            d = _num(r["delta_pct"])
            if math.isfinite(d):
                noise[(str(r["test"]), int(r["depth"]))] = abs(d)
    pts = []
    for _, r in res.iterrows():
        key = (str(r["test"]), int(r["depth"]))
        a, b = _num(r["median_a"]), _num(r["median_b"])
        lo, hi = _num(r["ci_low"]), _num(r["ci_high"])
        verdict = str(r["verdict"])
        nz = noise.get(key)
        if nz is not None and verdict in ("faster", "slower") and lo <= nz and hi >= -nz:
            verdict = "within noise"
        pts.append({
            "phase": str(r["phase"]), "depth": key[1], "test": key[0], "base_ts": a, "tuned_ts": b,
            "speedup": b / a if a > 0 else math.nan,
            "ci_low": 1 + lo / 100, "ci_high": 1 + hi / 100,
            "aa_noise_pct": nz, "verdict": verdict, "upstream_kernel": None, "kernel": None,
        })
    return pts


# ---------------------------------------------------------------------------------------------
# Optuna's ecosystem
# ---------------------------------------------------------------------------------------------


def dashboard_command(storage_url: str) -> str:
    """The shell command that opens a study's storage in optuna-dashboard.

    ``optuna-dashboard <storage>``, shell-quoted. A relative SQLite path is made absolute so the
    command works from any directory. A password in the URL is left out of the printed command
    (it would land in logs); PostgreSQL then takes it from ``PGPASSWORD`` or ``~/.pgpass``.
    """
    import shlex
    from urllib.parse import urlsplit, urlunsplit

    url = str(storage_url)
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if path and path != ":memory:" and not path.startswith("/"):
            url = "sqlite:///" + str(Path(path).resolve())
    else:
        parts = urlsplit(url)
        if parts.password is not None:
            host = parts.hostname or ""
            if parts.port:
                host += f":{parts.port}"
            user = parts.username or ""
            url = urlunsplit(parts._replace(netloc=f"{user}@{host}" if user else host))
    return f"optuna-dashboard {shlex.quote(url)}"


def importances_section(study: Any, params: Sequence[str] | None = None, *, min_trials: int = 4,
                        objective: int | None = None, target_name: str = "") -> str:
    """Optuna's parameter importances as a Markdown table, or one line saying why not.

    Uses ``optuna.importance.get_param_importances`` with Optuna's default evaluator (PED-ANOVA;
    fANOVA would need scikit-learn), importances normalized to sum to 1, most important first.

    Needs at least ``min_trials`` COMPLETE trials and a parameter (of ``params``, default all)
    that took at least 2 distinct values among them. A multi-objective study needs ``objective`` (the
    index of one of its values) and names it ``target_name``.
    """
    import optuna
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(study.directions) != 1 and objective is None:
        return "Parameter importances: not computed (multi-objective study)."
    target = None
    if objective is not None:
        # PED-ANOVA ranks by "lower is better" whenever a target is given, whatever the study's
        # direction; our objectives are speedups (maximized), so the value is negated for it.
        sign = -1.0 if study.directions[objective] == optuna.study.StudyDirection.MAXIMIZE else 1.0
        target = lambda t: sign * t.values[objective]  # noqa: E731
    if len(done) < min_trials:
        return (f"Parameter importances: not computed ({len(done)} complete trial"
                f"{'' if len(done) == 1 else 's'}; need at least {min_trials}).")
    names = list(params) if params is not None else sorted({k for t in done for k in t.params})
    varied = [n for n in names if len({repr(t.params[n]) for t in done if n in t.params}) >= 2]
    if not varied:
        return (f"Parameter importances: not computed (no parameter took 2 or more values over the "
                f"{len(done)} complete trials).")
    # Optuna's default evaluator (PED-ANOVA since Optuna 4; fANOVA would need scikit-learn).
    ev_cls = getattr(optuna.importance, "PedAnovaImportanceEvaluator", None)
    evaluator = ev_cls() if ev_cls is not None else None
    ev_name = "PED-ANOVA" if ev_cls is not None else "default evaluator"
    import warnings

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            imp = optuna.importance.get_param_importances(study, evaluator=evaluator, params=varied, target=target)
    except (ValueError, RuntimeError) as e:  # e.g. no parameter common to the complete trials
        return f"Parameter importances: not computed ({str(e).splitlines()[0]})."
    if not imp:
        return "Parameter importances: not computed (no parameter shared by the complete trials)."
    rows = [[name, f"{val:.3f}", "█" * max(0, round(val * 20))] for name, val in imp.items()]
    notes = sorted({str(w.message).splitlines()[0] for w in caught
                    if not issubclass(w.category, optuna.exceptions.ExperimentalWarning)
                    and "achieve low `target` values" not in str(w.message)})  # handled by the sign above
    return "\n".join([
        f"Parameter importances{' for ' + target_name if target_name else ''} (Optuna {ev_name} over {len(done)} "
        "complete trials; normalized to sum to 1; how much each parameter matters for reaching the best trials):",
        "",
        log.table(["parameter", "importance", ""], rows),
    ] + ([""] + [f"Optuna warned: {n}" for n in notes] if notes else []))

"""Markdown reports and depth plots from bench frames.

Tables follow the shape of lhl's rocWMMA write-up (seed 003) and llama.cpp's
``compare-llama-bench.py``: one table per phase, one line per ``test @ depth``, one t/s column
per variant and a Δ% column per non-baseline variant, so they paste into a pull request. Each
t/s cell is ``median ± CI`` with the sample count; each Δ% carries a significance mark from
:func:`tuner.measure.stats.compare` (✓ faster, ✗ slower, ~ no difference at the chosen confidence).
Roofline percentages are model estimates (tuner.targets.roofline) and are labelled as such.
"""

from __future__ import annotations

__all__ = ["MARKS", "plot_depth", "render_report"]

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner import log
from tuner.errors import UsageError
from tuner.measure.stats import compare

if TYPE_CHECKING:
    import pandas as pd

MARKS = {"faster": "✓", "slower": "✗", "no difference": "~"}

_PHASES = (("pp", "Prefill (pp)"), ("tg", "Decode (tg)"))


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


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
    base_df = frames[baseline]
    out = [f"# {title}", ""]
    meta = base_df.iloc[0] if len(base_df) else None
    if meta is not None:
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
        out += [", ".join(bits) + ".", ""]
        commits = {k: sorted({str(c) for c in frames[k]["build_commit"].dropna()}) for k in labels}
        out += ["Variants: " + "; ".join(f"**{k}**" + (f" (llama.cpp {', '.join(c)})" if c else "")
                                          for k, c in commits.items()) + f". Baseline: **{baseline}**.", ""]
    has_roof = any(
        "roofline_pct" in frames[k] and frames[k]["roofline_pct"].map(_num).map(math.isfinite).any()
        for k in labels
    )
    for phase, heading in _PHASES:
        keys = sorted({key for k in labels for key, r in idx[k].items() if r["phase"] == phase},
                      key=lambda t: (t[0], t[1]))
        if not keys:
            continue
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
        out += [f"## {heading}", "", log.table(headers, rows), ""]
    level = f"{confidence * 100:g}%"
    notes = [
        f"t/s: median ± half-width of the {level} bootstrap CI of the median; n = kept repetitions "
        "(the first repetition of every llama-bench call is discarded as warm-up).",
        f"Δ%: median vs {baseline}; ✓ faster / ✗ slower / ~ no difference at {level} "
        "(bootstrap CI of the ratio of medians excludes 0 and Mann-Whitney U p < "
        f"{1 - confidence:.2g}).",
    ]
    if has_roof:
        notes.append("roofline %: measured / model estimate (tg: bandwidth / bytes per token; "
                     "pp: compute peak). A model estimate, not a measurement.")
    else:
        notes.append("roofline %: not available (run `tuner bench` with --arch or --bandwidth).")
    drifted = [k for k in labels if "drift_corrected" in frames[k] and frames[k]["drift_corrected"].eq(True).any()]
    if drifted:
        notes.append("Drift-corrected by the interleaved baseline anchor: " + ", ".join(drifted) + ".")
    out += ["Notes:", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(out)


def plot_depth(frames: Mapping[str, pd.DataFrame], png_path: Path) -> Path:
    """Plot tokens/s against depth, one line per variant, pp and tg panels side by side.

    Error bars are the bootstrap CI of the median. Uses matplotlib's Agg backend (no display).

    Returns:
        ``png_path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not frames:
        raise UsageError("No bench results to plot.")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (phase, heading) in zip(axes, _PHASES):
        any_line = False
        for label, df in frames.items():
            sub = df[(df["phase"] == phase)].copy()
            sub = sub[sub["median_ts"].map(_num).map(math.isfinite)]
            if sub.empty:
                continue
            for test, grp in sub.groupby("test"):
                grp = grp.sort_values("depth")
                med = grp["median_ts"].astype(float)
                lo = (med - grp["ci_low"].astype(float)).clip(lower=0)
                hi = (grp["ci_high"].astype(float) - med).clip(lower=0)
                name = label if sub["test"].nunique() == 1 else f"{label} {test}"
                ax.errorbar(grp["depth"], med, yerr=[lo, hi], marker="o", capsize=3, label=name)
                any_line = True
        ax.set_title(heading)
        ax.set_xlabel("context depth (tokens)")
        ax.set_ylabel("tokens/s (median, 95% CI)")
        ax.grid(True, alpha=0.3)
        if any_line:
            ax.legend(fontsize=8)
    fig.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path

"""Plots of bench results: tokens/s against depth per variant (:func:`plot_depth`) and the speedup of
one side over the other per depth with its CI, the A/A noise and the kernel chosen per depth interval
(:func:`plot_speedup`), and decode t/s against CPU% with the Pareto front (:func:`plot_pareto`).
matplotlib's Agg backend; nothing is shown."""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypedDict

from tuner.errors import UsageError
from tuner.paths import write_into
from tuner.plan.fa_rules import FaRule
from tuner.result.tables import Points, as_float

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_PHASES = (("pp", "Prefill (pp)"), ("tg", "Decode (tg)"))


def pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib  # heavy: imported when a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(plt: ModuleType, fig: Figure, png_path: str | Path) -> Path:
    """``fig`` written to ``png_path`` (its folder made) at the plots' resolution, then closed."""
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=110, format="png")
    finally:
        plt.close(fig)
    # renamed over the name: a link already at png_path is replaced, never written through
    return write_into(png_path.parent, png_path.name, buf.getvalue())


def _phase_of(p: Mapping[str, object]) -> str:
    return str(p.get("phase") or str(p.get("test", ""))[:2])


def plot_depth(frames: Mapping[str, pd.DataFrame], png_path: Path) -> Path:
    """Tokens/s against depth, one line per variant (error bars: the median's bootstrap CI), pp and tg side by side."""
    plt = pyplot()
    if not frames:
        raise UsageError("No bench results to plot.")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (phase, heading) in zip(axes, _PHASES):
        any_line = False
        for label, df in frames.items():
            sub = df[(df["phase"] == phase)].copy()
            sub = sub[sub["median_ts"].map(as_float).map(math.isfinite)]
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
    return save_png(plt, fig, png_path)


_PHASE_TITLES = {"pp": "Prefill", "tg": "Decode"}
_PHASE_COLORS = {"pp": "tab:blue", "tg": "tab:orange"}
_KERNEL_COLORS = ("#d9c2f0", "#c6e5c0", "#f7d9b5", "#bfd9f2", "#f2c4c4", "#e8e8b0")


def _depth_label(d: int) -> str:
    if d == 0:
        return "0"
    return f"{d // 1024}k" if d % 1024 == 0 else str(d)


class _SpanRule(TypedDict, total=False):
    rule: str
    """The exported rule the span is (absent for a run of measured points)."""


class Span(_SpanRule):
    """A depth interval :func:`plot_speedup` shades: ``x1`` None runs to the right edge."""

    x0: float
    x1: float | None
    kernel: str
    upstream: str


def speedup_spans(points: Sequence[Mapping[str, Any]], rules: Sequence[FaRule] = ()) -> dict[str, list[Span]]:
    """Per phase, the spans to shade, with the ``upstream`` kernel(s) inside. With ``rules``: one per rule, ``lo``
    to ``hi`` (where the export switches kernel); without (two builds compared): each run of points whose
    ``kernel`` differs from ``upstream_kernel``, bounded halfway to the neighbouring depths."""
    out: dict[str, list[Span]] = {}
    if rules:
        for r in rules:
            ph = r.phase.bench
            inside = [p for p in points if _phase_of(p) == ph and r.covers(int(p["depth"]))]
            ups = sorted({str(p["upstream_kernel"]) for p in inside if p.get("upstream_kernel")})
            out.setdefault(ph, []).append(
                {
                    "x0": int(r.lo),
                    "x1": None if r.hi is None else int(r.hi),
                    "kernel": r.kernel,
                    "upstream": "/".join(ups),
                    "rule": r.text,
                }
            )
        return out
    for ph in {_phase_of(p) for p in points}:
        sub = sorted((p for p in points if _phase_of(p) == ph), key=lambda p: int(p["depth"]))
        ds = [int(p["depth"]) for p in sub]
        chosen = [p.get("kernel") if p.get("kernel") != p.get("upstream_kernel") else None for p in sub]
        for k, run in itertools.groupby(range(len(sub)), key=chosen.__getitem__):
            if not k:
                continue
            i, *rest = run
            j = rest[-1] if rest else i
            x0 = (ds[i - 1] + ds[i]) / 2 if i > 0 else ds[i]
            x1 = (ds[j] + ds[j + 1]) / 2 if j + 1 < len(ds) else None
            out.setdefault(ph, []).append(
                {"x0": x0, "x1": x1, "kernel": str(k), "upstream": str(sub[i].get("upstream_kernel") or "")}
            )
    return out


_SPAN_LABEL: dict[str, Any] = {"ha": "left", "va": "top", "fontsize": 9, "fontweight": "bold", "color": "#333333"}


def _draw_spans(ax: Axes, ax2: Axes, spans: Sequence[Span], right: float, kcolor: Mapping[str, str]) -> bool:
    """Shade and label each span (:func:`speedup_spans`) on both panels of a phase; True if any."""
    for sp in spans:
        x0, x1 = float(sp["x0"]), right if sp["x1"] is None else min(float(sp["x1"]), right)
        for a in (ax, ax2):
            a.axvspan(x0, x1, color=kcolor[str(sp["kernel"])], alpha=0.55, lw=0, zorder=0)
        label = f"{sp['kernel']} from d{_depth_label(int(sp['x0']))}" if sp.get("rule") else str(sp["kernel"])
        label = " " + label + (f"\n (upstream {sp['upstream']})" if sp.get("upstream") else "")
        ax.text(x0, 0.97, label, transform=ax.get_xaxis_transform(), **_SPAN_LABEL)
    return bool(spans)


class DepthAxis(TypedDict):
    linthresh: float
    left: float
    right: float
    ticks: list[int]


def depth_axis(depths: Sequence[int]) -> DepthAxis:
    """The numeric depth axis of :func:`plot_speedup`: symlog (linear below the smallest non-zero depth, so
    depth 0 fits; logarithmic above, so 1k..64k do not crowd), its limits and ticks."""
    pos = [d for d in depths if d > 0]
    lin = float(min(pos)) if pos else 1.0
    top = float(max(depths)) if depths else 1.0
    return {
        "linthresh": lin,
        "left": -0.15 * lin if 0 in depths else lin * 0.8,
        "right": max(top * 1.3, lin * 1.5),
        "ticks": list(depths),
    }


def _speedup_ylim(
    sp: Sequence[float], lo: Sequence[float], hi: Sequence[float], nz: Sequence[float]
) -> tuple[float, float]:
    """y range of a speedup panel: the speedups and the noise band decide; a CI far beyond them is
    clipped (its end is written at the edge), so one wide interval does not flatten the others."""
    core = [v for v in list(sp) + list(nz) + [-n for n in nz] if math.isfinite(v)] or [0.0]
    pad = max(max(core) - min(core), 4.0)
    cap_lo, cap_hi = min(core) - pad, max(core) + pad
    fin_lo = [v for v in lo if math.isfinite(v)]
    fin_hi = [v for v in hi if math.isfinite(v)]
    y0 = max(min(fin_lo + [min(core)]), cap_lo)
    y1 = min(max(fin_hi + [max(core)]), cap_hi)
    margin = 0.08 * (y1 - y0)
    return y0 - margin, y1 + margin


def _speedup_panel(
    ax: Axes, sub: Points, x: Sequence[int], *, phase: str, color: str, has_span: bool, name_a: str, name_b: str
) -> None:
    """Top panel of a phase: speedup % with its CI band, the A/A noise band and significance markers."""
    sp = [100 * (as_float(p.get("speedup")) - 1) for p in sub]
    lo = [100 * (as_float(p.get("ci_low")) - 1) for p in sub]
    hi = [100 * (as_float(p.get("ci_high")) - 1) for p in sub]
    tests = sorted({str(p["test"]) for p in sub})
    ups = sorted({str(p["upstream_kernel"]) for p in sub if p.get("upstream_kernel")})
    noise = [as_float(p.get("aa_noise_pct")) for p in sub]
    nz = [n if math.isfinite(n) else 0.0 for n in noise]
    if any(math.isfinite(n) for n in noise):
        ax.fill_between(x, [-n for n in nz], nz, color="0.45", alpha=0.3, lw=0, zorder=1)
    ax.axhline(0, color="black", lw=0.9, zorder=2)
    y0, y1 = _speedup_ylim(sp, lo, hi, nz)
    ok = [all(math.isfinite(v) for v in t) for t in zip(lo, hi)]
    if any(ok):
        xs = [xx for xx, o in zip(x, ok) if o]
        lows, highs = [max(v, y0) for v, o in zip(lo, ok) if o], [min(v, y1) for v, o in zip(hi, ok) if o]
        ax.fill_between(xs, lows, highs, color=color, alpha=0.22, lw=0, zorder=2)
    for xx, a, b in zip(x, lo, hi):  # a CI end beyond the y range is written at the edge
        for end, y, up in ((b, y1, True), (a, y0, False)):
            if math.isfinite(end) and (end > y if up else end < y):
                text, dy = (f"CI to {end:+.0f}% ↑", -11) if up else (f"CI to {end:+.0f}% ↓", 4)
                ax.annotate(
                    text, (xx, y), textcoords="offset points", xytext=(4, dy), fontsize=7.5, color=color, ha="left"
                )
    ax.plot(x, sp, color=color, lw=1.8, zorder=3)
    sig = [str(p.get("verdict", "")) in ("faster", "slower") for p in sub]
    ax.scatter([xx for xx, s in zip(x, sig) if s], [v for v, s in zip(sp, sig) if s], color=color, s=42, zorder=4)
    hollow_x, hollow_y = [xx for xx, s in zip(x, sig) if not s], [v for v, s in zip(sp, sig) if not s]
    ax.scatter(hollow_x, hollow_y, facecolor="white", edgecolor=color, s=42, lw=1.6, zorder=4)
    box = {"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.7}
    for xx, v in zip(x, sp):
        if math.isfinite(v):
            kw: dict[str, Any] = {"fontsize": 8, "color": color, "ha": "center", "fontweight": "bold", "bbox": box}
            ax.annotate(f"{v:+.1f}%", (xx, v), textcoords="offset points", xytext=(0, 8), **kw)
    head = f"{_PHASE_TITLES.get(phase, phase)} ({', '.join(tests)})"
    if ups:
        head += f" — upstream kernel {'/'.join(ups)}"
    ax.set_title(head, fontsize=10.5)
    ax.set_ylabel(f"speedup of {name_b} vs {name_a} (%)")
    ax.grid(True, axis="y", alpha=0.3)
    if has_span:  # room for the kernel labels above the data
        y1 += 0.2 * (y1 - y0)
    ax.set_ylim(y0, y1)


def _ts_panel(
    ax2: Axes, sub: Points, x: Sequence[int], axis: DepthAxis, *, color: str, name_a: str, name_b: str
) -> None:
    """Bottom panel of a phase: absolute t/s of both sides against the depth categories."""
    ya = [as_float(p.get("base_ts")) for p in sub]
    yb = [as_float(p.get("tuned_ts")) for p in sub]
    ax2.plot(x, ya, marker="s", color="0.35", lw=1.4, label=name_a)
    ax2.plot(x, yb, marker="o", color=color, lw=1.6, label=name_b)
    ax2.set_ylabel("tokens/s")
    ax2.set_xlabel("context depth (tokens)")
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8)
    ax2.set_ylim(bottom=0)
    ax2.set_xscale("symlog", linthresh=axis["linthresh"], linscale=0.6)
    ax2.set_xticks(axis["ticks"], [_depth_label(d) for d in axis["ticks"]])
    ax2.minorticks_off()
    ax2.set_xlim(axis["left"], axis["right"])


def _speedup_legend(
    fig: Figure, pts: Points, kernels: Sequence[str], kcolor: Mapping[str, str], *, title: str, ncol: int
) -> None:
    """The figure legend (noise band only when measured, one patch per chosen kernel), title and layout."""
    from matplotlib.lines import Line2D  # matplotlib is heavy: imported when a plot is drawn (pyplot())
    from matplotlib.patches import Patch

    handles = [
        Patch(color="0.45", alpha=0.3, label="A/A noise (±, run-to-run)"),
        Patch(color="0.6", alpha=0.35, label="95% CI of the speedup"),
        Line2D([], [], color="0.3", marker="o", ls="", label="faster/slower (significant)"),
        Line2D([], [], color="0.3", marker="o", mfc="white", ls="", label="no clear difference"),
    ]
    if not any(math.isfinite(as_float(p.get("aa_noise_pct"))) for p in pts):
        handles = handles[1:]
    handles += [Patch(color=kcolor[k], alpha=0.55, label=f"depths where {k} is chosen") for k in kernels]
    top = 0.925 if title else 0.95
    cols, anchor = min(len(handles), 3 if ncol == 1 else 6), (0.5, top + 0.02)
    fig.legend(handles=handles, loc="upper center", ncol=cols, fontsize=8.5, frameon=False, bbox_to_anchor=anchor)
    if title:
        fig.suptitle(title, fontsize=11.5, y=0.985)
    fig.tight_layout(rect=(0, 0, 1, top - (0.04 if ncol == 1 and len(handles) > 3 else 0.0)))


def plot_speedup(
    points: Sequence[Mapping[str, Any]],
    png_path: Path,
    *,
    title: str = "",
    name_a: str = "upstream",
    name_b: str = "tuned",
    rules: Sequence[FaRule] = (),
) -> Path:
    """Plot the speedup (%) vs context depth per phase (one column each), with the absolute t/s of both sides
    below; returns ``png_path``. Top row: the speedup with its 95% CI band, the A/A noise (``aa_noise_pct``) as a
    grey band around 0, a labelled span per kernel switch (:func:`speedup_spans`), filled markers where the
    verdict is faster/slower. The depth axis is symlog (:func:`depth_axis`), so a span starts at its threshold."""
    plt = pyplot()
    pts = [p for p in points if math.isfinite(as_float(p.get("depth")))]
    if not pts:
        raise UsageError("No points to plot.")
    phases = [ph for ph in ("pp", "tg") if any(_phase_of(p) == ph for p in pts)]
    phases += sorted({_phase_of(p) for p in pts} - set(phases))
    depths = sorted({int(p["depth"]) for p in pts})
    axis = depth_axis(depths)
    spans = speedup_spans(pts, rules)
    kernels = sorted({str(sp["kernel"]) for v in spans.values() for sp in v})
    kcolor = {k: _KERNEL_COLORS[i % len(_KERNEL_COLORS)] for i, k in enumerate(kernels)}

    ncol = len(phases)
    fig, axes = plt.subplots(
        2, ncol, figsize=(6.2 * ncol, 7.4), squeeze=False, gridspec_kw={"height_ratios": [3, 2]}, sharex=True
    )
    for c, phase in enumerate(phases):
        ax, ax2 = axes[0][c], axes[1][c]
        sub = sorted((p for p in pts if _phase_of(p) == phase), key=lambda p: int(p["depth"]))
        color = _PHASE_COLORS.get(phase, "tab:green")
        x = [int(p["depth"]) for p in sub]
        has_span = _draw_spans(ax, ax2, spans.get(phase, []), axis["right"], kcolor)
        _speedup_panel(ax, sub, x, phase=phase, color=color, has_span=has_span, name_a=name_a, name_b=name_b)
        _ts_panel(ax2, sub, x, axis, color=color, name_a=name_a, name_b=name_b)
    _speedup_legend(fig, pts, kernels, kcolor, title=title, ncol=ncol)
    return save_png(plt, fig, png_path)


class ParetoPoint(TypedDict):
    """One marker of :func:`plot_pareto`: a config's decode t/s and CPU% (percent of one core) at a depth."""

    config: str
    depth: int
    ts: float
    cpu: float
    stage: str
    """``screen`` (hollow marker) or ``confirm`` (filled)."""


def pareto_front(points: Sequence[ParetoPoint]) -> list[ParetoPoint]:
    """The points no other point beats on both axes (more t/s for no more CPU%, or less CPU% for no
    less t/s), by ascending CPU%."""
    front: list[ParetoPoint] = []
    for p in sorted(points, key=lambda p: (float(p["cpu"]), -float(p["ts"]))):
        if not front or float(p["ts"]) > float(front[-1]["ts"]):
            front.append(p)
    return front


def plot_pareto(points: Sequence[ParetoPoint], png_path: Path, *, title: str = "") -> Path:
    """Decode t/s against CPU% (the goal: more t/s for less CPU; docs/design.md), one marker per (config, depth),
    labelled with its config (grey where dominated); returns ``png_path``. One colour and Pareto front per
    depth, since depth moves t/s far more than any config."""
    plt = pyplot()
    pts = [p for p in points if math.isfinite(as_float(p.get("ts"))) and math.isfinite(as_float(p.get("cpu")))]
    if not pts:
        raise UsageError("No decode points with both t/s and CPU% to plot.")
    depths = sorted({int(p["depth"]) for p in pts})
    cmap = plt.get_cmap("viridis")
    fig, ax = plt.subplots(figsize=(8.0, 5.6))
    for i, d in enumerate(depths):
        color = cmap(i / max(1, len(depths) - 1) * 0.9)
        sub = [p for p in pts if int(p["depth"]) == d]
        front = pareto_front(sub)
        xs, ys = [float(p["cpu"]) for p in front], [float(p["ts"]) for p in front]
        ax.plot(xs, ys, "--", color=color, lw=1.3, label=f"d{_depth_label(d)} front", zorder=2)
        for p in sub:
            xy, filled = (float(p["cpu"]), float(p["ts"])), p.get("stage", "confirm") == "confirm"
            ax.scatter(*xy, s=46, color=color if filled else "none", edgecolors=color, zorder=3)
            # Dominated points are labelled too, in grey: they are the configs the CPU cost rules out.
            label_color = color if p in front else "dimgrey"
            ax.annotate(
                str(p["config"]), xy, textcoords="offset points", xytext=(5, 4), fontsize=7.5, color=label_color
            )
    ax.set_xlabel("CPU% of the llama-bench process tree (timed decode repetitions; 100 = one core)")
    ax.set_ylabel("decode tokens/s (median over rounds)")
    ax.grid(True, alpha=0.3)
    ax.scatter([], [], s=46, color="none", edgecolors="grey", label="screen (median of rounds)")
    ax.scatter([], [], s=46, color="grey", label="confirm")
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title or "Decode: t/s vs CPU% (up and to the left is better)", fontsize=11)
    fig.tight_layout()
    return save_png(plt, fig, png_path)

"""The plots of an exported sweep table (``tuner sweep export``), from the stored samples (matplotlib Agg)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from tuner.result.plots import pyplot, save_png
from tuner.rounds.engine import DEFAULT
from tuner.rounds.store import Sample
from tuner.sweep.grid import Cell
from tuner.sweep.live import FaKey
from tuner.sweep.mmq import MmqChoice, MmqKey
from tuner.sweep.table import TableRule

K = TypeVar("K", bound=Hashable)


def _medians(samples: Iterable[Sample[K]]) -> dict[tuple[K, str], float]:
    """(key, config) -> the median of its good samples' times."""
    by: dict[tuple[K, str], list[float]] = defaultdict(list)
    for s in samples:
        if s.ok and s.us:
            by[(s.key, s.config)].append(s.us)
    return {k: statistics.median(v) for k, v in by.items()}


def plot_fa(
    cells: Sequence[Cell], samples: Sequence[Sample[FaKey]], rules: Sequence[TableRule], out_dir: Path
) -> list[Path]:
    """One ``fa-D<head size>.png`` per head size at ``Q->ne[1] = 1``, one ``...-ne1-<N>.png`` per batch N > 1."""
    plt = pyplot()
    from matplotlib.colors import TwoSlopeNorm  # lazy, as pyplot(): matplotlib loads only to draw

    med = _medians(samples)
    sp: dict[FaKey, tuple[str, float]] = {}  # per cell: the table's kernel, its speedup over upstream's (or NaN)
    for c in cells:
        s = c.shape
        rule = next(
            (r for r in rules if (r.D, r.gqa, r.kv, r.ne1) == (s.D, s.gqa, s.kv, s.ne1) and r.covers(c.n_kv)), None
        )
        kernel = rule.kernel if rule else c.upstream
        base = med.get(((s, c.n_kv), DEFAULT), math.nan)
        tuned = base if rule is None or kernel == c.upstream else med.get(((s, c.n_kv), kernel), math.nan)
        sp[(s, c.n_kv)] = (kernel, base / tuned if tuned else math.nan)
    out = []
    for D, ne1 in sorted({(c.shape.D, c.shape.ne1) for c in cells}, key=lambda k: (k[1] != 1, k)):
        kvs = sorted({c.shape.kv for c in cells if (c.shape.D, c.shape.ne1) == (D, ne1)})
        fig, axes = plt.subplots(len(kvs), 1, figsize=(12, 1.2 + 1.6 * len(kvs) * 1.4), squeeze=False)
        for ax, kv in zip(axes[:, 0], kvs):
            mine = [c for c in cells if (c.shape.D, c.shape.kv, c.shape.ne1) == (D, kv, ne1)]
            gqas, nkvs = sorted({c.shape.gqa for c in mine}), sorted({c.n_kv for c in mine})
            grid = [[math.nan] * len(nkvs) for _ in gqas]
            for c in mine:
                kernel, x = sp[(c.shape, c.n_kv)]
                i, j = gqas.index(c.shape.gqa), nkvs.index(c.n_kv)
                grid[i][j] = x
                label = kernel + ("" if math.isnan(x) else f"\n{x:.2f}x")
                ax.text(j, i, label, ha="center", va="center", fontsize=7, color="black")
            ax.imshow(grid, cmap="RdBu", norm=TwoSlopeNorm(vcenter=1.0, vmin=0.5, vmax=1.5), aspect="auto")
            ax.set_xticks(range(len(nkvs)), [str(n) for n in nkvs], rotation=60, fontsize=7)
            ax.set_yticks(range(len(gqas)), [str(g) for g in gqas])
            ax.set_ylabel("GQA ratio")
            ax.set_title(
                f"head size {D}, K/V {kv}, Q->ne[1] = {ne1}: chosen kernel and speedup vs upstream", fontsize=9
            )
        axes[-1, 0].set_xlabel("n_kv")
        fig.tight_layout()
        out.append(save_png(plt, fig, out_dir / (f"fa-D{D}.png" if ne1 == 1 else f"fa-D{D}-ne1-{ne1}.png")))
    return out


def plot_mmq(samples: Sequence[Sample[MmqKey]], choices: Mapping[str, Sequence[MmqChoice]], path: Path) -> Path | None:
    """``mmq.png``: cuBLAS over MMQ per type and batch size, composed choices marked; None without data."""
    med = _medians(samples)
    logs: dict[tuple[str, int], list[float]] = defaultdict(list)
    for (key, cfg), base in med.items():
        t, _, _, n = key
        blas = med.get((key, "BLAS"))
        if cfg == DEFAULT and blas:
            logs[(t, n)].append(math.log(base / blas))
    # (type, batch size) -> cuBLAS's speedup over MMQ: geometric mean over sizes of median ratios
    sp = {k: math.exp(statistics.fmean(v)) for k, v in logs.items()}
    if not sp:
        return None
    plt = pyplot()
    from matplotlib.colors import TwoSlopeNorm  # lazy, as pyplot(): matplotlib loads only to draw

    types, batches = sorted({t for t, _ in sp}), sorted({n for _, n in sp})
    grid = [[sp.get((t, n), math.nan) for n in batches] for t in types]
    fig, ax = plt.subplots(figsize=(1.2 + 0.8 * len(batches), 1.0 + 0.6 * len(types)))
    ax.imshow(grid, cmap="RdBu", norm=TwoSlopeNorm(vcenter=1.0, vmin=0.25, vmax=4.0), aspect="auto")
    for i, t in enumerate(types):
        for j, n in enumerate(batches):
            x = grid[i][j]
            chosen = any(c.covers(n) and c.backend == "BLAS" for c in choices.get(t, ()))
            if not math.isnan(x):
                ax.text(j, i, f"{x:.2f}x" + ("\nBLAS" if chosen else ""), ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(batches)), [str(n) for n in batches])
    ax.set_yticks(range(len(types)), types)
    ax.set_xlabel("batch size (ne11)")
    ax.set_title("cuBLAS speedup over MMQ (geometric mean over weight sizes); BLAS: the composed choice", fontsize=9)
    fig.tight_layout()
    return save_png(plt, fig, path)

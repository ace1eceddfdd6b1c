"""Holm's family (compose.sequential_calls): only the cells that can differ from upstream are hypotheses.

A candidate that ran upstream's own kernel at a depth (a confirm's final config where no rule covers it)
is A/A there by construction: it is reported, never tested, and does not raise the other cells' Holm
thresholds. A candidate whose kernel is unknown stays in the family. The rounds are built so that each
cell's statistic is known: ``final = twin * exp(shift + noise)``, and a null cell is the twin exactly
(its mean difference is 0, p = 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest
from scipy.optimize import brentq

from tuner.measure.decide import PHASE_ALPHA
from tuner.rounds import compose as comp
from tuner.rounds.stats import AA_NAME, UPSTREAM, summarize_phase
from tuner.search.confirm import FINAL, point_rows

R = 6
DRIFT = (0.0, 0.04, -0.03, 0.02, -0.05, 0.01)
TWIN = (0.02, -0.03, 0.01, 0.035, -0.015, -0.02)
NOISE = (-0.025, 0.04, -0.01, 0.015, -0.045, 0.025)


def _records(cells: Mapping[int, tuple[float | None, float | None]], up_kernel: str | None = "VEC") -> list[dict]:
    """Confirm-shaped rounds (limits R..R: one look, the p-value unadjusted): per depth ``(final's kernel,
    shift)``, shift None for a null cell (the final config measures exactly what the twin does)."""
    out: list[dict[str, Any]] = []
    ds = [str(d) for d in cells]
    for i in range(R):
        vals: dict[str, dict[str, float]] = {UPSTREAM: {}, AA_NAME: {}, FINAL: {}}
        for d, (_, shift) in cells.items():
            up = 100.0 * math.exp(DRIFT[i])
            vals[UPSTREAM][str(d)] = up
            vals[AA_NAME][str(d)] = up * math.exp(TWIN[i])
            vals[FINAL][str(d)] = up * math.exp(TWIN[i] + (0.0 if shift is None else shift + NOISE[i]))
        kernels = {UPSTREAM: dict.fromkeys(ds, up_kernel), AA_NAME: dict.fromkeys(ds, up_kernel)}
        kernels[FINAL] = {str(d): k for d, (k, _) in cells.items()}
        out.append(
            {
                "phase": "tg",
                "depths": list(cells),
                "round": i,
                "order": [UPSTREAM, AA_NAME, FINAL],
                "limits": [R, R],
                "values": vals,
                "kernels": kernels,
                "why": {n: dict.fromkeys(ds, "default") for n in vals},
                "errors": {},
            }
        )
    return out


def _calls(cells: Mapping[int, tuple[str | None, float | None]], family: comp.Family = "changed", **kw: Any) -> dict:
    recs = _records(cells, **kw)
    return {
        d: c for (d, n), c in comp.sequential_calls(summarize_phase("tg", recs, list(cells)), family=family).items()
    }


def _shift_for(p_target: float) -> float:
    """The shift at which a lone changed cell's two-sided p-value is ``p_target`` (the variance does not depend
    on it: a shift moves a whole column, the two-way residuals stay)."""

    def gap(s: float) -> float:
        return (
            comp.sequential_calls(summarize_phase("tg", _records({0: ("MMA", s)}), [0]))[(0, FINAL)].p_adjusted
            - p_target
        )

    return float(brentq(gap, 1e-4, 0.5, xtol=1e-12))


def test_an_unchanged_cell_is_reported_but_not_tested() -> None:
    cells: dict[int, tuple[str | None, float | None]] = {0: ("VEC", 0.12), 32768: ("MMA", None)}
    before = _calls(cells, family="all")
    assert before[0].verdict == "faster" and before[0].p_adjusted < 1e-5  # an A/A cell claimed: a false claim
    now = _calls(cells)
    assert now[0].verdict == "no difference" and now[0].settled and now[0].p_adjusted == 1.0
    assert math.isclose(now[0].effect_pct, before[0].effect_pct) and now[0].effect_pct > 10.0  # its estimate, reported
    assert now[32768] == before[32768]
    # the confirm's rows: rules alone leave the point out of the family, tuned process knobs keep it in
    recs = _records(cells)
    rows = {r["depth"]: r["verdict"] for r in point_rows("tg", summarize_phase("tg", recs, [0, 32768]), recs)}
    knobs = point_rows("tg", summarize_phase("tg", recs, [0, 32768]), recs, family="all")
    assert rows[0] == "no difference" and {r["depth"]: r["verdict"] for r in knobs}[0] == "faster"
    bad: Any = "some"
    with pytest.raises(ValueError, match="family"):
        comp.sequential_calls(summarize_phase("tg", recs, [0]), family=bad)


@pytest.mark.parametrize("m", [2, 3, 8])
def test_a_cell_rejected_only_at_the_mth_step_passes_with_m_minus_1_hypotheses(m: int) -> None:
    """m cells: the changed one under test (its p between alpha/m and alpha/(m-1)), one unchanged null cell
    and m-2 changed null cells. With all m tested Holm's first step needs alpha/m: not claimed; with the
    unchanged cell out it needs alpha/(m-1): claimed."""
    p = PHASE_ALPHA * (1.0 / m + 1.0 / (m - 1)) / 2.0
    s = _shift_for(p)
    cells: dict[int, tuple[str | None, float | None]] = {0: ("MMA", s), 4096: ("VEC", None)}
    cells |= {8192 * k: ("MMA", None) for k in range(1, m - 1)}
    assert len(cells) == m
    before, now = _calls(cells, family="all"), _calls(cells)
    assert math.isclose(before[0].p_adjusted, p, rel_tol=1e-6) and math.isclose(now[0].p_adjusted, p, rel_tol=1e-6)
    assert before[0].verdict == "no difference" and now[0].verdict == "faster"
    assert now[4096].p_adjusted == 1.0 and all(before[d].verdict == "no difference" for d in cells if d)


@pytest.mark.parametrize(("up_kernel", "final_kernel"), [("VEC", None), (None, None), (None, "VEC")])
def test_a_cell_whose_kernel_is_unknown_stays_in_the_family(up_kernel: str | None, final_kernel: str | None) -> None:
    cells: dict[int, tuple[str | None, float | None]] = {0: (final_kernel, 0.08)}
    assert _calls(cells, up_kernel=up_kernel)[0].verdict == "faster"


def test_the_screen_family_is_unchanged() -> None:
    """A screen's forced kernels other than upstream's all ran another kernel: both families decide alike."""
    cells = {d: ("MMA", sh) for d, sh in ((0, 0.08), (4096, None), (16384, 0.03), (32768, -0.05))}
    assert _calls(cells) == _calls(cells, family="all")

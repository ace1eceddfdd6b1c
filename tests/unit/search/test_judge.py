"""compose.judge_phase: the verdicts the report shows are the ones compose and confirm act on.

The data are the decode screen rounds of the sm_89 search on the H100 (89-virtual,
llama-3.2-1b Q4_K_M; results/sm_89/llama-3.2-1b-q4_k_m-measured-on-h100/evidence/study.db.xz): at d32768 TILE's lower bound
(+3.6%) cleared that depth's own A/A noise (±3.6%) but not the phase's noise floor at its 10 rounds
(±4.1%), and the report's screen table said "faster" while nothing was composed. These tests pin the
earlier rule (``rule="aa-bar"``); the search's rule (tuner/measure/decide.py) claims that cell.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tuner.rounds import compose as comp
from tuner.rounds.stats import summarize_phase
from tuner.search.confirm import point_rows

ROUNDS = json.loads((Path(__file__).parents[2] / "data" / "screen" / "sm89-l1b-v4-tg-rounds.json").read_text())
DEPTHS = [0, 4096, 16384, 32768]


def test_a_cell_clearing_its_own_noise_but_not_the_floor_is_no_difference_everywhere() -> None:
    cells = summarize_phase("tg", ROUNDS, DEPTHS)
    c = cells[32768]
    tile = c.effects["TILE"]
    assert tile.ci_low > 1 + c.noise_pct / 100 and c.verdicts["TILE"] == "faster"  # the cell's own judgement
    floor = comp.noise_floor(cells, 32768)
    assert tile.ci_low < 1 + floor / 100 and floor > c.noise_pct

    judged = comp.judge_phase("tg", cells, rule="aa-bar")
    j = judged[32768]
    assert j.bar_pct == floor and j.verdicts["TILE"] == "no difference"
    assert all(math.isfinite(x.bar_pct) and x.bar_pct >= x.noise_pct for x in judged.values())
    assert j.as_dict()["effects"]["TILE"]["verdict"] == "no difference" and j.as_dict()["bar_pct"] == floor
    assert comp.judge_phase("tg", judged, rule="aa-bar")[32768].verdicts == j.verdicts  # judging twice changes nothing
    # the search's rule: +6.1% over 10 rounds, its per-round differences to the A/A twin, is a claim
    assert comp.judge_phase("tg", cells)[32768].verdicts["TILE"] == "faster"
    dec = {d.depth: d for d in comp.compose_phase("tg", cells)}
    assert dec[32768].winner == "TILE" and all(dec[d].winner is None for d in (0, 4096, 16384))


def test_confirm_rows_judge_by_the_same_bar() -> None:
    # The confirm's rows use the final config's name; rename TILE to it to read the same numbers as a confirm.
    from tuner.search.confirm import FINAL

    recs = [
        {
            **r,
            **{
                k: {(FINAL if n == "TILE" else n): v for n, v in r[k].items()}
                for k in ("values", "kernels", "why", "cpu", "core", "gpu")
                if isinstance(r.get(k), dict)
            },
            "order": [FINAL if n == "TILE" else n for n in r["order"]],
        }
        for r in ROUNDS
    ]
    cells = summarize_phase("tg", recs, DEPTHS)
    row = {r["depth"]: r for r in point_rows("tg", cells, recs)}[32768]
    judged = comp.judge_phase("tg", cells)[32768]
    assert row["verdict"] == judged.verdicts[FINAL] and row["aa_noise_pct"] == comp.noise_floor(cells, 32768)


def test_an_older_studys_screen_cells_are_shown_judged_by_their_decisions_bar() -> None:
    # a study screened before judge_phase stored the cell-local verdicts (the stored sm_89 study did)
    from tuner.measure.paired import CPU_REJECTED
    from tuner.result.pipeline_report import _judged_cell

    c = summarize_phase("tg", ROUNDS, DEPTHS)[32768].as_dict()
    c.pop("bar_pct"), c.pop("cpu_bar")
    c["effects"]["MMA"]["verdict"] = CPU_REJECTED
    assert c["effects"]["TILE"]["verdict"] == "faster"
    shown = _judged_cell(c, 4.08)
    assert shown["bar_pct"] == 4.08 and shown["effects"]["TILE"]["verdict"] == "no difference"
    assert shown["effects"]["MMA"]["verdict"] == CPU_REJECTED and shown["effects"]["VEC"]["verdict"] == "no difference"
    judged = comp.judge_phase("tg", summarize_phase("tg", ROUNDS, DEPTHS))[32768].as_dict()
    assert (
        _judged_cell(c, 3.0) is c and _judged_cell(judged, 9.9) is judged
    )  # a bar at or below the noise; a judged cell

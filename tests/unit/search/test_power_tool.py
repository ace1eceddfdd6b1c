"""tools/power.py on a tiny setting: the replay of recorded noise keeps the rule's promises.

Invariants: on pure A/A data (no injected effect) the share of searches the search's rule makes any
claim in stays within its family-wise bound (plus the binomial error of the replays); its power rises
with the injected effect; and the table is written between the markers of docs/decision-rule.md. The
confirm scenario likewise, and its family of the cells that can differ keeps a rule at least as often as
the family of every cell did.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

from tuner.measure.decide import ALPHA

ROOT = Path(__file__).resolve().parents[3]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("power_tool", ROOT / "tools" / "power.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["power_tool"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_replay_keeps_the_alpha_bound_and_power_rises_with_the_effect() -> None:
    power = _tool()
    reps = 60
    rows = power.run([0.0, 3.0, 8.0], reps, 1, rules=["sequential"])
    by = {r["effect_pct"]: r for r in rows}
    assert by[0.0]["any_claim_search"] <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / reps)
    assert by[0.0]["power_tg"] <= by[3.0]["power_tg"] < by[8.0]["power_tg"]
    assert all(3.0 <= r["rounds_tg"] <= 6.0 and 3.0 <= r["rounds_pp"] <= 6.0 for r in rows)


def test_the_table_goes_between_the_markers(tmp_path: Path) -> None:
    power = _tool()
    doc = tmp_path / "doc.md"
    doc.write_text("before\n<!-- power table -->\nold\n<!-- power table -->\nafter\n")
    assert power.main(["--effects", "0", "--reps", "2", "--markdown", str(doc)]) == 0
    text = doc.read_text()
    assert "old" not in text and text.startswith("before\n") and text.endswith("after\n")
    assert text.count("| sequential | +0% |") == 1 and text.count("| aa-bar | +0% |") == 1
    assert power.main(["--effects", "x"]) == 2 and power.main(["--reps", "0"]) == 2


def test_the_confirm_scenario_keeps_the_bound_and_the_smaller_family_keeps_more(tmp_path: Path) -> None:
    power = _tool()
    reps = 30
    rows = power.run_confirm([0.0, 6.0], reps, 1)
    by = {(r["family"], r["effect_pct"]): r for r in rows}
    bound = ALPHA / 2 + 3 * math.sqrt(ALPHA / 2 * (1 - ALPHA / 2) / reps)  # one phase: half the search's alpha
    assert by[("changed", 0.0)]["kept"] <= bound and by[("all", 0.0)]["any_faster"] <= bound
    assert by[("changed", 6.0)]["kept"] >= by[("all", 6.0)]["kept"] > by[("changed", 0.0)]["kept"]
    assert by[("changed", 6.0)]["cells"] == 3 and by[("all", 6.0)]["cells"] == 8
    assert all(2.0 <= r["rounds_in"] <= 6.0 and r["rounds_out"] == 3.0 for r in rows)  # futility may stop at 2
    doc = tmp_path / "doc.md"
    doc.write_text(
        "a\n<!-- power table -->\nkeep\n<!-- power table -->\n<!-- confirm power table -->\nold\n<!-- confirm power table -->\n"
    )
    assert power.main(["--scenario", "confirm", "--effects", "0", "--reps", "2", "--markdown", str(doc)]) == 0
    text = doc.read_text()
    assert "old" not in text and "keep" in text and text.count("| cells that can differ (3) | +0% |") == 1
    assert power.main(["--scenario", "confirm", "--rule-from", "70000"]) == 2

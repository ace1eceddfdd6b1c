"""report.md's line of the search's cost (config.toml's ``[cost]``, :attr:`tuner.study.record.SearchOutcome.cost`)."""

from __future__ import annotations

from tuner.study.record import SearchOutcome

COST_FIELDS: tuple[str, ...] = ("build_s", "model_s", "gate_s", "screen_s", "tune_s", "confirm_s", "gates_s", "total_s")
COST_FIELDS += ("llama_bench_calls", "tune_trials")  # the counts, after the seconds


def cost_line(outcome: SearchOutcome) -> str:
    """report.md's one line of the search's cost (config.toml's ``[cost]``), naming fields an older study lacks."""
    cost = outcome.cost
    have = ", ".join(f"{k} {v}" for k, v in cost.items()) or "none recorded"
    missing = [k for k in COST_FIELDS if k not in cost]
    # A study without a call count was recorded by an older tuner, which timed stages only in some of its
    # runs (a resumed run with a cached build adds seconds, the first run's real build may be missing).
    line = f"**Cost** (resumed runs summed): {have}."
    if missing:
        line += f" Not in this study (a stage it did not run, or a figure older tuner versions did not record): {', '.join(missing)}."
    if "llama_bench_calls" not in cost:
        line += " Recorded by an older tuner: its stage times cover only the runs it timed, so they can be far below"
        line += " what the search cost (a cached build counts its few seconds)."
    return line

"""The search's cost as it runs: llama-bench calls counted in the study (config.toml's ``[cost]``, written by
:func:`tuner.study.record.SearchOutcome.cost`), and the cost of a past search of the same arch for the plan."""

from __future__ import annotations

__all__ = ["counted", "full_build_seconds", "load_step_costs", "past_cost", "past_cost_line"]

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.search.observed import Observed
from tuner.study.state import StudyState


def counted(st: StudyState, factory: Any) -> Any:
    """``factory`` whose measures count each llama-bench call they make in the study (config.toml's
    ``[cost] llama_bench_calls``): one per ``measure`` or ``joint`` call, as the live measure runs one."""

    def make(build: Any) -> Observed:
        return Observed(factory(build), before=lambda: st.add_llama_bench_calls(1))

    return make


_SHAPE_KEYS = ("head_dim", "n_layers", "d_model", "n_heads", "n_kv_heads")
"""What makes two models cost alike in a search: attention and layer sizes (``[model.shape]``)."""


def _same_shape(doc: Mapping[str, Any], shape: Mapping[str, Any]) -> bool:
    have = (doc.get("model") or {}).get("shape") or {}
    keys = [k for k in _SHAPE_KEYS if shape.get(k) is not None and have.get(k) is not None]
    return bool(keys) and all(have.get(k) == shape[k] for k in keys)


def past_cost(
    arch: str, results: Path = Path("results"), *, trials: int | None = None, shape: Mapping[str, Any] | None = None
) -> tuple[Path, dict[str, Any], bool] | None:
    """The ``[cost]`` of a stored result of ``arch`` (``results/<arch>/*/config.toml``, from the current
    directory) and whether its model has ``shape``: one of that model shape if there is one; among those,
    with ``trials`` given, one that ran tune trials where the plan does and none where it does not, if
    there is such a result; then the one with the most recorded fields (then the first by path); None
    when none has one."""
    from tuner._compat import tomllib

    found = []
    for f in sorted((results / arch).glob("*/config.toml")):
        try:
            doc = tomllib.loads(f.read_text())
        except (OSError, ValueError):  # an unreadable stored result only loses the plan its figures
            continue
        cost = doc.get("cost")
        if isinstance(cost, Mapping) and cost:
            found.append((f, dict(cost), bool(shape) and _same_shape(doc, shape or {})))
    found = [fc for fc in found if fc[2]] or found  # a 1B's minutes do not price an 8B
    if trials is not None:  # a search without trials is not priced by one that spent minutes on them
        alike = [fc for fc in found if bool(fc[1].get("tune_trials")) == bool(trials)]
        found = alike or found
    return max(found, key=lambda fc: len(fc[1]), default=None)  # max keeps the first of equals


def past_cost_line(
    arch: str, results: Path = Path("results"), *, trials: int | None = None, shape: Mapping[str, Any] | None = None
) -> str | None:
    """The plan's line of what a past search of ``arch`` cost (None: no stored result has a ``[cost]``)."""
    past = past_cost(arch, results, trials=trials, shape=shape)
    if past is None:
        return None
    path, cost, same = past
    caveat = (
        "the same model shape; other depths or round counts change these figures"
        if same
        else "another model, depths or round count change these figures"
    )
    return f"A past {arch} search cost " + ", ".join(f"{k} {v}" for k, v in cost.items()) + f" (from {path}; {caveat})."


def load_step_costs() -> dict[str, Any]:
    """``tuner/data/step_costs.toml``: recorded per-step costs (machine, figures and their sources)."""
    from tuner._compat import tomllib
    from tuner.paths import package_data

    with open(package_data("step_costs.toml"), "rb") as f:
        return tomllib.load(f)


def full_build_seconds(costs: Mapping[str, Any] | None = None) -> float:
    """One full build's price (``[full_build]``): what the plan counts per build, and what a ``--time-budget``
    checks before starting one that is not cached."""
    return float((costs or load_step_costs())["full_build"]["seconds"])

"""The recorded per-step costs that the search's and the sweeps' time budgets price their work with."""

from __future__ import annotations

from typing import Any

from tuner._compat import tomllib
from tuner.paths import package_data


def load_step_costs() -> dict[str, Any]:
    """``tuner/data/step_costs.toml``: recorded per-step costs (machine, figures and their sources)."""
    with open(package_data("step_costs.toml"), "rb") as f:
        return tomllib.load(f)

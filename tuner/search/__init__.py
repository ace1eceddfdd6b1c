"""The ``search`` stage: the Optuna study over build, compile-time and runtime knobs (``study``), how a
study's measurements are recorded and read back (``record``), the choice of winners from them
(``select``, ``winner``), and the two offline modes ``--dry-run`` (``dryrun``) and ``--replay``
(``replay``). The public names are re-exported here: ``from tuner.search import run_search``.
"""

from __future__ import annotations

from tuner.plan.space import runtime_env_and_args
from tuner.search.record import parse_point_key, point_key
from tuner.search.study import PROFILES, SearchConfig, SearchOutcome, load_outcome, resolve_arch, run_search, run_worker

__all__ = [
    "SearchConfig",
    "SearchOutcome",
    "PROFILES",
    "resolve_arch",
    "run_search",
    "run_worker",
    "load_outcome",
    "runtime_env_and_args",
    "point_key",
    "parse_point_key",
]

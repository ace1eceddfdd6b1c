"""The ``search`` stage: the Optuna study over build, compile-time and runtime knobs (``study``), the
choice of winners from its measurements (``select``), and its two offline modes, ``--dry-run``
(``dryrun``) and ``--replay`` (``replay``). The public names are re-exported here:
``from tuner.search import run_search``.
"""

from __future__ import annotations

from tuner.search.study import (PROFILES, SearchConfig, SearchOutcome, load_outcome, parse_point_key, point_key,
                                resolve_arch, run_search, run_worker, runtime_env_and_args)

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

"""The ``search`` stage.

``tuner search`` runs :func:`~tuner.search.pipeline.run_pipeline`: screen -> compose -> tune -> confirm.

* ``screen`` measures upstream's kernel choice and every legal forced kernel per phase and depth in paired,
  interleaved rounds (runtime only, zero rebuilds);
* ``compose`` turns it into FlashAttention rules keyed by the model's shape, a kernel per depth interval, only
  where a kernel beats upstream by the decision rule (:mod:`tuner.measure.decide`);
* ``tune`` runs Optuna only over what really is a joint search (compile-time rows, process-wide knobs);
* ``confirm`` re-measures the final config against upstream at every depth plus depths the screen did not
  use; only what confirms is exported.

``study`` holds the configuration; studies of the earlier one-TPE search (the stored H100 results) are read
back by ``record`` and exported through ``select``/``winner``. The public names are re-exported here.
"""

from __future__ import annotations

from tuner.plan.space import runtime_env_and_args
from tuner.search.record import parse_point_key, point_key
from tuner.search.study import PROFILES, SearchConfig, resolve_arch
from tuner.study.record import SearchOutcome

__all__ = [
    "PROFILES",
    "SearchConfig",
    "parse_point_key",
    "point_key",
    "resolve_arch",
    "run_search",
    "run_worker",
    "runtime_env_and_args",
]


# The pipeline is imported on call: it pulls in Optuna and every stage, which `import tuner.search` should not.
def run_search(cfg: SearchConfig) -> SearchOutcome:
    """Run (or resume) ``tuner search``'s pipeline (screen -> compose -> tune -> confirm) for ``cfg``;
    returns its outcome, the confirmed result among it (see :func:`tuner.search.pipeline.run_pipeline`)."""
    from tuner.search.pipeline import run_pipeline

    return run_pipeline(cfg)


def run_worker(cfg: SearchConfig) -> int:
    """Add tune trials to a study that ``tuner search`` screened and composed; returns its trial count."""
    from tuner.search.pipeline import run_tune_worker

    return run_tune_worker(cfg)

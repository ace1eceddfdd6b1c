"""The ``search`` stage: :func:`~tuner.search.pipeline.run_pipeline` screens upstream's kernel choice against every
legal forced kernel per phase and depth (runtime only), composes FlashAttention rules where a kernel beats
upstream by the decision rule, tunes compile-time rows and process-wide knobs with Optuna, and confirms the final
config against upstream; only what confirms is exported.
"""

from __future__ import annotations

from tuner.plan.space import runtime_env_and_args
from tuner.search.study import SearchConfig
from tuner.study.record import SearchOutcome

__all__ = ["SearchConfig", "run_search", "run_worker", "runtime_env_and_args"]


# The pipeline is imported on call: it pulls in Optuna and every stage, which `import tuner.search` should not.
def run_search(cfg: SearchConfig) -> SearchOutcome:
    """Run (or resume) ``tuner search``'s pipeline for ``cfg``; returns its outcome."""
    from tuner.search.pipeline import run_pipeline

    return run_pipeline(cfg)


def run_worker(cfg: SearchConfig) -> int:
    """Add tune trials to a study that ``tuner search`` screened and composed; returns its trial count."""
    from tuner.search.pipeline import run_tune_worker

    return run_tune_worker(cfg)

"""A :class:`~tuner.search.context.SearchRun` for a stage test: what the test gives, stand-ins for the rest."""

from __future__ import annotations

import types
from typing import Any

from tuner.rounds.budget import Budget
from tuner.search.context import SearchRun
from tuner.study.record import StudyHeader
from tuner.study.state import StudyState


def search_run(cfg: Any, study: Any, **given: Any) -> SearchRun:
    """A run of ``cfg`` on ``study`` (an Optuna study, or anything with ``user_attrs``) for calling one stage;
    ``given`` replaces any other field (``space``, ``builds``, ``factory``, ``shape``, ``base_args``...).
    The shape stands in for a model of no known head size, layers or context (a 1B's width for prices)."""
    shape = types.SimpleNamespace(head_dim=None, gqa=None, n_layers=None, context_length=None, d_model=2048)
    fields: dict[str, Any] = {
        "cfg": cfg,
        "study": study,
        "storage": None,
        "st": StudyState(study),
        "header": StudyHeader(name=str(getattr(cfg, "study", "s"))),
        "space": None,
        "variants": tuple(getattr(cfg, "variants", None) or ("cpu",)),
        "fixed": {},
        "shape": shape,
        "base_env": {},
        "base_args": (),
        "builds": None,
        "budget": Budget(),
        "factory": None,
    }
    given.setdefault("custom", given.get("factory"))  # a test's measure replaces llama-bench, as run_pipeline's
    return SearchRun(**{**fields, **given})

"""Small-batch passes of the confirm: the table's entries at ``Q->ne[1]`` 2-8 checked end to end.

A ``ppN`` prompt after a depth attends at ``Q->ne[1] = N`` (the call of speculative and parallel decoding), so an
entry at batch N is confirmed by a ``ppN`` pass with the entries as ``prefill/../nbN`` hook rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tuner.sweep.grid import pad_kv
from tuner.sweep.table import TableRule

ModelPlan = Any
"""A :class:`tuner.sweep.confirm.ModelPlan` (which imports this module, so not imported here)."""


def batch_touches(rule: TableRule, depth: int, batch: int) -> bool:
    """Whether a ``pp<batch>`` test at ``depth`` attends at an n_kv in ``rule``'s interval (KV padded to 256)."""
    return rule.covers(pad_kv(depth + batch))


def batch_plan(plan: ModelPlan, batch: int) -> ModelPlan:
    """The pass of ``plan``'s model at ``Q->ne[1] = batch`` (``<shape>-pp<batch>``): its entries there, prefill."""
    mine, like = tuple(r for r in plan.unexercised if r.ne1 == batch), f"{plan.like}-pp{batch}"
    return dataclasses.replace(
        plan, like=like, base=plan.like, pp=batch, batch=batch, fa_rules=mine, unexercised=(), mmq=()
    )


def batch_passes(plans: Sequence[ModelPlan], depths: Sequence[int]) -> list[tuple[ModelPlan, tuple[int, ...]]]:
    """Per model and batch of its shape's entries at ``Q->ne[1] > 1``: the pass and the depths whose
    ``pp<batch>`` reaches some entry's n_kv range; a batch no depth reaches gets no pass (reported)."""
    out = []
    for p in plans:
        if p.base:
            continue
        for batch in sorted({r.ne1 for r in p.unexercised}):
            one = batch_plan(p, batch)
            ds = tuple(d for d in p.depths(depths) if any(batch_touches(r, d, batch) for r in one.fa_rules))
            if ds:
                out.append((one, ds))
    return out

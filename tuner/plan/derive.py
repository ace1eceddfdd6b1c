"""Derived knobs: legal values that come from the machine and the model, resolved at search time.

A space file marks such a knob ``derive = "threads"`` or ``derive = "ngl"`` instead of listing values, because the
right list differs per host and per model; docs/knobs.md says what each samples. The usual advice is to match threads
to physical cores, not logical: both are sampled, so the measurement decides.

Every derived knob keeps ``default`` (no flag: llama-bench's own choice), so an untouched space still
measures upstream. Under a CPU mask upstream's default is oversubscribed (llama-bench counts the
machine's physical cores, not the mask's): exactly the gap a host-paced search should find.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner.plan.space import BENCH_DEFAULT, SearchSpace
from tuner.targets import archs, models
from tuner.targets.host import Cpus, host_cpus, mask_text

_FIT_MARGIN = 0.9
"""Share of the free GPU memory the weights and KV may take (compute buffers need the rest)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Legal:
    """A derived knob's values on one machine and model."""

    choices: tuple[int | str, ...]
    """What the tune stage samples, ``default`` first."""
    low: int
    high: int
    """The range a pinned value (``--set``) may take."""
    why: str
    """How they were derived (logged, stored in the study, quoted by a refused pin)."""


def _threads(cpus: Cpus) -> Legal:
    phys = min(cpus.physical, cpus.logical)
    values = sorted({max(1, phys // 2), phys, cpus.logical})
    where = f"the --cpu-mask {mask_text(cpus.ids)}" if cpus.masked else "this machine"
    why = (
        f"threads must be 1..{cpus.logical}: {where} has {cpus.logical} logical CPU(s) on {phys} physical core(s); "
        f"sampled: default (llama-bench's own count), {', '.join(map(str, values))}"
    )
    return Legal(choices=(BENCH_DEFAULT, *values), low=1, high=cpus.logical, why=why)


def _full_offload(high: int, why: str) -> Legal:
    """Only llama-bench's default (every layer offloaded) is sampled; a pin may be 0..``high``."""
    return Legal(choices=(BENCH_DEFAULT,), low=0, high=high, why=why)


def _ngl(shape: Mapping[str, int] | None, model_bytes: int | None, gpu_free: int | None, tokens: int) -> Legal:
    if not shape or not shape.get("n_layers"):
        return _full_offload(
            1 << 20, "-ngl: the model's layer count is unknown here, so only full offload (default) is sampled"
        )
    n = int(shape["n_layers"])
    top = n + 1  # the output layer counts as one more (llama.cpp: n_layer + 1 offloads everything)
    head = f"-ngl must be 0..{top} for this model ({n} layers + the output layer; default offloads all)"
    if gpu_free is None or model_bytes is None:
        return _full_offload(top, f"{head}; GPU free memory unknown, so only full offload is sampled")
    # the weights and f16 K and V for tokens positions (llama-bench's default cache type)
    need = model_bytes + 2 * 2 * shape["n_layers"] * shape["n_kv_heads"] * shape["head_dim"] * tokens
    budget = int(gpu_free * _FIT_MARGIN)
    gib = 1 << 30
    if need <= budget:
        fits = f"it fits ({need / gib:.1f} GiB of {gpu_free / gib:.1f} GiB free)"
        return _full_offload(top, f"{head}; {fits}, so only full offload is sampled")
    fit = min(n, budget * top // need)  # layers that fit, each carrying its share of weights and KV
    steps = sorted({s for s in (fit, fit * 3 // 4, fit // 2) if s > 0})
    return Legal(
        choices=(BENCH_DEFAULT, *steps),
        low=0,
        high=top,
        why=f"{head}; it does not fit ({need / gib:.1f} GiB > {_FIT_MARGIN:.0%} of {gpu_free / gib:.1f} GiB free), "
        f"so partial offload is sampled: {', '.join(map(str, steps)) or 'none fits'}",
    )


def legal_values(
    space: SearchSpace,
    *,
    cpus: Cpus,
    shape: Mapping[str, int] | None = None,
    model_bytes: int | None = None,
    gpu_free_bytes: int | None = None,
    tokens: int = 0,
) -> dict[str, Legal]:
    """Each derived knob's :class:`Legal` for this machine and model (``tokens``: the deepest depth
    plus the test's tokens, for the KV cache)."""
    out: dict[str, Legal] = {}
    for k in space.runtime_knobs:
        derive = k.meta.get("derive")
        if derive == "threads":
            out[k.name] = _threads(cpus)
        elif derive == "ngl":
            out[k.name] = _ngl(shape, model_bytes, gpu_free_bytes, tokens)
    return out


def resolve_space(space: SearchSpace, legal: Mapping[str, Legal | Mapping[str, Any]]) -> SearchSpace:
    """``space`` with its derived knobs' choices and pin ranges filled in (``legal`` as returned by
    :func:`legal_values`, or its stored dict form)."""
    knobs = []
    for k in space.runtime_knobs:
        lg = legal.get(k.name)
        if lg is not None and k.meta.get("derive"):
            lg = lg if isinstance(lg, Legal) else Legal(**{**lg, "choices": tuple(lg["choices"])})
            k = dataclasses.replace(k, choices=lg.choices, low=lg.low, high=lg.high, meta={**k.meta, "legal": lg.why})
        knobs.append(k)
    return dataclasses.replace(space, runtime_knobs=tuple(knobs))


def space_for_run(
    space: SearchSpace, *, cpu_mask: Sequence[int] | None, model: Path | None, gpu: bool, tokens: int = 0
) -> tuple[SearchSpace, dict[str, Legal]]:
    """Resolve ``space`` for a run on this machine with ``model``, pinned to ``cpu_mask`` (``gpu``:
    whether to ask the GPU's free memory). UsageError when the model is unreadable.
    """
    if not any(k.meta.get("derive") for k in space.runtime_knobs):
        return space, {}
    shape = models.read_shape(model) if model is not None else None
    needs_gpu = gpu and any(k.meta.get("derive") == "ngl" for k in space.runtime_knobs)
    legal = legal_values(
        space,
        cpus=host_cpus(cpu_mask),
        shape=shape,
        model_bytes=model.stat().st_size if model else None,
        gpu_free_bytes=archs.gpu_free_bytes() if needs_gpu else None,
        tokens=tokens,
    )
    return resolve_space(space, legal), legal

"""The search's cost: the recorded per-step prices its plan and budget use, and the cost of a past search of the
same arch for the plan (its llama-bench calls are counted by :func:`tuner.search.device_guard.counted`)."""

from __future__ import annotations

import dataclasses
import math
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner._compat import tomllib
from tuner.rounds.budget import load_step_costs
from tuner.search.study import default_run_dir
from tuner.targets.models import ModelShape, plan_tensors

_SHAPE_KEYS = ("head_dim", "n_layers", "d_model", "n_heads", "n_kv_heads")
"""What makes two models cost alike in a search: attention and layer sizes (``[model.shape]``)."""


def _same_shape(doc: Mapping[str, Any], shape: Mapping[str, object]) -> bool:
    have = (doc.get("model") or {}).get("shape") or {}
    keys = [k for k in _SHAPE_KEYS if shape.get(k) is not None and have.get(k) is not None]
    return bool(keys) and all(have.get(k) == shape[k] for k in keys)


def past_cost(
    arch: str, results: Path = Path("results"), *, trials: int | None = None, shape: Mapping[str, object] | None = None
) -> tuple[Path, dict[str, object], bool] | None:
    """The ``[cost]`` of a stored result of ``arch`` (``results/<arch>/*/config.toml``) and whether its model has
    ``shape``: preferring that shape, then (``trials`` given) tune trials run or not as the plan, then the most
    recorded fields; None when none has one."""
    found = [
        (f, dict(doc["cost"]), bool(shape) and _same_shape(doc, shape or {}))
        for f, doc in _cost_docs(sorted((results / arch).glob("*/config.toml")))
    ]
    found = [fc for fc in found if fc[2]] or found  # a 1B's minutes do not price an 8B
    if trials is not None:  # a search without trials is not priced by one that spent minutes on them
        alike = [fc for fc in found if bool(fc[1].get("tune_trials")) == bool(trials)]
        found = alike or found
    return max(found, key=lambda fc: len(fc[1]), default=None)  # max keeps the first of equals


def past_cost_line(
    arch: str, results: Path = Path("results"), *, trials: int | None = None, shape: Mapping[str, object] | None = None
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


def full_build_seconds(costs: Mapping[str, Any] | None = None) -> float:
    """One full build's price (``[full_build]``)."""
    return float((costs or load_step_costs())["full_build"]["seconds"])


def nearest_recording(costs: Mapping[str, Any], d_model: int) -> Mapping[str, Any]:
    """The recorded model (``[models.*]``) whose width is nearest ``d_model`` (costs scale with model size)."""
    return min(costs["models"].values(), key=lambda m: abs(math.log(m["d_model"] / max(d_model, 1))))


def screen_round_seconds(rec: Mapping[str, Any], n_calls: int, n_depths: int, *, kernel: bool = False) -> float:
    """One screen round's price from the recording ``rec``: ``n_calls`` shared llama-bench calls at ``n_depths``
    depths, or with ``kernel`` test-backend-ops calls of a prefill and a decode case per depth."""
    if kernel:
        return n_calls * 2 * n_depths * float(rec["kernel_case_s"])
    return n_calls * n_depths * float(rec.get("screen_call_depth_s", rec["bench_call_depth_s"]))


def priced_screen_call(d_model: int | None, depths: Sequence[int], *, kernel: bool = False) -> dict[str, object]:
    """One screen call at ``depths`` priced by :func:`screen_round_seconds`, as a round record the round loops
    scale (``prior``), so a study without a measured round starts none its price says would overrun."""
    rec = nearest_recording(load_step_costs(), d_model or 0)
    kernel = kernel and "kernel_case_s" in rec  # the dry run prices a screen without the figure as llama-bench's
    return {"seconds": screen_round_seconds(rec, 1, len(depths), kernel=kernel), "depths": list(depths), "order": [""]}


@dataclasses.dataclass(frozen=True)
class Price:
    """One per-step cost the dry run multiplies by its counts, and where it was recorded."""

    seconds: float
    source: str
    here: bool
    """Recorded on this machine (the same device and core count)."""


def this_cpu_device() -> str:
    """The ``measured_on`` a CPU-backend search on this machine records (:mod:`tuner.rounds.live`'s wording)."""
    return f"CPU backend ({platform.processor() or platform.machine()}, {os.cpu_count()} threads)"


def _cost_docs(files: Sequence[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """The records of ``files`` that have a ``[cost]``; an unreadable one only loses the plan its figures."""
    out = []
    for f in files:
        try:
            doc = tomllib.loads(f.read_text())
        except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
            continue
        if isinstance(doc.get("cost"), Mapping) and doc["cost"]:
            out.append((f, doc))
    return out


def local_prices(
    arch: str,
    device: str,
    *,
    shape: Mapping[str, object],
    pp: int,
    tg: int,
    results: Path = Path("results"),
    runs: Path | None = None,
) -> dict[str, Price]:
    """Per-step costs that searches of ``arch`` recorded on this machine (``device``: its ``measured_on``):
    ``full_build`` (the longest build over a minute, of the same model shape if any: a resumed run's cached build
    counts seconds), ``model`` (the synthesis of the same shape) and ``call_depth`` (a llama-bench call per depth,
    of the same shape and pp/tg). Keys are left out where nothing recorded them."""
    runs = runs if runs is not None else default_run_dir("x").parent
    # stored results of arch and run dirs' exports measured on device, with a [cost]
    files = [*sorted((results / arch).glob("*/config.toml")), *sorted(runs.glob("*/export/config.toml"))]
    docs = [
        (f, doc)
        for f, doc in _cost_docs(files)
        if isinstance(t := doc.get("target"), Mapping) and t.get("arch") == arch and t.get("measured_on") == device
    ]
    out: dict[str, Price] = {}
    same = [(f, d) for f, d in docs if _same_shape(d, shape)]
    builds = [(float(d["cost"]["build_s"]), f) for f, d in same or docs if float(d["cost"].get("build_s", 0)) > 60]
    models = [(float(d["cost"]["model_s"]), f) for f, d in same if d["cost"].get("model_s")]
    for key, field, found in (("full_build", "build_s", builds), ("model", "model_s", models)):
        if found:
            s, f = max(found)
            out[key] = Price(s, f"{f}: [cost] {field} (on this machine, {device})", True)
    for f, d in same:
        c, m = d["cost"], d.get("model") or {}
        depths: Sequence[int] = m.get("depths") or ()
        calls = int(c.get("llama_bench_calls", 0))
        if calls and depths and m.get("pp") == pp and m.get("tg") == tg:
            secs = sum(float(c.get(k, 0.0)) for k in ("screen_s", "tune_s", "confirm_s"))
            per = round(secs / (calls * len(depths)), 2)
            why = f"{f}: [cost] screen_s + tune_s + confirm_s over {calls} llama-bench calls at {len(depths)} depths"
            out["call_depth"] = Price(per, f"{why} (on this machine, {device})", True)
            break
    return out


def synth_price(
    shape: ModelShape, quant: str | None, costs: Mapping[str, Any] | None = None
) -> tuple[Price, Price | None]:
    """The recorded cost of synthesizing a ``shape`` model in f16 and, with ``quant``, of llama-quantize making it."""
    rec = (costs or load_step_costs())["model_synth"]
    gparams = sum(math.prod(t.ne) for t in plan_tensors(shape)) / 1e9
    where = f"recorded on {rec['machine']}: {rec['source']}"
    synth = Price(round(float(rec["synth_s_per_gparam"]) * gparams, 1), where, False)
    quantize = Price(round(float(rec["quantize_s_per_gparam"]) * gparams, 1), where, False) if quant else None
    return synth, quantize

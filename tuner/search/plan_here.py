"""What the machine a search will run on changes in ``tuner search --dry-run``'s plan: its recorded per-step
costs, whether upstream's build and the model are cached, the model step's price, and the compile check's TUs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypedDict

from tuner.builder import cmake
from tuner.paths import tuner_home
from tuner.plan.render import render_variant
from tuner.plan.variant import RenderedVariant
from tuner.search.cost import Price, local_prices, synth_price, this_cpu_device
from tuner.source import Source
from tuner.targets.models import ModelShape
from tuner.targets.target import Target


class Stage(TypedDict):
    """One stage of the dry run's plan: calls and seconds are (low, high)."""

    stage: str
    what: str
    llama_bench_calls: list[int]
    seconds: list[float] | None
    cost: str


class RunInputs(Protocol):
    """The model settings and tokens of a search or its plan."""

    @property
    def model(self) -> Path | None: ...
    @property
    def quant(self) -> str | None: ...
    @property
    def direct(self) -> bool: ...
    @property
    def pp(self) -> int: ...
    @property
    def tg(self) -> int: ...


CPU_CHECK_OBJECTS = ("ggml/src/ggml-cpu/ops.cpp",)
"""A CPU variant's compile check: the TU of the CPU backend's FLASH_ATTN_EXT (the op the search times)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Here:
    """The plan's machine: its recorded per-step costs, whether upstream's build is cached, whether the gate runs
    (not on the CPU backend: it is the reference), and the model step's stage."""

    prices: Mapping[str, Price] = dataclasses.field(default_factory=dict)
    built: bool = False
    gate: bool = True
    model_stage: Stage | None = None


def check_objects(rv: RenderedVariant, root: Path, *, cpu: bool) -> list[str] | None:
    """The TUs a compile check of ``rv`` compiles (None: a CPU variant's tree has none of them)."""
    if not cpu:
        return cmake.default_check_objects(rv)
    objs = [o for o in CPU_CHECK_OBJECTS if (root / o).is_file()]
    return objs or None


def model_stage(inputs: RunInputs, shape: ModelShape, source: Source, prices: Mapping[str, Price]) -> Stage:
    """The model step before the study opens: nothing for --model, a cached file, or its synthesis (and
    llama-quantize for --quant), priced."""

    def stage(what: str, seconds: float, cost: str) -> Stage:
        return {"stage": "model", "what": what, "llama_bench_calls": [0, 0], "seconds": [seconds] * 2, "cost": cost}

    if inputs.model is not None:
        return stage(f"--model {inputs.model}: nothing is made", 0.0, "")
    # the file names tuner.targets.models.synth_cached gives the search's model (its default seed, s0)
    models, sid = tuner_home() / "models", source.source_id[:8]
    quant = inputs.quant or ""  # direct implies a quant (the request refuses it without one)
    if inputs.direct:  # one file, quant's blocks written by the synthesis: priced as an f16 synthesis
        base = final = models / f"{shape.name}-{quant.lower()}-direct-s0-{sid}.gguf"
    else:
        base = models / f"{shape.name}-f16-s0-{sid}.gguf"
        final = base.with_name(base.stem.replace("-f16-", f"-{quant.lower()}-") + ".gguf") if quant else base
    if final.is_file():
        return stage(f"{final.name}: cached (synthesized by an earlier run)", 0.0, "")
    synth, quantize = synth_price(shape, None if inputs.direct else inputs.quant)
    synth = prices.get("model", synth)
    kind = f"{quant.upper()} blocks written directly" if inputs.direct else "f16"
    parts = [] if base.is_file() else [(f"synthesize the random-weight GGUF ({kind})", synth)]
    if quantize is not None:
        parts.append((f"llama-quantize it to {quant.upper()} (with upstream's build)", quantize))
    what = f"{shape.name} -> {final.name}: " + "; ".join(w for w, _ in parts)
    cost = "; ".join(f"{p.seconds:g} s ({'this machine' if p.here else p.source.split(':')[0]})" for _, p in parts)
    return stage(what, sum(p.seconds for _, p in parts), cost)


def here_for(target: Target, source: Source, inputs: RunInputs, shape: ModelShape, variants: Sequence[str]) -> Here:
    """The plan's machine when the search runs here (upstream's build: the first of ``variants``)."""
    # a target that is not this machine's builds elsewhere: nothing of this machine's cache applies
    here = bool(variants) and (target.is_cpu or target.arch.name in target.local_archs)
    rv = render_variant(source, target.arch.name, variants[0], local_archs=list(target.local_archs)) if here else None
    keys = ("head_dim", "n_layers", "d_model", "n_heads", "n_kv_heads")
    prices: dict[str, Price] = {}
    if target.is_cpu:  # a GPU's recorded device name is llama-bench's, not known before a call
        prices = local_prices(
            target.arch.name, this_cpu_device(), shape={k: getattr(shape, k) for k in keys}, pp=inputs.pp, tg=inputs.tg
        )
    built = rv is not None and cmake.is_built(rv, cmake.search_targets(target.is_cpu))
    return Here(
        prices=prices, built=built, gate=not target.is_cpu, model_stage=model_stage(inputs, shape, source, prices)
    )

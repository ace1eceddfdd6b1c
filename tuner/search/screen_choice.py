"""Which tool times the kernel screen (``--screen``; docs/llama-bench-cost.md): one rule for the search and its
dry run. The kernel level stands for what llama-bench would time only where the whole model runs on an NVIDIA
GPU with kernels to force (no ``--cpu-mask``, where the host paces a step) and the live llama-bench measures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tuner.errors import UsageError
from tuner.plan.space import SearchSpace, runtime_env_and_args
from tuner.search.kernel_screen import METHOD_BENCH, METHOD_KERNEL
from tuner.search.residency_gate import full_offload
from tuner.targets.target import Target


def coerce_pins(space: SearchSpace, pins: Mapping[str, object]) -> dict[str, object]:
    """``--set`` pins as ``space``'s knobs take them (``variant`` names a build, not a knob: kept as given)."""
    return {k: (v if k == "variant" else space.knob(k).coerce(v)) for k, v in pins.items()}


def pinned_runtime(space: SearchSpace, fixed: Mapping[str, object]) -> tuple[dict[str, str], list[str]]:
    """The env vars and llama-bench arguments of the pinned (``--set``) runtime knobs, ``fixed`` coerced already."""
    names = {k.name for k in space.runtime_knobs}
    return runtime_env_and_args(space, {k: v for k, v in fixed.items() if k in names})


def screen_method(
    asked: str | None,
    *,
    target: Target,
    has_kernels: bool,
    base_args: Sequence[str],
    n_layers: int | None,
    cpu_mask: Sequence[int] | None,
    custom_measure: bool = False,
) -> str:
    """The screen's tool for a new study: ``asked`` (None or ``auto``: the rule); UsageError for ``--screen
    kernel`` where no kernel can be forced on an NVIDIA GPU. ``custom_measure``: a test's or replay's measure."""
    vendor = target.arch.vendor
    nvidia_gpu = vendor == "nvidia" and not target.is_cpu
    if asked == METHOD_KERNEL and not (nvidia_gpu and has_kernels):
        raise UsageError(
            f"--screen kernel times the FlashAttention kernels tuner can force on an NVIDIA GPU; {target.name} "
            f"({'no kernel to force' if nvidia_gpu else vendor}) has none. "
            "Use --screen llama-bench (or auto)."
        )
    if asked not in (None, "auto"):
        return asked
    host_paced = bool(cpu_mask) or not full_offload(base_args, n_layers)
    return METHOD_KERNEL if nvidia_gpu and has_kernels and not host_paced and not custom_measure else METHOD_BENCH

"""The target a search times, resolved once at the command line (:func:`resolve_target`) and carried
from there as a value: the arch record (:class:`tuner.targets.archs.Arch`, with its limits), the GPUs
this machine has (detected once) and whether the target's code runs here through PTX JIT."""

from __future__ import annotations

import dataclasses

from tuner import log
from tuner.errors import UsageError
from tuner.targets import archs
from tuner.targets.archs import Arch


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    """An arch of the arch database, checked against this machine."""

    arch: Arch
    """The arch record: vendor, family, compute capability, shared-memory limits, kernel paths."""
    local_archs: tuple[str, ...]
    """This machine's GPU arch names, in device order (``()``: no GPU, only the CPU backend)."""
    ptx_jit: bool = False
    """The target is an older NVIDIA arch whose code runs on a newer local GPU as ``<cc>-virtual`` PTX."""

    @property
    def name(self) -> str:
        """The canonical arch name: ``sm_90``, ``gfx1151``, ``cpu``."""
        return self.arch.name

    @property
    def is_cpu(self) -> bool:
        """True for llama.cpp's CPU backend (no GPU is timed)."""
        return self.arch.name == "cpu"


def resolve_target(
    requested: str | None,
    *,
    dry_run: bool = False,
    replay: bool = False,
    ptx_jit: bool = False,
    instead: str | None = None,
) -> Target:
    """The target to tune for: the requested arch if present here, else the local GPU, else ``cpu``.

    ``ptx_jit`` lets an NVIDIA target run on a newer local NVIDIA GPU through ``<cc>-virtual`` PTX
    (e.g. sm_89 code on an H100): the kernels are the target's, the clocks and memory are the
    local GPU's, and every report names the GPU that was measured. ``instead``: what to do without the GPU, in
    the refusal's words (default: ``tuner search``'s dry run).

    UsageError when ``requested`` is not in the arch database, or names a GPU this machine does not have (and
    neither ``dry_run`` nor ``replay`` is set).
    """
    local = tuple(archs.detect_local_archs())
    default = local[0] if local else "cpu"
    arch = archs.load_arch(default if requested is None else requested)  # unknown -> UsageError with suggestions
    if requested is None or arch.name == "cpu" or dry_run or replay or arch.name in local:
        return Target(arch=arch, local_archs=local)
    newer = archs.newer_nvidia(arch.cc or 0, local) if arch.vendor == "nvidia" else []
    if ptx_jit and newer:
        log.warning(
            f"{arch.name} code runs here as {(arch.cc or 0) // 10}-virtual PTX JIT-compiled for {newer[0]}: the "
            f"kernels and their legality are {arch.name}'s, the speed is {newer[0]}'s (clocks, bandwidth, SM count)."
        )
        return Target(arch=arch, local_archs=local, ptx_jit=True)
    found = ", ".join(local) if local else "no GPU (only the CPU backend)"
    instead = instead or (
        f"`tuner search --arch {arch.name} --dry-run` to render, constraint-check and compile-check the whole "
        "space here"
    )
    msg = (
        f"--arch {arch.name} asks for a {arch.vendor.upper()} {arch.family} GPU, but this machine has "
        f"{found}. tuner never benchmarks one device and reports it as another. Use {instead}, or run the same "
        "command on a machine with that GPU."
    )
    if newer:
        msg += (
            f" To run {arch.name}'s kernels on this newer GPU anyway (PTX JIT, measured speed is this GPU's), "
            "add --ptx-jit."
        )
    raise UsageError(msg)

"""The sweeps' default build: the one ``tuner sweep run``, ``mmq`` and ``confirm`` use without ``--build``."""

from __future__ import annotations

from pathlib import Path

from tuner import log, source
from tuner.builder.cmake import build_variant, ensure_targets
from tuner.plan.render import render_variant
from tuner.targets.archs import Arch, detect_local_archs, load_arch
from tuner.targets.target import resolve_target


def default_build(arch: str, spec: str | None, extra: tuple[str, ...] = ()) -> Path:
    """The bin dir of the arch's default variant of ``spec`` with the opt-in MMQ hook (one build for both sweeps)."""
    src = source.fetch_source(spec) if spec else source.fetch_source()
    variant = "hip" if load_arch(arch).vendor == "amd" else "cuda"
    rv = render_variant(src, arch, variant, local_archs=detect_local_archs(), hooks=("mmq",))
    with log.step(f"Building {rv.short} from {src.spec}"):
        b = build_variant(rv)
    if extra:
        b = ensure_targets(b, list(extra))
    return Path(b.bin_dir)


def gpu_backend(arch: Arch, backend: str) -> str:
    """``backend`` as ggml names it on ``arch``: the default ``CUDA0`` means ``ROCm0`` on an AMD arch."""
    return "ROCm0" if arch.vendor == "amd" and backend == "CUDA0" else backend


def require_gpu(arch: Arch, backend: str, dry_run: str) -> None:
    """An AMD sweep needs that GPU here, else the search's refusal (exit 2) naming ``dry_run``; CPU runs anywhere."""
    if arch.vendor != "amd" or backend.upper().startswith("CPU"):
        return
    resolve_target(
        arch.name,
        instead=f"`{dry_run}` to print what it would run and an estimate of its time (README, 'Tuning a Strix Halo')",
    )

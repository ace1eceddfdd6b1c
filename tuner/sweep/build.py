"""The sweeps' default build: the one ``tuner sweep run``, ``mmq`` and ``confirm`` use without ``--build``."""

from __future__ import annotations

__all__ = ["default_build"]

from pathlib import Path

from tuner import log, source
from tuner.builder.cmake import build_variant
from tuner.builder.extra import ensure_targets
from tuner.plan.render import render_variant
from tuner.targets.archs import detect_local_archs


def default_build(arch: str, spec: str | None, extra: tuple[str, ...] = ()) -> Path:
    """The bin dir of the arch's default ``cuda`` variant of ``spec`` (default: the pinned tree) with the
    opt-in MMQ hook (``templates/patches/mma/mmq-hook.toml``), so one build serves both sweeps; built (or
    taken from the build cache) as ``tuner build`` would; ``extra`` tools (``llama-perplexity``) added on
    demand without changing its build id."""
    src = source.fetch_source(spec) if spec else source.fetch_source()
    rv = render_variant(src, arch, "cuda", local_archs=detect_local_archs(), hooks=("mmq",))
    with log.step(f"Building {rv.short} from {src.spec}"):
        b = build_variant(rv)
    if extra:
        b = ensure_targets(b, list(extra))
    return Path(b.bin_dir)

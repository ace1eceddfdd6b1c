"""The variants there are, and the value objects passed between stages: source -> render -> build -> bench.

Kept in one small module so each stage can be written and tested against the same shapes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner._hash import stable_hash

VARIANTS: dict[str, str] = {
    "cpu": "CPU backend, -march=native (GGML_NATIVE=ON)",
    "cpu-no-native": "CPU backend without -march=native (portable baseline)",
    "cuda": "CUDA, upstream defaults for the arch",
    "cuda-force-mmq": "CUDA with GGML_CUDA_FORCE_MMQ=ON (a no-op on Turing+ for MMQ types)",
    "cuda-force-cublas": "CUDA with GGML_CUDA_FORCE_CUBLAS=ON (never MMQ)",
    "cuda-no-graphs": "CUDA with GGML_CUDA_GRAPHS=OFF",
    "hip": "HIP, upstream defaults for the arch",
    "hip-rocwmma": "HIP with the rocWMMA FlashAttention kernel (era rocwmma only)",
    "hip-force-mmq": "HIP with GGML_CUDA_FORCE_MMQ=ON",
    "hip-no-mmq-mfma": "HIP with GGML_HIP_MMQ_MFMA=OFF (also removes the CDNA MMA-FA path)",
}
"""Variant name -> one-line description; each has ``templates/cmake/<name>.j2``."""


def variant_family(variant: str) -> str:
    """``cuda-force-mmq`` -> ``cuda``; the family picks the patch manifests."""
    return variant.split("-", 1)[0]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RenderedVariant:
    """One build variant rendered for one source tree: CMake defines plus source edits.

    ``key`` identifies the *build directory* (source, base patch, defines). Compile-time candidates that only change
    ``tu_headers`` share that directory and rebuild only the translation units whose pre-included header changed;
    ``artifact_key`` identifies one candidate's binaries.
    """

    arch: str
    """Architecture name from the arch database, e.g. ``sm_90``, ``gfx1151``, ``cpu``."""
    variant: str
    """Variant family name, e.g. ``cuda``, ``cuda-force-cublas``, ``hip-rocwmma``, ``cpu``."""
    era: str
    source_id: str
    source_root: Path
    """The pristine llama.cpp tree the patch applies to."""
    defines: Mapping[str, str]
    """CMake cache entries, values already rendered as strings (``ON``/``OFF``/``90-real``...)."""
    patch: str
    """Unified diff (``a/``/``b/`` prefixes) against ``source_root``; '' when no edits."""
    files: Mapping[str, str]
    """Relative path -> full new text, for every file the patch changes."""
    tu_headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Relative path of a translation unit -> text of the header force-included into it.

    Only the TUs listed in the base patch's CMake hook can be given a header; '' means empty."""
    compile_values: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Compile-time knob values that produced ``tu_headers`` (for records and export)."""
    warnings: tuple[str, ...] = ()
    """Things the user should know (e.g. sm_89 requested on a non-Ada machine -> 89-virtual)."""
    hooks: tuple[str, ...] = ()
    """Opt-in hooks the patch carries beyond the variant's own (e.g. ``mmq``); already part of ``patch``."""

    @property
    def key(self) -> str:
        return stable_hash(self.source_id, self.patch, dict(self.defines))

    @property
    def artifact_key(self) -> str:
        return stable_hash(self.key, dict(self.tu_headers))

    @property
    def short(self) -> str:
        extra = "".join(f"+{h}-hook" for h in self.hooks)
        return f"{self.arch}/{self.variant}{extra}@{self.artifact_key[:8]}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Build:
    """A finished (or compile-checked) build of one RenderedVariant."""

    build_id: str
    """``RenderedVariant.artifact_key`` plus toolchain identity."""
    build_dir: Path
    """CMake build directory (shared by candidates of one variant)."""
    bin_dir: Path
    """Directory holding this candidate's executables and shared libraries (relocatable)."""
    log_file: Path
    cached: bool
    """True when nothing had to be compiled."""
    seconds: float
    compile_only: bool = False
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """build.json content: defines, toolchain versions, targets, rebuilt TUs..."""

    def exe(self, name: str) -> Path:
        return self.bin_dir / name

"""The project brief's six reference builds as tuner runs: a variant to build plus the env and llama-bench args to run it.

The mapping is data (``tuner/data/seed004_builds.toml``, explained in docs/seed004-builds.md). A build's runtime
settings are knob values of the arch's search space, so they pass the same type and range checks as a search's
(:func:`tuner.plan.space.render_runtime`); a partial offload is resolved against the model's layer count.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner._compat import tomllib
from tuner.errors import TunerError, UsageError, close_matches
from tuner.paths import package_data
from tuner.plan.derive import legal_values, resolve_space
from tuner.plan.space import SearchSpace, render_runtime
from tuner.plan.variant import VARIANTS
from tuner.targets.host import host_cpus

OFFLOADS = ("all", "half", "none")
"""``all``: no -ngl (llama-bench offloads every layer); ``half``: -ngl n_layers // 2; ``none``: -ngl 0."""
_DEFINE = re.compile(r"^[A-Z][A-Z0-9_]*$")
_VALUE = re.compile(r"^[A-Za-z0-9_.;+\-]*$")
_KEYS = {"name", "section", "seed_rank", "variant", "offload", "runtime", "seed_defines", "missing", "note"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SeedBuild:
    """One of the six reference builds mapped onto tuner (docs/seed004-builds.md)."""

    name: str
    section: str
    seed_rank: int
    """The brief's decode rank, 1 = highest tokens/s (its claim; docs/seed004-builds.md measures it)."""
    variant: str
    offload: str
    runtime: Mapping[str, int | str]
    """Runtime knob values besides the offload (search_spaces/<arch>.toml names)."""
    seed_defines: Mapping[str, str]
    """CMake options of the pinned tree the brief's words imply, with the value it asks for."""
    missing: tuple[str, ...]
    """What the brief asks for that has no option in the pinned tree."""
    note: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class SeedRun:
    """What tuner runs for one seed build on one model: build ``variant``, bench with ``env`` and ``bench_args``."""

    build: SeedBuild
    variant: str
    env: Mapping[str, str]
    bench_args: tuple[str, ...]


def _build(path: Path, i: int, raw: Mapping[str, Any]) -> SeedBuild:
    where = f"{path}: [[build]] #{i + 1}"
    unknown = set(raw) - _KEYS
    if unknown or _KEYS - set(raw):
        raise TunerError(
            f"{where}: keys must be exactly {sorted(_KEYS)} (extra {sorted(unknown)}, "
            f"missing {sorted(_KEYS - set(raw))})."
        )
    if raw["variant"] not in VARIANTS:
        msg = f"{where}: variant {raw['variant']!r} is not one of tuner's.{close_matches(raw['variant'], VARIANTS)}"
        raise TunerError(msg)
    if raw["offload"] not in OFFLOADS:
        raise TunerError(f"{where}: offload must be one of {', '.join(OFFLOADS)} (got {raw['offload']!r}).")
    rank = raw["seed_rank"]
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= 6:
        raise TunerError(f"{where}: seed_rank must be an integer 1..6 (got {rank!r}).")
    defines = raw["seed_defines"]
    for k, v in defines.items():
        if not _DEFINE.match(k) or not isinstance(v, str) or not _VALUE.match(v):
            raise TunerError(f"{where}: seed_defines {k}={v!r} is not NAME=VALUE with VALUE in [A-Za-z0-9_.;+-].")
    if "ngl" in raw["runtime"]:
        raise TunerError(f"{where}: set the offload with `offload`, not runtime.ngl (it depends on the model).")
    return SeedBuild(
        name=str(raw["name"]),
        section=str(raw["section"]),
        seed_rank=rank,
        variant=raw["variant"],
        offload=raw["offload"],
        runtime=dict(raw["runtime"]),
        seed_defines=dict(defines),
        missing=tuple(raw["missing"]),
        note=str(raw["note"]),
    )


def load_seed_builds(path: Path | None = None) -> tuple[SeedBuild, ...]:
    """The six builds, best claimed rank first; TunerError for a malformed file (a packaging bug)."""
    path = path or package_data("seed004_builds.toml")
    doc = tomllib.loads(path.read_text(encoding="utf-8"))
    builds = tuple(_build(path, i, raw) for i, raw in enumerate(doc.get("build", [])))
    names = [b.name for b in builds]
    ranks = sorted(b.seed_rank for b in builds)
    if len(set(names)) != len(names) or ranks != list(range(1, len(builds) + 1)):
        raise TunerError(
            f"{path}: build names must be distinct and seed ranks 1..{len(builds)} once each "
            f"(names {names}, ranks {ranks})."
        )
    return tuple(sorted(builds, key=lambda b: b.seed_rank))


def seed_build(name: str) -> SeedBuild:
    """Look a seed build up by name (``build_`` prefix optional); UsageError lists the known ones."""
    builds = {b.name: b for b in load_seed_builds()}
    key = name.removeprefix("build_")
    if key not in builds:
        raise UsageError(
            f"Unknown reference build {name!r}.{close_matches(key, builds)} Known (ranked order): "
            f"{', '.join(builds)}. See docs/seed004-builds.md."
        )
    return builds[key]


def seed_run(build: SeedBuild, space: SearchSpace, *, shape: Mapping[str, int] | None) -> SeedRun:
    """The env and llama-bench args of ``build`` for a model of ``shape`` (``tuner.targets.models.read_shape``).

    UsageError for a partial offload without the model's layer count, or a knob value the space refuses.
    """
    values: dict[str, int | str] = dict(build.runtime)
    if build.offload != "all":
        if build.offload == "half" and not (shape and shape.get("n_layers")):
            raise UsageError(
                f"Seed build {build.name} offloads half the layers, but the model's layer count is "
                "unknown. Pass a GGUF whose header has <arch>.block_count."
            )
        # OFFLOADS is checked on load: not none here is half, whose shape was checked just above
        values["ngl"] = 0 if build.offload == "none" or not shape else int(shape["n_layers"]) // 2
    # The ngl knob's legal range (0..n_layers+1) comes from the model, as in a search.
    resolved = resolve_space(space, legal_values(space, cpus=host_cpus(None), shape=shape))
    rt = render_runtime(resolved, values)
    return SeedRun(build=build, variant=build.variant, env=dict(rt.env), bench_args=tuple(rt.bench_args))

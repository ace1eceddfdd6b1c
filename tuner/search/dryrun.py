"""``tuner search --dry-run``: everything short of timing, for a GPU that is not here.

For the target arch and the source's era it

1. renders every variant of the search space (an unsupported variant, e.g. ``hip-rocwmma`` on a tree
   without rocWMMA FlashAttention, is reported with the reason);
2. constraint-checks the whole compile-time space. Knobs that form one kernel-config row are checked
   together; rows are independent, so the number of legal candidates is the product of the legal
   counts per row (exact, without enumerating millions of combinations);
3. compile-checks a representative sample per variant: the upstream row plus the first legal
   non-default candidate of each row, with the HIP compile-check toolchain for AMD targets or nvcc
   for NVIDIA targets;
4. prints the plan (builds x runtime trials x depths) with an *estimated* time on the target.

Nothing is benchmarked, and the output says so.
"""

from __future__ import annotations

__all__ = ["DryRunReport", "run_dry_run", "count_space", "plan_estimate"]

import collections
import dataclasses
import itertools
import math
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

from tuner import log
from tuner.errors import TunerError, UsageError

# Rough per-step costs on the *target* machine, from docs/measurements (device.md, hip-compilecheck.md).
# They are planning figures, never reported as measurements.
_EST = {
    "full_build_s": {"nvidia": 300.0, "amd": 500.0, "cpu": 300.0},
    "tu_rebuild_s": {"nvidia": 75.0, "amd": 60.0, "cpu": 20.0},
    "bench_point_s": {"nvidia": 4.0, "amd": 8.0, "cpu": 3.0},
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DryRunReport:
    arch: str
    era: str
    variants: Mapping[str, str]
    """variant -> 'ok' or the reason it cannot be rendered."""
    rows: tuple[Mapping[str, Any], ...]
    """One entry per kernel-config row: name, candidates, legal, illegal reasons."""
    legal: int
    total: int
    compile_checks: tuple[Mapping[str, Any], ...]
    plan: Mapping[str, Any]

    @property
    def ok(self) -> bool:
        return all(c["status"] in ("ok", "skipped") for c in self.compile_checks)


def _row_key(k: Any) -> tuple[Any, ...]:
    m = k.meta
    if k.kind == "wmma":
        return ("wmma",)
    return (k.kind, m["table"], int(m["dkq"]), int(m["dv"]), int(m["ncols"]), int(m.get("ncols2", 0)))


def _choices(k: Any) -> list[Any]:
    if k.choices is not None:
        return list(k.choices)
    return list(range(int(k.low), int(k.high) + 1, int(k.step)))


def count_space(arch: str, era: str, space: Any) -> tuple[list[dict[str, Any]], int, int]:
    """Constraint-check every candidate of every kernel-config row.

    Returns:
        (rows, legal, total): per row its candidate count, legal count and the broken rules with how
        often; ``legal``/``total`` for the whole compile-time space.
    """
    from tuner.plan.space import check_constraints

    groups: dict[tuple[Any, ...], list[Any]] = collections.defaultdict(list)
    for k in space.compile_knobs:
        groups[_row_key(k)].append(k)
    rows = []
    legal_total, total = 1, 1
    for key, knobs in groups.items():
        names = [k.name for k in knobs]
        n = n_ok = 0
        reasons: collections.Counter[str] = collections.Counter()
        first_legal: dict[str, Any] | None = None
        first_illegal: dict[str, Any] | None = None
        for combo in itertools.product(*(_choices(k) for k in knobs)):
            vals = dict(zip(names, combo))
            n += 1
            v = check_constraints(arch, era, vals, space=space)
            if v:
                for x in v:
                    reasons[getattr(x, "rule", str(x))] += 1
                if first_illegal is None:
                    first_illegal = {"values": vals, "why": "; ".join(map(str, v))}
            else:
                n_ok += 1
                if first_legal is None and any(vals[k.name] != k.default for k in knobs):
                    first_legal = vals
        rows.append(
            {
                "row": "/".join(str(x) for x in key),
                "knobs": names,
                "candidates": n,
                "legal": n_ok,
                "illegal_rules": dict(reasons.most_common()),
                "sample_legal": first_legal,
                "example_illegal": first_illegal,
            }
        )
        legal_total *= n_ok
        total *= n
    return rows, legal_total, total


def plan_estimate(vendor: str, *, n_variants: int, n_compile_samples: int, n_runtime: int, depths: Sequence[int],
                  trials: int) -> dict[str, Any]:
    """Builds x runtime trials x depths, with an estimated wall time on the target (a model)."""
    points = 2 * len(depths)
    builds = n_variants + min(n_compile_samples, trials)
    est = (
        n_variants * _EST["full_build_s"][vendor]
        + min(n_compile_samples, trials) * _EST["tu_rebuild_s"][vendor]
        + trials * points * _EST["bench_point_s"][vendor]
    )
    return {
        "builds": builds,
        "runtime_trials": trials,
        "points_per_trial": points,
        "runtime_space": n_runtime,
        "estimated_minutes": round(est / 60.0, 1),
        "note": "estimate from per-step costs measured on other machines; not a measurement of the target",
    }


def _compile_sample(source: Any, arch: str, variant: str, sample: Mapping[str, Any], vendor: str, *,
                    only_selector: bool = False) -> dict[str, Any]:
    from tuner.builder.cmake import build_variant, default_check_objects
    from tuner.plan.render import render_variant

    rv = render_variant(source, arch, variant, compile_values=dict(sample), local_archs=[])
    objs = default_check_objects(rv)
    if only_selector:
        # era rocwmma's fattn.cu is host code only; add the first TU with device code so the
        # check proves something was compiled for the target.
        objs = objs[:1] if rv.era == "mma" else objs[:2]
    if vendor == "amd":
        from tuner.builder.hip import find_hip_toolchain

        if find_hip_toolchain() is None:
            return {"variant": variant, "status": "skipped", "objects": objs,
                    "why": "HIP compile-check toolchain not set up; run `tuner toolchain hip` (root, ~1 min)"}
    elif vendor == "nvidia" and shutil.which("nvcc") is None:
        return {"variant": variant, "status": "skipped", "objects": objs, "why": "nvcc not on PATH"}
    try:
        b = build_variant(rv, compile_only=True, objects=objs)
    except TunerError as err:
        return {"variant": variant, "status": "failed", "objects": objs, "why": str(err)[:1500]}
    return {"variant": variant, "status": "ok", "objects": objs, "seconds": round(b.seconds, 1),
            "values": dict(sample), "offload": dict(b.meta.get("offload_targets", {}))}


def run_dry_run(*, arch: str, source_spec: str | None, sets: Mapping[str, str] | None = None,
                variants: Sequence[str] = (), compile_check: bool = True, trials: int = 40,
                depths: Sequence[int] = (0, 4096, 16384, 32768)) -> DryRunReport:
    """Render, constraint-check and compile-check ``arch``'s space; print the plan. Times nothing."""
    from tuner.targets.archs import load_arch
    from tuner.plan.render import render_variant
    from tuner.source import DEFAULT_SPEC, fetch_source
    from tuner.plan.space import load_space, parse_set_values

    a = load_arch(arch)
    source = fetch_source(source_spec or DEFAULT_SPEC)
    space = load_space(a.name, source.era)
    log.info(
        f"tuner search --dry-run: {a.name} ({a.vendor} {a.family}), source {source.spec} era {source.era}.\n"
        f"  DRY RUN: nothing is benchmarked; every time below is an estimate, not a measurement."
    )
    if sets:
        compile_pins, _ = parse_set_values(space, [f"{k}={v}" for k, v in sets.items()])
        from tuner.plan.space import check_constraints

        bad = check_constraints(a.name, source.era, compile_pins, space=space)
        if bad:
            raise UsageError(
                "the pinned values are illegal for " + a.name + ": " + "; ".join(map(str, bad))
                + ". Nothing was compiled. Pick values the constraint check accepts (see the rows below "
                "with `tuner search --arch " + a.name + " --dry-run`)."
            )
    wanted = [v for v in space.variants if not variants or v in variants]
    vstatus: dict[str, str] = {}
    for v in wanted:
        try:
            render_variant(source, a.name, v, local_archs=[])
            vstatus[v] = "ok"
        except TunerError as err:
            vstatus[v] = f"not renderable: {err}"
    with log.step(f"Constraint-checking the compile-time space ({len(space.compile_knobs)} knobs)"):
        rows, legal, total = count_space(a.name, source.era, space)
    checks: list[dict[str, Any]] = []
    if compile_check:
        samples = {}
        for r in rows:
            if r["sample_legal"]:
                samples.update(r["sample_legal"])
        first = True
        for v, st in vstatus.items():
            if st != "ok":
                continue
            # The first variant compiles the sample candidates' TUs too; the others differ only in
            # global defines, so their selector TU (fattn.cu, which holds the hook) is the sample.
            what = "upstream + one legal candidate per row" if first else "the patched selector TU"
            with log.step(f"Compile-checking {v} ({what})"):
                checks.append(_compile_sample(source, a.name, v, samples if first else {}, a.vendor,
                                              only_selector=not first))
            first = False
    plan = plan_estimate(
        a.vendor,
        n_variants=sum(1 for s in vstatus.values() if s == "ok"),
        n_compile_samples=sum(r["legal"] - 1 for r in rows if r["legal"]),
        n_runtime=math.prod(len(_choices(k)) for k in space.runtime_knobs) if space.runtime_knobs else 1,
        depths=depths,
        trials=trials,
    )
    rep = DryRunReport(arch=a.name, era=source.era, variants=vstatus, rows=tuple(rows), legal=legal, total=total,
                       compile_checks=tuple(checks), plan=plan)
    _print(rep)
    return rep


def _print(rep: DryRunReport) -> None:
    out = [f"\n## Variants ({rep.arch}, era {rep.era})", ""]
    out.append(log.table(["variant", "status"], [[v, s.splitlines()[0][:140]] for v, s in rep.variants.items()]))
    out += ["", f"## Compile-time space: {rep.legal} legal of {rep.total} candidates", ""]
    out.append(
        log.table(
            ["row", "candidates", "legal", "why the others are illegal"],
            [[r["row"], r["candidates"], r["legal"],
              "; ".join(f"{k} ×{n}" for k, n in r["illegal_rules"].items())[:160] or "-"] for r in rep.rows],
        )
    )
    if rep.compile_checks:
        out += ["", "## Compile checks (object files only; nothing runs)", ""]
        out.append(
            log.table(
                ["variant", "status", "TUs", "detail"],
                [[c["variant"], c["status"], len(c["objects"]),
                  (c.get("why") or f"{c.get('seconds')} s; targets {c.get('offload') or '-'}")[:160]]
                 for c in rep.compile_checks],
            )
        )
    p = rep.plan
    out += [
        "",
        f"## Plan on the target: {p['builds']} builds × {p['runtime_trials']} runtime trials × "
        f"{p['points_per_trial']} points (pp+tg per depth); about {p['estimated_minutes']} min ({p['note']}).",
    ]
    log.info("\n".join(out))

"""``tuner validate``: check stored winners (``results/<arch>/<model>/``) still hold.

Static checks (always): the schema of ``config.toml``; its ``[gate]`` table (the output-equivalence
gate, schema 3) passed, re-judged from its recorded numbers; the pinned source still resolves to the same
content id; re-rendering from ``config.toml`` reproduces ``tuned.patch`` byte for byte and the recorded
hashes (no ``tuned.patch`` where the render changes nothing: the kernels are upstream's); the patch applies
to the pristine tree (``git apply --check``); the build presets are a ``CMakeUserPresets.json`` (never a
``CMakePresets.json``, which would replace llama.cpp's own); no file names a local absolute path; every compile-time value passes
the arch's constraint check; where the folder holds ``upstream.patch``, it applies to the pristine tree
and has no whitespace-only hunks. Optional: ``--compile`` compiles the translation units the patch touches
for the target (nvcc for NVIDIA, the HIP compile-check toolchain for AMD); ``--bench`` re-measures on
matching hardware and fails when a bucket the winner claims is no longer faster beyond noise.
"""

from __future__ import annotations

__all__ = [
    "Finding",
    "ResultCheck",
    "find_results",
    "git_apply_to_copy",
    "load_config",
    "render_result",
    "validate_paths",
    "validate_result",
]

import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner._compat import tomllib
from tuner._hash import text_sha256
from tuner.errors import TunerError, UsageError
from tuner.result.checks import Finding, git_apply_to_copy

REQUIRED = {
    "schema": int,
    "source": dict,
    "hashes": dict,
    "target": dict,
    "model": dict,
    "choice": dict,
    "defines": dict,
    "buckets": list,
    "gate": dict,
}
REQUIRED_SUB: dict[str, dict[str, type]] = {
    "source": {"spec": str, "source_id": str, "era": str},
    "hashes": {"patch_sha256": str, "defines_sha256": str},
    "target": {"arch": str, "measured_on": str},
    "choice": {"variant": str, "compile": dict, "fa_rules": list, "fa_env": dict, "runtime_env": dict},
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResultCheck:
    path: Path
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)


def find_results(paths: Iterable[Path]) -> list[Path]:
    """Result folders (holding config.toml) under each path."""
    out: list[Path] = []
    for p in paths:
        if not p.exists():
            raise UsageError(f"{p} does not exist. Pass a result folder or a folder of results (default results/).")
        if (p / "config.toml").is_file():
            out.append(p)
        else:
            out += sorted(c.parent for c in p.rglob("config.toml"))
    return out


def load_config(folder: Path) -> dict[str, Any]:
    try:
        return tomllib.loads((folder / "config.toml").read_text())
    except tomllib.TOMLDecodeError as err:
        raise TunerError(f"{folder / 'config.toml'} is not valid TOML: {err}") from err


def render_result(source: Any, cfg: Mapping[str, Any]) -> Any:
    """The result's config rendered on ``source`` as it was exported (variant, compile values, baked FA rules;
    an empty patch where that changes nothing from upstream)."""
    from tuner.plan.fa_rules import rules_from_texts
    from tuner.result.export import baked_runtime, export_render

    choice = cfg["choice"]
    return export_render(
        source,
        cfg["target"]["arch"],
        choice["variant"],
        compile_values=dict(choice["compile"]),
        baked=baked_runtime(rules_from_texts(choice["fa_rules"]), dict(choice["fa_env"])),
    )


def _schema(cfg: Mapping[str, Any]) -> list[str]:
    errs = []
    required = dict(REQUIRED)
    if cfg.get("schema") in (2, 3):  # screen -> compose -> tune -> confirm: confirmed points instead of buckets
        del required["buckets"]
        required["points"] = list
    if cfg.get("schema") == 3:  # [gate] became the output-equivalence gate; test-backend-ops moved to [op_check]
        required["op_check"] = dict
    for k, t in required.items():
        if k not in cfg:
            errs.append(f"missing key {k!r}")
        elif not isinstance(cfg[k], t):
            errs.append(f"{k!r} should be a {t.__name__}, not {type(cfg[k]).__name__}")
    for sec, keys in REQUIRED_SUB.items():
        for k, t in keys.items():
            v = cfg.get(sec, {}).get(k) if isinstance(cfg.get(sec), dict) else None
            if v is None:
                errs.append(f"missing key {sec}.{k}")
            elif not isinstance(v, t):
                errs.append(f"{sec}.{k} should be a {t.__name__}, not {type(v).__name__}")
    errs += _narrowed_errors(cfg.get("choice"))
    if cfg.get("source", {}).get("era") not in (None, "mma", "rocwmma"):
        errs.append(f"source.era must be 'mma' or 'rocwmma', not {cfg['source']['era']!r}")
    return errs


def _narrowed_errors(choice: Any) -> list[str]:
    """``choice.narrowed_rules`` (optional: results before narrowing lack it): a table of the rules the confirm
    narrowed, each one an exported rule of ``choice.fa_rules`` (a narrowed rule is exported, its old form not)."""
    if not isinstance(choice, dict) or "narrowed_rules" not in choice:
        return []
    nr = choice["narrowed_rules"]
    if not isinstance(nr, dict):
        return [f"choice.narrowed_rules should be a dict, not {type(nr).__name__}"]
    exported = set(choice.get("fa_rules") or [])
    return [f"choice.narrowed_rules names {t!r}, which is not one of choice.fa_rules" for t in nr if t not in exported]


def _patch_hash_finding(patch: str, cfg: Mapping[str, Any]) -> Finding:
    """tuned.patch hashes to what config.toml records."""
    ok = text_sha256(patch) == cfg["hashes"]["patch_sha256"]
    return Finding(
        check="patch hash",
        ok=ok,
        detail=""
        if ok
        else f"sha256(tuned.patch)={text_sha256(patch)[:12]}… but config.toml records "
        f"{cfg['hashes']['patch_sha256'][:12]}… (stale hash or edited patch)",
    )


def _source_finding(source: Any, src_cfg: Mapping[str, Any]) -> Finding:
    """The fetched source is the one (id and era) config.toml names."""
    ok = source.source_id == src_cfg["source_id"] and source.era == src_cfg["era"]
    return Finding(
        check="source",
        ok=ok,
        detail=""
        if ok
        else f"{src_cfg['spec']} is {source.source_id} era {source.era}; config.toml says "
        f"{src_cfg['source_id']} era {src_cfg['era']}",
    )


def _residency_finding(cfg: Mapping[str, Any]) -> Finding:
    """``[residency]`` (the search's graph-split and buffer probe): a failing final config was not exported."""
    r = cfg["residency"]
    verdict = str(r.get("verdict"))
    if verdict == "fail":
        rules = list(r.get("rejected_rules", []))
        ok = "rejected_rules" in r and not cfg["choice"]["fa_rules"]
        return Finding(
            check="residency",
            ok=ok,
            detail=(
                f"the final config failed the residency check and upstream's selection was exported (rejected rules: {rules or 'none'})"
                if ok
                else f"[residency] says the exported config failed: {' '.join(r.get('reasons', []))}"
            ),
        )
    p = r.get("final") or r.get("upstream") or {}
    return Finding(
        check="residency",
        ok=verdict in ("pass", "not judged"),
        detail=f"{verdict}: decode graph splits {p.get('splits_tg', '?')}"
        + (f", {p['layers_offloaded']}/{p['layers_total']} layers on the GPU" if "layers_total" in p else ""),
    )


def _gate_finding(cfg: Mapping[str, Any]) -> Finding:
    """The output-equivalence gate: recorded as passed (its numbers re-judged), or not needed for upstream's config.

    A result exported before the gate (schema < 3) fails where this machine can run its arch (re-export
    it) and is reported as not run where it cannot: its numbers are never made up."""
    check = "output-equivalence gate"
    arch = cfg["target"]["arch"]
    if cfg["schema"] < 3:
        from tuner.targets.archs import detect_local_archs

        local = detect_local_archs()
        if arch != "cpu" and arch not in local:
            return Finding(
                check=check,
                ok=True,
                detail=f"gate not run: needs a {arch} GPU (this machine has "
                f"{', '.join(local) or 'none'}); the result was exported before the gate existed",
            )
        return Finding(
            check=check,
            ok=False,
            detail="exported before the output-equivalence gate existed (config.toml "
            "schema < 3): rerun `tuner search` with its study and `tuner export` it again",
        )
    g = cfg["gate"]
    if g.get("verdict") == "not needed":
        choice = cfg["choice"]
        upstream = not choice.get("fa_rules") and not choice.get("compile") and choice.get("tune_trial") is None
        return Finding(
            check=check,
            ok=upstream,
            detail="not needed: the exported config is upstream's"
            if upstream
            else "[gate] says 'not needed' but the choice has rules, compile values or a tune trial",
        )
    if g.get("verdict") != "pass" or not g.get("checks"):
        return Finding(
            check=check,
            ok=False,
            detail=f"[gate] verdict is {g.get('verdict')!r} with "
            f"{len(g.get('checks', []))} check(s); only a passing gate may be exported",
        )
    return _rejudged(g, check)


def _rejudged(g: Mapping[str, Any], check: str) -> Finding:
    """Every recorded check judged again from its numbers and the recorded thresholds (an edited verdict fails)."""
    import math

    from tuner.measure.equivalence import KldStats, Thresholds, judge

    try:
        thr = Thresholds(**dict(g["thresholds"]))
    except (KeyError, TypeError) as err:
        return Finding(check=check, ok=False, detail=f"[gate] thresholds unreadable: {err}")
    bad = []
    for c in g["checks"]:
        nums = {
            k: float(c[k]) if isinstance(c.get(k), (int, float)) else math.nan
            for k in ("mean_kld", "p99_kld", "max_kld", "same_top_pct")
        }
        stats = KldStats(
            **nums, mean_kld_unc=math.nan, median_kld=math.nan, same_top_unc=math.nan, ppl_q=math.nan, ppl_base=math.nan
        )
        try:  # each check's own thresholds where recorded (a kernel band sets them per mode)
            t = Thresholds(**dict(c["thresholds"])) if c.get("thresholds") else thr
        except TypeError as err:
            return Finding(check=check, ok=False, detail=f"[gate] thresholds of {c.get('name')} unreadable: {err}")
        ok, why = judge(
            stats=stats,
            deterministic=c.get("deterministic"),
            identical_to_upstream=c.get("identical_to_upstream"),
            strict=bool(c.get("strict")),
            thresholds=t,
        )
        if not ok or c.get("verdict") != "pass":
            bad.append(f"{c.get('name')}: {' '.join(why) or 'recorded verdict ' + repr(c.get('verdict'))}")
    detail = (
        f"pass in {', '.join(g.get('modes', []))}: {len(g['checks'])} check(s), worst mean KLD {g.get('mean_kld')}, "
        f"99% KLD {g.get('p99_kld')}, max KLD {g.get('max_kld')}, same top p {g.get('same_top_pct')}%"
    )
    return Finding(check=check, ok=not bad, detail="; ".join(bad) if bad else detail)


def _rendered_findings(rv: Any, patch: str, cfg: Mapping[str, Any]) -> list[Finding]:
    """Re-rendering config.toml reproduces tuned.patch byte for byte, and the recorded CMake defines."""
    same = rv.patch == patch
    why = (
        "tuned.patch is missing, but config.toml renders a patch that changes upstream's kernels"
        if not patch
        else "re-rendering config.toml gives no patch (upstream's kernels), but the folder has a tuned.patch"
        if not rv.patch
        else "re-rendering config.toml does not reproduce tuned.patch byte for byte (a value in config.toml or the patch was edited)"
    )
    f = [Finding(check="re-render", ok=same, detail="" if same else why)]
    dsha = text_sha256(json.dumps(dict(rv.defines), sort_keys=True))
    ok = dsha == cfg["hashes"]["defines_sha256"] and dict(rv.defines) == dict(cfg["defines"])
    f.append(Finding(check="defines", ok=ok, detail="" if ok else "rendered CMake defines differ from config.toml"))
    return f


_LOCAL_PATH = re.compile(
    r"""(?:^|[\s"'=(`:])(/(?:home|root|tmp|work|Users|mnt|media|var|opt|srv|scratch|data)/[^\s"'`)]*)""", re.M
)


def _files_findings(folder: Path) -> list[Finding]:
    """The preset file is a CMakeUserPresets.json that inherits the tree's presets, and no exported text
    names a local absolute path (an export is read on other machines)."""
    from tuner.result.export import PRESETS_FILE

    out = []
    user, old = folder / PRESETS_FILE, folder / "CMakePresets.json"
    ok = user.is_file() and not old.is_file()
    out.append(
        Finding(
            check="presets",
            ok=ok,
            detail=""
            if ok
            else (
                f"{old.name} would replace llama.cpp's own preset file (whose base/release presets the tuned preset inherits); "
                f"re-export to get {PRESETS_FILE}"
                if old.is_file()
                else f"{PRESETS_FILE} is missing"
            ),
        )
    )
    hits = []
    for f in sorted(folder.iterdir()):
        if f.is_file() and f.suffix in (".toml", ".md", ".env", ".patch", ".json"):
            hits += [f"{f.name}: {m}" for m in _LOCAL_PATH.findall(f.read_text(errors="replace"))]
    out.append(
        Finding(
            check="no local paths",
            ok=not hits,
            detail="; ".join(hits[:3]) + (f" (and {len(hits) - 3} more)" if len(hits) > 3 else ""),
        )
    )
    return out


def _applies_finding(patch: str, patch_file: Path, root: Path) -> Finding:
    """tuned.patch applies to pristine copies of the files it touches (none is exported when it would be empty)."""
    if not patch:
        return Finding(check="patch applies", ok=True, detail="no tuned.patch: the kernels are upstream's")
    res, _ = git_apply_to_copy(patch_file, root)
    return Finding(
        check="patch applies",
        ok=res.returncode == 0,
        detail="" if res.returncode == 0 else res.output.strip().splitlines()[-1] if res.output else "",
    )


def validate_result(
    folder: Path,
    *,
    compile: bool = False,
    bench: Callable[..., tuple[bool, str]] | None = None,
    gpu: Mapping[str, Any] | None = None,
    models: Sequence[Path] = (),
) -> ResultCheck:
    """Run every check on one result folder; failures are findings, not exceptions.

    ``bench``: the re-measurement (:func:`tuner.search.rebench.rebench`, given by the CLI: this stage does
    not import the search); None skips it. ``gpu``: run :func:`tuner.result.upstream_check.upstream_gpu_findings` with these keyword arguments
    (``upstream_bin``, ``tuned_bin``, ``log_dir``); None skips the GPU checks. ``models``: the GGUFs
    ``bench`` and ``gpu`` run, matched to a result by file name.
    """
    from tuner.plan.space import check_constraints
    from tuner.source import fetch_source

    f: list[Finding] = []
    try:
        cfg = load_config(folder)
    except TunerError as err:
        return ResultCheck(path=folder, findings=(Finding(check="schema", ok=False, detail=str(err)),))
    errs = _schema(cfg)
    f.append(Finding(check="schema", ok=not errs, detail="; ".join(errs)))
    if errs:
        return ResultCheck(path=folder, findings=tuple(f))
    patch_file = folder / "tuned.patch"
    # No tuned.patch is the export of a config whose kernels are upstream's; the re-render below must agree.
    patch = patch_file.read_text() if patch_file.is_file() else ""
    if patch_file.is_file() and not patch:
        f.append(
            Finding(
                check="patch present",
                ok=False,
                detail=f"{patch_file} is empty (`git apply` rejects it); "
                "re-export: an export with nothing to patch has no tuned.patch",
            )
        )
        return ResultCheck(path=folder, findings=tuple(f))
    f += _files_findings(folder)

    src_cfg, choice, arch = cfg["source"], cfg["choice"], cfg["target"]["arch"]
    f.append(_gate_finding(cfg))
    if "residency" in cfg:
        f.append(_residency_finding(cfg))
    f.append(_patch_hash_finding(patch, cfg))
    try:
        source = fetch_source(src_cfg["spec"])
    except TunerError as err:
        f.append(Finding(check="source", ok=False, detail=str(err)))
        return ResultCheck(path=folder, findings=tuple(f))
    f.append(_source_finding(source, src_cfg))

    violations = check_constraints(arch, source.era, dict(choice["compile"]))
    f.append(Finding(check="constraints", ok=not violations, detail="; ".join(map(str, violations))))

    if (folder / "upstream.patch").is_file():
        f += _upstream_patch_checks(folder / "upstream.patch", source.root)

    try:
        rv = render_result(source, cfg)
    except TunerError as err:
        f.append(Finding(check="re-render", ok=False, detail=str(err)))
        return ResultCheck(path=folder, findings=tuple(f))
    f += _rendered_findings(rv, patch, cfg)

    f.append(_applies_finding(patch, patch_file, source.root))

    if compile:
        f.append(_compile_check(rv))
    if bench:
        f.append(_bench_check(cfg, source, models, bench))
    if gpu is not None:
        from tuner.result.upstream_check import upstream_gpu_findings

        try:
            f += upstream_gpu_findings(folder, cfg, source, models=models, **gpu)
        except TunerError as err:  # a failed build or run is a failed check, not a crash
            f.append(Finding(check="upstream.patch on the GPU", ok=False, detail=str(err)[:1500]))
    return ResultCheck(path=folder, findings=tuple(f))


def _upstream_patch_checks(patch_file: Path, root: Path) -> list[Finding]:
    """``upstream.patch`` (the pull-request form of the rules): applies to the pristine tree, no whitespace noise."""
    from tuner.result.upstream_patch import whitespace_only_hunks

    text = patch_file.read_text()
    res = git_apply_to_copy(patch_file, root)[0] if text.strip() else None
    applies = res is not None and res.returncode == 0
    why = "empty patch" if res is None else (res.output.strip().splitlines() or [""])[-1]
    ws = whitespace_only_hunks(text)
    return [
        Finding(
            check="upstream.patch applies",
            ok=applies,
            detail="" if applies else f"git apply --check of {patch_file.name} against the pristine tree: {why}",
        ),
        Finding(
            check="upstream.patch whitespace",
            ok=not ws,
            detail="" if not ws else f"{len(ws)} whitespace-only hunk(s): {'; '.join(ws)}",
        ),
    ]


def _compile_check(rv: Any) -> Finding:
    from tuner.builder.cmake import build_variant

    tus = [p for p in rv.files if p.endswith((".cu", ".cpp"))] + list(rv.tu_headers)
    if not tus:
        # header-only changes: compile the FA TUs that include them
        tus = [p for p in rv.files]
    try:
        b = build_variant(rv, compile_only=True, objects=tus or None)
    except TunerError as err:
        return Finding(check="compile", ok=False, detail=str(err)[:1500])
    return Finding(check="compile", ok=True, detail=f"{len(tus)} TU(s) compiled in {b.seconds:.0f}s")


def _bench_check(
    cfg: Mapping[str, Any], source: Any, models: Sequence[Path], rebench: Callable[..., tuple[bool, str]]
) -> Finding:
    from tuner.targets.archs import detect_local_archs

    arch = cfg["target"]["arch"]
    local = detect_local_archs()
    if arch != "cpu" and arch not in local:
        return Finding(
            check="bench",
            ok=True,
            detail=f"skipped: needs a {arch} device, this machine has {local or 'none'} (static checks only)",
        )
    from tuner.result.upstream_check import model_for

    try:
        ok, detail = rebench(cfg, source=source, model=model_for(cfg, models))
        return Finding(check="bench", ok=ok, detail=detail)
    except TunerError as err:  # a failed build or run is a failed check, not a crash
        return Finding(check="bench", ok=False, detail=str(err)[:1500])


def validate_paths(
    paths: Iterable[Path],
    *,
    compile: bool = False,
    bench: Callable[..., tuple[bool, str]] | None = None,
    gpu: Mapping[str, Any] | None = None,
    models: Sequence[Path] = (),
) -> list[ResultCheck]:
    return [validate_result(p, compile=compile, bench=bench, gpu=gpu, models=models) for p in find_results(paths)]

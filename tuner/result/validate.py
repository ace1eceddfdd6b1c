"""``tuner validate``: check stored winners (``results/<arch>/<model>/``) still hold: schema, gate (re-judged
from its numbers), source id, byte-exact re-render of ``tuned.patch``/``upstream.patch`` and hashes, patches
apply, no local paths, constraints, presets and ``report.md``; optionally ``--compile`` and ``--bench``. A folder
from others is data (:mod:`tuner.result.checks`): only bounded regular files are read, nothing is fetched
unless ``fetch``, and a check stopped by something unexpected fails that folder only.

``tuner validate --soak N`` (:func:`soak_results`): the long-run stability test (:mod:`tuner.measure.soak`) on
stored results, each built as ``tuner validate`` re-renders it and soaked with its runtime env and llama-bench
arguments; results for a device this machine lacks are skipped with a note, as ``--bench`` does.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tuner.source
from tuner._hash import text_sha256
from tuner.builder import cmake
from tuner.errors import TunerError, UsageError
from tuner.measure.equivalence import KldStats, Thresholds, judge
from tuner.measure.soak import SoakResult, plan_chunks, run_soak
from tuner.paths import tuner_home
from tuner.plan.fa_rules import rules_from_texts
from tuner.plan.space import check_constraints
from tuner.plan.variant import RenderedVariant
from tuner.result import upstream_check
from tuner.result.checks import (
    ArgumentError,
    Finding,
    folder_problems,
    git_apply_to_copy,
    is_leftover,
    load_toml_in,
    present_in,
    read_bytes_in,
    read_text_in,
)
from tuner.result.export import PRESETS_FILE, baked_runtime, export_render
from tuner.result.upstream_check import model_for
from tuner.result.upstream_patch import render_upstream_patch, whitespace_only_hunks
from tuner.source.spec import Source
from tuner.targets import archs
from tuner.targets.archs import load_arch

logger = logging.getLogger(__name__)

REQUIRED: dict[str, type] = {"schema": int, **dict.fromkeys(("source", "hashes", "target", "model", "choice"), dict)}
REQUIRED |= {"defines": dict, "buckets": list, "gate": dict}
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
    """Result folders (holding an entry named config.toml, of any kind: the checks say what is wrong with
    it) under each path, and folders left by an interrupted export (``.OUT.tmp-*``); links not followed."""
    out: list[Path] = []
    for p in paths:
        if not p.exists():
            raise UsageError(f"{p} does not exist. Pass a result folder or a folder of results (default results/).")
        if present_in(p, "config.toml") or is_leftover(p.name):
            out.append(p)
            continue
        found = []
        for dirpath, dirnames, filenames in os.walk(p):  # followlinks=False: a link out is not walked
            d = Path(dirpath)
            if d != p and (is_leftover(d.name) or "config.toml" in filenames or "config.toml" in dirnames):
                found.append(d)
                dirnames[:] = [] if is_leftover(d.name) else dirnames
        out += sorted(found)
    return out


def render_result(source: Source, cfg: Mapping[str, Any]) -> RenderedVariant:
    """The result's config rendered on ``source`` as it was exported (variant, compile values, baked FA rules;
    an empty patch where that changes nothing from upstream)."""
    choice = cfg["choice"]
    return export_render(
        source,
        cfg["target"]["arch"],
        choice["variant"],
        compile_values=dict(choice["compile"]),
        baked=baked_runtime(rules_from_texts(choice["fa_rules"]), dict(choice["fa_env"])),
    )


def schema_errors(cfg: Mapping[str, Any]) -> list[str]:
    """What ``config.toml``'s ``cfg`` lacks or has of the wrong type for its schema version (empty: none)."""
    errs = []
    required = dict(REQUIRED)
    if cfg.get("schema") in (2, 3):  # screen -> compose -> tune -> confirm: confirmed points instead of buckets
        del required["buckets"]
        required["points"] = list
    if cfg.get("schema") == 3:  # [gate] became the output-equivalence gate; test-backend-ops moved to [op_check]
        required["op_check"] = dict
    # TOML has no null: a key that is None here is missing
    fields = [(repr(k), cfg.get(k), t) for k, t in required.items()]
    for sec, keys in REQUIRED_SUB.items():
        fields += [
            (f"{sec}.{k}", cfg[sec].get(k) if isinstance(cfg.get(sec), dict) else None, t) for k, t in keys.items()
        ]
    for name, v, t in fields:
        if v is None:
            errs.append(f"missing key {name}")
        elif not isinstance(v, t):
            errs.append(f"{name} should be a {t.__name__}, not {type(v).__name__}")
    errs += _narrowed_errors(cfg.get("choice"))
    src = cfg.get("source")
    if isinstance(src, dict) and src.get("era") not in (None, "mma", "rocwmma"):
        errs.append(f"source.era must be 'mma' or 'rocwmma', not {src['era']!r}")
    return errs


def _narrowed_errors(choice: object) -> list[str]:
    """``choice.narrowed_rules`` (optional: results before narrowing lack it): a table of the rules the confirm
    narrowed, each one an exported rule of ``choice.fa_rules`` (a narrowed rule is exported, its old form not)."""
    if not isinstance(choice, dict) or "narrowed_rules" not in choice:
        return []
    nr = choice["narrowed_rules"]
    if not isinstance(nr, dict):
        return [f"choice.narrowed_rules should be a dict, not {type(nr).__name__}"]
    exported = set(choice.get("fa_rules") or [])
    return [f"choice.narrowed_rules names {t!r}, which is not one of choice.fa_rules" for t in nr if t not in exported]


def _failed_why(check: str, ok: bool, why: str) -> Finding:
    return Finding(check=check, ok=ok, detail="" if ok else why)


def _patch_hash_finding(patch: str, cfg: Mapping[str, Any]) -> Finding:
    """tuned.patch hashes to what config.toml records."""
    got, want = text_sha256(patch), cfg["hashes"]["patch_sha256"]
    why = f"sha256(tuned.patch)={got[:12]}… but config.toml records {want[:12]}… (stale hash or edited patch)"
    return _failed_why("patch hash", got == want, why)


def _source_finding(source: Source, src_cfg: Mapping[str, object]) -> Finding:
    """The fetched source is the one (id and era) config.toml names."""
    ok = source.source_id == src_cfg["source_id"] and source.era == src_cfg["era"]
    why = f"{src_cfg['spec']} is {source.source_id} era {source.era}; config.toml says "
    why += f"{src_cfg['source_id']} era {src_cfg['era']}"
    return _failed_why("source", ok, why)


def _residency_finding(cfg: Mapping[str, Any]) -> Finding:
    """``[residency]`` (the search's graph-split and buffer probe): a failing final config was not exported."""
    r = cfg["residency"]
    verdict = str(r.get("verdict"))
    if verdict == "fail":
        rules = list(r.get("rejected_rules", []))
        ok = "rejected_rules" in r and not cfg["choice"]["fa_rules"]
        done = f"the final config failed the residency check and upstream's selection was exported (rejected rules: {rules or 'none'})"
        why = f"[residency] says the exported config failed: {' '.join(r.get('reasons', []))}"
        return Finding(check="residency", ok=ok, detail=done if ok else why)
    p = r.get("final") or r.get("upstream") or {}
    detail = f"{verdict}: decode graph splits {p.get('splits_tg', '?')}"
    if "layers_total" in p:
        detail += f", {p['layers_offloaded']}/{p['layers_total']} layers on the GPU"
    return Finding(check="residency", ok=verdict in ("pass", "not judged"), detail=detail)


def _gate_finding(cfg: Mapping[str, Any]) -> Finding:
    """The output-equivalence gate: recorded as passed (its numbers re-judged), or not needed for upstream's config.
    A result exported before the gate (schema < 3) fails where this machine can run its arch (re-export it) and
    is reported as not run where it cannot: its numbers are never made up."""
    check = "output-equivalence gate"
    arch = cfg["target"]["arch"]
    if cfg["schema"] < 3:
        local = archs.detect_local_archs()
        if arch != "cpu" and arch not in local:
            why = f"gate not run: needs a {arch} GPU (this machine has {', '.join(local) or 'none'}); the result was "
            return Finding(check=check, ok=True, detail=why + "exported before the gate existed")
        why = "exported before the output-equivalence gate existed (config.toml schema < 3): rerun `tuner search` "
        return Finding(check=check, ok=False, detail=why + "with its study and `tuner export` it again")
    g = cfg["gate"]
    if g.get("verdict") == "not needed":
        choice = cfg["choice"]
        upstream = not choice.get("fa_rules") and not choice.get("compile") and choice.get("tune_trial") is None
        done = "not needed: the exported config is upstream's"
        why = "[gate] says 'not needed' but the choice has rules, compile values or a tune trial"
        return Finding(check=check, ok=upstream, detail=done if upstream else why)
    if g.get("verdict") != "pass" or not g.get("checks"):
        why = f"[gate] verdict is {g.get('verdict')!r} with {len(g.get('checks', []))} check(s); only a passing gate "
        return Finding(check=check, ok=False, detail=why + "may be exported")
    return _rejudged(g, check)


def _rejudged(g: Mapping[str, Any], check: str) -> Finding:
    """Every recorded check judged again from its numbers and the recorded thresholds (an edited verdict fails)."""
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


def _rendered_findings(rv: RenderedVariant, patch: str, cfg: Mapping[str, Any]) -> list[Finding]:
    """Re-rendering config.toml reproduces tuned.patch byte for byte, and the recorded CMake defines."""
    same = rv.patch == patch
    why = (
        "tuned.patch is missing, but config.toml renders a patch that changes upstream's kernels"
        if not patch
        else "re-rendering config.toml gives no patch (upstream's kernels), but the folder has a tuned.patch"
        if not rv.patch
        else "re-rendering config.toml does not reproduce tuned.patch byte for byte (a value in config.toml or the patch was edited)"
    )
    dsha = text_sha256(json.dumps(dict(rv.defines), sort_keys=True))
    ok = dsha == cfg["hashes"]["defines_sha256"] and dict(rv.defines) == dict(cfg["defines"])
    return [
        _failed_why("re-render", same, why),
        _failed_why("defines", ok, "rendered CMake defines differ from config.toml"),
    ]


_LOCAL_PATH = re.compile(
    r"""(?:^|[\s"'=(`:])(/(?:home|root|tmp|work|Users|mnt|media|var|opt|srv|scratch|data)/[^\s"'`)]*)""", re.M
)


def _files_findings(folder: Path) -> list[Finding]:
    """The preset file is a CMakeUserPresets.json that inherits the tree's presets, report.md is there (an
    export writes it last of its files), and no exported text names a local absolute path (an export is read
    on other machines)."""
    out = []
    user, old = folder / PRESETS_FILE, folder / "CMakePresets.json"
    if not (folder / "report.md").is_file():
        why = "report.md is missing: an incomplete export (rerun `tuner export`, which writes it)"
        out.append(Finding(check="report", ok=False, detail=why))
    why = (
        f"{old.name} would replace llama.cpp's own preset file (whose base/release presets the tuned preset inherits); "
        f"re-export to get {PRESETS_FILE}"
        if old.is_file()
        else f"{PRESETS_FILE} is missing"
    )
    out.append(_failed_why("presets", user.is_file() and not old.is_file(), why))
    hits = []
    for f in sorted(folder.iterdir()):
        if f.is_file() and f.suffix in (".toml", ".md", ".env", ".patch", ".json"):
            text = read_bytes_in(folder, f.name).decode(errors="replace")
            hits += [f"{f.name}: {m}" for m in _LOCAL_PATH.findall(text)]
    out.append(Finding(check="no local paths", ok=not hits, detail=_first(hits, 3)))
    return out


def _first(items: Sequence[str], n: int) -> str:
    return "; ".join(items[:n]) + (f" (and {len(items) - n} more)" if len(items) > n else "")


def _applies_finding(patch: str, root: Path) -> Finding:
    """tuned.patch applies to pristine copies of the files it touches (none is exported when it would be empty)."""
    if not patch:
        return Finding(check="patch applies", ok=True, detail="no tuned.patch: the kernels are upstream's")
    try:
        res, _ = git_apply_to_copy(patch, root)
    except TunerError as err:
        return Finding(check="patch applies", ok=False, detail=str(err))
    why = res.output.strip().splitlines()[-1] if res.output and res.returncode != 0 else ""
    return _failed_why("patch applies", res.returncode == 0, why)


def validate_result(
    folder: Path,
    *,
    compile: bool = False,
    bench: Callable[..., tuple[bool, str]] | None = None,
    gpu: Mapping[str, Path | None] | None = None,
    models: Sequence[Path] = (),
    fetch: bool = False,
) -> ResultCheck:
    """Run every check on one result folder; failures are findings, not exceptions. ``bench``: the
    re-measurement (:func:`tuner.search.rebench.rebench`, passed in: result does not import search); ``gpu``: the
    keyword arguments of :func:`tuner.result.upstream_check.upstream_gpu_findings`; None skips either. ``models``:
    the GGUFs they run, matched by file name. ``fetch``: get a source the cache lacks (else a failed check)."""

    def run() -> ResultCheck:
        f: list[Finding] = []
        if is_leftover(folder.name):
            why = f"{folder.name} is a leftover of an interrupted export (its staging folder, never renamed into "
            why += "place); it is not a result: remove it, or run the export again"
            return ResultCheck(path=folder, findings=(Finding(check="leftover", ok=False, detail=why),))
        f.append(contents_finding(folder))
        if not f[-1].ok:
            return ResultCheck(path=folder, findings=tuple(f))
        try:
            cfg = load_toml_in(folder, "config.toml")
        except TunerError as err:
            return ResultCheck(path=folder, findings=(Finding(check="schema", ok=False, detail=str(err)),))
        errs = schema_errors(cfg)
        f.append(Finding(check="schema", ok=not errs, detail="; ".join(errs)))
        if errs:
            return ResultCheck(path=folder, findings=tuple(f))
        patch_file = folder / "tuned.patch"
        # No tuned.patch is the export of a config whose kernels are upstream's; the re-render below must agree.
        patch = read_text_in(folder, patch_file.name) if patch_file.is_file() else ""
        if patch_file.is_file() and not patch:
            why = f"{patch_file} is empty (`git apply` rejects it); re-export: an export with nothing to patch has "
            f.append(Finding(check="patch present", ok=False, detail=why + "no tuned.patch"))
            return ResultCheck(path=folder, findings=tuple(f))
        f += _files_findings(folder)

        src_cfg, choice, arch = cfg["source"], cfg["choice"], cfg["target"]["arch"]
        f.append(_gate_finding(cfg))
        if "residency" in cfg:
            f.append(_residency_finding(cfg))
        f.append(_patch_hash_finding(patch, cfg))
        try:
            source = cached_or_fetched(src_cfg["spec"], fetch)
        except TunerError as err:
            f.append(Finding(check="source", ok=False, detail=str(err)))
            return ResultCheck(path=folder, findings=tuple(f))
        f.append(_source_finding(source, src_cfg))

        violations = check_constraints(arch, source.era, dict(choice["compile"]))
        f.append(Finding(check="constraints", ok=not violations, detail="; ".join(map(str, violations))))

        if (folder / "upstream.patch").is_file():
            f += _upstream_patch_checks(folder / "upstream.patch", source.root)
            f.append(_upstream_rerender_finding(read_text_in(folder, "upstream.patch"), cfg, source))

        try:
            rv = render_result(source, cfg)
        except TunerError as err:
            f.append(Finding(check="re-render", ok=False, detail=str(err)))
            return ResultCheck(path=folder, findings=tuple(f))
        f += _rendered_findings(rv, patch, cfg)

        f.append(_applies_finding(patch, source.root))

        if compile:  # tuner's own render (rv), never the folder's tuned.patch
            f.append(_compile_check(rv))
        if bench:
            f.append(_bench_check(cfg, source, models, bench))
        if gpu is not None:
            f += _gpu_checks(folder, cfg, source, f, models, gpu)
        return ResultCheck(path=folder, findings=tuple(f))

    return guarded(folder, run)


def guarded(folder: Path, run: Callable[[], ResultCheck]) -> ResultCheck:
    """``run()``, or, where a folder's content stops the checks with an error, one failed check naming the
    folder (the traceback goes to the debug log): one bad folder never hides the others' findings."""
    try:
        return run()
    except ArgumentError:  # bad command-line input: exit 2 for the whole command
        raise
    except Exception as err:  # data from others may break any check in a way not foreseen
        logger.debug("checks of %s stopped", folder, exc_info=True)
        what = str(err) if isinstance(err, TunerError) else f"{type(err).__name__}: {err}"
        why = f"the checks of {folder} stopped: {what[:600]} (a value of the wrong type or shape?)"
        return ResultCheck(path=folder, findings=(Finding(check="readable", ok=False, detail=why),))


def contents_finding(folder: Path) -> Finding:
    """The folder holds only folders and regular files of bounded size (nothing else is read)."""
    bad = folder_problems(folder)
    why = f"a result folder holds only folders and regular files; found {_first(bad, 5)}"
    return _failed_why("folder contents", not bad, why)


def cached_or_fetched(spec: str, fetch: bool) -> Source:
    """The source a folder's SPEC names: from the cache only, unless ``fetch``; TunerError where it is bad, not
    cached (without ``fetch``) or the fetch failed."""
    if fetch:
        return tuner.source.fetch_source(spec)
    hit = tuner.source.cached_source(spec)
    if hit is None:
        raise TunerError(
            f"{spec} is not in the source cache, and validate fetches nothing a folder names unless asked: run "
            f"`tuner source fetch '{spec}'` if you trust that source, or pass --fetch"
        )
    return hit


def _gpu_checks(
    folder: Path,
    cfg: Mapping[str, object],
    source: Source,
    static: Sequence[Finding],
    models: Sequence[Path],
    gpu: Mapping[str, Path | None],
) -> list[Finding]:
    """``--gpu``: builds and runs the folder's upstream.patch, so only where it is byte for byte what tuner
    renders from config.toml (:func:`_upstream_rerender_finding`)."""
    rerender = next((x for x in static if x.check == "upstream.patch re-render"), None)
    if (folder / "upstream.patch").is_file() and (rerender is None or not rerender.ok):
        why = "not built: upstream.patch is not what tuner renders from config.toml, and validate compiles no code "
        why += "from a folder that tuner did not render"
        return [Finding(check="upstream.patch on the GPU", ok=False, detail=why)]
    try:
        return list(upstream_check.upstream_gpu_findings(folder, cfg, source, models=models, **gpu))
    except TunerError as err:  # a failed build or run is a failed check, not a crash
        return [Finding(check="upstream.patch on the GPU", ok=False, detail=str(err)[:1500])]


def _upstream_patch_checks(patch_file: Path, root: Path) -> list[Finding]:
    """``upstream.patch`` (the pull-request form of the rules): applies to the pristine tree, no whitespace noise."""
    text = read_text_in(patch_file.parent, patch_file.name)
    try:
        res = git_apply_to_copy(text, root)[0] if text.strip() else None
        why = "empty patch" if res is None else (res.output.strip().splitlines() or [""])[-1]
    except TunerError as err:
        res, why = None, str(err)
    applies = res is not None and res.returncode == 0
    ws = whitespace_only_hunks(text)
    why = f"git apply --check of {patch_file.name} against the pristine tree: {why}"
    return [
        _failed_why("upstream.patch applies", applies, why),
        _failed_why("upstream.patch whitespace", not ws, f"{len(ws)} whitespace-only hunk(s): {'; '.join(ws)}"),
    ]


_NOTE_LINE = re.compile(r"^\+ *// ?(.*)$")


def _upstream_rerender_finding(text: str, cfg: Mapping[str, Any], source: Source) -> Finding:
    """``upstream.patch`` is byte for byte what tuner renders from config.toml's rules and arch, with the
    comment note the patch carries (the only text an export adds that config.toml does not record). A note
    with a backslash or a control character is refused: it could carry a ``//`` comment into code."""
    check = "upstream.patch re-render"
    lines = text.splitlines()
    at = next((i for i, ln in enumerate(lines) if re.match(r"^\+ *if \(", ln)), None)
    notes: list[str] = []
    for ln in reversed(lines[:at] if at is not None else []):
        m = _NOTE_LINE.match(ln)
        if m is None:
            break
        notes.insert(0, m.group(1))
    note = "\n".join(" ".join(para.split("\n")) for para in "\n".join(notes).split("\n\n"))
    if any(c == "\\" or (ord(c) < 32 and c != "\n") for c in note):
        return Finding(check=check, ok=False, detail="the patch's comment has a backslash or a control character")
    try:
        want = render_upstream_patch(
            source, rules_from_texts(list(cfg["choice"]["fa_rules"])), load_arch(cfg["target"]["arch"]), note=note
        )
    except TunerError as err:
        return Finding(check=check, ok=False, detail=str(err))
    why = "upstream.patch is not what tuner renders from config.toml's rules (an edited patch or value)"
    return _failed_why(check, want == text, why)


def _compile_check(rv: RenderedVariant) -> Finding:
    tus = [p for p in rv.files if p.endswith((".cu", ".cpp"))] + list(rv.tu_headers)
    if not tus:  # header-only changes: compile the FA TUs that include them
        tus = list(rv.files)
    try:
        b = cmake.build_variant(rv, compile_only=True, objects=tus or None)
    except TunerError as err:
        return Finding(check="compile", ok=False, detail=str(err)[:1500])
    return Finding(check="compile", ok=True, detail=f"{len(tus)} TU(s) compiled in {b.seconds:.0f}s")


def _bench_check(
    cfg: Mapping[str, Any], source: Source, models: Sequence[Path], rebench: Callable[..., tuple[bool, str]]
) -> Finding:
    arch = cfg["target"]["arch"]
    local = archs.detect_local_archs()
    if arch != "cpu" and arch not in local:
        why = f"skipped: needs a {arch} device, this machine has {local or 'none'} (static checks only)"
        return Finding(check="bench", ok=True, detail=why)
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
    gpu: Mapping[str, Path | None] | None = None,
    models: Sequence[Path] = (),
    fetch: bool = False,
) -> list[ResultCheck]:
    """:func:`validate_result` of each result folder under ``paths`` (:func:`find_results`), each on its own."""
    return [
        validate_result(p, compile=compile, bench=bench, gpu=gpu, models=models, fetch=fetch)
        for p in find_results(paths)
    ]


def _soak_one(folder: Path, cfg: dict[str, Any], n_tokens: int, model: Path) -> SoakResult:
    choice, arch = cfg["choice"], cfg["target"]["arch"]
    build = cmake.build_variant(
        render_result(tuner.source.fetch_source(cfg["source"]["spec"]), cfg), targets=("llama-bench",)
    )
    # run.env's llama-bench line: results are measured and exported with FlashAttention on.
    args = ["-fa", "1", *[str(a) for a in choice.get("bench_args", [])]]
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log_dir = tuner_home() / "runs" / f"soak-{arch}-{folder.name}-{stamp}"
    return run_soak(build.bin_dir, model, n_tokens, dict(choice["runtime_env"]), args, log_dir)


def _find_model(cfg: dict[str, Any], folder: Path) -> Path | None:
    """The result's model file (``[model] file``, a bare file name) in the result folder, ``$TUNER_HOME/models``
    or the current directory."""
    name = str(cfg.get("model", {}).get("file", ""))
    if not name or Path(name).name != name:
        return None
    return next((d / name for d in (folder, tuner_home() / "models", Path.cwd()) if (d / name).is_file()), None)


def soak_results(
    paths: Iterable[Path], n_tokens: int, *, model: Path | None = None, echo: Callable[[str], None] = print
) -> int:
    """Soak every result under ``paths`` that this machine can run; returns how many failed. UsageError, before
    anything runs: ``n_tokens`` <= 0, a ``--model`` that does not exist, a config.toml that fails its schema, or a
    result whose model is not here."""
    plan_chunks(n_tokens)
    if model is not None and not Path(model).is_file():
        raise UsageError(
            f"--model {model} does not exist. Pass the GGUF the result was measured with "
            "(`tuner model synth --like tiny -o tiny.gguf` makes the CPU result's tiny model)."
        )
    local, todo = None, []
    for folder in find_results(paths):
        cfg = load_toml_in(folder, "config.toml")
        if errs := schema_errors(cfg):  # a folder someone else wrote: nothing of it is read before this check
            raise UsageError(
                f"{folder}/config.toml is not a result tuner can soak ({'; '.join(errs[:3])}); "
                f"`tuner validate {folder}` lists what is wrong with it."
            )
        arch = cfg["target"]["arch"]
        if arch != "cpu":
            local = archs.detect_local_archs() if local is None else local
            if arch not in local:
                echo(f"skip {folder}: soak needs a {arch} device, this machine has {local or 'none'}")
                continue
        m = Path(model) if model is not None else _find_model(cfg, folder)
        if m is None:
            raise UsageError(
                f"{folder} was measured with {cfg.get('model', {}).get('file', 'an unnamed model')}, which is "
                "not in the result folder, $TUNER_HOME/models or the current directory, so it cannot be "
                "soaked here. Pass --model PATH (for a CPU result, `tuner model synth --like tiny -o "
                "tiny.gguf` makes the tiny model)."
            )
        todo.append((folder, cfg, m))
    failed = 0
    for folder, cfg, m in todo:
        res = _soak_one(folder, cfg, n_tokens, m)
        echo(f"{'ok ' if res.passed else 'FAIL'} soak {folder}: {res.summary}")
        echo(f"     log: {res.log_file}")
        failed += not res.passed
    return failed

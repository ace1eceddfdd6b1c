"""``tuner validate`` of an exported sweep table (a folder with ``table.toml`` of kind ``sweep table``).

Static checks (manifest, files, hashes, source, recomposed evidence, byte-identical re-render, ``git apply``, the
host-only lookup against :func:`tuner.sweep.table.match_table`) and, with ``--gpu``, the patched build's
test-backend-ops and launched kernels. The folder is data (:mod:`tuner.result.checks`): evidence is decompressed
only once it hashes to its record, and only tuner's own re-render is ever compiled. See docs/sweep.md.

The launched kernels (:func:`selected_kernels`): the patched tree has no kernel log, so fa-bench runs stored cells
of each kept entry under Nsight Compute and the launched kernels must be the table's (:func:`match_table`); skipped
without ``ncu``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner import _run
from tuner._hash import file_sha256, text_sha256
from tuner.builder import cmake
from tuner.builder.carry import pack_build, unpack_build
from tuner.errors import TunerError, UsageError
from tuner.measure import fa_bench, gate
from tuner.measure.fa_bench import fa_bench_cases
from tuner.measure.gate import params_for_shapes
from tuner.plan import render
from tuner.plan.variant import RenderedVariant
from tuner.result import upstream_check
from tuner.result.checks import (
    ArgumentError,
    Finding,
    FolderError,
    git_apply_to_copy,
    is_leftover,
    load_toml_in,
    present_in,
    read_text_in,
)
from tuner.result.upstream_check import KERNEL_FUNCTIONS, gpu_skip, parse_ncu_csv
from tuner.result.upstream_patch import whitespace_only_hunks
from tuner.result.validate import ResultCheck, cached_or_fetched, contents_finding, guarded
from tuner.source import Source
from tuner.sweep import export, merge
from tuner.sweep.confirm import render_kept
from tuner.sweep.grid import Cell
from tuner.sweep.live import bench_shape
from tuner.sweep.table import TableRule, harness_source, match_table
from tuner.targets import archs

Kept = export.Evidence | merge.Merged
"""A table's recomposed evidence, or a merged table's view of its parts': what the patch checks read."""
GpuArg = str | Path | None
"""A ``gpu`` value of ``tuner validate --gpu``: ``log_dir``, ``pack`` or ``from_pack``."""

REQUIRED: dict[str, dict[str, type[object]]] = {
    "source": {"spec": str, "source_id": str, "commit": str, "era": str},
    "target": {"arch": str, "measured_on": str},
    "table": dict.fromkeys(
        ("fa_rules", "mmq_choices", "reported", "composed_fa_rules", "composed_mmq_choices", "models"), list
    ),
    "coverage": dict.fromkeys(
        (
            "shapes",
            "n_kv_points",
            "cells",
            "cells_with_verdict",
            "rounds",
            "mmq_points",
            "models_measured",
            "kept",
            "reported",
        ),
        int,
    ),
    "hashes": {"patch_sha256": str, "evidence": dict},
    "files": {"plots": list, "evidence": list},
}


def find_tables(paths: Iterable[Path]) -> list[Path]:
    """Sweep table folders under each path (a merged table's parts are checked by it, not again)."""
    out: list[Path] = []
    for p in paths:
        if not p.exists():
            raise UsageError(f"{p} does not exist. Pass a result folder or a folder of results (default results/).")
        cands = [p] if present_in(p, export.MANIFEST) else _manifests_under(p)
        kinds = {c: _kind(c) for c in cands}
        merged = [c for c, k in kinds.items() if k == merge.KIND]
        out += [
            c
            for c, k in kinds.items()
            if k == merge.KIND or (k == export.KIND and not any(m in c.parents for m in merged))
        ]
    return out


def _manifests_under(p: Path) -> list[Path]:
    """Folders under ``p`` with a table.toml; links not followed, export leftovers skipped."""
    out = []
    for dirpath, dirnames, filenames in os.walk(p):
        dirnames[:] = [d for d in dirnames if not is_leftover(d)]
        if export.MANIFEST in filenames or export.MANIFEST in dirnames:
            out.append(Path(dirpath))
    return sorted(out)


def _kind(folder: Path) -> str | None:
    """The manifest's kind; a manifest that cannot be read as data counts as a table (its checks say why)."""
    try:
        kind = load_toml_in(folder, export.MANIFEST).get("kind")
    except FolderError:
        return export.KIND
    return kind if isinstance(kind, str) else None


def _fail(check: str, detail: str) -> Finding:
    return Finding(check=check, ok=False, detail=detail)


_NOT_OURS = "and validate compiles no code from a folder that tuner did not render"


def _schema(m: Mapping[str, Any], required: Mapping[str, Mapping[str, type[object]]] = REQUIRED) -> list[str]:
    errs = []
    if m.get("schema") != export.SCHEMA:
        errs.append(f"schema is {m.get('schema')!r}; this tuner reads schema {export.SCHEMA}")
    for sec, keys in required.items():
        if not isinstance(m.get(sec), dict):
            errs.append(f"missing table [{sec}]")
            continue
        for k, t in keys.items():
            v = m[sec].get(k)
            if v is None:
                errs.append(f"missing key {sec}.{k}")
            elif not isinstance(v, t) or (t is int and isinstance(v, bool)):
                errs.append(f"{sec}.{k} should be a {t.__name__}, not {type(v).__name__}")
            elif isinstance(v, list) and not all(isinstance(x, str) for x in v):
                errs.append(f"{sec}.{k} should be a list of strings")
    return errs


def _present(folder: Path, want: Iterable[str]) -> Finding:
    """The ``files`` finding: each of ``want`` is a non-empty file in ``folder``."""
    missing = [w for w in want if not _inside(w) or not (folder / w).is_file() or not (folder / w).stat().st_size]
    return Finding(check="files", ok=not missing, detail="missing or empty: " + ", ".join(missing) if missing else "")


def _inside(rel: str) -> bool:
    parts = Path(rel).parts
    return bool(parts) and not Path(rel).is_absolute() and ".." not in parts


def _files(folder: Path, m: Mapping[str, Any]) -> list[Finding]:
    f = [_present(folder, ["PR.md", "report.md", *m["files"]["plots"], *m["files"]["evidence"]])]
    recorded = dict(m["hashes"]["evidence"])
    have = {p.name for p in (folder / "evidence").glob("*.xz")} if (folder / "evidence").is_dir() else set()
    bad = [n for n in sorted(recorded) if n in have and file_sha256(folder / "evidence" / n) != recorded[n]]
    bad += [f"{n} (not in the manifest)" for n in sorted(have - set(recorded))]
    bad += [f"{n} (missing)" for n in sorted(set(recorded) - have)]
    if "confirm.sqlite3.xz" not in recorded or "sweep.sqlite3.xz" not in recorded:
        bad.append("the manifest lists no sweep.sqlite3.xz or confirm.sqlite3.xz")
    why = "sha256 differs or file unexpected: " + "; ".join(bad) if bad else ""
    return [*f, Finding(check="evidence", ok=not bad, detail=why)]


def _patch_hash(patch: str | None, m: Mapping[str, Any]) -> Finding:
    want = m["hashes"]["patch_sha256"]
    kept = bool(m["table"]["fa_rules"] or m["table"]["mmq_choices"])
    if not want:
        ok = patch is None and not kept
        why = (
            "empty table: no entry was kept end to end, so there is no upstream.patch"
            if ok
            else "the manifest records no patch, but the folder has an upstream.patch"
            if patch is not None
            else "the manifest records no patch but lists kept entries"
        )
        return Finding(check="patch hash", ok=ok, detail=why)
    if patch is None:
        return _fail("patch hash", "the manifest records a patch, but upstream.patch is missing")
    ok = text_sha256(patch) == want
    why = f"sha256(upstream.patch)={text_sha256(patch)[:12]}… but table.toml records {want[:12]}… (edited patch or stale hash)"
    return Finding(check="patch hash", ok=ok, detail="" if ok else why)


def _recomposed(ev: export.Evidence, m: Mapping[str, Any]) -> Finding:
    """The manifest's table and coverage equal what the evidence recomposes to (first few differences)."""
    got = export.manifest_table(ev)
    diffs = []
    for sec in ("table", "coverage"):
        for k, v in got[sec].items():
            if m[sec].get(k) != v:
                diffs.append(f"{sec}.{k}: table.toml has {m[sec].get(k)!r}, the evidence gives {v!r}")
    t = ev.table
    if m["target"]["arch"] != t.arch.name:
        diffs.append(f"target.arch is {m['target']['arch']!r}; the sweep was measured for {t.arch.name}")
    eras = {str(r.get("era")) for r in ev.models if r.get("era")}
    if eras - {m["source"]["era"]}:
        diffs.append(f"the confirmation ran on era {', '.join(sorted(eras))}, source.era is {m['source']['era']!r}")
    detail = (
        f"{len(got['table']['fa_rules'])} FlashAttention entr(ies) and {len(got['table']['mmq_choices'])} MMQ "
        f"choice(s) kept of {got['coverage']['kept'] + got['coverage']['reported']}, from {got['coverage']['cells']} cells"
    )
    return Finding(check="recomposed from evidence", ok=not diffs, detail="; ".join(diffs[:4]) if diffs else detail)


def _lookup(patched: str, ev: Kept) -> Finding:
    """The C++ lookup of the patched fattn.cu against :func:`match_table` at every stored cell."""
    gxx = shutil.which("g++")
    if gxx is None:
        return Finding(
            check="table lookup", ok=True, detail="skipped: g++ not on PATH (host-only compile of the lookup)"
        )
    kvs = sorted({c.shape.kv for c in ev.table.cells} | {r.kv for r in ev.confirmed.kept_rules})
    queries = [
        (c.shape.D, c.shape.gqa, c.shape.kv, c.shape.ne1, c.n_kv, "VEC" in c.legal, opt)
        for c in ev.table.cells
        for opt in (True, False)
    ]
    with tempfile.TemporaryDirectory(prefix="tuner-lookup-") as tmp:
        src, exe = Path(tmp) / "lookup.cpp", Path(tmp) / "lookup"
        try:
            src.write_text(harness_source(patched, kvs))
        except TunerError as err:
            return _fail("table lookup", str(err))
        try:
            cc = _run.run(
                [gxx, "-std=c++17", "-O1", "-o", exe, src], check=False, timeout=300, what="the table lookup's compile"
            )
        except TunerError as err:  # the timeout
            return _fail("table lookup", f"the lookup did not compile: {err}")
        if cc.returncode != 0:
            return _fail("table lookup", f"the lookup does not compile: {cc.output.strip()[-400:]}")
        text = "".join(
            f"{D} {g} {kvs.index(kv)} {kvs.index(kv)} {n1} {n} {int(v)} {int(o)}\n" for D, g, kv, n1, n, v, o in queries
        )
        try:
            got = _run.run([exe], input=text, check=False, timeout=300, what="the table lookup").output.split()
        except TunerError as err:  # the timeout
            return _fail("table lookup", f"the lookup did not answer: {err}")
    rules = ev.confirmed.kept_rules
    bad = []
    for (D, gqa, kv, ne1, n, vec, opt), g in zip(queries, got + ["?"] * (len(queries) - len(got))):
        want = match_table(
            rules, D=D, gqa=gqa, type_k=kv, type_v=kv, ne1=ne1, n_kv=n, can_use_vector_kernel=vec, gqa_opt_applies=opt
        )
        if g != (want or "NONE"):
            bad.append(f"D{D} gqa{gqa} {kv} ne1 {ne1} n_kv {n} (gqa opt {opt}): C++ {g}, Python {want or 'NONE'}")
    detail = f"C++ lookup and Python matcher agree at {len(queries)} calls ({len(ev.table.cells)} stored cells)"
    return Finding(check="table lookup", ok=not bad, detail="; ".join(bad[:3]) if bad else detail)


def _patch_findings(folder: Path, patch: str | None, ev: Kept, source: Source) -> list[Finding]:
    try:
        want = render_kept(source.root, ev.confirmed.kept_rules, ev.confirmed.kept_mmq, ev.table.arch)
    except TunerError as err:
        return [_fail("re-render", str(err))]
    same = want == (patch or "")
    why = "re-rendering the kept entries on the pristine tree does not reproduce upstream.patch byte for byte"
    out = [Finding(check="re-render", ok=same, detail="" if same else why)]
    if patch is None:
        return out
    try:
        res, _ = git_apply_to_copy(patch, source.root)
        ok, last = res.returncode == 0, (res.output.strip().splitlines() or [""])[-1]
    except TunerError as err:
        ok, last = False, str(err)
    why = "" if ok else f"git apply against the pristine tree: {last}"
    out.append(Finding(check="upstream.patch applies", ok=ok, detail=why))
    ws = whitespace_only_hunks(patch)
    out.append(Finding(check="upstream.patch whitespace", ok=not ws, detail="; ".join(ws)))
    if not ev.confirmed.kept_rules:
        return out
    if not (same and ok):  # the lookup compiles code: only tuner's own render, and only the one the folder ships
        why = "not run: upstream.patch is not tuner's re-render of the kept entries (or does not apply), "
        return [*out, _fail("table lookup", why + _NOT_OURS)]
    res, new = git_apply_to_copy(want, source.root, check=False)
    fattn = next((t for p, t in new.items() if p.endswith("fattn.cu")), None)
    if res.returncode == 0 and fattn is not None:
        out.append(_lookup(fattn, ev))
    return out


def validate_table(folder: Path, *, gpu: Mapping[str, GpuArg] | None = None, fetch: bool = False) -> ResultCheck:
    """Every check of one sweep table folder, or of a merged one; failures are findings, not exceptions."""

    def run() -> ResultCheck:
        contents = contents_finding(folder)
        if not contents.ok:
            return ResultCheck(path=folder, findings=(contents,))
        if _kind(folder) == merge.KIND:
            return validate_merged(folder, gpu=gpu, fetch=fetch)
        f, _ = _table_findings(folder, gpu=gpu, fetch=fetch)
        return ResultCheck(path=folder, findings=tuple(f))

    return guarded(folder, run)


def _source(m: Mapping[str, Any], fetch: bool) -> tuple[Source | None, Finding]:
    try:
        source = cached_or_fetched(m["source"]["spec"], fetch)
    except TunerError as err:
        return None, _fail("source", str(err))
    same = (source.source_id, source.era) == (m["source"]["source_id"], m["source"]["era"])
    return source, Finding(
        check="source", ok=same, detail="" if same else f"{source.spec} is {source.source_id} era {source.era}"
    )


def _table_findings(
    folder: Path, *, gpu: Mapping[str, GpuArg] | None, fetch: bool
) -> tuple[list[Finding], export.Evidence | None]:
    """One table's findings, and its recomposed evidence (None where it could not be recomposed)."""
    f: list[Finding] = []
    try:
        m = load_toml_in(folder, export.MANIFEST)
    except FolderError as err:
        return [_fail("schema", str(err))], None
    errs = _schema(m)
    f.append(Finding(check="schema", ok=not errs, detail="; ".join(errs) if errs else "sweep table"))
    if errs:
        return f, None
    f += _files(folder, m)
    patch = read_text_in(folder, "upstream.patch") if (folder / "upstream.patch").is_file() else None
    f.append(_patch_hash(patch, m))
    source, found = _source(m, fetch)
    f.append(found)
    if source is None:
        return f, None
    if not next(x for x in f if x.check == "evidence").ok:  # hashed first, then decompressed (with a cap)
        why = "not run: the evidence files do not hash to what table.toml records"
        f.append(_fail("recomposed from evidence", why))
        return f, None
    with tempfile.TemporaryDirectory(prefix="tuner-table-evidence-") as tmp:
        try:
            ev = export.load_evidence(export.decompress_evidence(folder, Path(tmp)))
        except TunerError as err:
            f.append(_fail("recomposed from evidence", str(err)))
            return f, None
    f.append(_recomposed(ev, m))
    f += _patch_findings(folder, patch, ev, source)
    if gpu is not None:
        f += _gpu_checked(folder, patch, ev, source, gpu, f)
    return f, ev


def _gpu_checked(
    folder: Path, patch: str | None, ev: Kept, source: Source, gpu: Mapping[str, GpuArg], static: Sequence[Finding]
) -> list[Finding]:
    rerender = next((x for x in static if x.check == "re-render"), None)
    if patch is not None and (rerender is None or not rerender.ok):
        why = "not built: upstream.patch is not tuner's re-render of the kept entries, "
        return [_fail("upstream.patch on the GPU", why + _NOT_OURS)]
    try:
        return _gpu_findings(folder, patch, ev, source, gpu)
    except UsageError as err:  # bad input (a pack of another build): exit 2 with its paragraph, not a failed check
        raise ArgumentError(str(err)) from err
    except TunerError as err:  # a failed build or run is a failed check, not a crash
        return [_fail("upstream.patch on the GPU", str(err)[:1500])]


def _merged_schema(m: Mapping[str, Any]) -> list[str]:
    errs = _schema(m, {"source": REQUIRED["source"], "target": REQUIRED["target"], "hashes": {"patch_sha256": str}})
    table = m.get("table")
    for k in ("fa_rules", "mmq_choices", "reported", "models"):
        v = table.get(k) if isinstance(table, dict) else None
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            errs.append(f"table.{k} should be a list of strings")
    parts = m.get("parts")
    if not isinstance(parts, list) or len(parts) < 2:
        errs.append("parts should list two or more tables")
    elif not all(
        isinstance(p, dict) and all(isinstance(p.get(k), str) for k in ("name", "manifest_sha256")) for p in parts
    ):
        errs.append("each [[parts]] needs a name and a manifest_sha256 (strings)")
    elif any(not merge.NAME.fullmatch(p["name"]) or p["name"] in (".", "..") for p in parts):
        errs.append("a part's name must be a plain folder name under parts/")
    others = m.get("gpus", [])
    keys = ("device", "part", "name", "confirm_sha256")
    if not isinstance(others, list) or not all(
        isinstance(g, dict) and all(isinstance(g.get(k), str) for k in keys) for g in others
    ):
        errs.append("each [[gpus]] needs a device, part, name and confirm_sha256 (strings)")
    elif any(not merge.NAME.fullmatch(g["name"]) or g["name"] in (".", "..") for g in others):
        errs.append("a [[gpus]] name must be a plain folder name")
    return errs


def _gpu_stores(folder: Path, m: Mapping[str, Any], into: Path) -> tuple[list[tuple[str, Path]], list[Finding]]:
    """A merged table's other GPU models' stores, each hashed, then decompressed (capped) under ``into``."""
    stores, found = [], []
    for i, g in enumerate(m.get("gpus", [])):
        rel = f"{merge.GPUS}/{merge.slug(g['device'])}/{g['name']}/{merge.STORE}.xz"
        try:
            got = file_sha256(folder / rel) if present_in(folder, rel) else "missing"
        except FolderError as err:
            got = str(err)
        ok = got == g["confirm_sha256"]
        detail = f"{g['device']}, {g['part']}" if ok else f"{rel} is {got[:12]}, recorded {g['confirm_sha256'][:12]}"
        found.append(Finding(check=f"gpu {g['name']}", ok=ok, detail=detail))
        if ok:
            dest = into / str(i) / merge.STORE
            dest.parent.mkdir(parents=True)
            export.decompress_file(folder, rel, dest)
            stores.append((g["name"], dest))
    return stores, found


def validate_merged(folder: Path, *, gpu: Mapping[str, GpuArg] | None = None, fetch: bool = False) -> ResultCheck:
    """A merged table: each part validated, the parts join and give its entries, its patch checked."""
    f: list[Finding] = []
    try:
        m = load_toml_in(folder, export.MANIFEST)
    except FolderError as err:
        return ResultCheck(path=folder, findings=(_fail("schema", str(err)),))
    errs = _merged_schema(m)
    f.append(Finding(check="schema", ok=not errs, detail="; ".join(errs) if errs else "merged sweep table"))
    if errs:
        return ResultCheck(path=folder, findings=tuple(f))
    f.append(_present(folder, ("PR.md", "report.md")))
    parts = []
    for rec, d in zip(m["parts"], merge.part_dirs(folder, m)):
        mf = d / export.MANIFEST
        got = file_sha256(mf) if mf.is_file() else "missing"
        if got != rec["manifest_sha256"]:
            why = f"{mf.name} is {got[:12]}, recorded {rec['manifest_sha256'][:12]} (an edited or replaced part)"
            f.append(_fail(f"part {d.name}", why))
            continue
        pf, ev = _table_findings(d, gpu=None, fetch=fetch)
        bad = [x for x in pf if not x.ok]
        detail = "; ".join(f"{x.check}: {x.detail}" for x in bad)[:600] or f"{len(pf)} checks passed"
        f.append(Finding(check=f"part {d.name}", ok=not bad, detail=detail))
        if ev is not None:
            pm = load_toml_in(d, export.MANIFEST)
            parts.append(merge.Part(name=d.name, folder=d, manifest=pm, evidence=ev, backend_ops=()))
    if not all(x.ok for x in f):
        return ResultCheck(path=folder, findings=tuple(f))
    source, found = _source(m, fetch)
    f.append(found)
    try:
        with tempfile.TemporaryDirectory(prefix="tuner-validate-gpus-") as tmp:
            stores, gf = _gpu_stores(folder, m, Path(tmp))
            f += gf
            if not all(x.ok for x in gf):
                return ResultCheck(path=folder, findings=tuple(f))
            merged = merge.merged_view(parts, merge.load_gpu_confirmations(stores, parts))
    except TunerError as err:
        f.append(_fail("parts join", str(err)))
        return ResultCheck(path=folder, findings=tuple(f))
    got_t = merge.manifest_table(merged)
    diffs = [f"table.{k}: table.toml has {m['table'].get(k)!r}, the parts give {v!r}" for k, v in got_t.items()
             if m["table"].get(k) != v]  # fmt: skip
    diffs += [f"{k} differs from the parts'" for k in ("source", "target") if m[k] != parts[0].manifest[k]]
    detail = "; ".join(diffs[:4]) or (
        f"{len(got_t['fa_rules'])} FlashAttention entr(ies) and {len(got_t['mmq_choices'])} MMQ choice(s) "
        f"kept from {len(parts)} tables"
    )
    f.append(Finding(check="recomposed from the parts", ok=not diffs, detail=detail))
    patch = read_text_in(folder, "upstream.patch") if (folder / "upstream.patch").is_file() else None
    f.append(_patch_hash(patch, m))
    if source is not None:
        f += _patch_findings(folder, patch, merged, source)
        if gpu is not None:
            f += _gpu_checked(folder, patch, merged, source, gpu, f)
    return ResultCheck(path=folder, findings=tuple(f))


def _gpu_findings(
    folder: Path, patch: str | None, ev: Kept, source: Source, gpu: Mapping[str, GpuArg]
) -> list[Finding]:
    """``--gpu``: build the patched tree, run test-backend-ops FA and MUL_MAT (``pack``/``from_pack``)."""
    arch = ev.table.arch
    local = archs.detect_local_archs()
    if patch is None:
        return [Finding(check="upstream.patch on the GPU", ok=True, detail="skipped: the table has no upstream.patch")]
    pack, from_pack = gpu.get("pack"), gpu.get("from_pack")
    if arch.name not in local and pack is None:
        return gpu_skip(arch.name, local)
    log_dir = Path(gpu.get("log_dir") or tempfile.mkdtemp(prefix="tuner-validate-table-"))
    base = render.render_variant(source, arch.name, "cuda", local_archs=local)
    rv = RenderedVariant(
        arch=arch.name, variant="cuda+upstream.patch", era=source.era, source_id=source.source_id,
        source_root=source.root, defines=dict(base.defines), patch=patch,
        files=upstream_check.patched_tree_text(folder / "upstream.patch", source.root),
    )  # fmt: skip
    if from_pack is not None:
        unpack_build(Path(from_pack), rv)  # then build_variant takes it as cached
    b = cmake.build_variant(rv, targets=("test-backend-ops",))
    how = "carried" if from_pack is not None else "cached" if b.cached else f"built in {b.seconds:.0f} s"
    out = [Finding(check="upstream.patch builds", ok=True, detail=how)]
    if pack is not None:
        pack_build(b, rv, Path(pack), spec=source.spec)
        out.append(Finding(check="build packed", ok=True, detail=f"{pack}: run the tests on a {arch.name} GPU "
                           f"with `tuner validate --gpu --from-pack {pack} {folder}`"))  # fmt: skip
        if arch.name not in local:
            return out + gpu_skip(arch.name, local)
    fa = params_for_shapes((r.D, r.kv) for r in ev.confirmed.kept_rules)
    for op, params in (("FLASH_ATTN_EXT", fa), ("MUL_MAT", None)):
        if op == "FLASH_ATTN_EXT" and fa is None:  # no kept entry: nothing of FLASH_ATTN_EXT changed
            continue
        chk = gate.run_check(
            b.bin_dir, ops=(op,), backend=f"{arch.backend}0", log_dir=log_dir, params=params, label=f"table-{op}"
        )
        out.append(Finding(check=f"test-backend-ops {op}", ok=chk.passed, detail=f"{chk.summary} (log {chk.log_file})"))
    out.append(selected_kernels(b.bin_dir, ev, backend=f"{arch.backend}0", log_dir=log_dir))
    return out


CHECK = "upstream.patch selects the table's kernels"
_TIMEOUT_S = 300


def probes(rules: Sequence[TableRule], cells: Sequence[Cell]) -> list[tuple[Cell, str]]:
    """(cell, kernel the patched tree must launch) at the lowest and highest stored n_kv of each kept entry."""
    out: list[tuple[Cell, str]] = []
    for r in rules:
        cov = sorted(
            (c for c in cells if (c.shape.D, c.shape.gqa, c.shape.kv, c.shape.ne1) == (r.D, r.gqa, r.kv, r.ne1)
             and r.covers(c.n_kv)),
            key=lambda c: c.n_kv,
        )  # fmt: skip
        for c in dict.fromkeys([cov[0], cov[-1]] if cov else []):
            s = c.shape
            want = match_table(
                rules, D=s.D, gqa=s.gqa, type_k=s.kv, type_v=s.kv, ne1=s.ne1, n_kv=c.n_kv,
                can_use_vector_kernel="VEC" in c.legal, gqa_opt_applies=True,
            )  # fmt: skip
            out.append((c, want or c.upstream))
    return out


def _launched(ncu: Path, exe: Path, cases: Path, backend: str, log: Path) -> tuple[set[str] | None, str]:
    """The kernel families one fa-bench run launched under ncu, or None with why."""
    cmd: list[str | Path] = [ncu, "--clock-control", "none", "--cache-control", "none"]
    cmd += ["--kernel-name", "regex:^(" + "|".join(KERNEL_FUNCTIONS) + ")$", "--metrics", "gpu__time_duration.sum"]
    cmd += ["--csv", "--page", "raw", "--print-kernel-base", "function"]
    cmd += [exe, "-b", backend, "-f", cases, "-n", "1", "-c", "0", "-T", "120"]
    env = {**os.environ, "GGML_CUDA_DISABLE_GRAPHS": "1"}  # one launch per op, each seen by ncu
    res = _run.run(cmd, env=env, check=False, timeout=_TIMEOUT_S, what="ncu fa-bench")
    log.write_text(res.output)
    if res.returncode != 0:
        return None, f"ncu exited {res.returncode} (log {log})"
    names = parse_ncu_csv(res.output)
    if not names:
        return None, f"no FlashAttention launch seen (log {log})"
    return {KERNEL_FUNCTIONS.get(n, n) for n in names}, ""


def selected_kernels(bin_dir: Path, ev: export.Evidence | merge.Merged, *, backend: str, log_dir: Path) -> Finding:
    """:data:`CHECK` (module doc, :func:`selected_kernels`) on the patched build in ``bin_dir``; ``ev``: the table's kept rules and cells."""
    todo = probes(ev.confirmed.kept_rules, ev.table.cells)
    if not todo:
        return Finding(check=CHECK, ok=True, detail="skipped: no FlashAttention entry kept")
    ncu = upstream_check.find_ncu()
    if ncu is None:
        return Finding(
            check=CHECK,
            ok=True,
            detail="skipped: Nsight Compute (ncu) not found; the static 'table lookup' check compares the "
            "patch's lookup with the matcher at every stored cell",
        )
    exe = fa_bench.build_fa_bench(bin_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    rows, ok = [], True
    for i, (c, want) in enumerate(todo):
        cases = log_dir / f"select-{i}.txt"
        cases.write_text(fa_bench_cases([bench_shape(c.shape, c.n_kv)]))
        got, why = _launched(ncu, exe, cases, backend, log_dir / f"select-{i}.log")
        hit = got == {want}
        ok &= hit
        seen = "/".join(sorted(got)) if got else f"? ({why})"
        s = c.shape
        where = f"D{s.D} gqa{s.gqa} {s.kv} ne1 {s.ne1} n_kv {c.n_kv}"
        rows.append(f"{where}: {seen}" + ("" if hit else f", the table gives {want}"))
    return Finding(check=CHECK, ok=ok, detail=("" if ok else "differs: ") + "; ".join(rows))

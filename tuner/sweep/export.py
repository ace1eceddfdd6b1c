"""``tuner sweep export``: the confirmed sweep table as a result folder (``results/<arch>/<name>/``).

The manifest's table is recomposed from the stored evidence by the commands' own code (:func:`load_evidence`), as
``tuner validate`` does again; nothing is written outside ``-o``. See docs/sweep.md ("The result folder").
Its plots are drawn from the stored samples (matplotlib Agg).
"""

from __future__ import annotations

import dataclasses
import lzma
import math
import re
import sqlite3
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any, TypeVar

import tomli_w

from tuner import source
from tuner._compat import tomllib
from tuner._hash import file_sha256, text_sha256
from tuner.errors import UsageError
from tuner.result.checks import FolderError, present_in, read_bytes_in
from tuner.result.export import staged_export
from tuner.result.plots import pyplot, save_png
from tuner.rounds.engine import DEFAULT
from tuner.rounds.store import Sample, read_store
from tuner.sweep import confirm, live, mmq
from tuner.sweep.grid import Cell
from tuner.sweep.live import FaKey
from tuner.sweep.mmq import MmqChoice, MmqKey
from tuner.sweep.table import TableRule

MANIFEST = "table.toml"
SCHEMA = 1
KIND = "sweep table"
EVIDENCE = {"sweep": "sweep.sqlite3", "mmq": "mmq.sqlite3", "confirm": "confirm.sqlite3"}
"""The stores an export keeps, by role, each as ``evidence/<name>.xz``."""
MAX_EVIDENCE_BYTES = 256 * 2**20
"""The most one decompressed evidence store may be (the stored ones are under 1 MiB)."""
_COMMANDS = {"sweep": "tuner sweep run", "mmq": "tuner sweep mmq", "confirm": "tuner sweep confirm"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Evidence:
    """The table and its confirmation recomposed from the three stores, and what the plots need."""

    table: confirm.Table
    confirmed: confirm.Confirmed
    models: tuple[Mapping[str, object], ...]
    confirm_identity: Mapping[str, str]
    fa_samples: tuple[Sample[live.FaKey], ...]
    mmq_samples: tuple[Sample[mmq.MmqKey], ...]


def load_evidence(dirs: Mapping[str, Path | None]) -> Evidence:
    """The table and confirmation recomposed from the stores in ``dirs``; opens them for writing: pass copies.

    Raises:
        UsageError: A store that is not of its kind, a confirmation of another table, or an incomplete one."""
    sweep_dir, confirm_dir = dirs.get("sweep"), dirs.get("confirm")
    if sweep_dir is None or confirm_dir is None:
        raise UsageError("A sweep table needs the stores of `tuner sweep run` and `tuner sweep confirm`.")
    table = confirm.load_table(sweep_dir, dirs.get("mmq"))
    cpath = confirm_dir / EVIDENCE["confirm"]
    if not cpath.is_file():
        raise UsageError(
            f"{confirm_dir} holds no {EVIDENCE['confirm']}: pass the output directory of `tuner sweep confirm`."
        )
    meta = confirm.store_meta(cpath, "sweep confirm storage")
    if meta.get("sweep") != "confirm":
        raise UsageError(f"{cpath} is not the storage of `tuner sweep confirm` (its meta has no sweep = confirm).")
    if meta.get("table") and meta["table"] != confirm.table_id(table):
        raise UsageError(
            f"{cpath} confirmed another table (id {meta['table']}) than the sweep stores give "
            f"({confirm.table_id(table)}): pass the sweep directory the confirmation was run on and, where it "
            "had MMQ choices, its --mmq directory."
        )
    with closing(confirm.ConfirmStore(cpath, {})) as store:
        conf = confirm.recompose(table, store)
        models = tuple(store.models())
    fa = tuple(read_store(live.TABLE, sweep_dir / EVIDENCE["sweep"])[0])
    mdir = dirs.get("mmq")
    mm = () if mdir is None else tuple(read_store(mmq.MMQ_TABLE, mdir / EVIDENCE["mmq"])[0])
    return Evidence(table=table, confirmed=conf, models=models, confirm_identity=meta, fa_samples=fa, mmq_samples=mm)


def decompress_evidence(folder: Path, into: Path, *, limit: int | None = None) -> dict[str, Path | None]:
    """``folder/evidence/*.sqlite3.xz`` into ``into/<role>/``, each capped at ``limit`` bytes; check hashes first.

    Raises:
        UsageError: A file that is not xz, not a regular file, or decompresses past the limit."""
    out: dict[str, Path | None] = {}
    for role, name in EVIDENCE.items():
        rel = f"evidence/{name}.xz"
        if not present_in(folder, rel):
            out[role] = None
            continue
        (into / role).mkdir(parents=True, exist_ok=True)
        decompress_file(folder, rel, into / role / name, limit=limit)
        out[role] = into / role
    return out


def decompress_file(folder: Path, rel: str, dest: Path, *, limit: int | None = None) -> None:
    """One xz file of a result folder into ``dest`` in chunks, never more than ``limit`` bytes (None:
    :data:`MAX_EVIDENCE_BYTES`, as the evidence); UsageError for a bad file."""
    cap = MAX_EVIDENCE_BYTES if limit is None else limit
    xz = folder / rel
    try:
        data = read_bytes_in(folder, rel)
    except FolderError as err:
        raise UsageError(str(err)) from err
    dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    written, chunk = 0, 1 << 20
    try:
        with dest.open("wb") as fh:
            buf = dec.decompress(data, max_length=chunk)
            while True:
                written += len(buf)
                if written > cap:
                    raise UsageError(
                        f"{xz} decompresses to more than {cap // 2**20} MiB, the most a piece of evidence may "
                        "be; it is not read"
                    )
                fh.write(buf)
                if dec.eof or (dec.needs_input and not buf):
                    break
                buf = dec.decompress(b"", max_length=chunk)
    except lzma.LZMAError as err:
        raise UsageError(f"{xz} is not xz-compressed ({err}).") from err
    if not dec.eof:
        raise UsageError(f"{xz} is not a whole xz stream (truncated).")


def manifest_kind(folder: Path) -> str | None:
    """The ``kind`` of ``folder``'s manifest (a sweep table export's, a merged table's), None where it has none."""
    try:
        kind = tomllib.loads((folder / MANIFEST).read_text()).get("kind")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return kind if isinstance(kind, str) else None


def check_out(out: Path, *, kind: str = KIND, what: str = "sweep table export", verb: str = "export") -> None:
    """UsageError unless ``out`` is new, empty or an earlier ``kind`` folder (``tuner sweep VERB`` replaces it whole)."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())) or (out.is_dir() and manifest_kind(out) == kind):
        return
    raise UsageError(
        f"{out} exists and is not an earlier {what} (it has no {MANIFEST} of kind {kind!r}). `tuner sweep {verb}` "
        f"replaces its -o whole, so it writes only to a new or empty folder or over an earlier {verb}; pass another "
        f"-o{' (e.g. results/<arch>/<name>)' if kind == KIND else ''}, or remove that folder yourself if nothing in "
        "it is needed."
    )


def _locate(confirm_dir: Path, sweep_dir: Path | None, mmq_dir: Path | None) -> dict[str, Path | None]:
    dirs: dict[str, Path | None] = {"confirm": confirm_dir, "sweep": sweep_dir, "mmq": mmq_dir}
    if sweep_dir is None:  # `tuner sweep confirm`'s default -o is SWEEP_DIR/confirm
        dirs["sweep"] = confirm_dir.parent
    for role, d in dirs.items():
        if d is not None and not (d / EVIDENCE[role]).is_file():
            hint = (
                " (pass --sweep: it is not the confirm directory's parent)" if role == "sweep" and not sweep_dir else ""
            )
            raise UsageError(
                f"{d} holds no {EVIDENCE[role]}{hint}: pass the output directory of `{_COMMANDS[role]}` "
                "that the confirmation was run on."
            )
    return dirs


def backup_store(src: Path, dest: Path) -> None:
    """A consistent copy of a SQLite file (its WAL included), read-only on the source."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(f"file:{src}?mode=ro", uri=True) as a, sqlite3.connect(dest) as b:
        a.backup(b)


def demoted(text: str) -> str:
    """Markdown headings two levels down (outside code fences), for a report inside a section."""
    out, fence = [], False
    for ln in text.splitlines():
        fence ^= ln.lstrip().startswith("```")
        out.append("##" + ln if not fence and re.match(r"#+ ", ln) else ln)
    return "\n".join(out)


def _report(dirs: Mapping[str, Path | None]) -> str:
    parts = [
        "# Sweep table: the reports behind it",
        "",
        "As each command wrote them (headings two levels down): the FlashAttention sweep, the MMQ-vs-cuBLAS "
        "sweep and the end-to-end confirmation. `PR.md` has the kept and reported entries, `table.toml` the "
        "manifest.",
        "",
    ]
    for title, role, name in (
        ("FlashAttention kernels (`tuner sweep run`)", "sweep", "report.md"),
        ("MMQ vs cuBLAS (`tuner sweep mmq`)", "mmq", "report.md"),
        ("End to end (`tuner sweep confirm`)", "confirm", "e2e.md"),
    ):
        d = dirs.get(role)
        if d is None:
            body = "Not part of this table."
        elif (d / name).is_file():
            body = demoted((d / name).read_text())
        else:  # the sweep is part of the table: its samples are in evidence/, its report was not there
            body = f"The sweep's directory held no {name} at export; its samples are in `evidence/`."
        parts += [f"## {title}", "", body.rstrip(), ""]
    return "\n".join(parts)


_LOCAL_PATH = re.compile(r"(?<![\w.:/~-])/(?:[\w.+@=-]+/)*[\w.+@=-]+/?")
"""An absolute path on the machine that ran the sweep (not a URL's path, not a relative source path)."""


def without_local_paths(text: str) -> str:
    """``text`` with each absolute local path cut to its last component (the reader's machine is another)."""
    return _LOCAL_PATH.sub(lambda m: m.group().rstrip("/").rsplit("/", 1)[-1], text)


def clean_identity(meta: Mapping[str, str]) -> dict[str, str]:
    """An identity without local paths (a build directory: its name only); read on other machines."""
    return {k: (Path(v).name if v.startswith("/") else v) for k, v in sorted(meta.items())}


def manifest_table(ev: Evidence) -> dict[str, Any]:
    """The manifest's ``[table]`` and ``[coverage]``: everything :func:`load_evidence` recomposes."""
    t, c = ev.table, ev.confirmed
    kept = [f for f in c.fates if f.kept]
    return {
        "table": {
            "fa_rules": [r.text for r in c.kept_rules],
            "mmq_choices": [m.text for m in c.kept_mmq],
            "reported": [f"{f.text}: {f.why}" for f in c.fates if not f.kept],
            "composed_fa_rules": [r.text for r in t.rules],
            "composed_mmq_choices": [m.text for m in t.mmq],
            "models": [str(m["like"]) for m in ev.models],
        },
        "coverage": {
            "shapes": len(t.shapes),
            "n_kv_points": len(t.n_kv),
            "cells": len(t.cells),
            "cells_with_verdict": t.with_verdict,
            "rounds": t.rounds,
            "mmq_points": t.mmq_points,
            "models_measured": len(c.points),
            "kept": len(kept),
            "reported": len(c.fates) - len(kept),
        },
    }


def _write(
    stage: Path, ev: Evidence, src: source.Source, dirs: Mapping[str, Path | None], *, patch: str, measured_on: str
) -> dict[str, object]:
    """Every file but the evidence into ``stage``; the manifest returned (written by the caller)."""
    if patch:
        (stage / "upstream.patch").write_text(patch)
    confirm_dir = dirs["confirm"]
    assert confirm_dir is not None
    for name in ("PR.md", "e2e.md"):
        if not (confirm_dir / name).is_file():
            raise UsageError(f"{confirm_dir} has no {name}: run `tuner sweep confirm` to the end before exporting.")
        (stage / name).write_text(without_local_paths((confirm_dir / name).read_text()))
    (stage / "report.md").write_text(without_local_paths(_report(dirs)))
    (stage / "plots").mkdir()
    t = ev.table
    plots = plot_fa(t.cells, ev.fa_samples, t.rules, stage / "plots")
    by_type = {ch.type: [c for c in t.mmq if c.type == ch.type] for ch in t.mmq}
    mplot = plot_mmq(ev.mmq_samples, by_type, stage / "plots" / "mmq.png") if ev.mmq_samples else None
    plots += [mplot] if mplot else []
    evidence = sorted((stage / "evidence").iterdir())
    return {
        "schema": SCHEMA,
        "kind": KIND,
        "source": {"spec": src.spec, "source_id": src.source_id, "commit": src.commit or "", "era": src.era},
        "target": {"arch": t.arch.name, "measured_on": measured_on},
        **manifest_table(ev),
        "hashes": {
            "patch_sha256": text_sha256(patch) if patch else "",
            "evidence": {p.name: file_sha256(p) for p in evidence},
        },
        "identity": {
            "sweep": clean_identity(t.identity),
            "mmq": clean_identity(t.mmq_identity),
            "confirm": clean_identity(ev.confirm_identity),
        },
        "files": {"plots": [f"plots/{p.name}" for p in plots], "evidence": [f"evidence/{p.name}" for p in evidence]},
    }


def export_table(
    confirm_dir: Path,
    out: Path,
    *,
    sweep_dir: Path | None = None,
    mmq_dir: Path | None = None,
    spec: str | None = None,
    measured_on: str | None = None,
) -> dict[str, object]:
    """Write the result folder ``out`` and return its manifest.

    Raises:
        UsageError: ``out`` is not new, empty or an earlier export; a store missing or not the confirmation's;
            a stale confirmation ``upstream.patch``."""
    out, cdir = Path(out), Path(confirm_dir)
    check_out(out)
    dirs = _locate(cdir, sweep_dir, mmq_dir)
    # Written into a staging folder beside -o and swapped in whole (a failure or a kill leaves the earlier export).
    with tempfile.TemporaryDirectory(prefix="tuner-sweep-export-") as tmp, staged_export(out, check=check_out) as stage:
        raw = Path(tmp) / "raw"
        (stage / "evidence").mkdir(parents=True)
        for role, d in dirs.items():
            if d is not None:
                backup_store(d / EVIDENCE[role], raw / role / EVIDENCE[role])
                data = (raw / role / EVIDENCE[role]).read_bytes()
                (stage / "evidence" / f"{EVIDENCE[role]}.xz").write_bytes(lzma.compress(data, preset=9))
        ev = load_evidence({r: (raw / r if d is not None else None) for r, d in dirs.items()})
        src = source.fetch_source(spec) if spec else source.fetch_source()
        eras = {str(m.get("era")) for m in ev.models if m.get("era")}
        if eras - {src.era}:
            raise UsageError(
                f"The confirmation ran on a tree of era {', '.join(sorted(eras))}; {src.spec} is {src.era}."
            )
        patch = confirm.render_kept(src.root, ev.confirmed.kept_rules, ev.confirmed.kept_mmq, ev.table.arch)
        old = cdir / "upstream.patch"
        if (old.read_text() if old.is_file() else "") != patch:
            raise UsageError(
                f"{cdir}'s upstream.patch is not the patch its confirm.sqlite3 decides on {src.spec} (the "
                "directory's outputs are stale, or it was confirmed on another tree): rerun the same `tuner sweep "
                "confirm` command (it measures nothing already stored and rewrites them), or pass --source."
            )
        ident = ev.table.identity
        device = measured_on or ident.get("device") or f"not recorded (backend {ident.get('backend', '?')})"
        manifest = _write(stage, ev, src, dirs, patch=patch, measured_on=device)
        (stage / MANIFEST).write_text(tomli_w.dumps(manifest))
    return manifest


K = TypeVar("K", bound=Hashable)


def _medians(samples: Iterable[Sample[K]]) -> dict[tuple[K, str], float]:
    """(key, config) -> the median of its good samples' times."""
    by: dict[tuple[K, str], list[float]] = defaultdict(list)
    for s in samples:
        if s.ok and s.us:
            by[(s.key, s.config)].append(s.us)
    return {k: statistics.median(v) for k, v in by.items()}


def plot_fa(
    cells: Sequence[Cell], samples: Sequence[Sample[FaKey]], rules: Sequence[TableRule], out_dir: Path
) -> list[Path]:
    """One ``fa-D<head size>.png`` per head size at ``Q->ne[1] = 1``, one ``...-ne1-<N>.png`` per batch N > 1."""
    plt = pyplot()
    from matplotlib.colors import TwoSlopeNorm  # lazy, as pyplot(): matplotlib loads only to draw

    med = _medians(samples)
    sp: dict[FaKey, tuple[str, float]] = {}  # per cell: the table's kernel, its speedup over upstream's (or NaN)
    for c in cells:
        s = c.shape
        rule = next(
            (r for r in rules if (r.D, r.gqa, r.kv, r.ne1) == (s.D, s.gqa, s.kv, s.ne1) and r.covers(c.n_kv)), None
        )
        kernel = rule.kernel if rule else c.upstream
        base = med.get(((s, c.n_kv), DEFAULT), math.nan)
        tuned = base if rule is None or kernel == c.upstream else med.get(((s, c.n_kv), kernel), math.nan)
        sp[(s, c.n_kv)] = (kernel, base / tuned if tuned else math.nan)
    out = []
    for D, ne1 in sorted({(c.shape.D, c.shape.ne1) for c in cells}, key=lambda k: (k[1] != 1, k)):
        kvs = sorted({c.shape.kv for c in cells if (c.shape.D, c.shape.ne1) == (D, ne1)})
        fig, axes = plt.subplots(len(kvs), 1, figsize=(12, 1.2 + 1.6 * len(kvs) * 1.4), squeeze=False)
        for ax, kv in zip(axes[:, 0], kvs):
            mine = [c for c in cells if (c.shape.D, c.shape.kv, c.shape.ne1) == (D, kv, ne1)]
            gqas, nkvs = sorted({c.shape.gqa for c in mine}), sorted({c.n_kv for c in mine})
            grid = [[math.nan] * len(nkvs) for _ in gqas]
            for c in mine:
                kernel, x = sp[(c.shape, c.n_kv)]
                i, j = gqas.index(c.shape.gqa), nkvs.index(c.n_kv)
                grid[i][j] = x
                label = kernel + ("" if math.isnan(x) else f"\n{x:.2f}x")
                ax.text(j, i, label, ha="center", va="center", fontsize=7, color="black")
            ax.imshow(grid, cmap="RdBu", norm=TwoSlopeNorm(vcenter=1.0, vmin=0.5, vmax=1.5), aspect="auto")
            ax.set_xticks(range(len(nkvs)), [str(n) for n in nkvs], rotation=60, fontsize=7)
            ax.set_yticks(range(len(gqas)), [str(g) for g in gqas])
            ax.set_ylabel("GQA ratio")
            ax.set_title(
                f"head size {D}, K/V {kv}, Q->ne[1] = {ne1}: chosen kernel and speedup vs upstream", fontsize=9
            )
        axes[-1, 0].set_xlabel("n_kv")
        fig.tight_layout()
        out.append(save_png(plt, fig, out_dir / (f"fa-D{D}.png" if ne1 == 1 else f"fa-D{D}-ne1-{ne1}.png")))
    return out


def plot_mmq(samples: Sequence[Sample[MmqKey]], choices: Mapping[str, Sequence[MmqChoice]], path: Path) -> Path | None:
    """``mmq.png``: cuBLAS over MMQ per type and batch size, composed choices marked; None without data."""
    med = _medians(samples)
    logs: dict[tuple[str, int], list[float]] = defaultdict(list)
    for (key, cfg), base in med.items():
        t, _, _, n = key
        blas = med.get((key, "BLAS"))
        if cfg == DEFAULT and blas:
            logs[(t, n)].append(math.log(base / blas))
    # (type, batch size) -> cuBLAS's speedup over MMQ: geometric mean over sizes of median ratios
    sp = {k: math.exp(statistics.fmean(v)) for k, v in logs.items()}
    if not sp:
        return None
    plt = pyplot()
    from matplotlib.colors import TwoSlopeNorm  # lazy, as pyplot(): matplotlib loads only to draw

    types, batches = sorted({t for t, _ in sp}), sorted({n for _, n in sp})
    grid = [[sp.get((t, n), math.nan) for n in batches] for t in types]
    fig, ax = plt.subplots(figsize=(1.2 + 0.8 * len(batches), 1.0 + 0.6 * len(types)))
    ax.imshow(grid, cmap="RdBu", norm=TwoSlopeNorm(vcenter=1.0, vmin=0.25, vmax=4.0), aspect="auto")
    for i, t in enumerate(types):
        for j, n in enumerate(batches):
            x = grid[i][j]
            chosen = any(c.covers(n) and c.backend == "BLAS" for c in choices.get(t, ()))
            if not math.isnan(x):
                ax.text(j, i, f"{x:.2f}x" + ("\nBLAS" if chosen else ""), ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(batches)), [str(n) for n in batches])
    ax.set_yticks(range(len(types)), types)
    ax.set_xlabel("batch size (ne11)")
    ax.set_title("cuBLAS speedup over MMQ (geometric mean over weight sizes); BLAS: the composed choice", fontsize=9)
    fig.tight_layout()
    return save_png(plt, fig, path)

"""``tuner sweep merge``: several exported sweep tables as one result folder with one ``upstream.patch``.

Parts (``parts/<name>/``, copied whole) must share source, arch and device and cover disjoint cells; ``--gpu``
adds other GPU models' confirmations. See docs/sweep.md.

One table on several GPU models of its arch: their confirmations are kept side by side and their verdicts joined.
The patch keys on the compute capability, which models share (H100 and H200: sm_90); :func:`join` patches an
entry faster on some model and worse on none, drops it where models disagree.

Its ``PR.md`` (:func:`table_pr_text`) is for a llama.cpp maintainer: the patched entries with each GPU model's
verdict, one compare table per GPU model, the commands that reproduce every number, the checks and a short method;
everything else is in ``report.md``.
"""

from __future__ import annotations

import dataclasses
import lzma
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any, Literal

import tomli_w

from tuner import source
from tuner._compat import tomllib
from tuner._hash import file_sha256, text_sha256
from tuner.errors import TunerError, UsageError
from tuner.paths import package_data
from tuner.result.export import staged_export
from tuner.result.tables import compare_table
from tuner.sweep import confirm, export
from tuner.sweep.confirm import Confirmed, ConfirmStore, RuleFate, Table, recompose, store_meta, table_id
from tuner.sweep.confirm_report import e2e_text, merged_pr_text
from tuner.sweep.grid import Cell
from tuner.sweep.live import FaKey
from tuner.sweep.mmq import MmqChoice
from tuner.sweep.table import TableRule
from tuner.targets.archs import Arch
from tuner.targets.defaults import DEFAULT_QUANT
from tuner.targets.quant_types import quant_type

KIND = "merged sweep table"
PARTS = "parts"
GPUS = "gpus"
STORE = "confirm.sqlite3"
NAME = re.compile(r"[\w.+-]+")
"""A part's name: its folder under ``parts/`` (no separator, no space)."""


Action = Literal["patched", "dropped", "reported"]

# A model's verdict on an entry, from the keep rule's reason (tuner.rounds.keep): the worst of its confirmations.
_WORDS = {
    "gate": "gate failed",
    "slower": "slower",
    "faster": "faster",
    "no gain": "no gain",
    "noisy": "too noisy",
    "cpu": "CPU% up",
    "none": "not measured",
}
_RANK = ("gate failed", "slower", "faster", "no gain", "too noisy", "CPU% up", "not measured")
_AGAINST = ("gate failed", "slower")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Confirmation:
    """One ``tuner sweep confirm`` store of one table (a merged table's part) on one GPU model, recomposed."""

    device: str
    part: str
    folder: str
    """``parts/<part>/evidence`` (the first GPU model's) or ``gpus/<slug(device)>/<name>``."""
    identity: Mapping[str, str]
    confirmed: Confirmed
    models: tuple[Mapping[str, object], ...]
    """The models its store recorded (what the ``tuner sweep confirm`` call was)."""
    backend_ops: tuple[Mapping[str, object], ...]

    @property
    def name(self) -> str:
        return self.folder.rsplit("/", 1)[-1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    device: str
    word: str
    why: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Joined:
    """One entry decided over every GPU model that confirmed its table."""

    fate: RuleFate
    """The first model's fate (the entry's rule or MMQ choice, its text)."""
    action: Action
    verdicts: tuple[Verdict, ...]

    @property
    def kept(self) -> bool:
        return self.action == "patched"

    @property
    def why(self) -> str:
        if len(self.verdicts) == 1:  # one GPU model: its confirmation's words, as before models were joined
            return self.verdicts[0].why
        each = "; ".join(f"{v.device}: {v.why}" for v in self.verdicts)
        return f"GPU models disagree ({each})" if self.action == "dropped" else each


def slug(device: str) -> str:
    """``NVIDIA H200`` -> ``nvidia-h200``: a GPU model's folder name."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "unknown"


def _device_verdict(device: str, fates: Sequence[RuleFate]) -> Verdict:
    """The worst of one model's fates of an entry (a slower confirmation outweighs a faster one)."""
    words = [(_WORDS.get(f.reason, "not measured"), f) for f in fates]
    word, fate = min(words, key=lambda wf: _RANK.index(wf[0]))
    return Verdict(device=device, word=word, why=fate.why)


def join(fates_by_device: Sequence[tuple[str, Sequence[RuleFate]]]) -> list[Joined]:
    """Each entry decided over every ``(device, fates)`` (the first GPU model's first; a model's worst verdict)."""
    if not fates_by_device:
        return []
    devices = list(dict.fromkeys(d for d, _ in fates_by_device))
    first = fates_by_device[0][1]
    for dev, fs in fates_by_device:
        if [f.text for f in fs] != [f.text for f in first]:
            raise UsageError(f"The {dev} confirmation decided other entries than the first one: not the same table.")
    out = []
    for i, fate in enumerate(first):
        verdicts = tuple(_device_verdict(d, [fs[i] for dev, fs in fates_by_device if dev == d]) for d in devices)
        words = {v.word for v in verdicts}
        action: Action = ("dropped" if words & set(_AGAINST) else "patched") if "faster" in words else "reported"
        out.append(Joined(fate=fate, action=action, verdicts=verdicts))
    return out


def load_confirmation(store_path: Path, tables: Mapping[str, Table], *, name: str, first_device: str) -> Confirmation:
    """Another GPU model's confirm store recomposed against the table it recorded (pass a copy); UsageError."""
    meta = store_meta(store_path, "sweep confirm storage")
    if meta.get("sweep") != "confirm":
        raise UsageError(f"{store_path} is not the storage of `tuner sweep confirm`.")
    device = meta.get("device", "")
    if not device:
        raise UsageError(
            f"{store_path} records no GPU model (a confirmation older than the device record): it cannot stand as "
            "another GPU model's evidence."
        )
    if device == first_device:
        raise UsageError(
            f"{store_path} was measured on {device}, the GPU model the table's own evidence is of; --gpu takes "
            "confirmations made on other GPU models of the arch."
        )
    ids = {table_id(t): part for part, t in tables.items()}
    part = ids.get(meta.get("table", ""))
    if part is None:
        raise UsageError(
            f"{store_path} confirmed table {meta.get('table', '?')}, which is none of the tables merged "
            f"({', '.join(f'{p}: {i}' for i, p in ids.items())}): run `tuner sweep confirm` on that table's sweeps."
        )
    table = tables[part]
    if meta.get("arch") != table.arch.name:
        raise UsageError(f"{store_path} was confirmed for {meta.get('arch')}, the table is {table.arch.name}.")
    with closing(ConfirmStore(store_path, {})) as store:
        conf = recompose(table, store)
        models = tuple(store.models())
        ops = tuple(rec for _, rec in sorted(store.gate("test-backend-ops").items()))
    folder = f"gpus/{slug(device)}/{name}"
    return Confirmation(
        device=device, part=part, folder=folder, identity=meta, confirmed=conf, models=models, backend_ops=ops
    )


def gpu_specs() -> dict[str, dict[str, object]]:
    """Datasheet figures by GPU model name (``tuner/data/gpus.toml``), each with its source."""
    text = package_data("gpus.toml").read_text()
    return {k: dict(v) for k, v in tomllib.loads(text).items() if isinstance(v, dict)}


_FIELDS = (
    ("memory_bandwidth_tbs", "memory bandwidth", "TB/s"),
    ("sms", "SM count", ""),
    ("max_sm_clock_mhz", "max SM clock", "MHz"),
)


def differs(devices: Sequence[str]) -> str:
    """What separates ``devices`` by their datasheets, in words (the key a patch would need), or ''."""
    specs = gpu_specs()
    if not all(d in specs for d in devices):
        return ""
    for key, words, unit in _FIELDS:
        vals = [specs[d].get(key) for d in devices]
        if None not in vals and len(set(map(str, vals))) > 1:
            each = " vs ".join(f"{v}{' ' + unit if unit else ''}" for v in vals)
            return f"{words} ({each})"
    return ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Part:
    """One exported table: its folder name in ``parts/``, its manifest and its evidence recomposed."""

    name: str
    folder: Path
    manifest: dict[str, Any]
    evidence: export.Evidence
    backend_ops: tuple[Mapping[str, object], ...]
    """The test-backend-ops records its confirmation stored (by name), as its own PR.md lists them."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Cells:
    arch: Arch
    cells: tuple[Cell, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Kept:
    kept_rules: list[TableRule]
    kept_mmq: list[MmqChoice]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Merged:
    """What the checks and the patch need of an :class:`export.Evidence`, over all parts."""

    table: _Cells
    confirmed: _Kept
    parts: tuple[Part, ...]
    joined: tuple[tuple[int, Joined], ...] = ()
    """Every entry of every part decided over every GPU model (with its index in its part's fates)."""
    gpus: tuple[Confirmation, ...] = ()
    """The confirmations of other GPU models."""

    @property
    def devices(self) -> list[str]:
        return list(dict.fromkeys([self.parts[0].manifest["target"]["measured_on"], *(g.device for g in self.gpus)]))


def part_dirs(folder: Path, manifest: dict[str, Any]) -> list[Path]:
    return [folder / PARTS / str(p["name"]) for p in manifest.get("parts", []) if isinstance(p, dict)]


def load_parts(folders: Sequence[Path], tmp: Path) -> list[Part]:
    """Each exported table's manifest and evidence (under ``tmp``); UsageError for a folder that is not one."""
    out = []
    for i, f in enumerate(folders):
        if export.manifest_kind(f) != export.KIND:
            raise UsageError(
                f"{f} is not an exported sweep table (no {export.MANIFEST} of kind {export.KIND!r}): pass folders "
                "written by `tuner sweep export`."
            )
        m = tomllib.loads((f / export.MANIFEST).read_text())
        dirs = export.decompress_evidence(f, tmp / str(i))
        ev = export.load_evidence(dirs)
        cdir = dirs["confirm"]
        assert cdir is not None  # load_evidence needs it
        with closing(confirm.ConfirmStore(cdir / export.EVIDENCE["confirm"], {})) as store:
            ops = tuple(rec for _, rec in sorted(store.gate("test-backend-ops").items()))
        out.append(Part(name=f.resolve().name, folder=f, manifest=m, evidence=ev, backend_ops=ops))
    return out


def _same(parts: Sequence[Part], what: str, get: Callable[[Part], object], fix: str) -> None:
    seen = {p.name: get(p) for p in parts}
    if len(set(seen.values())) > 1:
        each = ", ".join(f"{n}: {v}" for n, v in seen.items())
        raise UsageError(f"The tables were measured on different {what} ({each}); a merged table needs one. {fix}")


def merged_view(parts: Sequence[Part], others: Sequence[Confirmation] = ()) -> Merged:
    """The parts as one table with the other GPU models' confirmations; UsageError where they do not join."""
    if len(parts) < 2:
        raise UsageError("A merged table joins two or more exported tables; pass at least two folders.")
    names = [p.name for p in parts]
    odd = [n for n in names if not NAME.fullmatch(n) or n in (".", "..")]
    if odd:
        raise UsageError(
            f"Table folder name(s) {', '.join(map(repr, odd))} cannot name a part (parts/<name>): use letters, "
            "digits and . _ + - only; rename the folder."
        )
    if len(set(names)) != len(names):
        raise UsageError(f"Two tables share a folder name ({', '.join(names)}); each part is kept as parts/<name>.")
    _same(parts, "llama.cpp sources", lambda p: p.manifest["source"]["source_id"], "Export each on the same --source.")
    _same(parts, "archs", lambda p: p.manifest["target"]["arch"], "Merge tables of one arch.")
    _same(
        parts,
        "devices",
        lambda p: p.manifest["target"]["measured_on"],
        "Merge tables of one GPU model; where a table says 'not recorded', export it again with --measured-on.",
    )
    owner: dict[FaKey, str] = {}
    for p in parts:
        for c in p.evidence.table.cells:
            key = (c.shape, c.n_kv)
            if key in owner and owner[key] != p.name:
                raise UsageError(
                    f"{owner[key]} and {p.name} both measured {c.shape} at n_kv {c.n_kv}: merged tables must cover "
                    "disjoint cells (merge sweeps of other shapes, K/V types or query batches)."
                )
            owner[key] = p.name
    mtypes: dict[str, str] = {}
    for p in parts:
        for ch in p.evidence.table.mmq:
            if mtypes.setdefault(ch.type, p.name) != p.name:
                raise UsageError(f"{mtypes[ch.type]} and {p.name} both have MMQ choices for {ch.type}.")
    # the parts' entries decided over the first GPU model and every other one that confirmed a part
    first = parts[0].manifest["target"]["measured_on"]
    joined: list[tuple[int, Joined]] = []
    for p in parts:
        by_device = [
            (first, p.evidence.confirmed.fates),
            *((g.device, g.confirmed.fates) for g in others if g.part == p.name),
        ]
        joined += list(enumerate(join(by_device)))
    kept = [j.fate for _, j in joined if j.kept]
    return Merged(
        table=_Cells(arch=parts[0].evidence.table.arch, cells=tuple(c for p in parts for c in p.evidence.table.cells)),
        confirmed=_Kept(
            kept_rules=[f.rule for f in kept if f.rule is not None],
            kept_mmq=[f.choice for f in kept if f.choice is not None],
        ),
        parts=tuple(parts),
        joined=tuple(joined),
        gpus=tuple(others),
    )


def manifest_table(merged: Merged) -> dict[str, list[str]]:
    """The merged manifest's ``[table]``: what :func:`merged_view` gives from the parts' evidence."""
    return {
        "fa_rules": [r.text for r in merged.confirmed.kept_rules],
        "mmq_choices": [m.text for m in merged.confirmed.kept_mmq],
        "reported": [f"{j.fate.text}: {j.why}" for _, j in merged.joined if not j.kept],
        "models": sorted({str(m["like"]) for p in merged.parts for m in p.evidence.models}),
    }


def load_gpu_confirmations(stores: Sequence[tuple[str, Path]], parts: Sequence[Part]) -> list[Confirmation]:
    """Each ``(name, store)`` of another GPU model recomposed against its part (pass copies)."""
    tables = {p.name: p.evidence.table for p in parts}
    first = parts[0].manifest["target"]["measured_on"] if parts else ""
    return [load_confirmation(path, tables, name=name, first_device=first) for name, path in stores]


def confirmations(merged: Merged) -> list[Confirmation]:
    """Every confirm store behind the merged table, the first GPU model's first, as PR.md reads them."""
    return [
        Confirmation(
            device=merged.devices[0], part=p.name, folder=f"{PARTS}/{p.name}/evidence",
            identity=p.evidence.confirm_identity, confirmed=p.evidence.confirmed, models=p.evidence.models,
            backend_ops=p.backend_ops,
        )
        for p in merged.parts
    ] + list(merged.gpus)  # fmt: skip


def _store_in(folder: Path) -> Path:
    """The confirm store of a ``tuner sweep confirm -o`` folder: ``confirm.sqlite3`` or ``confirm.sqlite3.xz``."""
    for name in (STORE, f"{STORE}.xz"):
        if (folder / name).is_file() and not (folder / name).is_symlink():
            return folder / name
    raise UsageError(
        f"{folder} holds no {STORE} (or {STORE}.xz): --gpu takes the -o folder of a `tuner sweep confirm` run on "
        "another GPU model."
    )


def merged_pr(merged: Merged, patch: str) -> str:
    """PR.md of the merged table (:func:`table_pr_text`)."""
    return table_pr_text(
        arch=merged.table.arch.name,
        joined=merged.joined,
        confirmations=confirmations(merged),
        patch=patch,
        has_mmq={p.name: bool(p.evidence.table.mmq_identity) for p in merged.parts},
    )


def _check_out(out: Path) -> None:
    export.check_out(out, kind=KIND, what="merged table", verb="merge")


def _report(parts: Sequence[Part]) -> str:
    """``report.md``: where each part's reports and plots are (they stay in the part, as exported)."""
    lines = [
        "# Merged sweep table: the reports behind it",
        "",
        "`PR.md` has the kept and reported entries of every part, `table.toml` the manifest. Each part keeps the "
        "reports its export wrote:",
        "",
        "| part | measured | reports | plots |",
        "|---|---|---|---|",
    ]
    for p in parts:
        t = p.manifest.get("coverage", {})
        plots = p.manifest.get("files", {}).get("plots", [])
        lines.append(
            f"| `{p.name}` | {t.get('cells', '?')} cells, {t.get('mmq_points', 0)} MMQ points, "
            f"{t.get('models_measured', '?')} model passes | `parts/{p.name}/report.md`, `parts/{p.name}/PR.md`, "
            f"`parts/{p.name}/e2e.md` | {len(plots)} in `parts/{p.name}/plots/` |"
        )
    return "\n".join([*lines, ""])


def _copy_part(src: Path, dest: Path) -> None:
    """A part copied into the merge; links and special files are refused (copying would follow them)."""
    for d, subdirs, files in os.walk(src):
        for n in [*subdirs, *files]:
            p = Path(d) / n
            if p.is_symlink() or not (p.is_dir() or p.is_file()):
                raise UsageError(
                    f"{p} is a link or a special file, not a file of a sweep table export; `tuner sweep merge` copies "
                    "only plain files. Export that table again (`tuner sweep export`), or remove the link."
                )
    shutil.copytree(src, dest)


def merge_tables(
    folders: Sequence[Path], out: Path, *, spec: str | None = None, gpu_dirs: Sequence[Path] = ()
) -> dict[str, Any]:
    """Write the merged folder ``out`` and return its manifest.

    Raises:
        UsageError: ``out`` is not new, empty or an earlier merge; a folder not an export; parts that do not
            join; a source other than the parts'."""
    out = Path(out)
    folders = [Path(f) for f in folders]
    if any(out.resolve() == f.resolve() or out.resolve() in f.resolve().parents for f in folders):
        raise UsageError(f"-o {out} is one of the tables to merge, or holds one; pass a new folder.")
    _check_out(out)
    # Written into a staging folder beside -o and swapped in whole (a failure or a kill leaves the earlier merge).
    with tempfile.TemporaryDirectory(prefix="tuner-sweep-merge-") as tmp, staged_export(out, check=_check_out) as stage:
        parts = load_parts(folders, Path(tmp) / "ev")
        raw = []
        for i, d in enumerate(Path(g) for g in gpu_dirs):
            name = d.resolve().name
            if not NAME.fullmatch(name) or name in (".", ".."):
                raise UsageError(
                    f"--gpu folder name {name!r} cannot name gpus/<model>/<name>: use letters, digits and . _ + - "
                    "only; rename the folder."
                )
            src_store, copy = _store_in(d), Path(tmp) / "gpu" / str(i) / STORE
            copy.parent.mkdir(parents=True)
            if src_store.suffix == ".xz":  # streamed and capped, as an export's evidence is (a small file can expand)
                export.decompress_file(d, src_store.name, copy)
            else:
                export.backup_store(src_store, copy)
            raw.append((name, copy))
        merged = merged_view(parts, load_gpu_confirmations(raw, parts))
        names = [(g.device, g.name) for g in merged.gpus]
        if len(set(names)) != len(names):
            raise UsageError("Two --gpu folders of one GPU model share a name; each is kept as gpus/<model>/<name>.")
        first = merged.parts[0].manifest["source"]
        src = source.fetch_source(spec or first["spec"])
        if src.source_id != first["source_id"]:
            raise UsageError(
                f"{src.spec} is source {src.source_id}; the tables were measured on {first['source_id']} "
                f"({first['spec']}). Pass --source with that tree."
            )
        try:  # every part's kept entries on the pristine tree ('' where no part kept one)
            kept = merged.confirmed
            patch = confirm.render_kept(src.root, kept.kept_rules, kept.kept_mmq, merged.table.arch)
        except TunerError as err:  # entries of two parts that overlap (the renderer checks)
            raise UsageError(f"The parts' kept entries cannot form one table: {err}") from err
        for p in merged.parts:
            _copy_part(p.folder, stage / PARTS / p.name)
        gpu_records = []
        for g, (_, copy) in zip(merged.gpus, raw):
            dest = stage / g.folder
            dest.mkdir(parents=True)
            (dest / f"{STORE}.xz").write_bytes(lzma.compress(copy.read_bytes(), preset=9))
            rounds = max((int(str(m.get("rounds", 3))) for m in g.models), default=3)
            e2e = e2e_text(g.confirmed, identity=export.clean_identity(g.identity), rounds=rounds)
            (dest / "e2e.md").write_text(export.without_local_paths(e2e))
            gpu_records.append({"device": g.device, "part": g.part, "name": g.name,
                                "confirm_sha256": file_sha256(dest / f"{STORE}.xz")})  # fmt: skip
        if patch:
            (stage / "upstream.patch").write_text(patch)
        (stage / "PR.md").write_text(merged_pr(merged, patch))
        full = export.demoted(merged_pr_text(merged.parts, patch=bool(patch)))
        (stage / "report.md").write_text(
            f"{_report(merged.parts)}\n## The table in full, as measured on {merged.devices[0]}\n\n{full}\n"
        )
        manifest = {
            "schema": export.SCHEMA,
            "kind": KIND,
            "source": dict(first),
            "target": dict(merged.parts[0].manifest["target"]),
            "table": manifest_table(merged),
            "parts": [
                {"name": p.name, "manifest_sha256": file_sha256(stage / PARTS / p.name / export.MANIFEST)}
                for p in merged.parts
            ],
            "hashes": {"patch_sha256": text_sha256(patch) if patch else ""},
            **({"gpus": gpu_records} if gpu_records else {}),
        }
        (stage / export.MANIFEST).write_text(tomli_w.dumps(manifest))
    return manifest


def confirm_command(c: Confirmation, *, has_mmq: bool, out: str) -> str:
    """The ``tuner sweep confirm`` call that measured ``c``, on stores unpacked to ``<part>/fa``, ``/mmq``."""
    rows = c.models
    base = [r for r in rows if "pass" not in r and "batch" not in r]
    likes = list(dict.fromkeys(str(r["like"]) for r in base))
    depths = sorted({int(d) for r in base for d in _ints(r.get("depths"))})
    passes = [r for r in rows if "pass" in r]
    args = [f"tuner sweep confirm {c.part}/fa", *([f"--mmq {c.part}/mmq"] if has_mmq else [])]
    args += [f"--like {x}" for x in likes]
    quant = _quant(c)
    if quant != DEFAULT_QUANT.upper():
        args.append(f"--quant {quant}")
    if tuple(depths) != confirm.DEFAULT_DEPTHS:
        args.append(f"--depths {','.join(map(str, depths))}")
    if any(f.choice is not None for f in c.confirmed.fates):  # the table has MMQ choices
        mmq_like = str(passes[0]["like"]) if passes else "none"
        if mmq_like != "llama-3.1-8b":
            args.append(f"--mmq-like {mmq_like}")
    rounds = {int(str(r.get("rounds", 3))) for r in rows}
    if rounds != {3}:
        args.append(f"--rounds {max(rounds)}")
    return " ".join([*args, f"-o {out}"])


def _quant(c: Confirmation) -> str:
    """The models' type the store recorded, checked (it is printed into PR.md's commands): UsageError otherwise."""
    return quant_type(c.identity.get("quant", DEFAULT_QUANT))


def _ints(v: object) -> list[int]:
    return [int(x) for x in v if isinstance(x, int)] if isinstance(v, list) else []


def _verdict_cell(j: Joined, device: str) -> str:
    return next((v.word for v in j.verdicts if v.device == device), "not measured")


def _entry_text(fate: RuleFate) -> str:
    if fate.choice is not None:
        c = fate.choice
        return (
            f"`{fate.text}`: {c.type} weights to cuBLAS from batch {c.lo}"
            + (f" to {c.hi}" if c.hi else "")
            + f" (needs `-ub >= {c.lo}`; the default `-ub 512` never reaches it)"
        )
    return f"`{fate.text}`"


def _points(entry: int, confs: Sequence[Confirmation], fate: RuleFate) -> list[dict[str, object]]:
    """The rows of one patched entry on one GPU model (for an MMQ choice also its weights below its batch)."""
    out: list[dict[str, object]] = []
    for c in confs:
        quant = _quant(c)
        label = "" if quant == DEFAULT_QUANT.upper() else f" {quant}"
        out += [{**p, "model": f"{p['model']}{label}"} for p in c.confirmed.fates[entry].touched]
        ch = fate.choice
        if ch is None:
            continue
        for like, types in c.confirmed.weight_types.items():
            # the choice's own weight type at llama-bench's default -ub, where its batch is never reached
            if quant.upper().startswith(ch.type.upper()) and ch.type.lower() in {t.lower() for t in types}:
                below = [p for p in c.confirmed.points.get(like, ()) if not ch.covers(int(str(p.get("ne11", 1))))]
                out += [{**p, "model": f"{p['model']}{label}, -ub 512"} for p in below]
    return out


def _caption(device: str) -> str:
    spec = gpu_specs().get(device)
    if spec is None:
        return f"## {device}"
    return (
        f"## {device}: {spec['sms']} SMs, max SM clock {spec['max_sm_clock_mhz']} MHz, "
        f"{spec['memory_bandwidth_tbs']} TB/s ({spec['memory']}; {spec['source']})"
    )


def _op_text(r: Mapping[str, object]) -> str:
    """One stored test-backend-ops run; a FLASH_ATTN_EXT run names the head sizes its case filter selected (a run
    stored before an entry of another head size was kept does not cover that entry)."""
    heads = sorted({int(h) for h in re.findall(r"hsk=(\d+)", str(r.get("params") or ""))})
    cover = f"; head sizes {', '.join(map(str, heads))}" if heads else ""
    return f"{r.get('op')} {'PASS' if r.get('passed') else 'FAIL'} ({r.get('summary', '')}{cover})"


def _ops_line(device: str, confs: Sequence[Confirmation]) -> str:
    each = [f"{c.part}: " + ", ".join(_op_text(r) for r in c.backend_ops) for c in confs if c.backend_ops]
    if not each:
        return f"- test-backend-ops on {device}: not run (no entry kept there)"
    return (
        f"- test-backend-ops on {device}, each confirmation's kept entries, against the CPU backend: {'; '.join(each)}"
    )


def _gate_line(device: str, confs: Sequence[Confirmation]) -> str:
    gates = {like: g for c in confs for like, g in c.confirmed.gates.items() if g}
    failed = sorted(like for like, g in gates.items() if g.get("verdict") != "pass")
    verdict = f"FAIL on {', '.join(failed)}" if failed else "PASS"
    return (
        f"- Output equivalence on {device} (llama-perplexity KLD of the table against upstream, within twice the "
        f"spread of upstream's own kernels): {verdict}, {len(gates)} model(s)"
    )


def table_pr_text(
    *,
    arch: str,
    joined: Sequence[tuple[int, Joined]],
    confirmations: Sequence[Confirmation],
    patch: str,
    has_mmq: Mapping[str, bool],
) -> str:
    """PR.md (module doc); ``confirmations``: every confirm store, the first GPU model's first."""
    devices = list(dict.fromkeys(c.device for c in confirmations))
    patched = [(i, j) for i, j in joined if j.kept]
    dropped = [(i, j) for i, j in joined if j.action == "dropped"]
    guard = re.search(r"cc == GGML_CUDA_CC_\w+", patch)
    what = "FlashAttention kernel" + (" and MMQ-vs-cuBLAS" if any(j.fate.choice for _, j in joined) else "")
    lines = [
        f"# CUDA: {what} selection for {arch}, measured on {' and '.join(devices)}",
        "",
        (
            f"`upstream.patch` adds {len(patched)} entr{'y' if len(patched) == 1 else 'ies'}, "
            f"keyed on `{guard.group() if guard else arch}`; a shape it does not list keeps upstream's logic."
            if patch
            else "No patch: no entry was faster end to end on any GPU model without being slower on another."
        ),
        "",
        "| Entry | " + " | ".join(devices) + " |",
        "|---|" + "---|" * len(devices),
    ]
    lines += [
        f"| {_entry_text(j.fate)} | " + " | ".join(_verdict_cell(j, d) for d in devices) + " |" for _, j in patched
    ]
    if dropped:
        lines += [
            "",
            "Dropped, as the GPU models disagree and the patch keys entries on the compute capability alone:",
            "",
        ]
        for _, j in dropped:
            key = differs(devices)
            lines.append(
                f"- `{j.fate.text}`: {j.why}"
                + (f". A run-time key on their {key} would separate them; this patch adds none." if key else ".")
            )
    lines += [
        "",
        "faster: faster end to end beyond the A/A noise where the entry acts; no gain: measured there, within the "
        "noise; not measured: no confirmed model of its shape on that GPU model. Below, per GPU model, the points "
        "the patched entries act on.",
    ]
    for d in devices:
        mine = [c for c in confirmations if c.device == d]
        rows, unmeasured = [], []
        for i, j in patched:
            # the part whose confirmations decided j (its fate is one of theirs)
            part = next((c.part for c in mine if any(f.text == j.fate.text for f in c.confirmed.fates)), "")
            got = _points(i, [c for c in mine if c.part == part], j.fate)
            rows += got
            if j.fate.choice is not None and not any(", -ub 512" in str(p["model"]) for p in got):
                unmeasured.append(f"- `{j.fate.text}` at the default `-ub 512`: not measured on {d}.")
        unique: dict[tuple[object, ...], dict[str, object]] = {}
        for p in rows:
            unique.setdefault((p["model"], p["test"], p["depth"]), p)
        rows = list(unique.values())
        lines += ["", _caption(d), ""]
        lines.append(
            compare_table(rows, name_a="upstream", name_b="table") if rows else "No point of a patched entry measured."
        )
        lines += ["", *unmeasured] if unmeasured else []
    lines += ["", "## Reproduce", "", "From this folder, with tuner installed, on each GPU model:", "", "```sh"]
    for part in dict.fromkeys(c.part for c in confirmations):  # the sweeps' stores, once a part
        mmq = has_mmq.get(part)
        lines += [
            f"E=parts/{part}/evidence; mkdir -p {part}/fa" + (f" {part}/mmq" if mmq else ""),
            f"xz -dc $E/sweep.sqlite3.xz > {part}/fa/sweep.sqlite3"
            + (f"; xz -dc $E/mmq.sqlite3.xz > {part}/mmq/mmq.sqlite3" if mmq else ""),
        ]
    for c in confirmations:
        out = f"{c.part}/confirm" if c.device == devices[0] else f"{c.part}/{c.name}-{c.folder.split('/')[-2]}"
        lines += [f"# on {c.device}", confirm_command(c, has_mmq=bool(has_mmq.get(c.part)), out=out)]
    lines += [
        "```",
        "",
        "The stores read here: " + ", ".join(f"`{c.folder}/confirm.sqlite3.xz`" for c in confirmations) + ".",
        "",
        "## Checks",
        "",
    ]
    for d in devices:
        mine = [c for c in confirmations if c.device == d]
        lines += [_ops_line(d, mine), _gate_line(d, mine)]
    lines += [
        "",
        "## Method",
        "",
        "1. Kernel level: every (head size, GQA, K/V type, batch, n_kv) cell times each legal kernel against "
        "upstream's choice and an A/A copy of it, in paired rounds; MMQ against cuBLAS the same way per type and batch.",
        "2. End to end: random-weight models of each shape, llama-bench against upstream with the table in the "
        "build's runtime hook, paired interleaved rounds with an A/A pair; a verdict only where the paired 95% CI "
        "clears the A/A noise.",
        "3. On each GPU model apart; an entry is patched where it is faster on one and slower on none, and the "
        "output-equivalence gate passes.",
        "4. Speedup = t/s table / t/s upstream (compare-llama-bench.py's figure); Noise = upstream against itself.",
        "5. Details, every model's rows and the entries not patched: `report.md`; the method: `docs/sweep.md` in "
        "the tuner repository.",
        "",
    ]
    return "\n".join(lines)

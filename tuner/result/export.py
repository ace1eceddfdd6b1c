"""``tuner export``: a finished study (:class:`tuner.search.winner.FinishedStudy`) as a reviewable, reproducible
result folder (``config.toml``, ``tuned.patch`` unless the kernels are upstream's, ``CMakeUserPresets.json``,
``run.env``, ``report.md``, ``depth.png``), renamed into place whole (:func:`staged_export`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import re
import shutil
import statistics
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import tomli_w

from tuner import log
from tuner._hash import text_sha256
from tuner.errors import TunerError, UsageError
from tuner.measure.bench import COLUMNS
from tuner.measure.stats import bootstrap_median_ci
from tuner.paths import current_umask
from tuner.plan import render
from tuner.plan.fa_rules import FaRule, rules_env, rules_texts
from tuner.plan.render import render_presets
from tuner.plan.space import RULE_KINDS, SearchSpace, compile_values_of, runtime_env_and_args
from tuner.plan.variant import RenderedVariant
from tuner.result.plots import plot_depth
from tuner.result.report import render_report
from tuner.study import legacy
from tuner.study.record import StudyHeader, load_header
from tuner.targets import models
from tuner.targets.archs import find_product, load_arch
from tuner.targets.models import ModelShape
from tuner.targets.roofline import estimate

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.source.spec import Source

SCHEMA_VERSION = 1


class Samples(Protocol):
    """One config's measurement at one point (:class:`tuner.search.select.Measurement`)."""

    @property
    def samples(self) -> tuple[float, ...]: ...


class ChosenWinner(Protocol):
    """What the export reads of :class:`tuner.search.winner.Winner` (result/ does not import search/)."""

    @property
    def global_config(self) -> str: ...
    @property
    def values(self) -> Mapping[str, object]: ...
    @property
    def rules(self) -> tuple[FaRule, ...]: ...
    @property
    def buckets(self) -> tuple[Mapping[str, Any], ...]: ...


class Finished(Protocol):
    """What the export reads of :class:`tuner.search.winner.FinishedStudy`."""

    @property
    def study(self) -> optuna.Study: ...
    @property
    def source(self) -> Source: ...
    @property
    def space(self) -> SearchSpace: ...
    @property
    def winner(self) -> ChosenWinner: ...
    @property
    def results(self) -> Mapping[str, Mapping[tuple[str, int], Samples]]: ...
    @property
    def base(self) -> str: ...
    @property
    def baseline_trial(self) -> FrozenTrial | None: ...


PRESETS_FILE = "CMakeUserPresets.json"
"""The preset file an export writes: CMake reads it beside the tree's own ``CMakePresets.json`` (which it
must not replace: the tuned preset inherits that file's ``base``/``release``)."""

EXPORT_FILES = frozenset(
    ["config.toml", "tuned.patch", PRESETS_FILE, "run.env", "report.md", "PR.md", "upstream.patch", "speedup.png"]
    + ["pareto_decode.png", "depth.png", "CMakePresets.json"]
)  # the last: what exports wrote before CMakeUserPresets.json
"""Every file an export writes (or wrote): an existing folder holding only these is a previous export."""

NO_PATCH_NOTE = (
    "No tuned.patch: nothing to patch, the tuned kernels are upstream's (the export differs from the "
    "pristine tree only in CMake settings and run-time arguments)."
)


def check_out_dir(out_dir: Path) -> None:
    """UsageError unless ``out_dir`` is missing, empty or a previous export (only files an export writes): an
    export replaces the whole folder. A llama.cpp checkout is named as such (the likely intent)."""
    tree_files = (out_dir / "CMakeLists.txt").is_file() or (out_dir / "CMakePresets.json").is_file()
    if (out_dir / "ggml").is_dir() and tree_files:
        raise UsageError(
            f"{out_dir} is a llama.cpp source tree (it has ggml/ and CMakeLists.txt). `tuner export -o` writes a "
            f"result folder and replaces it whole, so it will not write into a checkout. Export to a folder of its own "
            f"(e.g. results/<arch>/<model>), then copy {PRESETS_FILE} into the tree and `git apply` tuned.patch there "
            f"(when the export has one)."
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(
            f"{out_dir} is a file, not a folder. Pass -o a folder (new, empty or a previous export), or "
            "move the file away."
        )
    if out_dir.is_dir():
        if foreign := sorted(p.name for p in out_dir.iterdir() if p.name not in EXPORT_FILES):
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise UsageError(
                f"{out_dir} exists and holds files an export does not write ({shown}). An export replaces its folder "
                f"whole, so it only overwrites an empty folder or a previous export. Choose another -o, or move those "
                f"files away."
            )


_STAGING = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-[a-z0-9_]{8}")
"""The names :func:`staged_export` gives its folders beside ``-o`` (``tempfile.mkdtemp``'s 8 characters)."""


def _own(folder: Path) -> int | None:
    """An fd holding an exclusive flock on ``folder`` (released when closed, or when its process dies, even by
    ``kill -9``), or None where another process holds it (a live export) or it is not a plain folder."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def clean_leftovers(out_dir: Path) -> list[Path]:
    """Remove (and return) what killed exports to ``out_dir`` left beside it and no live process holds: staging
    folders (``.NAME.tmp-*``) and moved-aside previous exports (``.NAME.old-*``); one moved aside before its
    replacement was renamed into place is put back as ``out_dir`` (the last whole export)."""
    parent = out_dir.parent
    try:
        entries = sorted(parent.iterdir(), key=lambda p: p.name)
    except OSError:
        return []
    gone = []
    for p in entries:
        m = _STAGING.fullmatch(p.name)
        if m is None or m["name"] != out_dir.name or p.is_symlink() or not p.is_dir():
            continue
        fd = _own(p)
        if fd is None:  # a live export is writing it, or it is not ours to judge
            continue
        try:
            prev = p / "x"
            if m["kind"] == "old" and not os.path.lexists(out_dir) and prev.is_dir() and not prev.is_symlink():
                os.replace(prev, out_dir)
                log.info(f"put back the previous export {out_dir} (an export was killed while replacing it)")
            shutil.rmtree(p)
            gone.append(p)
        finally:
            os.close(fd)
    if gone:
        log.info(f"removed {len(gone)} folder(s) left beside {out_dir} by a killed export")
    return gone


@contextlib.contextmanager
def staged_export(out_dir: Path, *, check: Callable[[Path], None] = check_out_dir) -> Iterator[Path]:
    """Yield a temporary folder beside ``out_dir`` to write the export into; on success it replaces
    ``out_dir`` (the previous export is moved aside, then removed), on any failure it is removed and
    ``out_dir`` is left as it was; ``check`` (UsageError) first. Every command that replaces a result folder
    whole goes through here. The staging folders are flocked while in use, so the next export to the same
    ``-o`` removes those a killed export left (:func:`clean_leftovers`)."""
    check(out_dir)
    parent = out_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(out_dir)
    # Beside the target, so the final rename stays on one filesystem (atomic, no copy).
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    held = [fd for fd in [_own(tmp)] if fd is not None]
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it 0700; an export folder gets the usual mode
        old = None
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=parent))
            held += [fd for fd in [_own(old)] if fd is not None]
            os.replace(out_dir, old / "x")
        try:
            os.replace(tmp, out_dir)
        except BaseException:
            if old is not None:  # put the previous export back
                os.replace(old / "x", out_dir)
                shutil.rmtree(old, ignore_errors=True)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        for fd in held:
            os.close(fd)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
    """A chosen config's knob values as an export writes them: the variant, the compile values, and the runtime
    knobs' environment (``run_env``, the hook's ``GGML_TUNER_*`` apart as ``fa_env``) and llama-bench args."""

    variant: str
    compile_values: dict[str, int]
    run_env: dict[str, str]
    fa_env: dict[str, str]
    args: list[str]

    @classmethod
    def of(
        cls, space: SearchSpace, values: Mapping[str, object], *, runtime: Mapping[str, object] | None = None
    ) -> Choice:
        env, args = runtime_env_and_args(space, values if runtime is None else runtime)
        return cls(
            variant=str(values.get("variant") or space.variants[0]),
            compile_values=compile_values_of(space, values),
            run_env={k: v for k, v in env.items() if not k.startswith("GGML_TUNER_")},
            fa_env={k: v for k, v in env.items() if k.startswith("GGML_TUNER_")},
            args=args,
        )


def source_table(source: Source) -> dict[str, str]:
    return {"spec": source.spec, "source_id": source.source_id, "commit": source.commit or "", "era": source.era}


def hashes_table(rv: RenderedVariant) -> dict[str, str]:
    """config.toml's ``[hashes]``: what validate checks the folder's patch and defines against."""
    return {
        "patch_sha256": text_sha256(rv.patch),
        "defines_sha256": text_sha256(json.dumps(dict(rv.defines), sort_keys=True)),
    }


def export_render(
    source: Source, arch: str, variant: str, *, compile_values: Mapping[str, int], baked: Mapping[str, str]
) -> RenderedVariant:
    """The exported (baked) render of a config; its ``patch`` is empty (no ``tuned.patch``) where it equals the
    default config's, whose baked hook selects exactly upstream's kernels."""
    rv = render.render_variant(source, arch, variant, compile_values=compile_values, baked_runtime=baked)
    if rv.patch:
        default = render.render_variant(source, arch, variant, baked_runtime={})
        if default.patch == rv.patch:
            return dataclasses.replace(rv, patch="", files={})
    return rv


def write_result(finished: Finished, out_dir: Path, *, like: str | None = None, weight_type: str | None = None) -> Path:
    """Write the result folder of a finished study; returns ``out_dir``. ``like``/``weight_type``: the model
    shape for the roofline when the GGUF is not here (default: the study's)."""
    study, source, space, w = finished.study, finished.source, finished.space, finished.winner
    h = load_header(study)
    vals = dict(w.values)
    rule_knobs = {x.name for x in space.runtime_knobs if x.kind in RULE_KINDS}
    choice = Choice.of(space, vals, runtime={k: v for k, v in vals.items() if k not in rule_knobs})
    baked = baked_runtime(w.rules, choice.fa_env)
    arch = h.required(h.arch, "arch")
    rv = export_render(source, arch, choice.variant, compile_values=choice.compile_values, baked=baked)
    with staged_export(out_dir) as tmp:
        model = Path(h.required(h.model, "model"))
        write_build_files(tmp, rv, choice, (), model=model.name, depths=",".join(map(str, h.depths)))
        trial0 = next((t for t in study.trials if legacy.trial_attr(t, "build_id")), None)
        g_trial = study.trials[int(w.global_config.removeprefix("trial"))] if w.global_config != "baseline" else trial0
        # (arch, product) of the GPU the study ran on: the roofline is that GPU's, which is not the target's
        # when a newer GPU ran older code (``--ptx-jit``, e.g. sm_89 as 89-virtual on an H100)
        measured = find_product(_device_name(study)) or (str(h.arch), None)
        config = {
            "schema": SCHEMA_VERSION,
            "source": source_table(source),
            "hashes": hashes_table(rv),
            "target": {
                "arch": h.arch,
                "measured_on": _device_name(study),
                "measured_arch": measured[0],
                "toolchain": (legacy.trial_attr(g_trial, "toolchain") if g_trial else None) or dict(h.toolchain),
            },
            "model": {"file": model.name, "depths": h.depths, "pp": h.pp, "tg": h.tg},
            "choice": {
                "variant": choice.variant,
                "global_config": w.global_config,
                "compile": choice.compile_values,
                "runtime_env": choice.run_env,
                "fa_env": choice.fa_env,
                "bench_args": choice.args,
                "fa_rules": rules_texts(w.rules),
            },
            "defines": dict(rv.defines),
            "buckets": list(w.buckets),
            "gate": (legacy.trial_attr(g_trial, "gate") if g_trial else None) or {"status": "unknown"},
            "study": {"name": study.study_name, "n_trials": len(study.trials), "profile": h.profile},
        }
        (tmp / "config.toml").write_text(tomli_w.dumps(tomlable(portable_paths(config, study.study_name))))
        _write_report(finished, tmp, measured, like=like, weight_type=weight_type, no_patch=not rv.patch)
    log.info(f"exported {study.study_name} -> {out_dir}")
    return out_dir


def write_build_files(
    out_dir: Path,
    rv: RenderedVariant,
    choice: Choice,
    rules: Sequence[FaRule],
    *,
    model: str,
    depths: str,
    mask: str = "",
) -> None:
    """``tuned.patch`` (only when it changes something), ``CMakeUserPresets.json`` (preset ``tuned-<arch>``) and
    ``run.env``: the runtime environment, the FA rules (when the export has any) and the llama-bench and
    llama-server command lines (under ``taskset -c mask`` when measured pinned)."""
    if rv.patch:
        (out_dir / "tuned.patch").write_text(rv.patch)
    (out_dir / PRESETS_FILE).write_text(render_presets(rv, name=f"tuned-{rv.arch.replace('_', '')}"))
    pin = ["taskset", "-c", mask] if mask else []  # measured pinned (--cpu-mask): the numbers hold only so
    bench_cmd = [*pin, "llama-bench", "-m", model, "-fa", "1", "-d", depths, *choice.args]
    server_cmd = [*pin, "llama-server", "-m", model, "-fa", "on", *server_args(list(choice.args))]
    text = "# Runtime settings chosen by tuner; `set -a; . ./run.env; set +a` before running llama.cpp.\n"
    text += "".join(f"{k}={v}\n" for k, v in sorted(choice.run_env.items()))
    if rules:
        text += "# The FA rules are baked into tuned.patch; on a tuner build (env hook) the same rules are:\n"
        text += f"# GGML_TUNER_FA_RULES={rules_env(rules)}\n"
    text += f"# llama-bench: {' '.join(bench_cmd)}\n# llama-server: {' '.join(server_cmd)}\n"
    (out_dir / "run.env").write_text(text)


def baked_runtime(rules: Sequence[FaRule], fa_env: Mapping[str, str]) -> dict[str, str]:
    """The hook's env values to compile in (render's ``baked_runtime``); export and validate share it."""
    out = dict(fa_env)
    out.pop("GGML_TUNER_FA_RULES", None)
    if rules:
        out["GGML_TUNER_FA_RULES"] = rules_env(rules)
    return out


def portable_paths(x: object, study_name: str) -> object:
    """``x`` with every absolute local path made portable: relative to the study's run folder
    (``…/runs/<study>/``) where it is under it, else the file name. An export is read on other machines;
    this machine's folders mean nothing there (and name its user)."""
    if isinstance(x, Mapping):
        return {k: portable_paths(v, study_name) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [portable_paths(v, study_name) for v in x]
    if isinstance(x, str) and x.startswith("/") and " " not in x and "\n" not in x:
        marker = f"/runs/{study_name}/"
        return x.split(marker, 1)[1] if marker in x else Path(x).name
    return x


def server_args(args: list[str]) -> list[str]:
    # llama-bench and llama-server share -ub/-b/-t/-ngl spellings; the server's -nkvo and --no-repack are switches
    # (bench: -nkvo 0|1, --repack 0|1); anything else is bench-only.
    out = []
    for i in range(0, len(args) - 1, 2):
        if args[i] in ("-ub", "-b", "-t", "-ngl", "-ctk", "-ctv"):
            out += [args[i], args[i + 1]]
        elif args[i] == "-nkvo" and args[i + 1] == "1":
            out.append("-nkvo")
        elif args[i] == "--repack" and args[i + 1] == "0":  # llama-server (common/arg.cpp): --no-repack
            out.append("--no-repack")
    return out


def _device_name(study: optuna.Study) -> str:
    devices = (legacy.trial_attr(t, "device") for t in study.trials)
    d = next((d for d in devices if d), None) or load_header(study).device
    return str(d) if d is not None else "unknown"


def tomlable(x: object) -> Any:
    """TOML has no null: drop None values, stringify the rest that TOML cannot hold."""
    if isinstance(x, Mapping):
        return {str(k): tomlable(v) for k, v in x.items() if v is not None}
    if isinstance(x, (list, tuple)):
        return [tomlable(v) if v is not None else "none" for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def _roofline_for(
    h: StudyHeader, like: str | None, weight_type: str | None, measured: tuple[str, str | None]
) -> dict[tuple[str, int], float | None] | None:
    """(phase, depth) -> roofline t/s: from the GGUF when it is here, else from its named shape."""
    model: Path | ModelShape = Path(h.required(h.model, "model"))
    wt = "f16"  # estimate's default: a GGUF's own weight types are read from it
    if isinstance(model, Path) and not model.is_file():
        if not like:
            return None
        model = models.load_model_shape(like)
        wt = weight_type or "f16"
    try:
        arch, product = measured
        pp, tg = h.required(h.pp, "pp"), h.required(h.tg, "tg")
        rows = estimate(arch, model, tuple(h.depths), pp=pp, tg=tg, product=product, weight_type=wt)
    except TunerError:
        return None  # e.g. cpu: no bandwidth known for an arbitrary host
    return {(("pp" if str(r["test"]).startswith("pp") else "tg"), int(r["depth"])): r.get("bound_tps") for r in rows}


def _write_report(
    finished: Finished,
    out_dir: Path,
    measured: tuple[str, str | None],
    *,
    like: str | None = None,
    weight_type: str | None = None,
    no_patch: bool = False,
) -> None:
    """report.md (seed-003 style tables) and depth.png, baseline vs tuned per bucket."""
    import pandas as pd  # heavy: imported when a report is written

    study, w = finished.study, finished.winner
    results, base = finished.results, finished.base
    like, weight_type = like or legacy.study_attr(study, "like"), weight_type or legacy.study_attr(study, "weight_type")
    h = load_header(study)
    roof = _roofline_for(h, like, weight_type, measured) or {}
    rows: dict[str, list[dict[str, object]]] = {"baseline": [], "tuned": []}
    sel_rows = []
    for b in w.buckets:
        ph = b["phase"]
        for d in b["depths"]:
            for label, cfg in (("baseline", base), ("tuned", b["config"])):
                m = results[cfg][(ph, d)]
                rows[label].append(_row(label, ph, d, m.samples, h, roof.get((ph, d))))
            e = b["evidence"][str(d)]
            sel_rows.append(
                [
                    f"{ph} d{d}",
                    f"{e['delta_pct']:+.1f}%",
                    f"[{e['ci_low']:+.1f}, {e['ci_high']:+.1f}]",
                    f"{e['noise_floor_pct']:.1f}%",
                    f"{e['verdict']} (p={e['p_value']:.3g})",
                    b["config"],
                    ", ".join(b["rules"]),
                ]
            )
    frames = {k: pd.DataFrame(v) for k, v in rows.items()}
    md = render_report(frames, baseline="baseline")
    header = (
        f"# tuner result: {h.arch} / {Path(h.required(h.model, 'model')).name}\n\n"
        f"Source {h.source_spec} (llama.cpp {h.commit}, era {h.era}); study `{study.study_name}`, "
        f"{len(study.trials)} trials; measured on {_device_name(study)}.\n\n"
        + (_ptx_jit_note(h, measured, like, weight_type) if measured[0] != h.arch else "")
        + f"FlashAttention rules: {', '.join(rules_texts(w.rules)) or 'upstream selection'}.\n\n"
        + (NO_PATCH_NOTE + "\n\n" if no_patch else "")
    )
    selection = (
        "\n## Selection (what the export is based on)\n\n"
        "A verdict needs the 95% CI of the change to clear the noise floor: the run-to-run drift of the "
        "baseline re-measured as an anchor during the search (at least 2%). The marks in the tables "
        "above compare within one run only and do not account for that drift.\n\n"
        + log.table(["point", "Δ tuned", "95% CI", "noise floor", "verdict", "config", "rules"], sel_rows)
        + "\n"
    )
    (out_dir / "report.md").write_text(header + md + selection + _trials_section(study, finished.baseline_trial))
    plot_depth(frames, out_dir / "depth.png")


def _ptx_jit_note(h: StudyHeader, measured: tuple[str, str | None], like: str | None, weight_type: str | None) -> str:
    """What a result measured through --ptx-jit says, and does not say, about a real target card."""
    target = load_arch(h.required(h.arch, "arch"))
    prod = target.products[0] if target.products else None
    note = (
        f"**{h.arch} code, measured on the {measured[0]} GPU named above** ({h.arch} kernels built as PTX and "
        f"JIT-compiled for it): kernel legality and device code are {h.arch}'s; speeds, clocks, bandwidth and "
        f"roofline % are the {measured[0]} GPU's ({measured[1]}), not an {h.arch} card's. Host-side code sees "
        f"the {measured[0]} GPU's compute capability, so branches that single out {h.arch} take the "
        f"{measured[0]} path. Which candidate wins can differ on a real card; rerun the search there.\n\n"
    )
    roof = _roofline_for(h, like, weight_type, (target.name, prod.name if prod else None)) or {}
    tg = [(d, roof[("tg", d)]) for d in h.depths if roof.get(("tg", d))]
    if prod and tg:
        bounds = ", ".join(f"d{d} {b:.0f}" for d, b in tg)
        note += (
            f"For scale, the decode roofline of a {prod.name} ({prod.bandwidth_gbps:g} GB/s) is {bounds} t/s "
            f"(a model estimate, not a measurement).\n\n"
        )
    return note


def _trials_section(study: optuna.Study, base: FrozenTrial | None) -> str:
    """Every trial's status, score and what it changed from upstream (``base``: the enqueued upstream-default trial)."""
    ref = dict(base.params) if base else {}
    rows = []
    for t in study.trials:
        status = str(legacy.trial_attr(t, "status") or t.state.name.lower())
        ratios = legacy.trial_attr(t, "ratios") or {}
        if status == "pruned" and ratios:
            last = list(ratios)[-1]  # the Wilcoxon pruner stops on per-point ratios
            score = f"{ratios[last]:.3f}x at {last} ({len(ratios)} points)"
        else:
            score = f"{t.value:.3f}x" if t.value is not None else "-"
        changed = [f"{k}={v}" for k, v in sorted(t.params.items()) if k in ref and ref[k] != v]
        note = "upstream defaults" if base is not None and t.number == base.number else ", ".join(changed) or "-"
        if status not in ("ok", "pruned") and legacy.trial_attr(t, "reason"):
            note += f" ({str(legacy.trial_attr(t, 'reason'))[:90]})"
        rows.append([f"trial{t.number}", status, score, note])
    return (
        "\n## Trials\n\nscore: candidate/baseline t/s, the search's objective (weighted geometric mean over all "
        "points) for a finished trial; for a pruned one, the ratio at the point where the pruner stopped it. "
        "The score alone picks nothing; the selection above does.\n\n"
        + log.table(["trial", "status", "score", "changed from upstream"], rows)
        + "\n"
    )


def _row(
    label: str, phase: str, depth: int, samples: tuple[float, ...], h: StudyHeader, bound: float | None
) -> dict[str, object]:
    """One report row as a bench frame's (:data:`tuner.measure.bench.COLUMNS`), roofline % where ``bound`` is known."""
    s = sorted(samples)
    med = float(statistics.median(s))
    lo, hi = bootstrap_median_ci(samples)
    n_tok = h.pp if phase == "pp" else h.tg
    row: dict[str, object] = {c: math.nan for c in COLUMNS}  # the keys below are all COLUMNS: their order holds
    row |= {
        "label": label,
        "test": f"{phase}{n_tok}",
        "phase": phase,
        "depth": depth,
        "n": len(samples),
        "median_ts": med,
        "ci_low": lo,
        "ci_high": hi,
        "min_ts": s[0],
        "max_ts": s[-1],
        "samples": list(samples),
        "status": "ok",
        "error": "",
        "build_commit": h.commit or "",
        "backends": load_arch(h.required(h.arch, "arch")).backend,
        "gpu_info": "",
        "model_filename": Path(h.required(h.model, "model")).name,
        "env": "{}",
        "cmd": "",
        "log_file": "",
    }
    if bound:
        row |= {"roofline_tps": float(bound), "roofline_pct": 100.0 * med / float(bound)}
    return row

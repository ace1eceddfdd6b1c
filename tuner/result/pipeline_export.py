"""Export a screen -> compose -> tune -> confirm study: what confirmed, and nothing else (the files of
:mod:`tuner.result.export`, plus ``speedup.png`` and, where CPU% was measured, ``pareto_decode.png``; studies
from before CPU% was measured show "—" there and get no Pareto plot).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import optuna
import tomli_w

import tuner.plan.space
import tuner.source
from tuner import log
from tuner.errors import TunerError, UsageError
from tuner.measure.paired import CPU_REJECTED, NOISE_CEILING_PCT, TOO_NOISY
from tuner.plan.derive import resolve_space
from tuner.plan.fa_rules import FaRule, Phase, as_stored, rules_texts
from tuner.redact import redact
from tuner.result.export import (
    NO_PATCH_NOTE,
    Choice,
    baked_runtime,
    export_render,
    hashes_table,
    portable_paths,
    source_table,
    staged_export,
    tomlable,
    write_build_files,
)
from tuner.result.pipeline_report import confirmed_points, device_name, finite, need, rejected_points, report_text
from tuner.result.plots import ParetoPoint, plot_pareto, plot_speedup
from tuner.result.upstream_patch import models_note, render_pr_body, render_upstream_patch, reproduce_commands
from tuner.sanity import require_finite
from tuner.study.record import SearchOutcome, StudyHeader, load_outcome
from tuner.study.state import StudyState
from tuner.targets.archs import load_arch
from tuner.targets.host import mask_text
from tuner.targets.models import load_models, read_gguf

if TYPE_CHECKING:
    from tuner.source.spec import Source

SCHEMA_VERSION = 3
"""3: ``[gate]`` is the output-equivalence gate (llama-perplexity vs upstream) and ``[op_check]`` the
test-backend-ops record that schema 2 called ``[gate]``."""


def summary_line(outcome: SearchOutcome) -> str:
    """One line on what the search found."""
    gate = outcome.gate or {}
    if gate.get("rejected"):
        bad = [c["name"] for c in gate["rejected"]["gate"].get("checks", []) if not c.get("passed")]
        return (
            f"Result: the confirmed config FAILED the output-equivalence gate ({', '.join(bad)}): it is infeasible, "
            "and the export is upstream's selection (report.md shows the gate's numbers)."
        )
    rows = outcome.rows
    noisy = sorted({Phase.from_bench(r["phase"]).value for r in rows if r["verdict"] == TOO_NOISY})
    if noisy and not outcome.rules and not outcome.tuned:
        return (
            f"Result: the machine was too noisy in {' and '.join(noisy)} (A/A noise above the {NOISE_CEILING_PCT:g}% "
            "ceiling): nothing is claimed there and the export is upstream's selection; report.md's first line "
            "says what to do."
        )
    faster = [r for r in rows if r["verdict"] == "faster"]
    # rows judged by the decision rule (measure/decide) say so; stored results judged by the earlier
    # whole-CI-beyond-the-A/A-noise rule keep their wording
    by = "by the decision rule" if any(r.get("rule") == "sequential" for r in rows) else "beyond the A/A noise"
    if not faster and not rows and outcome.knobs_dropped:
        return _dropped_line(outcome)
    if not faster:
        return (
            f"Result: nothing beat upstream {by}; the export is upstream's selection "
            f"({len(rows)} point(s) confirmed as no difference)."
            if rows
            else "Result: no forced kernel or knob beat upstream in the screen and tune; the export is upstream's selection."
        )
    best = max(faster, key=lambda r: r["speedup"])
    test = f"{best['phase']}{512 if best['phase'] == 'pp' else 128}@d{best['depth']}"
    return (
        f"Result: {len(faster)} point(s) faster than upstream {by}, best "
        f"{test} {100 * (best['speedup'] - 1):+.1f}% (95% CI {100 * (best['ci_low'] - 1):+.1f}..{100 * (best['ci_high'] - 1):+.1f}%); "
        f"rules: {', '.join(outcome.rule_texts) or 'none'}"
        + (f"; output-equivalence gate: {gate['verdict']} ({len(gate.get('checks', []))} check(s))." if gate else ".")
    )


def export_pipeline(
    study_name: str, *, storage: str, out_dir: Path, like: str | None = None, weight_type: str | None = None
) -> Path:
    """Write the result folder of a pipeline study; returns ``out_dir``."""
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError as err:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        raise UsageError(f"no study {study_name!r} in {redact(storage)}; it has {names}. Pass --study NAME.") from err
    outcome = load_outcome(study).exported()  # TunerError before the confirm stage finished
    h = outcome.header
    # a NaN t/s (every llama-bench call failed) is never exported
    require_finite(outcome.result_json(), f"study {study_name!r}'s result")
    gate = _checked_gate(study_name, outcome)
    source = tuner.source.fetch_source(h.source_spec)
    if source.source_id != h.source_id:
        raise TunerError(
            f"the study was run on source {h.source_id} but {h.source_spec} now resolves to "
            f"{source.source_id}. Export needs the exact tree the numbers came from."
        )
    space = resolve_space(tuner.plan.space.load_space(need(h.arch, "arch"), need(h.era, "era")), dict(h.derived_knobs))
    choice = Choice.of(space, dict(outcome.tuned.values) if outcome.tuned else {})
    # what every config ran with on the measuring host (--repack 0 where llama.cpp's AMX kernels died there)
    choice = dataclasses.replace(choice, args=[*choice.args, *(StudyState(study).host_args or [])])
    baked = baked_runtime(outcome.rules, choice.fa_env)
    rv = export_render(source, need(h.arch, "arch"), choice.variant, compile_values=choice.compile_values, baked=baked)
    with staged_export(out_dir) as tmp:
        model, mask = Path(need(h.model, "model")), mask_text(h.cpu_mask or [])
        ds = ",".join(map(str, outcome.confirm_depths or h.depths))
        write_build_files(tmp, rv, choice, outcome.rules, model=model.name, depths=ds, mask=mask)
        gate_t = gate_table(gate)
        residency = residency_table(outcome.residency) if outcome.residency else None
        config: dict[str, object] = {
            "schema": SCHEMA_VERSION,
            "source": source_table(source),
            "hashes": hashes_table(rv),
            "target": {
                "arch": h.arch,
                "measured_on": device_name(h, "unknown"),
                "toolchain": dict(h.toolchain),
                "cpu_mask": mask or None,
            },
            "model": {"file": model.name, "shape": dict(h.shape), "depths": list(h.depths), "pp": h.pp, "tg": h.tg},
            "choice": {
                "variant": choice.variant,
                "compile": choice.compile_values,
                "runtime_env": choice.run_env,
                "fa_env": choice.fa_env,
                "bench_args": choice.args,
                "fa_rules": rules_texts(outcome.rules),
                "dropped_rules": as_stored(dict(outcome.dropped)),
                "narrowed_rules": as_stored(dict(outcome.narrowed)),
                "tune_trial": outcome.tuned.trial if outcome.tuned else None,
            },
            "defines": dict(rv.defines),
            "points": [
                {k: (round(v, 5) if isinstance(v, float) and math.isfinite(v) else v) for k, v in r.items()}
                for r in outcome.rows
            ],
            "gate": gate_t,
            **({"residency": residency} if residency else {}),
            "op_check": dict(next(iter(outcome.op_checks.values()))) if outcome.op_checks else {"status": "unknown"},
            "study": {"name": h.name, "pipeline": h.pipeline, "stage_seconds": dict(outcome.stage_seconds)},
            **({"cost": outcome.cost} if outcome.cost else {}),
        }
        (tmp / "config.toml").write_text(tomli_w.dumps(tomlable(portable_paths(config, h.name))))
        points = confirmed_points(outcome.rows, need(h.pp, "pp"), need(h.tg, "tg"))
        _write_upstream(
            tmp, source, h, outcome.rules, points, defines=dict(rv.defines), like=like, weight_type=weight_type
        )
        if points:
            title = f"{h.arch} {model.name}: final vs upstream (confirm)"
            plot_speedup(points, tmp / "speedup.png", title=title, rules=outcome.rules)
        _write_pareto(tmp / "pareto_decode.png", outcome, title=f"{h.arch} {model.name}: decode t/s vs CPU%")
        report = report_text(outcome, study=study, storage=storage, gate=gate_t, residency=residency)
        (tmp / "report.md").write_text(report + ("" if rv.patch else f"\n## Build\n\n{NO_PATCH_NOTE}\n"))
    log.info(f"exported {study_name} -> {out_dir}")
    return out_dir


def _checked_gate(study_name: str, outcome: SearchOutcome) -> dict[str, object]:
    """The result's output-equivalence gate record; UsageError for a final config that failed or never ran it."""
    gate = outcome.gate
    changed = bool(outcome.rules) or bool(outcome.tuned)
    if gate is None and not changed:
        return {
            "verdict": "not needed",
            "checks": [],
            "why": "the final config is upstream's (no rule or knob confirmed), so its output is upstream's",
        }
    if gate is None:
        raise UsageError(
            f"study {study_name!r} confirmed a config that differs from upstream ({', '.join(outcome.rule_texts) or 'tuned knobs'}) "
            "but has no output-equivalence gate record: it finished before `tuner search` ran the gate. Rerun the same "
            "`tuner search` command (it resumes and runs only the gate), then export."
        )
    if gate.get("verdict") not in ("pass", "not needed"):
        failing = "; ".join(
            f"{c.get('name')}: {' '.join(c.get('reasons', []))}" for c in gate.get("checks", []) if not c.get("passed")
        )
        raise UsageError(
            f"study {study_name!r}: the final config failed the output-equivalence gate ({failing or gate.get('verdict')}). "
            "A config whose output differs from upstream's is infeasible and is never exported; rerun `tuner search` "
            "(this version exports upstream's selection in its place) or export another study."
        )
    return dict(gate)


def _gate_check_row(c: Mapping[str, Any]) -> dict[str, Any]:
    s = c.get("stats") or {}
    keep = ["name", "mode", "strict", "verdict", "why", "deterministic", "identical_to_upstream", "reasons"]
    keep += ["not_applied", "logs", "seconds", "thresholds"]
    settings = c.get("settings") or {}
    return {
        **{k: c[k] for k in keep if c.get(k) not in (None, [], {})},
        **{k: s.get(k) for k in ("mean_kld", "p99_kld", "max_kld", "same_top_pct")},
        **{
            k: settings.get(k)
            for k in ("candidate_env", "candidate_args", "upstream_env", "upstream_args")
            if settings.get(k)
        },
    }


def gate_table(gate: Mapping[str, Any]) -> dict[str, object]:
    """config.toml's ``[gate]``: the verdict, the worst numbers over its checks, thresholds, and each check."""
    checks = [_gate_check_row(c) for c in gate.get("checks", [])]
    out: dict[str, object] = {
        "verdict": gate["verdict"],
        "tool": "llama-perplexity",
        "modes": sorted({c["mode"] for c in checks}),
    }
    if checks:
        first = gate["checks"][0]
        settings = first.get("settings") or {}
        nums = [c for c in checks if c.get("mean_kld") is not None]
        out.update(
            {
                "ctx": settings.get("ctx"),
                "chunks": settings.get("chunks"),
                "thresholds": first.get("thresholds"),
                **{k: max((c[k] for c in nums), default=None) for k in ("mean_kld", "p99_kld", "max_kld")},
                "same_top_pct": min((c["same_top_pct"] for c in nums), default=None),
                "deterministic": all(c.get("deterministic") for c in checks),
                "checks": checks,
            }
        )
    else:
        out["why"] = gate.get("why", "")
    if gate.get("band"):
        out["band_factor"] = gate.get("band_factor")
        out["band"] = [
            {k: v for k, v in _gate_check_row(b).items() if k not in ("verdict", "reasons", "thresholds")}
            for b in gate["band"]
        ]
    if rej := gate.get("rejected"):
        out["rejected"] = {
            "rules": list(rej.get("rules") or []),
            "tuned": _sampled(rej.get("tuned")),
            "checks": [_gate_check_row(c) for c in rej["gate"].get("checks", [])],
            "points": rejected_points(rej.get("rows") or []),
        }
    return out


def residency_table(rec: Mapping[str, Any]) -> dict[str, object]:
    """config.toml's ``[residency]``: the residency gate's verdict and each probe's numbers (None-free for TOML)."""

    def probe(p: Mapping[str, object] | None) -> dict[str, object]:
        return {k: v for k, v in (p or {}).items() if v is not None and k != "log"}

    out: dict[str, object] = {
        "verdict": rec["verdict"],
        "full_offload": rec["full_offload"],
        "why": rec.get("why", ""),
        "reasons": list(rec.get("reasons", [])),
        "upstream": probe(rec["upstream"]),
    }
    if rec.get("final"):
        out["final"] = probe(rec["final"])
    if rec.get("rejected"):
        rej = rec["rejected"]
        out["rejected_rules"] = list(rej.get("rules") or [])
        out["rejected_tuned"] = _sampled(rej.get("tuned"))
        out["rejected_points"] = rejected_points(rej.get("rows") or [])
    return out


def _sampled(tuned: Mapping[str, Any] | None) -> dict[str, object]:
    """A rejected trial's knobs as the tune sampled them (its ``values`` also repeat every pinned knob)."""
    t = tuned or {}
    return dict(t.get("params") or t.get("values") or {})


_SYNTH_NAME = re.compile(r"^(?P<like>[a-z0-9.\-]+?)-(?P<wt>f16|q8_0|q\w+)(?:-direct)?-s\d+-[0-9a-f]{8}$")


class ModelOrigin(TypedDict):
    like: str | None
    quant: str | None
    synthetic: bool | None


def model_origin(h: StudyHeader, like: str | None = None, weight_type: str | None = None) -> ModelOrigin:
    """Where the study's model came from: ``{"like", "quant", "synthetic"}`` (None where unknown). In order: the
    GGUF itself when it is on this machine (``tuner model synth`` names its models ``tuner-random-<shape>``);
    ``like`` given to the export (the model was ``tuner model synth --like LIKE``); the name ``synth_cached``
    gives its files; else only the shape is matched against ``tuner/data/models.toml``."""
    path = Path(str(h.model if h.model is not None else ""))
    quant = weight_type.upper() if weight_type else None
    if path.is_file():
        try:
            name = str(read_gguf(path)[0].get("general.name", (0, None, ""))[2])
        except UsageError:
            name = ""
        if name.startswith("tuner-random-"):
            return {"like": name[len("tuner-random-") :], "quant": quant, "synthetic": True}
        return {"like": like, "quant": quant, "synthetic": False}
    if like:
        return {"like": like, "quant": quant, "synthetic": True}
    if m := _SYNTH_NAME.match(path.stem):
        wt = m.group("wt").upper() if m.group("wt") not in ("f16", "q8_0") else None
        return {"like": m.group("like"), "quant": quant or wt, "synthetic": True}
    shape = h.shape
    dims = ("head_dim", "n_layers", "n_kv_heads", "n_heads")
    match = [n for n, sh in load_models().items() if shape and all(getattr(sh, k) == shape.get(k) for k in dims)]
    return {"like": match[0] if len(match) == 1 else None, "quant": quant, "synthetic": None}


def _write_upstream(
    out_dir: Path,
    source: Source,
    h: StudyHeader,
    rules: Sequence[FaRule],
    points: Sequence[Mapping[str, Any]],
    *,
    defines: Mapping[str, str],
    like: str | None = None,
    weight_type: str | None = None,
) -> None:
    """``upstream.patch`` (the kept rules as conditions in upstream's selection function) and ``PR.md``."""
    for stale in ("upstream.patch", "PR.md"):
        (out_dir / stale).unlink(missing_ok=True)
    arch = load_arch(need(h.arch, "arch"))
    if not rules or arch.vendor == "cpu":
        return
    faster = [p for p in points if p["verdict"] == "faster"]
    best = max(faster, key=lambda p: p["speedup"]) if faster else None
    gpu = device_name(h, "unknown GPU")
    model_file = Path(need(h.model, "model")).name
    note = f"{gpu}: {model_file}, llama-bench in paired interleaved rounds"
    if best:
        note += f"; best {best['test']}@d{best['depth']} {100 * (best['speedup'] - 1):+.1f}% "
        note += f"(95% CI {100 * (best['ci_low'] - 1):+.1f}..{100 * (best['ci_high'] - 1):+.1f}%, "
        note += f"A/A noise {best['aa_noise_pct']:.1f}%)"
    note += "."
    patch = render_upstream_patch(source, rules, arch, note=note)
    if patch is None:
        return
    (out_dir / "upstream.patch").write_text(patch)
    (out_dir / "PR.md").write_text(pr_body(h, rules, points, defines=defines, like=like, weight_type=weight_type))


def pr_body(
    h: StudyHeader,
    rules: Sequence[FaRule],
    points: Sequence[Mapping[str, Any]],
    *,
    defines: Mapping[str, str],
    like: str | None = None,
    weight_type: str | None = None,
) -> str:
    """``PR.md`` of a pipeline result (``points``: the confirmed rows as :func:`confirmed_points` makes them)."""
    arch = load_arch(need(h.arch, "arch"))
    model_file = Path(need(h.model, "model")).name
    origin = model_origin(h, like, weight_type)
    mask: Sequence[int] = h.cpu_mask or []
    commands = reproduce_commands(
        commit=h.commit,
        arch=arch,
        defines=defines,
        model_file=model_file,
        like=origin["like"] if origin["synthetic"] else None,  # synthesize only what was synthesized
        quant=origin["quant"],
        depths=sorted({int(p["depth"]) for p in points}),
        pp=need(h.pp, "pp"),
        tg=need(h.tg, "tg"),
        phases=sorted({p["phase"] for p in points}),
        search_depths=h.depths,
        search_args=(["--cpu-mask", mask_text(mask)] if mask else []),
    )
    models = models_note(model_file=model_file, shape=dict(h.shape), like=origin["like"], synthetic=origin["synthetic"])
    return render_pr_body(
        rules,
        arch,
        gpu=device_name(h, "unknown GPU"),
        model=model_file,
        points=points,
        commands=commands,
        source=f"llama.cpp {h.commit}",
        models=models,
        noise_ceiling_pct=NOISE_CEILING_PCT,
    )


def pareto_points(outcome: SearchOutcome) -> list[ParetoPoint]:
    """Decode (config, depth) points with t/s and CPU% for :func:`tuner.result.plots.plot_pareto`: every
    screened candidate (median over its rounds) and both sides of every confirmed point. Empty when
    the study measured no CPU% (recorded before it did)."""
    sides = [
        (name, int(d), lv.get("ts"), lv.get("cpu"), "screen")
        for d, c in outcome.screens.get("tg", {}).items()
        for name, lv in c.get("levels", {}).items()
    ]
    sides += [
        (name, r["depth"], r.get(f"{side}_ts"), r.get(f"{side}_cpu"), "confirm")
        for r in outcome.rows
        if r["phase"] == "tg"
        for name, side in (("upstream", "base"), ("final", "tuned"))
    ]
    return [
        ParetoPoint(config=n, depth=d, ts=ts, cpu=cpu, stage=st)
        for n, d, ts, cpu, st in sides
        if finite(ts) and finite(cpu)
    ]


def _beyond(lo: object, hi: object, noise: object) -> bool:
    """A CI ``[lo, hi]`` (points) entirely outside ``±noise``."""
    if not (finite(lo) and finite(hi)):
        return False
    n = noise if finite(noise) else 0.0
    return bool(lo > n or hi < -n)


def pareto_differs(outcome: SearchOutcome) -> bool:
    """Whether any decode config differs from upstream beyond the noise, in t/s (a faster/slower/CPU-rejected
    verdict: the A/A noise) or in CPU% (the CPU Δ's CI beyond the A/A pair's CPU noise), in the screen or
    the confirm. Otherwise a t/s-vs-CPU% front would only order points inside the noise."""
    moved = ("faster", "slower", CPU_REJECTED)
    for c in outcome.screens.get("tg", {}).values():
        for e in c.get("effects", {}).values():
            cpu = e.get("cpu") or {}
            if e.get("verdict") in moved or _beyond(cpu.get("ci_low"), cpu.get("ci_high"), c.get("cpu_noise")):
                return True
    for r in outcome.rows:
        if r["phase"] == "tg" and (
            r.get("verdict") in moved or _beyond(r.get("cpu_ci_low"), r.get("cpu_ci_high"), r.get("cpu_noise"))
        ):
            return True
    return False


def _write_pareto(png: Path, outcome: SearchOutcome, *, title: str) -> None:
    """The decode Pareto plot where the study measured CPU% and some config differs beyond the noise."""
    png.unlink(missing_ok=True)
    pts = pareto_points(outcome)
    if pts and pareto_differs(outcome):
        plot_pareto(pts, png, title=title)


def _dropped_line(outcome: SearchOutcome) -> str:
    """The closing line where the tune's best trial went to confirm and was dropped: its one-round score, what
    the confirm measured and why it was dropped (a trial that scored well in one round is not "nothing")."""
    kd = outcome.knobs_dropped or {}
    trial = next((t for t in outcome.trials if t.number == kd.get("trial")), None)
    score = ""
    if trial is not None and trial.objectives:
        ratios = [f"{ph} x{v:.2f}" for ph, v in zip(("pp", "tg"), trial.objectives) if math.isfinite(v)]
        score = f" scored {' / '.join(ratios)} in its one paired round;" if ratios else ""
    rounds = max((int(r.get("rounds") or 0) for r in kd.get("rows") or ()), default=0)
    return (
        f"Result: tune trial {kd.get('trial')} ({dict(kd.get('params') or {})}){score} the confirm measured it "
        f"against upstream in {rounds} paired round(s) and dropped it: {kd.get('why')}. The export is upstream's "
        "selection; report.md shows those rounds and what to do."
    )

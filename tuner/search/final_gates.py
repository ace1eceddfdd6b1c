"""The gates the confirmed final config passes before it is exported: residency
(:mod:`tuner.search.residency_gate`) and output equivalence (:mod:`tuner.rounds.output_gate`). Each stores its
record per final config, so a resumed search does not run it again; a failing final config becomes upstream's
selection."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tuner import log
from tuner._hash import stable_hash
from tuner.measure import residency as probes
from tuner.measure.residency import Residency
from tuner.plan.fa_rules import FaRule, Phase, as_stored, rules_env, rules_texts
from tuner.plan.space import compile_values_of, runtime_env_and_args
from tuner.plan.variant import Build
from tuner.rounds import output_gate as og
from tuner.search import residency_gate as rg
from tuner.search import tune as tn
from tuner.search.context import Proposal, SearchRun
from tuner.study.record import SearchOutcome

Probe = Callable[[Build, Mapping[str, str], Sequence[str], Path], Residency]
"""probe(build, env, args, log_dir) -> one verbose llama-bench probe."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Final:
    """The confirmed final config."""

    base_variant: str
    variant: str
    compile_values: Mapping[str, object]
    values: Mapping[str, object]
    env: Mapping[str, str]
    args: tuple[str, ...]


def final_of(run: SearchRun, outcome: SearchOutcome | Proposal) -> _Final:
    """The final config of ``outcome`` or of the proposal the confirm measures (upstream's runtime where no trial
    was kept)."""
    tuned = outcome.tuned
    vals = dict(tuned.values if tuned else {})
    env, args = runtime_env_and_args(run.space, vals) if tuned else (dict(run.base_env), list(run.base_args))
    args += run.host_args if tuned else ()  # base_args has them already
    return _Final(
        base_variant=run.base_variant,
        variant=str(vals.get("variant", run.base_variant)),
        compile_values=compile_values_of(run.space, vals),
        values=vals,
        env=env,
        args=tuple(args),
    )


def config_key(rules: Sequence[FaRule], vals: Mapping[str, object]) -> str:
    return stable_hash({"rules": rules_texts(rules), "tuned": dict(vals) or None})[:12]


def _gated(outcome: SearchOutcome, then: Callable[[Mapping[str, object]], Mapping[str, object]]) -> SearchOutcome:
    """``outcome`` through a gate's verdict on its stored form."""
    return SearchOutcome.from_result(outcome.header, as_stored(then(outcome.result_json())))


def run_residency_gate(run: SearchRun, outcome: SearchOutcome, probe: Probe | None = None) -> SearchOutcome:
    """The residency gate: one verbose llama-bench probe of upstream's config and one of the final config."""
    cfg, st = run.cfg, run.st
    fin = final_of(run, outcome)
    rules = outcome.rules
    ckey = config_key(rules, fin.values)
    rec = st.residency(ckey)
    full = rg.full_offload(run.base_args, run.shape.n_layers)  # the scenario is upstream's config (e.g. a pinned -ngl)
    if rec is not None and any((rec.get(side) or {}).get("error") for side in ("upstream", "final")):
        rec = None  # a probe that failed measured nothing: probe again rather than carry the failure forward
    if rec is not None:
        again = rg.redecide(rec, full=full, host_weights_mib=probes.input_layer_mib(cfg.model))
        if again is not None and again["verdict"] != rec["verdict"]:
            log.info(
                f"Residency: re-judged from the recorded probe logs by this version's rule: {rec['verdict']} -> {again['verdict']}"
            )
            rec = again
            st.set_residency(ckey, rec)
    if rec is None:

        def counted(b: Build, e: Mapping[str, str], a: Sequence[str], d: Path) -> Residency:
            st.add_llama_bench_calls(1)  # each probe is one llama-bench call
            if probe is not None:
                return probe(b, e, a, d)
            d.mkdir(parents=True, exist_ok=True)
            return probes.run_residency(b.bin_dir, cfg.model, env=e, args=a, log_dir=d)

        same = (
            not rules
            and fin.env == dict(run.base_env)
            and fin.args == run.base_args
            and fin.variant == fin.base_variant
            and not fin.compile_values
        )
        run.budget.fits(run.price("residency_s") / (2 if same else 1), "the residency check")
        with log.step(
            "Residency check: graph splits and buffers, upstream" + ("" if same else " and the final config")
        ):
            up_build = run.builds.get(fin.base_variant, {})
            up = counted(up_build, dict(run.base_env), list(run.base_args), cfg.run_dir / "residency" / "upstream")
            final = (
                None
                if same
                else counted(
                    run.builds.get(fin.variant, fin.compile_values),
                    {**fin.env, **({"GGML_TUNER_FA_RULES": rules_env(rules)} if rules else {})},
                    list(fin.args),
                    cfg.run_dir / "residency" / "final",
                )
            )
        rec = rg.decide(up, final, full=full, host_weights_mib=probes.input_layer_mib(cfg.model))
        st.set_residency(ckey, rec)
    log.info(f"Residency: {rec['verdict']}: " + (rec["final"] or rec["upstream"])["summary"])
    return _gated(outcome, lambda res: rg.residency_result(res, rec))


def run_output_gate(run: SearchRun, outcome: SearchOutcome) -> SearchOutcome:
    """The output-equivalence gate on the confirmed final config vs upstream, its thresholds from the kernel band
    where kernels can be forced. Each check's record is stored as soon as it exists; none starts that would end
    past the budget."""
    cfg, space, st = run.cfg, run.space, run.st
    fin = final_of(run, outcome)
    vals = fin.values
    changed = [
        k for k in space.runtime_knobs if k.name in vals and k.name not in run.fixed and vals[k.name] != k.default
    ]
    rules = outcome.rules
    checks = og.plan_checks(
        rules=rules,
        base_env=run.base_env,
        base_args=run.base_args,
        final_env=fin.env,
        final_args=fin.args,
        changed={str(k.meta.get("flag") or k.meta.get("env") or k.name): tn.knob_phases(k) for k in changed},
        build_changed=fin.variant != fin.base_variant or bool(fin.compile_values),
        era=cfg.source.era,
    )
    ckey = config_key(rules, vals)

    check_s = run.price("equivalence_check_s")

    def run_one(c: og.GateCheck) -> Mapping[str, object]:
        run.budget.fits(check_s, f"the output-equivalence check {c.name}")
        wd = cfg.run_dir / "equivalence" / ckey / re.sub(r"[^A-Za-z0-9.-]+", "_", c.name)
        up = run.builds.get(fin.base_variant, {})
        fb = up if c.name.startswith(og.BAND) else run.builds.get(fin.variant, fin.compile_values)
        if run.equivalence is not None:  # a test's or the replay's stand-in for llama-perplexity
            return run.equivalence(c, up, fb, wd)
        return og.run_gate_check(c, up, fb, wd, model=cfg.model, run_dir=cfg.run_dir, jobs=cfg.jobs)

    kernels = run.kernels
    with log.step(
        f"Output-equivalence gate: {len(checks)} llama-perplexity check(s) of the final config vs upstream"
        if checks
        else "Output-equivalence gate: not needed (the final config is upstream's)"
    ):
        gate = og.run_checks(
            checks,
            done=st.equivalence_checks(ckey),
            run_one=run_one,
            on_check=functools.partial(st.set_equivalence_check, ckey),
            band=og.plan_band(checks, {p.value: kernels[p.bench] for p in Phase}),
        )
    return _gated(outcome, lambda res: og.gated_result(res, gate))

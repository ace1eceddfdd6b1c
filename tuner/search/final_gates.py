"""The gates the confirmed final config passes before it is exported: the residency gate (graph splits
and buffers, :mod:`tuner.search.residency_gate`) and the output-equivalence gate (llama-perplexity,
:mod:`tuner.rounds.output_gate`). Each stores its record per final config, so a resumed search does
not run it again; a failing final config becomes upstream's selection."""

from __future__ import annotations

__all__ = ["config_key", "final_of", "run_output_gate", "run_residency_gate"]

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner import log
from tuner._hash import stable_hash
from tuner.plan.fa_rules import FaRule, rules_env, rules_texts
from tuner.search import tune as tn
from tuner.search.study import SearchConfig
from tuner.study.state import StudyState


def final_of(
    cfg: SearchConfig,
    space: Any,
    fixed: Mapping[str, Any],
    result: Mapping[str, Any],
    base_env: Mapping[str, str],
    base_args: Sequence[str],
) -> tuple[str, str, dict[str, Any], dict[str, Any], dict[str, str], list[str]]:
    """The confirmed final config: (upstream's variant, its variant, compile values, tuned values, env, args)."""
    from tuner.plan.space import compile_values_of, runtime_env_and_args

    variants = [v for v in space.variants if cfg.variants is None or v in cfg.variants]
    base_variant = str(fixed.get("variant", variants[0]))
    tuned = result.get("tuned")
    vals = dict((tuned or {}).get("values", {}))
    env, args = runtime_env_and_args(space, vals) if tuned else (dict(base_env), list(base_args))
    return base_variant, str(vals.get("variant", base_variant)), compile_values_of(space, vals), vals, env, args


def config_key(rules: Sequence[FaRule], vals: Mapping[str, Any]) -> str:
    """The final config's key for records stored per final config (the gates' checks)."""
    return stable_hash({"rules": rules_texts(rules), "tuned": dict(vals) or None})[:12]


def run_residency_gate(
    cfg: SearchConfig,
    st: StudyState,
    space: Any,
    fixed: Mapping[str, Any],
    result: Mapping[str, Any],
    base_env: Mapping[str, str],
    base_args: Sequence[str],
    builds: Any,
    shape: Mapping[str, int],
    probe: Any = None,
) -> dict[str, Any]:
    """The residency gate (:mod:`tuner.search.residency_gate`): one verbose llama-bench probe of upstream's config
    and one of the final config; stored per final config, so a resumed search does not probe again."""
    from tuner.measure.residency import input_layer_mib, run_residency
    from tuner.search import residency_gate as rg

    base_variant, variant, compile_values, vals, env, args = final_of(cfg, space, fixed, result, base_env, base_args)
    rules = tuple(result.get("rules", ()))
    ckey = config_key(rules, vals)
    rec = st.residency(ckey)
    full = rg.full_offload(base_args, shape.get("n_layers"))  # the scenario is upstream's config (e.g. a pinned -ngl)
    if rec is not None and any((rec.get(side) or {}).get("error") for side in ("upstream", "final")):
        rec = None  # a probe that failed measured nothing: probe again rather than carry the failure forward
    if rec is not None:
        again = rg.redecide(rec, full=full, host_weights_mib=input_layer_mib(cfg.model))
        if again is not None and again["verdict"] != rec["verdict"]:
            log.info(
                f"Residency: re-judged from the recorded probe logs by this version's rule: {rec['verdict']} -> {again['verdict']}"
            )
            rec = again
            st.set_residency(ckey, rec)
    if rec is None:

        def live(b: Any, e: Mapping[str, str], a: Sequence[str], d: Path) -> Any:
            d.mkdir(parents=True, exist_ok=True)
            return run_residency(b.bin_dir, cfg.model, env=e, args=a, log_dir=d)

        given = probe or live

        def counted(*a: Any) -> Any:  # each probe is one llama-bench call
            st.add_llama_bench_calls(1)
            return given(*a)

        same = (
            not rules
            and env == dict(base_env)
            and list(args) == list(base_args)
            and variant == base_variant
            and not compile_values
        )
        with log.step(
            "Residency check: graph splits and buffers, upstream" + ("" if same else " and the final config")
        ):
            up_build = builds.get(base_variant, {})
            up = counted(up_build, dict(base_env), list(base_args), cfg.run_dir / "residency" / "upstream")
            final = (
                None
                if same
                else counted(
                    builds.get(variant, compile_values),
                    {**env, **({"GGML_TUNER_FA_RULES": rules_env(rules)} if rules else {})},
                    list(args),
                    cfg.run_dir / "residency" / "final",
                )
            )
        rec = rg.decide(up, final, full=full, host_weights_mib=input_layer_mib(cfg.model))
        st.set_residency(ckey, rec)
    log.info(f"Residency: {rec['verdict']}: " + (rec["final"] or rec["upstream"])["summary"])
    return rg.residency_result(result, rec)


def run_output_gate(
    cfg: SearchConfig,
    st: StudyState,
    space: Any,
    fixed: Mapping[str, Any],
    era: str,
    result: Mapping[str, Any],
    base_env: Mapping[str, str],
    base_args: Sequence[str],
    builds: Any,
    equivalence: Any,
    kernels: Mapping[str, Sequence[str]] = {},
) -> dict[str, Any]:
    """The output-equivalence gate on the confirmed final config vs upstream (:mod:`tuner.rounds.output_gate`),
    its thresholds from the kernel band where ``kernels`` (per mode) can be forced.

    Each check's record is stored as soon as it exists (``equivalence_<key>``, keyed by the final
    config), so a resumed search does not run it again. A failing final config becomes upstream's
    selection; nothing confirmed: the gate is not needed and nothing runs."""
    from tuner.rounds import output_gate as og

    base_variant, variant, compile_values, vals, env, args = final_of(cfg, space, fixed, result, base_env, base_args)
    changed = [k for k in space.runtime_knobs if k.name in vals and k.name not in fixed and vals[k.name] != k.default]
    rules = tuple(result.get("rules", ()))
    checks = og.plan_checks(
        rules=rules,
        base_env=base_env,
        base_args=base_args,
        final_env=env,
        final_args=args,
        changed={str(k.meta.get("flag") or k.meta.get("env") or k.name): tn.knob_phases(k) for k in changed},
        build_changed=variant != base_variant or bool(compile_values),
        era=era,
    )
    ckey = config_key(rules, vals)
    run = equivalence or (
        lambda c, ub, fb, wd: og.run_gate_check(c, ub, fb, wd, model=cfg.model, run_dir=cfg.run_dir, jobs=cfg.jobs)
    )

    def run_one(c: Any) -> Mapping[str, Any]:
        wd = cfg.run_dir / "equivalence" / ckey / re.sub(r"[^A-Za-z0-9.-]+", "_", c.name)
        up = builds.get(base_variant, {})
        return run(c, up, up if c.name.startswith(og.BAND) else builds.get(variant, compile_values), wd)

    def persist(name: str, rec: Mapping[str, Any]) -> None:
        st.set_equivalence_check(ckey, name, rec)

    with log.step(
        f"Output-equivalence gate: {len(checks)} llama-perplexity check(s) of the final config vs upstream"
        if checks
        else "Output-equivalence gate: not needed (the final config is upstream's)"
    ):
        gate = og.run_checks(
            checks,
            done=st.equivalence_checks(ckey),
            run_one=run_one,
            on_check=persist,
            band=og.plan_band(checks, kernels),
        )
    return og.gated_result(result, gate)

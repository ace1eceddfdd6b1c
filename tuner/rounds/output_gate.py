"""The output-equivalence gate as the search's last stage: the confirmed final config vs upstream.

What to run follows ``docs/equivalence.md``: each phase whose config changed is judged in its own mode; each
kernel of the kept rules once, its interval widened to ``0-`` so it fires at the gate's short context;
``strict`` (byte-identical logits) where only scheduling knobs changed on the same build; nothing when nothing
changed. Where the search has kernels to force, a non-strict check passes within :data:`BAND_FACTOR` times the
kernel band, the spread of upstream's own kernels measured on the model at hand (:func:`plan_band`, see
docs/equivalence.md for the H100 numbers).

A final config with any failing check is infeasible and upstream's selection is kept (:func:`gated_result`): the
confirmed speedups belong to the whole final config, so a part of it would be a config nobody confirmed.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner import log
from tuner.builder.cmake import ensure_targets
from tuner.errors import TunerError, UsageError
from tuner.measure.equivalence import DEFAULT_THRESHOLDS, KldStats, Thresholds, judge, run_equivalence, widened_rules
from tuner.plan.fa_rules import FaRule, Phase, rules_env
from tuner.plan.variant import Build

SCHEDULING_FLAGS = frozenset({"-t"})
"""llama-bench flags that only schedule work (the CPU gives byte-identical logits for -t 1 and -t 2)."""
SCHEDULING_ENV = frozenset({"GGML_CUDA_GRAPH_OPT", "GGML_CUDA_DISABLE_GRAPHS"})
"""Environment knobs that only change how kernels are launched (CUDA graphs)."""
_BATCH_FLAGS = frozenset({"-ub", "-b"})  # the gate's mode sets the micro-batch (one token, or one chunk)
# llama-bench spells these switches with a 0/1 value, llama-perplexity as bare flags (`-nkvo 1` is an error
# there): flag -> (perplexity spelling for 1, for 0); None: llama.cpp's default, nothing to pass.
_SWITCHES: dict[str, tuple[str | None, str | None]] = {
    "-nkvo": ("-nkvo", None),
    "--no-kv-offload": ("-nkvo", None),
    "-nopo": ("--no-op-offload", None),
    "--no-op-offload": ("--no-op-offload", None),
    "--repack": (None, "--no-repack"),
    "--no-host": ("--no-host", None),
}
BAND_FACTOR = 2.0
"""How far beyond the kernel band a non-strict check may go (see the module docstring)."""
BAND = "band"


@dataclasses.dataclass(frozen=True, kw_only=True)
class GateCheck:
    """One run of the gate: the final config (or one widened rule of it) against upstream in one mode."""

    name: str
    mode: str
    strict: bool
    env: Mapping[str, str]
    args: tuple[str, ...]
    upstream_env: Mapping[str, str]
    upstream_args: tuple[str, ...]
    why: str
    not_applied: tuple[str, ...] = ()
    """Final-config flags the gate cannot apply (the micro-batch is its mode's)."""


def _pairs(args: Sequence[str]) -> dict[str, str]:
    """llama-bench knob args are flag/value pairs (``-t 1 -ub 128``)."""
    if len(args) % 2:
        raise UsageError(
            f"llama-bench arguments {list(args)} are not flag/value pairs; the gate cannot translate them."
        )
    return dict(zip(args[::2], args[1::2]))


def perplexity_args(bench_args: Sequence[str], era: str) -> tuple[list[str], list[str]]:
    """llama-bench knob args -> (llama-perplexity args, flags left out); FlashAttention on unless a knob says off
    (era ``mma`` spells ``-fa on|off``, era ``rocwmma`` a bare ``-fa`` switch)."""
    out: list[str] = []
    left: list[str] = []
    fa = True
    for flag, val in _pairs(bench_args).items():
        if flag == "-fa":
            fa = val in ("on", "1", "true")
        elif flag in _BATCH_FLAGS:
            left += [flag, val]
        elif flag in _SWITCHES:
            if val not in ("0", "1"):
                raise UsageError(f"llama-bench's {flag} takes 0 or 1 (got {val!r}); the gate cannot translate it.")
            spelled = _SWITCHES[flag][0 if val == "1" else 1]
            out += [spelled] if spelled else []
        else:
            out += [flag, val]
    if era == "rocwmma":
        return (["-fa"] if fa else []) + out, left
    return ["-fa", "on" if fa else "off"] + out, left


def plan_checks(
    *,
    rules: Sequence[FaRule],
    base_env: Mapping[str, str],
    base_args: Sequence[str],
    final_env: Mapping[str, str],
    final_args: Sequence[str],
    changed: Mapping[str, Sequence[str]],
    build_changed: bool,
    era: str,
) -> list[GateCheck]:
    """The gate runs a final config needs (the decision table of docs/equivalence.md); empty when nothing
    differs from upstream. ``changed``: each process knob that differs, by its flag or env variable, -> the
    phases it can affect; ``final_env``/``final_args`` exclude the rules."""
    up_args, _ = perplexity_args(base_args, era)
    cand_args, left = perplexity_args(final_args, era)
    left = [x for flag, val in zip(left[::2], left[1::2]) if flag in changed for x in (flag, val)]
    scheduling_only = not build_changed and set(changed) <= SCHEDULING_ENV | SCHEDULING_FLAGS
    what = sorted(changed) + (["build"] if build_changed else [])
    widened = widened_rules(rules)
    all_rules = {"GGML_TUNER_FA_RULES": rules_env(rules)} if rules else {}
    checks = []
    for p in Phase:
        mode, phase = p.value, p.bench
        process_here = build_changed or any(phase in ph for ph in changed.values())
        process = GateCheck(
            name=f"{mode} process",
            mode=mode,
            strict=scheduling_only,
            env={**final_env, **all_rules},
            args=tuple(cand_args),
            upstream_env=dict(base_env),
            upstream_args=tuple(up_args),
            why=f"{', '.join(what)} changed",
            not_applied=tuple(left) if mode == "prefill" else (),
        )
        knobs = f"; with {', '.join(what)} changed" if process_here else ""
        checks += [
            dataclasses.replace(
                process,
                name=f"{mode} {rule.text}",
                strict=False,
                env={**final_env, "GGML_TUNER_FA_RULES": rules_env([rule])},
                why=f"kept rule kernel {rule.kernel} (interval widened to 0-){knobs}",
            )
            for rule in widened[p]
        ]
        if process_here and not widened[p]:
            # The other phase's rules, if any, cannot fire in this mode, so strict still holds.
            checks.append(process)
    return checks


def plan_band(checks: Sequence[GateCheck], kernels: Mapping[str, Sequence[str]]) -> list[GateCheck]:
    """The kernel band's runs: in each mode of a non-strict check, each kernel of ``kernels[mode]`` forced on
    upstream's build against upstream's own pick."""
    out = []
    for mode in dict.fromkeys(c.mode for c in checks if not c.strict):
        ref = next(c for c in checks if c.mode == mode)
        for k in kernels.get(mode, ()):
            rule = FaRule(phase=Phase(mode), lo=0, hi=None, kernel=k)
            out.append(
                GateCheck(
                    name=f"{BAND} {mode} {k}",
                    mode=mode,
                    strict=False,
                    env={**ref.upstream_env, "GGML_TUNER_FA_RULES": rules_env([rule])},
                    args=ref.upstream_args,
                    upstream_env=ref.upstream_env,
                    upstream_args=ref.upstream_args,
                    why=f"upstream's own kernel {k} forced vs upstream's pick: how far upstream's kernels differ",
                )
            )
    return out


def band_thresholds(band: Sequence[Mapping[str, Any]], base: Thresholds = DEFAULT_THRESHOLDS) -> Thresholds | None:
    """:data:`BAND_FACTOR` times the band's widest numbers, never tighter than ``base``; None without a band."""
    stats = [
        r["stats"]
        for r in band
        if r.get("stats")
        and all(isinstance(r["stats"].get(k), (int, float)) for k in ("mean_kld", "p99_kld", "same_top_pct"))
    ]
    if not stats:
        return None
    f = BAND_FACTOR
    return Thresholds(
        mean_kld=max(base.mean_kld, round(f * max(s["mean_kld"] for s in stats), 6)),
        p99_kld=max(base.p99_kld, round(f * max(s["p99_kld"] for s in stats), 6)),
        # floored at 0: a band under 50% same-top (cuBLAS vs MMQ on random weights) allows any share, and says so
        same_top_pct=max(
            0.0, min(base.same_top_pct, round(100.0 - f * (100.0 - min(s["same_top_pct"] for s in stats)), 3))
        ),
    )


def _rejudged(rec: Mapping[str, Any], thr: Thresholds) -> dict[str, Any]:
    """A check's record judged by ``thr`` from its own numbers (the measurement does not change)."""
    st = rec.get("stats")
    stats = KldStats(**{k: math.nan if v is None else v for k, v in st.items()}) if st else None
    ok, why = judge(
        stats=stats,
        deterministic=rec.get("deterministic"),
        identical_to_upstream=rec.get("identical_to_upstream"),
        strict=bool(rec.get("strict")),
        thresholds=thr,
    )
    if (stats is None or not stats.complete) and rec.get("reasons"):
        why = tuple(rec["reasons"])  # a run that failed has no numbers to re-judge: its own error says why
    return {
        **rec,
        "passed": ok,
        "verdict": "pass" if ok else "fail",
        "reasons": list(why),
        "thresholds": dataclasses.asdict(thr),
    }


def run_checks(
    checks: Sequence[GateCheck],
    *,
    done: Mapping[str, Any],
    run_one: Callable[[GateCheck], Mapping[str, object]],
    on_check: Callable[[str, Mapping[str, object]], None],
    band: Sequence[GateCheck] = (),
    quiet: bool = False,
) -> dict[str, Any]:
    """Run each check not in ``done`` (``name -> record``, resumed from the study); returns the gate record.

    ``on_check`` persists each record as soon as it exists. ``band`` runs first; each mode's non-strict checks
    are then judged by that mode's :func:`band_thresholds`. ``quiet``: no progress lines."""
    if not checks:
        return {
            "verdict": "not needed",
            "checks": [],
            "why": "the final config is upstream's (no rule or knob confirmed), so its output is upstream's",
        }

    def one(c: GateCheck) -> dict[str, Any]:
        rec = done.get(c.name)
        # a stored check whose run did not complete measured nothing: run it again, don't carry the failure
        if rec is None or not rec.get("stats"):
            rec = {**run_one(c), "name": c.name, "why": c.why, "not_applied": list(c.not_applied)}
            on_check(c.name, rec)
            if not c.name.startswith(BAND):
                log.info(f"  output-equivalence gate, {c.name}: measured (judged below)")
        return dict(rec)

    say = (lambda _msg: None) if quiet else log.info
    bands = [one(b) for b in band]
    thr = {m: band_thresholds([b for b in bands if b.get("mode") == m]) for m in {b.mode for b in band}}
    for b in bands:
        s = b.get("stats") or {}
        say(
            f"  kernel band, {b['name']}: mean KLD {s.get('mean_kld')}, 99% KLD {s.get('p99_kld')}, "
            f"same top p {s.get('same_top_pct')}%"
        )
    recs = []
    for c in checks:
        rec = one(c)
        t = thr.get(c.mode)
        if t is not None and not c.strict:
            rec = _rejudged(rec, t)
        say(
            f"  output-equivalence gate, {c.name}: {str(rec.get('verdict', '?')).upper()}"
            + (f" ({' '.join(rec.get('reasons', []))})" if rec.get("reasons") else "")
            + (f"; thresholds from the kernel band: {rec.get('thresholds')}" if t is not None and not c.strict else "")
        )
        recs.append(rec)
    out: dict[str, Any] = {"verdict": "pass" if all(r.get("passed") for r in recs) else "fail", "checks": recs}
    if bands:
        out["band"] = bands
        out["band_factor"] = BAND_FACTOR
    return out


def run_gate_check(
    check: GateCheck,
    up_build: Build,
    fin_build: Build,
    work_dir: Path,
    *,
    model: Path,
    run_dir: Path,
    jobs: int | None = None,
) -> dict[str, Any]:
    """One check with the real llama-perplexity of both builds (built on demand); a failed tool build is a failed
    check. Logs are recorded relative to ``run_dir``: the study and the export must not name this machine's paths."""
    try:
        up, fin = (ensure_targets(b, ["llama-perplexity"], jobs=jobs) for b in (up_build, fin_build))
    except TunerError as err:
        return {
            "verdict": "fail",
            "passed": False,
            "mode": check.mode,
            "strict": check.strict,
            "reasons": [f"llama-perplexity could not be built, so the gate could not run: {str(err)[:500]}"],
        }
    res = run_equivalence(
        fin.bin_dir,
        up.bin_dir,
        model,
        mode=check.mode,
        candidate_env=check.env,
        candidate_args=check.args,
        upstream_env=check.upstream_env,
        upstream_args=check.upstream_args,
        work_dir=work_dir,
        strict=check.strict,
    ).as_dict()
    res["logs"] = {k: os.path.relpath(v, run_dir) for k, v in res["logs"].items()}
    res["settings"] = {k: v for k, v in res["settings"].items() if k not in ("model", "candidate_bin", "upstream_bin")}
    return res


def gated_result(result: Mapping[str, object], gate: Mapping[str, Any]) -> dict[str, Any]:
    """The result to export: unchanged with its gate record when it passed, else upstream's selection, with the
    rejected config and its failing numbers under ``gate.rejected``."""
    if gate["verdict"] != "fail":
        return {**result, "gate": dict(gate)}
    failing = [c for c in gate["checks"] if not c.get("passed")]
    why = "; ".join(f"{c['name']}: {' '.join(c.get('reasons', []))}" for c in failing)
    log.warning(
        f"OUTPUT-EQUIVALENCE GATE FAILED for the final config ({why}). It is infeasible and is NOT exported; "
        "the result is upstream's selection."
    )
    out, rejected = upstream_instead(result, "failed the output-equivalence gate with the final config")
    return {
        **out,
        "gate": {
            "verdict": "not needed",
            "checks": [],
            "rejected": {**rejected, "gate": dict(gate)},
            "why": "the final config failed the gate, so upstream's selection is exported",
        },
    }


def upstream_instead(result: Mapping[str, Any], why: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(upstream's selection, the rejected config)`` for a final config that failed a gate: its rules and
    knobs dropped as a whole (each rule's reason ``why``), its confirmed rows with them (they measured it)."""
    rejected = {k: result.get(k) for k in ("rules", "tuned", "rows")}
    dropped = {**dict(result.get("dropped", {})), **{r: why for r in result.get("rules", [])}}
    return (
        {
            **result,
            "rules": (),
            "tuned": None,
            "rows": [],
            "dropped": dropped,
            "narrowed": {},  # the narrowed rules are dropped with the rest
            "upstream_phases": ["tg", "pp"],
        },
        rejected,
    )

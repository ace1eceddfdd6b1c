"""report.md of a pipeline study (:func:`report_text`) and its sections: the confirmed points, the
output-equivalence gate, graph splits and residency, the kernel screen, the tune trials and the search's cost
(config.toml's ``[cost]``, :attr:`tuner.study.record.SearchOutcome.cost`).
:mod:`tuner.result.pipeline_export` writes it beside config.toml."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

from tuner import log
from tuner.errors import TunerError
from tuner.measure.paired import CPU_REJECTED, NOISE_CEILING_PCT, TOO_NOISY, Effect, too_noisy, verdict
from tuner.plan.fa_rules import FaRule, Phase
from tuner.redact import redact
from tuner.result.report import dashboard_command, importances_section
from tuner.result.tables import compare_table, method_paragraph
from tuner.study.record import SearchOutcome, StudyHeader, TrialSummary
from tuner.study.state import StudyState
from tuner.targets.archs import find_product

if TYPE_CHECKING:
    import optuna

T = TypeVar("T")


def need(value: T | None, field: str) -> T:
    """A header field a pipeline study always records (``field`` names it when a study lacks it)."""
    if value is None:
        raise TunerError(
            f"the study's header has no {field}: it was not recorded by `tuner search`, so it cannot be exported."
        )
    return value


def noisy_phases(outcome: SearchOutcome) -> dict[str, float]:
    """Phases whose A/A noise is above the ceiling (:func:`tuner.measure.paired.too_noisy`): the screen's
    per-depth A/A noise, or a confirm row judged ``too noisy``; phase -> the median noise, percent."""
    out = {}
    for ph in ("tg", "pp"):
        ns = [float(c["noise_pct"]) for c in outcome.screens.get(ph, {}).values() if c.get("noise_pct") is not None]
        rows = [r for r in outcome.rows if r["phase"] == ph]
        if too_noisy(ns) or any(r["verdict"] == TOO_NOISY for r in rows):
            out[ph] = statistics.median(ns or [float(r["aa_noise_pct"]) for r in rows])
    return out


def noise_line(outcome: SearchOutcome) -> str:
    """The A/A noise each phase's screen measured (the median over its depths) against the ceiling, in one
    line ("" when the screen measured none): what a claim had to clear, stated whether or not one was made."""
    parts = []
    for ph in ("tg", "pp"):
        ns = [float(c["noise_pct"]) for c in outcome.screens.get(ph, {}).values() if c.get("noise_pct") is not None]
        ns = [x for x in ns if math.isfinite(x)]
        if ns:
            med = statistics.median(ns)
            parts.append(f"{Phase.from_bench(ph).value} " + ("over ±100%" if med > 100 else f"±{med:.1f}%"))
    if not parts:
        return ""
    where = "above" if noisy_phases(outcome) else "under"
    return (
        f"A/A noise (upstream against itself in the screen's rounds, median over depths): {', '.join(parts)}; "
        f"{where} the {NOISE_CEILING_PCT:g}% ceiling.\n"
    )


def noisy_line(outcome: SearchOutcome) -> str:
    """report.md's first line when the machine was too noisy for the search to claim anything, else ``""``."""
    noisy = noisy_phases(outcome)
    if not noisy:
        return ""
    # The noise is how far the A/A CI reaches; with 2-3 rounds on a busy host it reaches thousands of
    # percent (Student-t with 1-2 degrees of freedom), a number that says no more than "over 100%".
    what = ", ".join(
        f"{Phase.from_bench(p).value} " + ("over ±100%" if v > 100 else f"±{v:.0f}%") for p, v in noisy.items()
    )
    return (
        f"**This machine was too noisy to claim anything in {' and '.join(Phase.from_bench(p).value for p in noisy)}: the A/A "
        f"noise (upstream against itself, the reach of its 95% CI) was {what}, above the {NOISE_CEILING_PCT:g}% ceiling, so no kernel or knob "
        "there is called faster and the export keeps upstream's selection.** To measure: stop other work on the "
        "machine (other benchmarks, builds, test suites), pin llama-bench to idle cores (`--cpu-mask`)"
        + ("" if outcome.header.arch == "cpu" else ", keep the GPU's clocks steady")
        + f", then {fresh_study_advice(outcome.header.name)}"
    )


def fresh_study_advice(study: str) -> str:
    """How to measure again: a new study. The same command resumes this one, whose rounds are stored and whose
    stages are done, so it measures nothing new (the build and the model are cached either way)."""
    return (
        f"run the same `tuner search` command with `--study {study + '-2' if study else 'NEW-NAME'}` added: a new study measures every stage "
        "again. Rerunning it unchanged resumes this study, whose rounds are already measured, and measures nothing new."
    )


def knobs_dropped_section(outcome: SearchOutcome) -> str:
    """What the confirm measured of a tune trial it then dropped ("" when none was dropped): the rounds ran,
    so the report shows them rather than saying nothing was measured."""
    kd = outcome.knobs_dropped
    if not kd:
        return ""
    rows = list(kd.get("rows") or ())
    rounds = max((int(r.get("rounds") or 0) for r in rows), default=0)
    phases = " and ".join(Phase.from_bench(p).value for p in kd.get("phases") or ())
    head = (
        f"**The confirm measured tune trial {kd.get('trial')}'s knobs {dict(kd.get('params') or {})} against upstream "
        f"({phases or 'no phase'}, {rounds} paired round(s) with the A/A pair) and dropped them: {kd.get('why')}.** "
        "The export is upstream's config for those knobs; what the confirm measured:\n\n"
    )
    heads = ["Test", "t/s upstream", "t/s trial", "Speedup", "95% CI", "A/A noise", "rounds", "verdict"]
    table = log.table(
        heads,
        [
            [
                f"{r['phase']}@d{r['depth']}",
                _num(r.get("base_ts")),
                _num(r.get("tuned_ts")),
                _num(r.get("speedup"), 3),
                _ci(r.get("ci_low", math.nan), r.get("ci_high", math.nan)),
                f"±{r['aa_noise_pct']:.1f}%" if isinstance(r.get("aa_noise_pct"), float) else "over ±100%",
                str(r.get("rounds", "")),
                r.get("verdict", ""),
            ]
            for r in rows
        ],
    )
    return head + table + "\n"


def _num(x: object, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def device_name(h: StudyHeader, unknown: str) -> str:
    """The measured device's name; ``unknown`` when the study did not record it."""
    return str(h.device) if h.device is not None else unknown


def _f6(x: object) -> str:
    # llama-perplexity's KLD of identical logits can be a hair below 0; print it as 0, not "-0.000000"
    return f"{(0.0 if abs(x) < 5e-7 else x):.6f}" if isinstance(x, (int, float)) else "-"


def gate_section(gate: Mapping[str, Any]) -> str:
    """report.md's section on the output-equivalence gate (``gate`` as :func:`gate_table` writes it)."""
    out = ["## Output-equivalence gate (llama-perplexity, final config vs upstream)\n\n"]
    heads = ["check", "mode", "strict", "mean KLD", "99% KLD", "max KLD", "same top p", "deterministic"]
    heads += ["identical to upstream", "verdict"]

    def rows(checks: Sequence[Mapping[str, object]]) -> list[list[object]]:
        return [
            [
                c["name"],
                c["mode"],
                "yes" if c.get("strict") else "no",
                _f6(c.get("mean_kld")),
                _f6(c.get("p99_kld")),
                _f6(c.get("max_kld")),
                f"{c['same_top_pct']:.3f}%" if c.get("same_top_pct") is not None else "-",
                c.get("deterministic", "-"),
                c.get("identical_to_upstream", "-"),
                str(c.get("verdict", "")).upper(),
            ]
            for c in checks
        ]

    if gate.get("rejected"):
        rej = gate["rejected"]
        out.append(
            f"**The final config FAILED the gate and is not exported** (rules: {', '.join(rej['rules']) or 'none'}; "
            f"knobs: {rej['tuned'] or 'upstream'}): a check below failed (its output differs beyond the thresholds, "
            "or its run did not complete), so it is infeasible; this result is upstream's selection.\n\n"
            + log.table(heads, rows(rej["checks"]))
            + "\n\n"
            + "".join(f"- {c['name']}: {' '.join(c.get('reasons', []))}\n" for c in rej["checks"] if c.get("reasons"))
            + "\n"
            + _rejected_table(rej.get("points", []))
        )
    if not gate.get("checks"):
        out.append(f"Verdict: **not needed**: {gate.get('why', '')}.\n")
        return "".join(out)
    t = gate.get("thresholds") or {}
    out.append(
        f"Verdict: **{gate['verdict'].upper()}** in mode(s) {', '.join(gate['modes'])}: llama-perplexity on "
        f"tuner's fixed text, c={gate.get('ctx')}, {gate.get('chunks')} chunks; upstream's log-probabilities vs the "
        "candidate's (twice: determinism). Thresholds: mean KLD <= "
        f"{t.get('mean_kld')}, 99% KLD <= {t.get('p99_kld')}, same top p >= {t.get('same_top_pct')}%; strict checks "
        "(scheduling-only changes) also need logits byte-identical to upstream's. How the thresholds were calibrated: "
        "docs/equivalence.md.\n\n" + log.table(heads, rows(gate["checks"])) + "\n\n"
    )
    if gate.get("band"):
        out.append(
            f"The thresholds above come from the **kernel band**: each of upstream's own kernels forced on upstream's "
            f"build against upstream's pick, on this model (how far upstream's kernels differ from each other); a "
            f"non-strict check passes within {gate.get('band_factor')}x the band's widest numbers.\n\n"
            + log.table(heads[:8], [r[:8] for r in rows(gate["band"])])
            + "\n\n"
        )
    for c in gate["checks"]:
        line = f"- {c['name']}: {c.get('why', '')}"
        if c.get("not_applied"):
            line += f" (not applied: {' '.join(c['not_applied'])}: the gate's mode sets the micro-batch)"
        if c.get("logs"):
            line += f"; logs (in the search's run directory): {', '.join(sorted(c['logs'].values()))}"
        out.append(line + "\n")
    return "".join(out)


def rejected_points(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, object]]:
    """What the confirm measured of a config a gate then rejected (None-free for TOML): the report shows it,
    so a rejected speedup is visible rather than silently replaced by upstream's selection."""
    keys = ["phase", "depth", "base_ts", "tuned_ts", "speedup", "ci_low", "ci_high", "aa_noise_pct", "verdict"]
    keys += ["base_cpu", "tuned_cpu"]
    return [
        {k: r[k] for k in keys if r.get(k) is not None and (not isinstance(r[k], float) or math.isfinite(r[k]))}
        for r in rows
    ]


def _rejected_table(points: Sequence[Mapping[str, Any]]) -> str:
    if not points:
        return ""

    def num(p: Mapping[str, object], k: str, f: str) -> str:
        return format(p[k], f) if k in p else "—"

    rows = [
        [
            f"{p['phase']}@d{p['depth']}",
            num(p, "base_ts", ".2f"),
            num(p, "tuned_ts", ".2f"),
            f"{100 * (p['speedup'] - 1):+.1f}% [{100 * (p['ci_low'] - 1):+.1f}..{100 * (p['ci_high'] - 1):+.1f}%]"
            if {"speedup", "ci_low", "ci_high"} <= p.keys()
            else "—",
            f"±{p['aa_noise_pct']:.1f}%" if "aa_noise_pct" in p else "—",
            p.get("verdict", "—"),
            f"{num(p, 'base_cpu', '.0f')} / {num(p, 'tuned_cpu', '.0f')}",
        ]
        for p in points
    ]
    return (
        "What the confirm measured of the rejected config (not claimed):\n\n"
        + log.table(
            ["point", "t/s upstream", "t/s rejected", "Δ [95% CI]", "A/A noise", "verdict", "CPU% upstream / rejected"],
            rows,
        )
        + "\n\n"
    )


def residency_section(rec: Mapping[str, Any]) -> str:
    """report.md's section on graph splits and residency (``rec`` as :func:`residency_table` writes it)."""
    heads = ["config", "graph splits (prefill / decode)", "layers on GPU", "weights GPU / host MiB", "KV buffers MiB"]
    heads += ["fused-op fallbacks", "verdict"]

    def row(name: str, p: Mapping[str, Any]) -> list[object]:
        layers = f"{p['layers_offloaded']}/{p['layers_total']}" if "layers_total" in p else "— (no GPU offload)"
        kv = ", ".join(f"{k} {v:.2f}" for k, v in p.get("kv_buffers", {}).items()) or "-"
        return [
            name,
            f"{p.get('splits_pp', '?')} / {p.get('splits_tg', '?')}",
            layers,
            f"{p.get('device_weights_mib', 0):.2f} / {p.get('host_weights_mib', 0):.2f}",
            kv,
            p.get("fallbacks", 0),
            ("pass" if p.get("passed") else "fail: " + " ".join(p.get("reasons", [])))
            if not p.get("error")
            else f"failed: {p['error']}",
        ]

    rows = [row("upstream", rec["upstream"])] + ([row("final", rec["final"])] if rec.get("final") else [])
    head = (
        f"**The final config FAILED the residency check and is not exported** (rules: "
        f"{', '.join(rec.get('rejected_rules', [])) or 'none'}; knobs: {rec.get('rejected_tuned') or 'upstream'}): "
        f"{' '.join(rec.get('reasons', []))}\n\n" + _rejected_table(rec.get("rejected_points", []))
        if rec["verdict"] == "fail"
        else ""
    )
    return (
        "## Graph splits and residency (llama.cpp's own loader and scheduler lines; docs/soak.md)\n\n"
        + head
        + f"Verdict: **{rec['verdict'].upper()}** ({rec.get('why', '')}). One verbose llama-bench probe per config "
        "(`-v -pg 512,16 -r 1`); with full offload the decode graph may have 2 splits (the host embedding lookup and "
        "the GPU), no layer, KV buffer or fused op may sit on the host beyond the input layer.\n\n"
        + log.table(heads, rows)
        + "\n"
    )


def confirmed_points(rows: Sequence[Mapping[str, object]], pp: int, tg: int) -> list[dict[str, object]]:
    """Confirmed rows as the points of :func:`tuner.result.tables.compare_table` and ``plot_speedup``."""
    return [{**r, "test": f"{r['phase']}{pp if r['phase'] == 'pp' else tg}"} for r in rows]


def finite(x: object) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _pair(a: object, b: object, fmt: str = ".0f") -> str:
    """``a → b`` for two utilizations, "—" for a side not measured (or both)."""
    if not (finite(a) or finite(b)):
        return "—"
    return f"{format(a, fmt) if finite(a) else '—'} → {format(b, fmt) if finite(b) else '—'}"


def _cpu_cell(r: Mapping[str, object]) -> str:
    """Confirm row's CPU%: upstream → final, the paired Δ with its 95% CI and the A/A CPU noise (points)."""
    pair = _pair(r.get("base_cpu"), r.get("tuned_cpu"))
    if not finite(r.get("cpu_delta")):
        return pair
    ci = (
        f" [{r['cpu_ci_low']:+.1f}..{r['cpu_ci_high']:+.1f}]"
        if finite(r.get("cpu_ci_low")) and finite(r.get("cpu_ci_high"))
        else ""
    )
    noise = f", noise ±{r['cpu_noise']:.1f}" if finite(r.get("cpu_noise")) else ""
    return f"{pair} (Δ {r['cpu_delta']:+.1f}{ci}{noise})"


def _pct(x: float) -> str:
    return f"{100 * (x - 1):+.1f}%" if isinstance(x, float) and math.isfinite(x) else "-"


def _ci(lo: float, hi: float) -> str:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "-"
    return f"{100 * (lo - 1):+.1f}..{100 * (hi - 1):+.1f}%"


def report_text(
    outcome: SearchOutcome,
    *,
    study: optuna.Study | None = None,
    storage: str | None = None,
    gate: Mapping[str, object] | None = None,
    residency: Mapping[str, object] | None = None,
) -> str:
    """The Markdown report of a pipeline study; ``gate``/``residency``: config.toml's ``[gate]``/``[residency]`` (their
    sections follow the points); ``study``: the Optuna study, for the tune trials' parameter importances (optional)."""
    h = outcome.header
    pp, tg = need(h.pp, "pp"), need(h.tg, "tg")
    model = Path(need(h.model, "model")).name
    shape = h.shape
    rows = outcome.rows
    noisy = noisy_line(outcome)
    out = ([noisy + "\n\n"] if noisy else []) + [
        f"# tuner result: {h.arch} / {model}\n\n",
        f"Source {h.source_spec} (llama.cpp {h.commit}, era {h.era}); study `{h.name}`; "
        f"measured on {device_name(h, 'unknown')}. Model shape: head size {shape.get('head_dim')}, "
        f"GQA {shape.get('gqa')}, {shape.get('n_layers')} layers.\n",
        f"FlashAttention rules (confirmed): {', '.join(outcome.rule_texts) or 'none: upstream selection'}.\n",
    ]
    if (ran := find_product(device_name(h, ""))) and ran[0] != h.arch:  # `tuner search --ptx-jit`
        out.append(
            f"**{h.arch} code, measured on the {ran[0]} GPU named above** ({ran[1]}; built as PTX, JIT-compiled by "
            f"the driver): kernel legality and device code are {h.arch}'s, speeds are that GPU's, and host code took "
            f"its {ran[0]} branches. Which config wins can differ on a real {h.arch} card; search again there.\n"
        )
    if host := (StudyState(study).host_args if study is not None else None):
        out.append(
            f"Every config, upstream included, ran with `{' '.join(host)}`: upstream's llama-bench died on this host "
            "in llama.cpp's AMX kernels (the weights repacked for AMX tiles) and ran with it.\n"
        )
    if outcome.dropped:
        out.append("Dropped after confirm: " + _why_rules(outcome.dropped) + ".\n")
    if outcome.narrowed:
        kept = "upstream's kernel kept where the forced kernel was not faster end to end"
        out.append(f"Narrowed after confirm ({kept}): {_why_rules(outcome.narrowed)}.\n")
    if noise := noise_line(outcome):
        out.append(noise)
    tuned = outcome.tuned
    out.append(f"Process-wide / compile-time knobs: {dict(tuned.params) if tuned else 'upstream defaults'}.\n")
    measured = set((outcome.knobs_dropped or {}).get("phases") or ())
    if left := [p for p in outcome.upstream_phases if p not in measured]:
        out.append(f"Phases left exactly as upstream (identical config, not re-measured): {', '.join(left)}.\n")
    if outcome.knobs_dropped:
        out.append("\n" + knobs_dropped_section(outcome))
    out.append(
        "\n## Confirmed points (final config vs upstream, paired interleaved rounds)\n\n"
        + method_paragraph(
            "paired rounds",
            rounds=[int(r.get("rounds") or 0) for r in rows],
            ceiling_pct=NOISE_CEILING_PCT,
            rule="sequential" if any(r.get("rule") == "sequential" for r in rows) else None,
            noise="A/A: how far upstream measured against itself in the same rounds strays from 1 "
            "(its CI's reach), at least the phase's median A/A noise.",
        )
        + "\n\n"
    )
    out.append(_confirmed_table(rows, model, pp, tg, dropped=bool(outcome.knobs_dropped)))
    if gate is not None:
        out.append("\n\n" + gate_section(gate))
    if residency:
        out.append("\n\n" + residency_section(residency))
    out.append(_screen_section(outcome))
    if decisions := outcome.compose.get("decisions"):
        cells = [
            [d["phase"], d["depth"], d["upstream_kernel"] or "-", d["winner"] or "upstream", d["reason"]]
            for d in decisions
        ]
        table = log.table(["phase", "depth", "upstream", "winner", "why"], cells)
        out.append("## Composed (before confirm)\n\n" + table + "\n\n")
    out.append(_trials(outcome.trials, outcome.tune_method))
    if outcome.trials and study is not None:  # the tune stage's two objectives, one table each
        for i, name in enumerate(("the prefill objective", "the decode objective")):
            out.append("\n" + importances_section(study, objective=i, target_name=name) + "\n")
    if storage and not storage.startswith("sqlite:"):  # a local path would be this machine's, not the reader's
        out.append(f"\nOpen the study in Optuna's dashboard: `{dashboard_command(redact(storage))}`\n")
    out.append("\n" + cost_line(outcome) + "\n")
    if secs := outcome.stage_seconds:
        table = log.table(["stage", "seconds"], [[k, f"{v:.0f}"] for k, v in secs.items()])
        out.append("\n## Wall time per stage\n\n" + table + "\n")
    return "".join(x if x.endswith("\n") else x + "\n" for x in out)


COST_FIELDS: tuple[str, ...] = ("build_s", "model_s", "gate_s", "screen_s", "tune_s", "confirm_s", "gates_s", "total_s")
COST_FIELDS += ("llama_bench_calls", "tune_trials")  # the counts, after the seconds


def cost_line(outcome: SearchOutcome) -> str:
    """report.md's one line of the search's cost (config.toml's ``[cost]``), naming fields an older study lacks."""
    cost = outcome.cost
    have = ", ".join(f"{k} {v}" for k, v in cost.items()) or "none recorded"
    missing = [k for k in COST_FIELDS if k not in cost]
    # A study without a call count was recorded by an older tuner, which timed stages only in some of its
    # runs (a resumed run with a cached build adds seconds, the first run's real build may be missing).
    line = f"**Cost** (resumed runs summed): {have}."
    if missing:
        line += f" Not in this study (a stage it did not run, or a figure older tuner versions did not record): {', '.join(missing)}."
    if "llama_bench_calls" not in cost:
        line += " Recorded by an older tuner: its stage times cover only the runs it timed, so they can be far below"
        line += " what the search cost (a cached build counts its few seconds)."
    return line


def _why_rules(rules: Mapping[FaRule, str]) -> str:
    return "; ".join(f"`{r.text}` ({w})" for r, w in rules.items())


def _confirmed_table(rows: Sequence[Mapping[str, Any]], model: str, pp: int, tg: int, dropped: bool = False) -> str:
    """report.md's confirmed points: the speedup table and the per-point table with CPU% and GPU%."""
    table = [
        [
            f"{r['phase']}{pp if r['phase'] == 'pp' else tg}@d{r['depth']}",
            r["depth"],
            r.get("upstream_kernel") or "-",
            r.get("kernel") or "-",
            f"{r['base_ts']:.2f} → {r['tuned_ts']:.2f}",
            _cpu_cell(r),
            _pair(r.get("base_core"), r.get("tuned_core")),
            _pair(r.get("base_gpu"), r.get("tuned_gpu")),
            _ci(r["ci_low"], r["ci_high"]),
            f"±{r['aa_noise_pct']:.1f}%" if math.isfinite(r["aa_noise_pct"]) else "-",
            str(r.get("rounds", "")),
            r["verdict"],
        ]
        for r in rows
    ]
    heads = ["Test", "depth", "upstream kernel", "kernel", "t/s upstream → tuned", "CPU% upstream → tuned"]
    heads += ["busiest core %", "GPU%", "Speedup 95% CI", "A/A noise", "rounds", "verdict"]
    return (
        compare_table(confirmed_points(rows, pp, tg), name_a="upstream", name_b="tuned", model=model)
        + "\n\n"
        + log.table(heads, table)
        + "\n\nCPU%: the llama-bench process tree during the timed repetitions, percent of one core (200 = two busy "
        "cores); Δ is the paired per-round difference in points with its 95% CI and the A/A pair's CPU noise; "
        "busiest core: its busiest thread; GPU%: NVML/AMD SMI utilization; — where not measured (no GPU "
        "library, or a study recorded before CPU% was). A decode point whose CPU% rises beyond the noise without "
        f"a t/s gain beyond it is {CPU_REJECTED!r} (docs/design.md) and is not claimed."
        if rows
        else "(the final config is upstream's, so no point of it was confirmed"
        + ("; the dropped trial's rounds are above)" if dropped else ")")
    )


def _screen_section(outcome: SearchOutcome) -> str:
    """report.md's kernel-screen tables, one per phase."""
    out = ["\n\n## Kernel screen (every legal forced kernel vs upstream, per phase and depth)\n\n"]
    op_level = outcome.screen_method == "kernel"
    if op_level:
        out.append(
            "Timed at the op level: `test-backend-ops perf -o FLASH_ATTN_EXT` at the model's head size, head counts "
            "and K/V type, at the cache cells each depth reads, one process per candidate and round. The values are "
            "op runs per second, not tokens per second, and the op's gains are larger than end to end (the op is "
            "part of a step); the confirm stage below measured the composed rules end to end with llama-bench.\n\n"
        )
    # A study screened before compose.judge_phase stored each cell judged by its own A/A noise only; its
    # decisions hold the bar compose used, so such a cell is shown judged by that bar as well.
    bars = {(x["phase"], str(x["depth"])): x.get("noise_pct") for x in outcome.compose.get("decisions", [])}
    for phase in ("tg", "pp"):
        cells = {d: _judged_cell(c, bars.get((phase, str(d)))) for d, c in outcome.screens.get(phase, {}).items()}
        srows = []
        for d in sorted(cells, key=int):
            c = cells[d]
            effs = ", ".join(
                f"{k} {_pct(e['ratio'])} [{_ci(e['ci_low'], e['ci_high'])}] {e['verdict']}"
                + (f" (CPU {e['cpu']['mean']:+.1f})" if finite(e.get("cpu", {}).get("mean")) else "")
                for k, e in c["effects"].items()
            )
            up = c.get("levels", {}).get("upstream", {})
            cpu_noise = f"; CPU ±{c['cpu_noise']:.1f}" if finite(c.get("cpu_noise")) else ""
            # The verdicts are judged against the phase's noise floor where it is above this depth's own A/A noise.
            bar = c.get("bar_pct")
            floor = (
                f"; floor ±{bar:.1f}%" if finite(bar) and finite(c["noise_pct"]) and bar > c["noise_pct"] + 0.05 else ""
            )
            srows.append(
                [
                    f"{phase}@d{d}",
                    c.get("upstream_kernel") or "-",
                    f"{c['upstream_ts']:.2f}",
                    *(f"{up[k]:.0f}" if finite(up.get(k)) else "—" for k in ("cpu", "core", "gpu")),
                    f"±{c['noise_pct']:.1f}% ({c.get('aa') or '-'}){floor}{cpu_noise}"
                    if math.isfinite(c["noise_pct"])
                    else "-",
                    effs or "-",
                    ", ".join(c.get("fallback", [])) or "-",
                ]
            )
        if srows:
            heads = ["point", "upstream kernel", "op runs/s upstream" if op_level else "t/s upstream", "CPU% upstream"]
            heads += ["busiest core %", "GPU% upstream", "A/A noise (pair; phase floor; CPU points)"]
            heads += ["forced kernels: Δ [95% CI] verdict (CPU Δ points)", "fell back"]
            out.append(log.table(heads, srows) + "\n\n")
    return "".join(out)


_EFFECT_KEYS = ("n", "ratio", "ci_low", "ci_high")  # Effect.as_dict(), as the study stores each screen effect


def _judged_cell(c: Mapping[str, Any], bar: object) -> Mapping[str, Any]:
    if finite(c.get("bar_pct")) or not finite(bar) or not finite(c.get("noise_pct")) or bar <= c["noise_pct"]:
        return c

    def v(e: Mapping[str, Any]) -> str:  # the stored effect judged by paired.verdict, as judge_phase does
        if e.get("verdict") == CPU_REJECTED:
            return CPU_REJECTED
        return verdict(Effect(**{k: e[k] for k in _EFFECT_KEYS}), bar)

    return {**c, "bar_pct": bar, "effects": {k: {**e, "verdict": v(e)} for k, e in c["effects"].items()}}


_ABS_PATH = re.compile(r"(?<![\w.])/[^\s:;,)]+")
"""An absolute path in a trial's reason (a build log on the machine that ran it): the report keeps its name."""


def _trials(trials: Sequence[TrialSummary], method: str = "llama-bench") -> str:
    rows = []
    for t in trials:
        vals = t.objectives
        score = f"pp x{vals[0]:.3f}, tg x{vals[1]:.3f}" if len(vals) == 2 else "-"
        note = ", ".join(f"{k}={v}" for k, v in sorted(t.params.items()))
        if t.status != "ok" and t.reason:
            note += f" ({_ABS_PATH.sub(lambda m: Path(m.group()).name, str(t.reason))[:90]})"
        rows.append([f"trial{t.number}", t.status, score, ", ".join(t.phases) or "-", note or "-"])
    if not rows:
        return "## Tune\n\nNo Optuna trials (nothing left to sample, or --trials 0).\n"
    timer = (
        "each trial timed at the op level (test-backend-ops FLASH_ATTN_EXT at the model's shape)"
        if method == "kernel"
        else "each trial timed with llama-bench"
    )
    return (
        f"## Tune (Optuna, one paired round per trial vs the composed rules, {timer}; proposals only: confirm decides)\n\n"
        + log.table(["trial", "status", "objectives", "phases measured", "params"], rows)
        + "\n"
    )

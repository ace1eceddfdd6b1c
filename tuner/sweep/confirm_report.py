"""``e2e.md`` and ``PR.md`` of ``tuner sweep confirm``: the end-to-end table, the kept and reported rules, the gates.

Only public llama.cpp sources are cited (``fattn.cu``, ``mmq.cu``, issue 18865, PR 15035): a reviewer upstream
cannot open anything else.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.result.tables import compare_table
from tuner.rounds.budget import load_step_costs
from tuner.sweep.confirm import PP, TG, Confirmed, ModelPlan, RuleFate, Table, batch_passes, quant_mode
from tuner.targets.models import load_model_shape, plan_tensors

_REFS = [
    "- `ggml/src/ggml-cuda/fattn.cu`, `ggml_cuda_get_best_fattn_kernel`: the selection the table goes into.",
    "- `ggml/src/ggml-cuda/mmq.cu`, `ggml_cuda_should_use_mmq`: the MMQ-vs-cuBLAS choice.",
    "- https://github.com/ggml-org/llama.cpp/issues/18865: the request to check these choices on datacenter GPUs.",
    "- https://github.com/ggml-org/llama.cpp/pull/15035: the earlier change to the FlashAttention kernel selection.",
]


def _gate_line(model: str, gate: Mapping[str, Any] | None) -> str:
    if not gate:
        return f"- {model}: not run (the table does not change this model)"
    checks = gate.get("checks") or []
    detail = "; ".join(
        f"{c.get('name')}: {str(c.get('verdict', '?')).upper()}"
        + (f" ({' '.join(c.get('reasons', []))})" if c.get("reasons") else "")
        for c in checks
    )
    return f"- {model}: **{str(gate.get('verdict', '?')).upper()}**" + (f" ({detail})" if detail else "")


def _identity_lines(identity: Mapping[str, str], *, model_rounds: bool = True) -> list[str]:
    """The confirm storage's identity in words (``model_rounds`` False: only small-batch passes ran)."""
    known = {"arch", "build", "quant", "models", "reps", "table", "tests", "schema", "sweep"}
    out = []
    if "arch" in identity:
        out.append(f"- arch: {identity['arch']}; build: `{identity.get('build', '?')}`")
    if "quant" in identity:
        how = {"direct": "blocks written directly", "quantize": "quantized with llama-quantize", "f16": "as written"}
        out.append(
            f"- models: random weights of each shape, {identity['quant']} "
            f"({how.get(str(identity.get('models')), identity.get('models'))})"
        )
    if "reps" in identity:
        reps = int(identity["reps"])
        tests = str(identity.get("tests", f"pp{PP},tg{TG}")).replace(",", " and ")
        only = (
            "" if model_rounds else f"; no model's {tests} rounds ran, every entry measured here is a small-batch one"
        )
        out.append(
            f"- llama-bench {tests if model_rounds else '(each pass names its test)'}, -r {reps + 1} a call: "
            f"{reps} timed repetitions after one discarded as warm-up{only}"
        )
    if "table" in identity:
        out.append(f"- table id: {identity['table']} (a hash of the composed entries and MMQ choices)")
    out += [f"- {k}: {v}" for k, v in identity.items() if k not in known]
    return out


def e2e_text(conf: Confirmed, *, identity: Mapping[str, str], rounds: int) -> str:
    """``e2e.md``: per model, the table's env and a compare-llama-bench table of upstream against the table."""
    lines = ["# End-to-end confirmation of the sweep's table", ""]
    model_rounds = any(p.like in conf.points for p in conf.plans)
    lines += _identity_lines(identity, model_rounds=model_rounds)
    lines += [
        f"- {rounds} paired rounds per model: upstream, its A/A twin and the table, order rotated per round; "
        f"pp{PP} and tg{TG} share each depth's fill"
        if model_rounds
        else f"- {rounds} paired rounds per small-batch pass: upstream, its A/A twin and the table, order rotated per round",
        "",
    ]
    for p in conf.plans:
        lines += [f"## {p.like} ({p.shape_text})", ""]
        env = p.env
        if not env or p.like not in conf.points:
            lines += [
                "No entry at Q->ne[1] = 1 and no MMQ choice of its weights: its pp512 and tg128 rounds were not "
                "measured; its small-batch passes follow."
                if p.unexercised
                else "The table does not change this model: not measured.",
                "",
            ]
            continue
        lines += [f"- `{k}={v}`" for k, v in env.items()]
        lines += ["", compare_table(conf.points[p.like], name_a="upstream", name_b="table"), ""]
        lines += [_gate_line(p.like, conf.gates.get(p.like)), ""]
    return "\n".join(lines) + "\n"


def coverage_lines(table: Table) -> list[str]:
    """What the sweep covered: shapes x n_kv, per head size, and the cells with a verdict."""
    shapes, lo = table.shapes, table.min_rounds or table.rounds
    more = "" if lo == table.rounds else f", up to {table.rounds} where a cell's verdict was still open"
    lines = [
        f"- {len(shapes)} shapes x {len(table.n_kv)} n_kv points = {len(table.cells)} cells, {lo} paired rounds each"
        f"{more}; {table.with_verdict} cells with a verdict",
        f"- n_kv: {', '.join(map(str, table.n_kv)) or '-'} (llama pads n_kv to a multiple of 256)",
        "",
        "| head size | GQA ratios | K/V types | Q->ne[1] | rules |",
        "|---:|---|---|---|---:|",
    ]
    per_head = Counter(r.D for r in table.rules)
    for head, group in itertools.groupby(shapes, key=lambda s: s.D):  # shapes sort by head size first
        ss = list(group)
        lines.append(
            f"| {head} | {', '.join(map(str, sorted({s.gqa for s in ss})))} | {', '.join(sorted({s.kv for s in ss}))} "
            f"| {', '.join(map(str, sorted({s.ne1 for s in ss})))} | {per_head[head]} |"
        )
    if table.mmq_identity:
        lines += ["", f"- MMQ vs cuBLAS: {table.mmq_points} points (quant type x weight size x batch size)"]
    return lines


def _method(table: Table) -> list[str]:
    timer = table.identity.get("timer", "fa-bench")
    items = [
        f"**Kernel level** (`tuner sweep run`, timer {timer}): every cell (head size, GQA ratio, K/V type, "
        "Q->ne[1], n_kv) times `FLASH_ATTN_EXT` with upstream's choice, the same choice again (the A/A pair) and "
        "every other legal kernel forced, in paired rounds with the order rotated per round. A kernel wins a cell "
        "only when its paired effect clears an A/A-controlled sequential test (Holm over cells); consecutive "
        "winning n_kv points form one entry.",
        *(
            [
                "**MMQ vs cuBLAS** (`tuner sweep mmq`, timer mm-bench): every point (quant type, weight size m x k, "
                "batch size ne11) times `MUL_MAT` with upstream's choice, its A/A twin and cuBLAS forced through "
                "the build's hook, in paired rounds judged by the same rule. A batch size goes to cuBLAS for a "
                "type only where cuBLAS won at every weight size, as `ggml_cuda_should_use_mmq` has no size key."
            ]
            if table.mmq_identity
            else []
        ),
        "**End to end** (`tuner sweep confirm`): each model shape, random weights of the stated type, "
        f"llama-bench pp{PP} and tg{TG} at each depth (-d), upstream against the table given to the build's "
        "runtime hook, with an A/A pair, in paired interleaved rounds, judged by the same rule."
        + (
            " Entries at Q->ne[1] = N > 1 get a pass of llama-bench ppN of their own (a prompt of N tokens after "
            "the depth: one attention call at that batch per layer, the call speculative decoding makes to check "
            "N drafted tokens) at the depths their n_kv range reaches."
            if any(r.ne1 > 1 for r in table.rules)
            else ""
        ),
        "**Kept** are the entries whose model points are faster end to end beyond noise, with none slower "
        "beyond noise and the models' output-equivalence gate (llama-perplexity KLD against upstream, within "
        "twice the spread of upstream's own kernels) passed; the rest are reported below, not patched.",
        "The patch is rendered on the pristine tree from the kept entries only: a static table and a lookup "
        "called at the top of the Turing-and-newer branch, guarded by `cc == GGML_CUDA_CC_HOPPER`; a shape it "
        "does not list keeps upstream's logic.",
    ]
    return [f"{i}. {t}" for i, t in enumerate(items, 1)]


def _reported_lines(dropped: Sequence[RuleFate]) -> list[str]:
    """Entries measured but not kept (with why), then the entries no confirmed model exercised."""
    if not dropped:
        return ["None."]
    unmeasured = [f for f in dropped if f.why.startswith("no confirmed model")]
    measured = [f for f in dropped if f not in unmeasured]
    out = [f"- {f.text}: {f.why}" for f in measured]
    if unmeasured:
        out += [
            *([""] if out else []),
            f"Not exercised by any confirmed model ({len(unmeasured)}; kernel-level verdicts only, "
            "each needs a model of its shape or weight type to be confirmed):",
            "",
            *[f"- {f.text}" for f in unmeasured],
        ]
    return out


def _e2e_lines(conf: Confirmed) -> list[str]:
    lines = []
    for p in conf.plans:
        if p.like in conf.points:
            lines += [compare_table(conf.points[p.like], name_a="upstream", name_b="table"), ""]
        else:
            lines += [f"{p.like} ({p.shape_text}): the table does not change this model.", ""]
    return lines


def _gates_lines(conf: Confirmed, backend_ops: Sequence[Mapping[str, object]]) -> list[str]:
    lines = ["Output equivalence (table vs upstream, per model):", ""]
    lines += [_gate_line(p.like, conf.gates.get(p.like)) for p in conf.plans]
    lines += ["", "test-backend-ops with the kept table's env, against the CPU backend:", ""]
    kept = any(f.kept for f in conf.fates)
    lines += [
        f"- {r['op']}: {'PASS' if r.get('passed') else 'FAIL'} ({r.get('summary', '')}; "
        + (f"the cases `-p '{r['params']}'` selects: the kept entries' head sizes and K/V types)" if r.get("params")
           else "every case)")
        for r in backend_ops
    ] or ["- not run (no entry kept)" if not kept else "- not run"]  # fmt: skip
    return lines


def pr_text(table: Table, conf: Confirmed, *, backend_ops: Sequence[Mapping[str, object]], patch: bool) -> str:
    """``PR.md``: method, coverage, the end-to-end table, the gates, kept and reported entries, the patch."""
    lines = [
        *_head_lines(table, conf.fates, patch=patch),
        "",
        "## Coverage",
        "",
        *coverage_lines(table),
        "",
        "## End to end",
        "",
        *_e2e_lines(conf),
        "## Gates",
        "",
        *_gates_lines(conf, backend_ops),
    ]
    return "\n".join([*lines, "", *_closing_lines(conf.fates, patch=patch, adds="the kept entries")])


def _head_lines(table: Table, fates: Sequence[RuleFate], *, patch: bool, more: str = "") -> list[str]:
    """PR.md's title, the count of kept entries (``more`` appended to it) and the method (:func:`_method`)."""
    what = "FlashAttention kernel" + (" and MMQ-vs-cuBLAS" if any(f.choice is not None for f in fates) else "")
    return [
        f"# CUDA: {what} selection for {table.arch.name}, measured",
        "",
        f"{sum(f.kept for f in fates)} of {len(fates)} kernel-level entries are kept after the end-to-end confirmation"
        + (" and go into the patch." if patch else "; the patch is empty.")
        + more,
        "",
        "## Method",
        "",
        *_method(table),
    ]


def _closing_lines(fates: Sequence[RuleFate], *, patch: bool, adds: str) -> list[str]:
    """PR.md's last sections: kept, reported (:func:`_reported_lines`), the patch, the references."""
    lines = ["## Kept", "", *([f"- {f.text}: {f.why}" for f in fates if f.kept] or ["None."])]
    lines += ["", "## Reported, not patched", "", *_reported_lines([f for f in fates if not f.kept])]
    lines += ["", "## Patch", ""]
    lines.append(
        f"`upstream.patch` (this directory) adds {adds}; `git apply` on the pristine tree."
        if patch
        else "No patch: no entry was confirmed end to end."
    )
    return [*lines, "", "## References", "", *_REFS, ""]


def merged_pr_text(parts: Sequence[Any], *, patch: bool) -> str:
    """``PR.md`` of a merged table: one method, each part's sections under its name, all entries, one patch."""
    tables = [p.evidence.table for p in parts]
    confs = [p.evidence.confirmed for p in parts]
    fates = [f for c in confs for f in c.fates]
    mmq_id: Mapping[str, str] = next((t.mmq_identity for t in tables if t.mmq_identity), {})
    union = dataclasses.replace(tables[0], rules=tuple(r for t in tables for r in t.rules), mmq_identity=mmq_id)
    names = ", ".join(f"`{p.name}`" for p in parts)
    joins = (
        f" The table joins {len(parts)} sweeps over disjoint cells ({names}), each confirmed end to end on its "
        "own; its sections below are named after them, and `parts/<name>/` holds each one's evidence and report."
    )
    lines = _head_lines(union, fates, patch=patch, more=joins)
    sections: list[tuple[str, list[list[str]]]] = [
        ("Coverage", [coverage_lines(p.evidence.table) for p in parts]),
        ("End to end", [_e2e_lines(p.evidence.confirmed) for p in parts]),
        ("Gates", [[*_gates_lines(p.evidence.confirmed, p.backend_ops), ""] for p in parts]),
    ]
    for title, bodies in sections:
        lines += ["", f"## {title}", ""]
        for p, body in zip(parts, bodies):
            lines += [f"### {p.name}", "", *body]
            lines += [] if lines[-1] == "" else [""]
    lines += [
        "`tuner validate --gpu` builds the pristine tree with this patch (all parts' entries together) and runs "
        "test-backend-ops FLASH_ATTN_EXT and MUL_MAT on it.",
        "",
        *_closing_lines(fates, patch=patch, adds="the kept entries of every part"),
    ]
    return "\n".join(lines)


def _params(like: str) -> int:
    return sum(t.n_elements for t in plan_tensors(load_model_shape(like)))


def _nearest(recs: Sequence[Mapping[str, Any]], d_model: int) -> Mapping[str, Any]:
    """The recording whose model is nearest ``d_model`` in width (costs scale with model size)."""

    def width(r: Mapping[str, Any]) -> float:
        return float(r["d_model"]) if "d_model" in r else float(load_model_shape(str(r["like"])).d_model)

    return min(recs, key=lambda r: abs(math.log(width(r) / d_model)))


def _call_cost(costs: Mapping[str, Any], like: str) -> tuple[float, Mapping[str, Any], float]:
    """(size ratio, recording, seconds per call and depth) of a pp512+tg128 call on ``like``, scaled by params."""
    rec = _nearest(list(costs["models"].values()), load_model_shape(like).d_model)
    own = {str(r["like"]): float(r["call_depth_s"]) for r in costs.get("confirm", {}).values()}
    size = _params(like) / _params(str(rec["like"]))
    return size, rec, own.get(like, size * float(rec["bench_call_depth_s"]))


def round_seconds(plan: ModelPlan, depths: Sequence[int], *, reps: int) -> float:
    """One paired round of a model as the dry run prices it; 0 (unknown) for a pass."""
    if plan.base:
        return 0.0
    _, _, call_depth_s = _call_cost(load_step_costs(), plan.like)
    return 3 * len(depths) * call_depth_s * (reps + 1) / 4


def check_seconds(like: str) -> float:
    """One output-equivalence check on ``like`` as the dry run prices it (scaled by parameter count)."""
    size, rec, _ = _call_cost(load_step_costs(), like)
    return size * float(rec["equivalence_check_s"])


def backend_ops_seconds(op: str, shapes: int | None = None) -> float:
    """One ``test-backend-ops -o OP`` run as recorded (per shape pair where recorded; else the largest)."""
    recs = {str(r["op"]): r for r in load_step_costs().get("backend_ops", {}).values()}
    rec = recs.get(op) or max(recs.values(), key=lambda r: float(r["seconds"]), default={"seconds": 0.0})
    whole = float(rec["seconds"])
    return whole if shapes is None or "shape_s" not in rec else min(whole, shapes * float(rec["shape_s"]))


def _batch_pass_s(costs: Mapping[str, Any], like: str, *, calls: int, reps: int, band: bool) -> float:
    """A small-batch pass's estimated seconds: its calls at the recorded per-call cost (``[confirm_batch]``,
    scaled as :func:`_call_cost`; -r as reps + 1 runs, recorded at 4) and its gate, plus the model's prefill band
    of three kernels on its first pass."""
    recs = list(costs.get("confirm_batch", {}).values())
    own = next((r for r in recs if r["like"] == like), None)
    d_model, params = load_model_shape(like).d_model, _params(like)
    rec = own or _nearest(recs, d_model)
    size = 1.0 if own else params / _params(str(rec["like"]))
    bench = _nearest(list(costs["models"].values()), d_model)
    checks = 1 + (3 if band else 0)
    scale = params / _params(str(bench["like"]))
    return calls * size * float(rec["call_s"]) * (reps + 1) / 4 + checks * scale * float(bench["equivalence_check_s"])


def plan_text(
    table: Table,
    plans: Sequence[ModelPlan],
    depths: Sequence[int],
    *,
    rounds: int,
    reps: int,
    quant: str,
    passes: Sequence[ModelPlan] = (),
) -> str:
    """The dry run: per model, what the table changes, the llama-bench calls and the estimated GPU time."""
    costs, lo = load_step_costs(), table.min_rounds or table.rounds
    span = str(lo) if lo == table.rounds else f"{lo}-{table.rounds}"  # every cell got lo, the open ones up to rounds
    lines = [
        f"sweep confirm: {len(table.rules)} FlashAttention rule(s) from {span} round(s) over "
        f"{len(table.cells)} cells"
        + (f", {len(table.mmq)} MMQ choice(s)" if table.mmq_identity else "")
        + f"; {len(plans)} model(s) at {quant}, depths {list(depths)}, {rounds} rounds, -r {reps}"
    ]
    total = 0.0
    for p in plans:
        ds = p.depths(depths)
        if not p.env:
            lines.append(
                f"  {p.like} ({p.shape_text}): "
                + (
                    "no entry at Q->ne[1] = 1 and no MMQ choice; pp512/tg128 not measured, small-batch passes below"
                    if p.unexercised
                    else "the table does not change this model; not measured"
                )
            )
            continue
        size, rec, call_depth_s = _call_cost(costs, p.like)
        calls = 3 * rounds  # upstream, its A/A twin and the table, pp and tg sharing each call
        # recorded at -r 4: llama-bench runs -r reps + 1 (the first run is a warm-up, dropped)
        secs = calls * len(ds) * call_depth_s * (reps + 1) / 4 + size * 4 * float(rec["equivalence_check_s"])
        total += secs
        what = [f"{len(p.fa_rules)} decode rule(s)"] + ([f"{len(p.mmq)} MMQ choice(s)"] if p.mmq else [])
        lines.append(
            f"  {p.like} ({p.shape_text}): {', '.join(what)}; {calls} llama-bench calls (pp{PP}+tg{TG}) at depths "
            f"{ds}, about {round(secs / 60)} min with the output gate"
        )
    banded: set[str] = set()
    for one, at in batch_passes(plans, depths):
        secs = _batch_pass_s(costs, one.base, calls=3 * rounds, reps=reps, band=one.base not in banded)
        banded.add(one.base)
        total += secs
        lines.append(
            f"  small-batch pass {one.like}: {len(one.fa_rules)} entry(ies) at Q->ne[1] = {one.batch}, pp{one.pp} at "
            f"depths {list(at)}: {3 * rounds} llama-bench calls, about {max(1, round(secs / 60))} min with its gate"
        )
    for one in passes:
        lines.append(
            f"  MMQ pass {one.like}: {', '.join(c.text for c in one.mmq)} on {one.base} at {one.quant} "
            f"({'blocks written directly' if quant_mode(one.quant) == 'direct' else 'llama-quantize'}), "
            f"pp{one.pp} as one micro-batch (-ub {one.pp} -b {one.pp}) at depth 0: "
            f"{3 * rounds} llama-bench calls and a prefill gate, plus making the model (not in the estimate below)"
        )
    for c in table.mmq:  # what no planned test can confirm, said before the GPU time is spent
        if any(c in one.mmq for one in passes):
            continue
        why = [f"no planned model's weights have {c.type} at {quant}"] if all(c not in p.mmq for p in plans) else []
        why += [] if c.covers(PP) else [f"pp{PP} multiplies at ne11 = {PP}, outside its batch range"]
        if why:
            lines.append(f"  MMQ {c.text} will be reported, not confirmed: {'; '.join(why)}")
    lines.append(
        f"estimated GPU time: about {round(total / 60)} min (ESTIMATE: per-depth costs recorded on an "
        f"{costs['machine']['name']}, tuner/data/step_costs.toml, scaled by -r {reps + 1} / 4 and, for a model without its own confirm "
        "recording, by parameter count; plus model synthesis on first use)"
    )
    return "\n".join(lines) + "\n"

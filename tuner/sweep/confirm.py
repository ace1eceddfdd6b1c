"""The sweep's table confirmed end to end: llama-bench on model shapes, upstream against the table's env.

Kernel-level wins can overstate end-to-end gains, so an entry goes upstream only once a model shape shows it:
the search's paired rounds (:func:`tuner.rounds.joint.run_joint_rounds`) per ``--like`` model, ``tg128``
exercising the ``Q->ne[1] = 1`` entries, small-batch passes (:func:`batch_passes`) and MMQ passes
(:func:`mmq_passes`) the rest; :func:`decide_rules` keeps what is faster somewhere, slower nowhere and passed the
output-equivalence gate. A model the table does not change is not measured. See docs/sweep.md.

A ``ppN`` prompt after a depth attends at ``Q->ne[1] = N`` (the call of speculative and parallel decoding), so an
entry at batch N is confirmed by a ``ppN`` pass with the entries as ``prefill/../nbN`` hook rules.
:class:`ConfirmStore` (``confirm.sqlite3``) holds rounds, gate checks and recorded models: the unit that travels
between machines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypedDict

from tuner import _run, log
from tuner.errors import TunerError, UsageError
from tuner.measure.equivalence import run_equivalence
from tuner.measure.paired import NOISE_CEILING_PCT
from tuner.plan.fa_rules import FaRule, rules_env
from tuner.rounds import output_gate as og
from tuner.rounds.budget import UNBOUNDED, Budget
from tuner.rounds.compose import Family, judge_phase, open_depths
from tuner.rounds.joint import Candidate, JointMeasure, run_joint_rounds
from tuner.rounds.keep import keep
from tuner.rounds.stats import AA_NAME, UPSTREAM, CellStats, summarize_phase
from tuner.rounds.store import open_store, read_store
from tuner.sweep import live, mmq
from tuner.sweep.grid import STRIDE, Cell, FaShape, legal_kernels, pad_kv, upstream_kernel
from tuner.sweep.table import TableRule, render_table_patch
from tuner.targets.archs import Arch, load_arch
from tuner.targets.models import DIRECT_QUANTS, load_model_shape, plan_tensors

# Gemma 3 4B's shape, not 12B's: the same FlashAttention shape (head size 256, GQA 2) for about a third
# of the weights and of the rounds' time; --like gemma-3-12b-shape still confirms on the larger one.
DEFAULT_LIKE = ("llama-3.2-1b", "llama-3.1-8b", "qwen2.5-3b", "qwen2.5-7b", "gemma-3-4b-shape")
DEFAULT_DEPTHS = (0, 4096, 16384, 32768, 65536)
"""0: short context; 4096: below upstream's VEC-to-MMA switch (8192); 16384, 32768: the Hopper decode rules."""
TABLE = "table"  # the candidate that runs with the table's env
PP, TG = 512, 128
_SCHEMA = 1


class ConfirmStore:
    """The rounds' records (one row per model, phase and round, the search's record as JSON) and the gate's
    checks, in SQLite; the identity (build, quant, the table's env per model...) is checked on reopening."""

    def __init__(self, path: Path, identity: Mapping[str, str]) -> None:
        self.path = Path(path)
        self.db = open_store(
            self.path,
            {"schema": str(_SCHEMA), "sweep": "confirm", **identity},
            table_sql="CREATE TABLE IF NOT EXISTS rounds (model TEXT NOT NULL, phase TEXT NOT NULL, "
            "round INTEGER NOT NULL, record TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (model, phase, round))",
            what="a sweep confirm storage",
            fix="Pass another -o or --storage, or the same build, --quant, -r and sweep table.",
            strict=True,
        )
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS gate (model TEXT NOT NULL, name TEXT NOT NULL, record TEXT NOT NULL, "
            "PRIMARY KEY (model, name))"
        )
        self.db.execute("CREATE TABLE IF NOT EXISTS models (ord INTEGER PRIMARY KEY, record TEXT NOT NULL)")

    def close(self) -> None:
        self.db.close()

    def records(self, model: str) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT record FROM rounds WHERE model = ? ORDER BY phase, round", (model,))
        return [json.loads(r) for (r,) in rows]

    def add(self, model: str, rec: Mapping[str, Any]) -> None:
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO rounds VALUES (?, ?, ?, ?, ?)",
                (model, rec["phase"], int(rec["round"]), json.dumps(rec), time.time()),
            )

    def gate(self, model: str) -> dict[str, Any]:
        rows = self.db.execute("SELECT name, record FROM gate WHERE model = ?", (model,))
        return {str(n): json.loads(r) for n, r in rows}

    def add_gate(self, model: str, name: str, rec: Mapping[str, object]) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO gate VALUES (?, ?, ?)", (model, name, json.dumps(rec)))

    def set_models(self, rows: Sequence[Mapping[str, object]]) -> None:
        """The models of the last call with their ``weight_types``, so :func:`recompose` can decide again."""
        with self.db:
            self.db.execute("DELETE FROM models")
            self.db.executemany("INSERT INTO models VALUES (?, ?)", [(i, json.dumps(r)) for i, r in enumerate(rows)])

    def models(self) -> list[dict[str, Any]]:
        return [json.loads(r) for (r,) in self.db.execute("SELECT record FROM models ORDER BY ord")]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Table:
    """A measured sweep recomposed from its storage: the rules, where they were measured and how."""

    rules: tuple[TableRule, ...]
    identity: Mapping[str, str]
    rounds: int
    cells: tuple[Cell, ...]
    with_verdict: int
    arch: Arch
    min_rounds: int = 0
    """The fewest rounds any cell got (``rounds`` is the most): rounds past the minimum go only to open cells."""
    mmq: tuple[mmq.MmqChoice, ...] = ()
    mmq_identity: Mapping[str, str] = dataclasses.field(default_factory=dict)
    mmq_points: int = 0

    @property
    def shapes(self) -> list[FaShape]:
        return sorted({c.shape for c in self.cells})

    @property
    def n_kv(self) -> list[int]:
        return sorted({c.n_kv for c in self.cells})


def store_meta(path: Path, what: str = "sweep storage this command can read") -> dict[str, str]:
    """A sweep store's ``meta`` table, read-only; UsageError naming ``what`` the file is not."""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            return {str(k): str(v) for k, v in db.execute("SELECT key, value FROM meta")}
    except sqlite3.Error as err:
        raise UsageError(f"{path} is not a {what} ({err}).") from err


def _storage(directory: Path, name: str, command: str) -> Path:
    path = Path(directory) / name
    if not path.is_file():
        raise UsageError(
            f"{directory} holds no {name}: pass the output directory (-o) of `{command}`, which keeps its samples "
            f"there, or the directory of its --storage file renamed to {name}."
        )
    return path


def load_table(sweep_dir: Path, mmq_dir: Path | None = None) -> Table:
    """The composed tables recomposed from their stores; UsageError for a missing or foreign store."""
    path = _storage(sweep_dir, "sweep.sqlite3", "tuner sweep run")
    meta = store_meta(path)
    if "arch" not in meta:
        raise UsageError(f"{path} records no arch; it is not the storage of `tuner sweep run`.")
    arch = load_arch(meta["arch"])
    samples, limits = read_store(live.TABLE, path)
    cells = tuple(
        Cell(shape=sh, n_kv=n, upstream=upstream_kernel(arch, sh, n), legal=legal_kernels(arch, sh.D, n, sh.gqa))
        for sh, n in sorted({s.key for s in samples})
    )
    rounds_per_cell = Counter(key for key, _ in {(s.key, s.round) for s in samples})
    outcome = live.compose(cells, samples, limits=limits)
    table = Table(
        rules=outcome.rules,
        identity=meta,
        rounds=max((s.round for s in samples), default=0) + 1,
        min_rounds=min(rounds_per_cell.values(), default=0),
        cells=cells,
        with_verdict=len(cells) - outcome.n_gaps,
        arch=arch,
    )
    if mmq_dir is None:
        return table
    mpath = _storage(mmq_dir, "mmq.sqlite3", "tuner sweep mmq")
    mmeta = store_meta(mpath)
    msamples, mlimits = read_store(mmq.MMQ_TABLE, mpath)
    points = mmq.stored_points(msamples)
    cuda = mmeta.get("backend", "").upper().startswith("CUDA")
    withhold = "" if cuda else f"the {mmeta.get('backend')} backend has no MMQ-vs-cuBLAS choice"
    mout = mmq.compose_mmq(points, msamples, limits=mlimits, withhold=withhold)
    return dataclasses.replace(table, mmq=mout.choices, mmq_identity=mmeta, mmq_points=len(points))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelPlan:
    """One model shape to confirm on: its attention shape and what of the table acts on it."""

    like: str
    D: int
    gqa: int
    kv: str
    context: int
    fa_rules: tuple[TableRule, ...]
    """The shape's ``Q->ne[1] = 1`` entries, what tg128 exercises (a small-batch pass: those at its batch)."""
    unexercised: tuple[TableRule, ...]
    """Entries of this shape at other ``Q->ne[1]``: no pp512/tg128 call makes them."""
    mmq: tuple[mmq.MmqChoice, ...] = ()
    pp: int = PP
    """The prompt test's tokens, one micro-batch (``-ub``/``-b`` set where it is not llama-bench's 512)."""
    base: str = ""
    """An MMQ pass (:func:`mmq_passes`): the model shape ``like`` names a quantization of; prefill only."""
    quant: str = ""
    batch: int = 0
    """A small-batch pass (:func:`batch_passes`): the ``Q->ne[1]`` its ``pp`` test attends at."""

    @property
    def bench_args(self) -> tuple[str, ...]:
        # a small batch fits llama-bench's micro-batch; a smaller -ub would slow every depth fill
        return () if self.pp == PP or self.batch else ("-ub", str(self.pp), "-b", str(self.pp))

    @property
    def phases(self) -> tuple[str, ...]:
        return ("pp",) if self.base else ("pp", "tg")

    @property
    def gate_rules(self) -> tuple[FaRule, ...]:
        """The rules the output gate forces (a batch pass's without their batch key: perplexity runs whole batches)."""
        return tuple(r.hook_rule(widened=True) if self.batch else r.hook_rule() for r in self.fa_rules)

    @property
    def env(self) -> dict[str, str]:
        """The table's runtime env for this model (empty: the table does not change it)."""
        # the entries as the hook's rules: decode rules, or a small-batch pass's prefill/../nbN rules
        out = {"GGML_TUNER_FA_RULES": rules_env(r.hook_rule() for r in self.fa_rules)} if self.fa_rules else {}
        return out | ({mmq.ENV: mmq.mmq_env(self.mmq)} if self.mmq else {})

    @property
    def shape_text(self) -> str:
        return f"D{self.D}/gqa{self.gqa}/kv{self.kv}"

    def depths(self, depths: Sequence[int]) -> list[int]:
        """``depths`` within the model's context (as the search refuses deeper ones)."""
        return [d for d in depths if not self.context or d <= self.context]


def plan_model(table: Table, like: str, *, kv: str = "f16", weight_types: Iterable[str] | None = None) -> ModelPlan:
    """What the table does to model ``like``; ``weight_types``: its GGUF's tensor types (None: every MMQ choice)."""
    s = load_model_shape(like)
    gqa = s.n_heads // s.n_kv_heads if s.n_kv_heads and s.n_heads % s.n_kv_heads == 0 else 0
    mine = [r for r in table.rules if (r.D, r.gqa, r.kv) == (s.head_dim, gqa, kv)]
    types = None if weight_types is None else {t.lower() for t in weight_types}
    return ModelPlan(
        like=s.name,
        D=s.head_dim,
        gqa=gqa,
        kv=kv,
        context=int(s.context_length or 0),
        fa_rules=tuple(r for r in mine if r.ne1 == 1),
        unexercised=tuple(r for r in mine if r.ne1 != 1),
        mmq=tuple(c for c in table.mmq if types is None or c.type.lower() in types),
    )


MMQ_QUANT = {"q4_0": "Q4_0", "q8_0": "Q8_0", "q4_K": "Q4_K_M", "q5_K": "Q5_K_M", "q6_K": "Q6_K", "iq4_xs": "IQ4_XS"}
"""The llama-quantize type whose tensors are mostly of an MMQ choice's type (an MMQ pass's model)."""


def mmq_passes(table: Table, plans: Sequence[ModelPlan], like: str) -> list[ModelPlan]:
    """An MMQ pass per choice no planned test exercises: ``like`` quantized to its type, one micro-batch, depth 0."""
    return [
        pass_plan(table, c, like, quant=MMQ_QUANT[c.type], pp=PP if c.covers(PP) else max(c.lo, 1))
        for c in table.mmq
        # a type no quantization has is reported: no confirmed model has its weights
        if c.type in MMQ_QUANT and not (c.covers(PP) and any(c in p.mmq for p in plans))
    ]


def pass_plan(
    table: Table, choice: mmq.MmqChoice, like: str, *, quant: str, pp: int, weight_types: Iterable[str] | None = None
) -> ModelPlan:
    """The MMQ pass of ``choice`` on ``like`` at ``quant`` (``<shape>@<quant>-pp<N>``), that choice alone."""
    one = plan_model(dataclasses.replace(table, rules=(), mmq=(choice,)), like, weight_types=weight_types)
    return dataclasses.replace(one, like=f"{one.like}@{quant.lower()}-pp{pp}", base=one.like, quant=quant, pp=pp)


def quant_mode(quant: str) -> str:
    """How confirm makes models of ``--quant``: ``f16`` as synthesized, ``direct`` blocks, else ``quantize``."""
    if quant.lower() in ("f16", "none"):
        return "f16"
    return "direct" if quant.upper() in DIRECT_QUANTS else "quantize"


def planned_weight_types(like: str, quant: str) -> list[str] | None:
    """The ggml types ``like`` will have at ``quant`` where known before it is made, else None."""
    wt = {"f16": "f16", "direct": quant.lower()}.get(quant_mode(quant))
    return None if wt is None else sorted({t.ggml_type for t in plan_tensors(load_model_shape(like), wt)})


def tg_window(depth: int, tg: int = TG) -> tuple[int, int]:
    """The first and last n_kv a ``tg`` test at ``depth`` attends over (the KV cache padded to 256)."""
    return pad_kv(depth + 1), pad_kv(depth + tg)


def _touches(rule: TableRule, depth: int) -> bool:
    lo, hi = tg_window(depth)
    return rule.lo <= hi and (rule.hi is None or rule.hi > lo)


def batch_touches(rule: TableRule, depth: int, batch: int) -> bool:
    """Whether a ``pp<batch>`` test at ``depth`` attends at an n_kv in ``rule``'s interval (KV padded to 256)."""
    return rule.covers(pad_kv(depth + batch))


def batch_plan(plan: ModelPlan, batch: int) -> ModelPlan:
    """The pass of ``plan``'s model at ``Q->ne[1] = batch`` (``<shape>-pp<batch>``): its entries there, prefill."""
    mine, like = tuple(r for r in plan.unexercised if r.ne1 == batch), f"{plan.like}-pp{batch}"
    return dataclasses.replace(
        plan, like=like, base=plan.like, pp=batch, batch=batch, fa_rules=mine, unexercised=(), mmq=()
    )


def batch_passes(plans: Sequence[ModelPlan], depths: Sequence[int]) -> list[tuple[ModelPlan, tuple[int, ...]]]:
    """Per model and batch of its shape's entries at ``Q->ne[1] > 1``: the pass and the depths whose
    ``pp<batch>`` reaches some entry's n_kv range; a batch no depth reaches gets no pass (reported)."""
    out = []
    for p in plans:
        if p.base:
            continue
        for batch in sorted({r.ne1 for r in p.unexercised}):
            one = batch_plan(p, batch)
            ds = tuple(d for d in p.depths(depths) if any(batch_touches(r, d, batch) for r in one.fa_rules))
            if ds:
                out.append((one, ds))
    return out


def measure_model(
    joint: JointMeasure,
    plan: ModelPlan,
    depths: Sequence[int],
    *,
    rounds: int,
    store: ConfirmStore,
    max_rounds: int | None = None,
    budget: Budget | None = None,
    round_s: Callable[[ModelPlan, Sequence[int]], float] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """The paired rounds of one model (upstream, its A/A twin, the table) per phase, resuming from ``store``.
    ``max_rounds`` above ``rounds``: further rounds only at the depths still open
    (:func:`tuner.rounds.compose.open_depths`), or at every depth with an MMQ choice in the env. ``budget``: no round
    starts that would end past it (the first priced by ``round_s``)."""
    hi = max(rounds, max_rounds or rounds)
    settle = None if hi == rounds or plan.mmq else open_depths
    args = plan.bench_args
    cands = [Candidate(name=UPSTREAM, args=args), Candidate(name=AA_NAME, args=args)]
    cands.append(Candidate(name=TABLE, env=plan.env, args=args))
    recs, first_s = store.records(plan.like), round_s(plan, depths) if budget and round_s else 0.0
    return run_joint_rounds(
        joint,
        dict.fromkeys(plan.phases, cands),
        list(depths),
        recs,
        pp_tokens=plan.pp,
        min_rounds=rounds,
        max_rounds=hi,
        target_ci=0.0,
        settle=settle,
        budget=budget or UNBOUNDED,
        prior=[{"seconds": first_s, "depths": list(depths), "order": [c.name for c in cands]}],  # 0: unknown
        on_round=lambda rec: store.add(plan.like, rec),
        tag=f"confirm-{plan.like}",
    )


def judge_model(
    recs: Mapping[str, Sequence[Mapping[str, object]]],
    depths: Sequence[int],
    *,
    mmq_changed: bool,
    phases: Sequence[str] = ("pp", "tg"),
) -> dict[str, dict[int, CellStats]]:
    """Per phase and depth, the table judged as the search judges (every cell tested with MMQ choices)."""
    family: Family = "all" if mmq_changed else "changed"
    return {p: judge_phase(p, summarize_phase(p, list(recs.get(p, ())), list(depths)), family=family) for p in phases}


def model_points(like: str, cells: Mapping[str, Mapping[int, CellStats]], *, pp: int = PP) -> list[E2ePoint]:
    """The compare-table points of one model; ``ne11``: the batch its weight multiplications run at."""
    pts: list[E2ePoint] = []
    for phase, by_depth in cells.items():
        for d, c in sorted(by_depth.items()):
            e = c.effects.get(TABLE)
            pts.append(
                {
                    "model": like,
                    "phase": phase,
                    "depth": d,
                    "test": f"pp{pp}" if phase == "pp" else f"tg{TG}",
                    "ne11": pp if phase == "pp" else 1,
                    "base_ts": c.upstream_ts,
                    "tuned_ts": c.levels.get(TABLE, {}).get("ts") if e else None,
                    "ci_low": e.ci_low if e else None,
                    "ci_high": e.ci_high if e else None,
                    "aa_noise_pct": c.bar_pct if math.isfinite(c.bar_pct) else c.noise_pct,
                    "noise_kind": "A/A",
                    "verdict": c.verdicts.get(TABLE, "fell back") if e else "fell back",
                    "upstream_kernel": c.upstream_kernel,
                    "kernel": c.kernels.get(TABLE),
                }
            )
    return pts


class E2ePoint(TypedDict):
    """One model point of the end-to-end table: :func:`tuner.result.tables.compare_table`'s input."""

    model: str
    phase: str
    depth: int
    test: str
    ne11: int
    base_ts: float
    tuned_ts: float | None
    ci_low: float | None
    ci_high: float | None
    aa_noise_pct: float
    noise_kind: str
    verdict: str
    upstream_kernel: str | None
    kernel: str | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuleFate:
    """One rule or MMQ choice: kept for the patch, or reported with why."""

    text: str
    kept: bool
    why: str
    rule: TableRule | None = None
    choice: mmq.MmqChoice | None = None
    reason: str = ""  # keep()'s reason (faster, slower, none...): what sweep.merge.join joins GPU models by
    touched: tuple[E2ePoint, ...] = ()  # the model points the entry acts on


def _fate(
    text: str, touched: list[E2ePoint], failed_gate: list[str], none_why: str, entry: TableRule | mmq.MmqChoice
) -> RuleFate:
    """``entry``'s fate by :func:`tuner.rounds.keep.keep`; a FA rule's gains count only where its kernel ran."""
    rule = entry if isinstance(entry, TableRule) else None
    fate = keep(touched, gate_failed=bool(failed_gate), kernel=None if rule is None else rule.kernel)
    at = ", ".join(f"{p['model']} {p['test']}@d{p['depth']}" for p in fate.points)
    why = {
        "none": none_why,
        "gate": f"the output-equivalence gate failed on {', '.join(failed_gate)}",
        "slower": f"slower end to end beyond noise at {at}",
        "cpu": f"CPU% up beyond the noise without a t/s gain at {at}",
        "noisy": f"the A/A noise is above the {NOISE_CEILING_PCT:g}% ceiling at {at}",
        "faster": f"faster end to end beyond noise at {at}",
        "no gain": f"no end-to-end gain beyond noise at {at} (a kernel-level gain only)",
    }[fate.reason]
    choice = entry if isinstance(entry, mmq.MmqChoice) else None
    return RuleFate(
        text=text, kept=fate.kept, why=why, rule=rule, choice=choice, reason=fate.reason, touched=tuple(touched)
    )


def decide_rules(
    table: Table,
    plans: Sequence[ModelPlan],
    points: Mapping[str, Sequence[E2ePoint]],
    gates: Mapping[str, Mapping[str, object]],
    *,
    weight_types: Mapping[str, Iterable[str]] = {},
) -> list[RuleFate]:
    """Each rule and MMQ choice of the table, kept or reported (module doc)."""
    failed = [m for m, g in gates.items() if g.get("verdict") == "fail"]
    out = []
    for r in table.rules:
        shaped = [p for p in plans if (p.D, p.gqa, p.kv) == (r.D, r.gqa, r.kv) and not p.base]
        if r.ne1 != 1:  # a small-batch pass's ppN points
            models = [p.like for p in plans if p.batch == r.ne1 and r in p.fa_rules]
            test = f"pp{r.ne1}"
            touched = [q for m in models for q in points.get(m, ()) if batch_touches(r, int(q["depth"]), r.ne1)]
        else:
            models = [p.like for p in shaped if r in p.fa_rules]
            test = f"tg{TG}"
            touched = [
                q for m in models for q in points.get(m, ()) if q["phase"] == "tg" and _touches(r, int(q["depth"]))
            ]
        none = (
            "no confirmed model has this shape"
            if not shaped
            else f"no measured {test} depth of {', '.join(p.like for p in shaped)} reaches its n_kv range"
        )
        out.append(_fate(r.text, touched, [m for m in models if m in failed], none, r))
    for c in table.mmq:
        # a model whose weights have the type and whose env had the choice (an MMQ pass has its own only)
        models = [
            p.like for p in plans if c in p.mmq and c.type.lower() in {t.lower() for t in weight_types.get(p.like, ())}
        ]
        touched = [
            q
            for m in models
            for q in points.get(m, ())
            if c.covers(int(q.get("ne11", PP if q["phase"] == "pp" else 1)))  # points stored before ne11: pp512
        ]
        none = (
            f"no confirmed model has {c.type} weights"
            if not models
            else "no measured pp or tg test multiplies in its batch range"
        )
        out.append(_fate(f"MMQ {c.text}", touched, [m for m in models if m in failed], none, c))
    return out


def unexplained_slower(points: Mapping[str, Sequence[E2ePoint]]) -> list[str]:
    """Points slower beyond noise (for the report: any, whichever rule acted there)."""
    return [
        f"{p['model']} {p['test']}@d{p['depth']}" for pts in points.values() for p in pts if p["verdict"] == "slower"
    ]


def gate_model(
    plan: ModelPlan,
    model: Path,
    bin_dir: Path,
    *,
    arch: Arch,
    era: str,
    store: ConfirmStore,
    work_dir: Path,
    run_one: Callable[[og.GateCheck], Mapping[str, object]] | None = None,
    quiet: bool = False,
    before: Callable[[str], None] | None = None,
) -> Mapping[str, object]:
    """The output-equivalence gate of the table's env on ``model``, as the search's final gate plans and judges it
    (:mod:`tuner.rounds.output_gate`), MMQ choices widened and judged against :func:`cublas_band`. Each check is
    stored as it ends, so a rerun runs only the missing ones; ``before(name)`` runs before each check."""
    widened = tuple(dataclasses.replace(c, lo=0, hi=None) for c in plan.mmq)
    checks = og.plan_checks(
        rules=plan.gate_rules,
        base_env={},
        base_args=(),
        final_env={mmq.ENV: mmq.mmq_env(dict.fromkeys(widened))} if widened else {},
        final_args=(),
        changed={mmq.ENV: ("pp",)} if widened else {},
        build_changed=False,
        era=era,
    )
    # the band's phase: a batch pass's rules act in prefill (MMQ choices keep their own prefill band)
    kernels = {"prefill" if plan.batch else "decode": list(legal_kernels(arch, plan.D, STRIDE, plan.gqa))}

    def run(c: og.GateCheck) -> Mapping[str, object]:
        if before is not None:
            before(c.name)
        if run_one is not None:
            return run_one(c)
        wd = work_dir / plan.like / "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in c.name)
        return run_equivalence(
            bin_dir, bin_dir, model, mode=c.mode, candidate_env=c.env, candidate_args=c.args,
            upstream_env=c.upstream_env, upstream_args=c.upstream_args, work_dir=wd, strict=c.strict,
        ).as_dict()  # fmt: skip

    # a model's small-batch passes force the same kernels on the same file in prefill: one band serves them all
    band_key = f"{plan.base} small-batch band" if plan.batch else plan.like
    return og.run_checks(
        checks,
        done={**(store.gate(band_key) if plan.batch else {}), **store.gate(plan.like)},
        run_one=run,
        on_check=lambda name, rec: store.add_gate(band_key if name.startswith(og.BAND) else plan.like, name, rec),
        band=og.plan_band(checks, kernels) + cublas_band(checks, widened),
        quiet=quiet,
    )


def cublas_band(checks: Sequence[og.GateCheck], choices: Sequence[mmq.MmqChoice]) -> list[og.GateCheck]:
    """The prefill band of MMQ choices: upstream with their types on cuBLAS at every batch size against upstream's
    MMQ. cuBLAS multiplies f16 activations where MMQ quantizes them to q8_1, so they differ beyond the
    CPU-calibrated thresholds (H100: mean KLD 0.004 on the 1B shape, 0.03 on the 8B); the check shows the hook
    runs, and ``test-backend-ops -o MUL_MAT`` (:func:`backend_ops_check`) is the correctness evidence."""
    ref = next((c for c in checks if c.mode == "prefill"), None)
    if not choices or ref is None:
        return []
    every = dict.fromkeys(mmq.MmqChoice(type=c.type, lo=0, hi=None, backend="BLAS") for c in choices)
    return [
        og.GateCheck(
            name=f"{og.BAND} prefill cuBLAS",
            mode="prefill",
            strict=False,
            env={**ref.upstream_env, mmq.ENV: mmq.mmq_env(every)},
            args=ref.upstream_args,
            upstream_env=ref.upstream_env,
            upstream_args=ref.upstream_args,
            why="upstream's own cuBLAS path forced for the choices' types at every batch size vs upstream's MMQ",
        )
    ]


def backend_ops_check(
    bin_dir: Path, op: str, env: Mapping[str, str], log_file: Path, *, backend: str, timeout: float = 1800.0,
    params: str | None = None,
) -> dict[str, object]:  # fmt: skip
    """``test-backend-ops test -o OP -b BACKEND [-p PARAMS]`` with the kept table's env, as a record."""
    exe = Path(bin_dir) / "test-backend-ops"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    if not exe.is_file():
        return {"op": op, "passed": False, "summary": f"no test-backend-ops in {bin_dir}", "log": str(log_file)}
    cmd = [str(exe), "test", "-o", op, "-b", backend] + (["-p", params] if params else [])
    try:
        res = _run.run(cmd, env={**os.environ, **env}, timeout=timeout, check=False, what="test-backend-ops")
        text, rc = res.output, res.returncode
    except TunerError as err:  # the timeout (the process group stopped), or a program that cannot start
        text, rc = str(err), 124
    log_file.write_text("$ " + " ".join(cmd) + "\n" + "".join(f"{k}={v}\n" for k, v in env.items()) + text)
    summary = next((ln.strip() for ln in reversed(text.splitlines()) if "tests passed" in ln), "")
    return {
        "op": op,
        "passed": rc == 0 and "FAIL" not in text,
        "summary": summary or f"exit code {rc}",
        "env": dict(env),
        "params": params,
        "log": str(log_file),
    }


@dataclasses.dataclass(frozen=True, kw_only=True)
class Confirmed:
    """What a confirm run measured and decided."""

    plans: tuple[ModelPlan, ...]
    depths: Mapping[str, tuple[int, ...]]
    points: Mapping[str, list[E2ePoint]]
    gates: Mapping[str, Mapping[str, object]]
    weight_types: Mapping[str, tuple[str, ...]]
    fates: tuple[RuleFate, ...]

    @property
    def kept_rules(self) -> list[TableRule]:
        return [f.rule for f in self.fates if f.kept and f.rule is not None]

    @property
    def kept_mmq(self) -> list[mmq.MmqChoice]:
        return [f.choice for f in self.fates if f.kept and f.choice is not None]


def confirm_models(
    table: Table,
    likes: Sequence[str],
    *,
    depths: Sequence[int],
    rounds: int,
    store: ConfirmStore,
    model_for: Callable[[str], Path],
    joint_for: Callable[[Path, ModelPlan], JointMeasure],
    gate: Callable[[ModelPlan, Path], Mapping[str, object]],
    weight_types_of: Callable[[Path], Iterable[str]],
    kv: str = "f16",
    era: str = "",
    mmq_like: str | None = None,
    quantized_for: Callable[[str, str], Path] | None = None,
    max_rounds: int | None = None,
    budget: Budget | None = None,
    round_s: Callable[[ModelPlan, Sequence[int]], float] | None = None,
) -> Confirmed:
    """Per model: make, plan, measure, judge, gate; then the batch and MMQ passes and every rule's decision."""
    plans, points, gates, wtypes, dmap = [], {}, {}, {}, {}
    rows: list[dict[str, object]] = []
    limits = {"rounds": rounds} | ({"max_rounds": max_rounds} if (max_rounds or 0) > rounds else {})  # recompose's
    known = {_row_key(r): r.get("weight_types") for r in store.models()}  # an earlier call's made models

    def measure(one: ModelPlan, ds: tuple[int, ...], mmq_changed: bool, path: Path) -> None:
        recs = measure_model(joint_for(path, one), one, ds, rounds=rounds, store=store, max_rounds=max_rounds,
                             budget=budget, round_s=round_s)  # fmt: skip
        cells = judge_model(recs, ds, mmq_changed=mmq_changed, phases=one.phases)
        points[one.like], gates[one.like] = model_points(one.like, cells, pp=one.pp), gate(one, path)

    def stored(plan: ModelPlan, ds: tuple[int, ...]) -> bool:
        try:  # judged from the storage alone where every round and check is there (no model made)
            verdict = _stored_verdict(table, store, plan, ds, rounds=rounds, max_rounds=max_rounds, era=era)
            points[plan.like], gates[plan.like] = verdict
        except UsageError:
            return False
        return True

    for i, like in enumerate(likes):
        dry = plan_model(table, like, kv=kv)
        ds = dmap[dry.like] = tuple(dry.depths(depths))
        row: dict[str, object] = {"like": like, "kv": kv, "depths": list(ds), **limits, "era": era}
        rows.append(row | {"weight_types": None})
        if not dry.env:
            log.info(f"[{i + 1}/{len(likes)}] {dry.like} ({dry.shape_text}): " + (
                "no entry at Q->ne[1] = 1 and no MMQ choice" if dry.unexercised else "the table does not change this model"))  # fmt: skip
            plans.append(dry)
            continue
        types = known.get(_row_key(row))
        plan = dry if types is None else plan_model(table, like, kv=kv, weight_types=types)
        path = None
        if types is None or (plan.env and not stored(plan, ds)):
            path = model_for(like)
            types = sorted({str(t) for t in weight_types_of(path)})
            plan = plan_model(table, like, kv=kv, weight_types=types)
        wtypes[dry.like] = tuple(types)
        rows[-1] = row | {"weight_types": list(types)}
        plans.append(plan)
        if not plan.env:
            log.info(f"[{i + 1}/{len(likes)}] {plan.like}: no table entry or MMQ choice acts on its weights")
            continue
        log.info(
            f"[{i + 1}/{len(likes)}] {plan.like} ({plan.shape_text}): {len(plan.fa_rules)} decode rule(s), "
            f"{len(plan.mmq)} MMQ choice(s); {rounds} rounds x 3 llama-bench calls at depths {list(ds)}"
            + ("" if path else "; all stored")
        )
        if path is not None:
            measure(plan, ds, bool(plan.mmq), path)
    for one, ds in batch_passes(plans, depths):  # judged from the store where whole, else measured
        row = {"kv": kv, **limits, "era": era, "like": one.base, "depths": list(ds), "batch": one.batch}
        types = known.get(_row_key(row))
        log.info(f"small-batch pass {one.like}: {len(one.fa_rules)} entry(ies) at Q->ne[1] = {one.batch}, pp{one.pp} "
                 f"at depths {list(ds)}" + ("" if types is None else "; stored"))  # fmt: skip
        if types is None or not stored(one, ds):
            measure(one, ds, False, path := model_for(one.base))  # on its base model's file
            types = sorted({str(t) for t in weight_types_of(path)})
        rows.append(row | {"weight_types": list(types)})
        plans.append(one)
        dmap[one.like], wtypes[one.like] = ds, tuple(types)
    for one in mmq_passes(table, plans, mmq_like) if mmq_like else []:
        if quantized_for is None:  # nothing to make the pass's model with
            break
        choice = one.mmq[0]
        row = {"like": one.base, "kv": kv, "depths": [0], **limits, "era": era,
               "pass": {"quant": one.quant, "pp": one.pp, "choice": table.mmq.index(choice)}}  # fmt: skip
        types = known.get(_row_key(row))
        path = None
        if types is not None:
            one = pass_plan(table, choice, one.base, quant=one.quant, pp=one.pp, weight_types=types)
        if types is None or (one.mmq and not stored(one, (0,))):
            path = quantized_for(one.base, one.quant)
            types = sorted({str(t) for t in weight_types_of(path)})
            one = pass_plan(table, choice, one.base, quant=one.quant, pp=one.pp, weight_types=types)
        rows.append(row | {"weight_types": list(types)})
        plans.append(one)
        dmap[one.like], wtypes[one.like] = (0,), tuple(types)
        if not one.mmq:
            log.info(f"MMQ pass {one.like}: its weights ({', '.join(wtypes[one.like])}) lack the choice's type; "
                     "not measured")  # fmt: skip
            continue
        log.info(f"MMQ pass {one.like}: {choice.text} at pp{one.pp} (-ub {one.pp}), depth 0, {rounds} rounds"
                 + ("" if path else "; all stored"))  # fmt: skip
        if path is not None:
            measure(one, (0,), True, path)
    store.set_models(rows)
    fates = decide_rules(table, plans, points, gates, weight_types=wtypes)
    return Confirmed(
        plans=tuple(plans), depths=dmap, points=points, gates=gates, weight_types=wtypes, fates=tuple(fates)
    )


def table_id(table: Table) -> str:
    """A short hash of the table's composed rules and MMQ choices: a confirm storage records the table it confirms."""
    text = "\n".join([r.text for r in table.rules] + [c.text for c in table.mmq])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def render_kept(root: Path, rules: Sequence[TableRule], choices: Sequence[mmq.MmqChoice], arch: Arch) -> str:
    """``upstream.patch`` of the kept entries on the pristine tree at ``root`` ('' where none is kept)."""
    note = f"Kernel choices measured on {arch.name} and confirmed end to end with llama-bench on model shapes."
    parts = [render_table_patch(root, rules, arch, note=note), mmq.render_mmq_patch(root, choices, arch, note=note)]
    return "".join(p for p in parts if p)


def _stored_only(*_: object) -> NoReturn:
    raise UsageError(
        "the confirm storage lacks a round or a gate check its recorded models need (a truncated or edited "
        "confirm.sqlite3): nothing can be recomposed from it."
    )


def _row_key(row: Mapping[str, object]) -> str:
    """A recorded model row's identity across calls (all but the weight types, which making the model gives)."""
    return json.dumps({k: row.get(k) for k in ("like", "kv", "depths", "pass", "batch")}, sort_keys=True)


def _stored_verdict(
    table: Table,
    store: ConfirmStore,
    plan: ModelPlan,
    ds: Sequence[int],
    *,
    rounds: int,
    max_rounds: int | None,
    era: str,
    quiet: bool = False,
) -> tuple[list[E2ePoint], Mapping[str, object]]:
    """``plan``'s points and gate judged from ``store`` alone; UsageError where a round or check is missing."""
    recs = measure_model(_stored_only, plan, ds, rounds=rounds, store=store, max_rounds=max_rounds)
    cells = judge_model(recs, ds, mmq_changed=bool(plan.mmq), phases=plan.phases)
    gate = gate_model(
        plan, Path(), Path(), arch=table.arch, era=era, store=store, work_dir=Path(), run_one=_stored_only, quiet=quiet
    )
    return model_points(plan.like, cells, pp=plan.pp), gate


def recompose(table: Table, store: ConfirmStore) -> Confirmed:
    """What :func:`confirm_models` decided, decided again from ``store`` alone; UsageError where it lacks a record."""
    rows = store.models()
    if not rows:
        raise UsageError(
            f"{store.path} records no models: it was made before `tuner sweep confirm` recorded them, or no call "
            "finished. Rerun the same `tuner sweep confirm` command: it resumes from the storage, measures "
            "nothing already measured and records them."
        )
    plans, points, gates, wtypes, dmap = [], {}, {}, {}, {}
    for row in rows:
        types = row.get("weight_types")
        plan = plan_model(table, str(row["like"]), kv=str(row["kv"]), weight_types=types)
        if "pass" in row:  # an MMQ pass: its choice alone, on the quantization it was measured on
            ps = row["pass"]
            choice = table.mmq[int(ps["choice"])]
            plan = pass_plan(table, choice, plan.like, quant=str(ps["quant"]), pp=int(ps["pp"]), weight_types=types)
        if "batch" in row:  # a small-batch pass: the shape's entries at that Q->ne[1], on the model's own file
            plan = batch_plan(plan, int(row["batch"]))
        ds = tuple(int(d) for d in row["depths"])
        dmap[plan.like] = ds
        plans.append(plan)
        if types is None or not plan.env:
            continue
        wtypes[plan.like] = tuple(str(t) for t in types)
        n, top = int(row["rounds"]), row.get("max_rounds")
        points[plan.like], gates[plan.like] = _stored_verdict(
            table, store, plan, ds, rounds=n, max_rounds=top and int(top), era=str(row["era"]), quiet=True
        )
    fates = decide_rules(table, plans, points, gates, weight_types=wtypes)
    return Confirmed(
        plans=tuple(plans), depths=dmap, points=points, gates=gates, weight_types=wtypes, fates=tuple(fates)
    )

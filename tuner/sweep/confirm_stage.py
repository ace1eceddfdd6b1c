"""``tuner sweep confirm`` as two stages over one frozen request: :func:`plan_confirm` (table loaded, models
planned, dry-run text) and :func:`run_confirm` (build, storage, measurements, gates, test-backend-ops, outputs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from contextlib import closing
from pathlib import Path

from tuner import source
from tuner.errors import UsageError
from tuner.measure.exe import find_bin_dir
from tuner.measure.gate import params_for_shapes
from tuner.plan.fa_rules import rules_env
from tuner.rounds.budget import Budget
from tuner.rounds.joint import JointMeasure
from tuner.rounds.live import make_live_measure
from tuner.rounds.store import DEVICE, device_identity
from tuner.sweep import confirm, mmq
from tuner.sweep.confirm import Confirmed, ConfirmStore, ModelPlan, Table
from tuner.sweep.confirm_report import backend_ops_seconds, check_seconds, e2e_text, plan_text, pr_text, round_seconds
from tuner.sweep.merge import slug
from tuner.sweep.run_stage import default_build, gpu_backend, require_gpu
from tuner.sweep.table import widened_layers
from tuner.targets.archs import detect_local_archs, local_gpu_names
from tuner.targets.defaults import DEFAULT_QUANT
from tuner.targets.models import load_gguf_tensors, synth_cached


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConfirmRequest:
    """``tuner sweep confirm``'s flags, as given (the rounds already checked against each other)."""

    sweep_dir: Path
    mmq_dir: Path | None = None
    likes: tuple[str, ...] = ()
    """Model shapes; empty: :data:`tuner.sweep.confirm.DEFAULT_LIKE`."""
    quant: str = DEFAULT_QUANT
    depths: tuple[int, ...] = confirm.DEFAULT_DEPTHS
    mmq_like: str = "llama-3.1-8b"
    """The MMQ passes' model shape; ``none``: no passes."""
    rounds: int = 3
    max_rounds: int | None = None
    reps: int = 3
    build_dir: Path | None = None
    """A build or bin directory; None: the sweeps' default build (:func:`tuner.sweep.run_stage.default_build`)."""
    backend: str = "CUDA0"
    spec: str | None = None
    storage: Path | None = None
    time_budget: float | None = None
    out_dir: Path | None = None
    """Where the outputs go; None: ``sweep_dir/confirm``."""

    @property
    def out(self) -> Path:
        return self.out_dir or self.sweep_dir / "confirm"

    @property
    def storage_path(self) -> Path:
        return self.storage or self.out / "confirm.sqlite3"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConfirmPlan:
    """What :func:`plan_confirm` decided: the table, the models it changes, the MMQ passes, the dry run's text."""

    request: ConfirmRequest
    table: Table
    likes: tuple[str, ...]
    plans: tuple[ModelPlan, ...]
    passes: tuple[ModelPlan, ...]
    mmq_like: str | None
    budget: Budget | None
    text: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConfirmOutcome:
    """What :func:`run_confirm` measured, decided and wrote to ``out``."""

    conf: Confirmed
    backend_ops: tuple[Mapping[str, object], ...]
    patch: bool
    """Whether ``upstream.patch`` was written (an entry was kept)."""
    out: Path


def plan_confirm(request: ConfirmRequest) -> ConfirmPlan:
    """The table and its models planned, nothing built; UsageError for a foreign store or unknown shape."""
    r = request
    # the clock starts before anything is loaded: a caller's limit counts from the command's start
    budget = Budget.counted_from(None, r.time_budget) if r.time_budget else None
    table = confirm.load_table(r.sweep_dir, r.mmq_dir)
    likes = r.likes or confirm.DEFAULT_LIKE
    # an unknown name: its UsageError, exit 2; an MMQ choice counts only where the model's weights have its type
    plans = [
        confirm.plan_model(table, like, weight_types=confirm.planned_weight_types(like, r.quant)) for like in likes
    ]
    like_mmq = None if r.mmq_like.lower() == "none" else r.mmq_like
    passes = confirm.mmq_passes(table, plans, like_mmq) if like_mmq else []
    text = plan_text(table, plans, r.depths, rounds=r.rounds, reps=r.reps, quant=r.quant, passes=passes)
    r, beside = _beside_the_first_model(r, table)
    text += beside
    if r.max_rounds and r.max_rounds > r.rounds:
        text += (
            f"  up to {r.max_rounds} rounds at the depths still open after {r.rounds} (not in the estimate: "
            "how many stay open is known only then)\n"
        )
    return ConfirmPlan(
        request=r,
        table=table,
        likes=tuple(likes),
        plans=tuple(plans),
        passes=tuple(passes),
        mmq_like=like_mmq,
        budget=budget,
        text=text,
    )


def _beside_the_first_model(r: ConfirmRequest, table: Table) -> tuple[ConfirmRequest, str]:
    """On another GPU model of the arch, the default output goes to ``confirm-<model>``; the line saying so."""
    swept = table.identity.get(DEVICE)
    names = local_gpu_names() if r.out_dir is None and r.storage is None and swept else []
    if not names or names[0] == swept:
        return r, ""
    out = r.sweep_dir / f"confirm-{slug(names[0])}"
    note = (
        f"  this GPU ({names[0]}) is another model than the table was swept on ({swept}): its confirmation is "
        f"kept apart, in {out} (`tuner sweep merge --gpu` joins the two models' verdicts)\n"
    )
    return dataclasses.replace(r, out_dir=out), note


def _bin_dir(plan: ConfirmPlan) -> Path:
    """``--build``'s bin dir with the tools the confirmation needs, or the default build with them added."""
    r = plan.request
    modes = {confirm.quant_mode(q) for q in (r.quant, *(p.quant for p in plan.passes))}  # the passes' types too
    tools = ("llama-perplexity",) + (("llama-quantize",) if "quantize" in modes else ())
    if r.build_dir is None:
        return default_build(plan.table.arch.name, r.spec, extra=tools)
    bin_dir = find_bin_dir(r.build_dir)
    missing = [t for t in tools if not (bin_dir / t).is_file()]
    if missing:
        raise UsageError(
            f"{bin_dir} has no {' or '.join(missing)}, which the confirmation needs (the output-equivalence "
            "gate runs llama-perplexity; the models are quantized with llama-quantize). Leave --build out to "
            "use the sweeps' default build with them added, or build them into this one."
        )
    return Path(bin_dir)


def _same_device(table: Table, bin_dir: Path, backend: str) -> dict[str, str]:
    """``{"device": ...}`` for the confirm storage; UsageError where the device is not the sweeps' and not of the
    table's arch (the patch would not act on it)."""
    mine = device_identity(bin_dir, backend)
    dev = mine.get(DEVICE)
    for what, ident in (("tuner sweep run", table.identity), ("tuner sweep mmq", table.mmq_identity)):
        swept = ident.get(DEVICE)
        if dev and swept and swept != dev and table.arch.name not in detect_local_archs():
            raise UsageError(
                f"The table's `{what}` samples were measured on {swept} ({table.arch.name}), but this machine "
                f"measures on {dev}, which is not {table.arch.name}: the table's patch would not act here. Confirm "
                f"it on a {table.arch.name} GPU, or sweep this device first."
            )
    return mine


def run_confirm(plan: ConfirmPlan) -> ConfirmOutcome:
    """Measure, gate and decide ``plan``'s models (resuming), run test-backend-ops and write the outputs.

    Raises:
        UsageError: a build without the tools it needs, a device other than the sweeps' (exit 2).
        BudgetReached: the time budget stopped it; what was measured is stored, nothing is written."""
    r, table, budget = plan.request, plan.table, plan.budget
    r = dataclasses.replace(r, backend=gpu_backend(table.arch, r.backend))
    require_gpu(table.arch, r.backend, f"tuner sweep confirm {r.sweep_dir} --dry-run")
    out = r.out
    bin_dir = _bin_dir(dataclasses.replace(plan, request=r))
    src = source.fetch_source(r.spec) if r.spec else source.fetch_source()
    identity = {  # what the storage's rounds belong to: the build, the models' type, -r, the table, the device
        "arch": table.arch.name,
        "build": str(bin_dir.resolve()),
        "quant": r.quant.upper(),
        "models": confirm.quant_mode(r.quant),
        "reps": str(r.reps),
        "tests": f"pp{confirm.PP},tg{confirm.TG}",
        "table": confirm.table_id(table),
        **_same_device(table, bin_dir, r.backend),
    }
    qbin = bin_dir / "llama-quantize"
    mode = confirm.quant_mode(r.quant)
    qtype = None if mode == "f16" else r.quant  # f16: the synthesized model as written

    def joint_for(path: Path, one: ModelPlan) -> JointMeasure:
        reps_by, logs = {"pp": r.reps, "tg": r.reps}, out / "logs" / one.like
        m = make_live_measure(
            bin_dir, path, pp=one.pp, tg=confirm.TG, reps=reps_by, log_dir=logs, era=src.era, arch=None
        )
        return m.joint  # rounds.live's both-phases call

    def model_for(like: str, quant: str | None = qtype, direct: bool = mode == "direct") -> Path:
        if budget is not None:
            budget.check(f"making the {like}{f' {quant}' if quant else ''} model")
        return Path(synth_cached(like, source=src, quant=quant, quantize_bin=qbin, direct=direct))

    def gate(one: ModelPlan, path: Path) -> Mapping[str, object]:
        return confirm.gate_model(one, path, bin_dir, arch=table.arch, era=src.era, store=store,
                                  work_dir=out / "equivalence", before=_check_budget(budget, one))  # fmt: skip

    with closing(ConfirmStore(r.storage_path, identity)) as store:
        conf = confirm.confirm_models(
            table,
            plan.likes,
            depths=r.depths,
            rounds=r.rounds,
            store=store,
            model_for=model_for,
            joint_for=joint_for,
            gate=gate,
            weight_types_of=lambda path: [t.ggml_type for t in load_gguf_tensors(path)],
            era=src.era,
            mmq_like=plan.mmq_like,
            max_rounds=r.max_rounds,
            # a pass's type written directly where it can be: no f16, no quantize
            quantized_for=lambda like, q: model_for(like, q, confirm.quant_mode(q) == "direct"),
            budget=budget,
            round_s=lambda p, ds: round_seconds(p, ds, reps=r.reps),
        )
        ops = _backend_ops(conf, bin_dir, backend=r.backend, store=store, log_dir=out / "logs", budget=budget)
    # e2e.md, PR.md and upstream.patch (the kept entries only, on the pristine tree)
    patch = confirm.render_kept(src.root, conf.kept_rules, conf.kept_mmq, table.arch)
    out.mkdir(parents=True, exist_ok=True)
    (out / "upstream.patch").unlink(missing_ok=True)
    if patch:
        (out / "upstream.patch").write_text(patch)
    (out / "e2e.md").write_text(e2e_text(conf, identity=identity, rounds=r.rounds))
    (out / "PR.md").write_text(pr_text(table, conf, backend_ops=ops, patch=bool(patch)))
    return ConfirmOutcome(conf=conf, backend_ops=tuple(ops), patch=bool(patch), out=out)


def _check_budget(budget: Budget | None, plan: ModelPlan) -> Callable[[str], None] | None:
    """The gate's ``before``: no check starts that would end past the budget (priced as the dry run)."""
    if budget is None:
        return None
    secs = check_seconds(plan.base or plan.like)
    return lambda name: budget.fits(
        secs, f"the {plan.like} output-equivalence check {name} (about {secs:.0f} s)", worded=True
    )


def _backend_ops(
    conf: Confirmed, bin_dir: Path, *, backend: str, store: ConfirmStore, log_dir: Path, budget: Budget | None = None
) -> list[Mapping[str, object]]:
    """test-backend-ops FLASH_ATTN_EXT (the kept entries' shapes, once per layer of widened rules, as the hook's
    first matching rule wins) and MUL_MAT with the kept entries' env; stored, so a rerun with the same env and
    cases skips them. ``budget``: none starts that would end past it."""
    layers = widened_layers(conf.kept_rules)
    choices = [dataclasses.replace(c, lo=0, hi=None) for c in conf.kept_mmq]
    mmq_env = {mmq.ENV: mmq.mmq_env(dict.fromkeys(choices))} if choices else {}
    # the cases of the kept entries' head sizes and K/V types (as `tuner validate --gpu`): elsewhere the hook
    # matches nothing and every case runs upstream's selection (on an H100 all 3982 took 129-141 s, the 540 of
    # head size 128 and f16 K/V 17-19 s)
    runs: list[tuple[str, str, dict[str, str], str | None, int | None]] = []
    for i, ly in enumerate(layers):
        name = f"FLASH_ATTN_EXT{f' ({i + 1} of {len(layers)})' if len(layers) > 1 else ''}"
        pairs = {(r.D, r.kv) for r in ly}
        p = params_for_shapes(pairs)
        env = {"GGML_TUNER_FA_RULES": rules_env(dict.fromkeys(ly))}
        runs.append((name, "FLASH_ATTN_EXT", env, p, len(pairs) if p else None))
    if layers or mmq_env:  # every widened rule in, as before layers existed, so a stored record still matches
        every = [r for ly in layers for r in ly]
        fa_all = {"GGML_TUNER_FA_RULES": rules_env(dict.fromkeys(every))} if every else {}
        runs.append(("MUL_MAT", "MUL_MAT", fa_all | mmq_env, None, None))  # an MMQ choice acts at every shape
    done = store.gate("test-backend-ops")
    out = []
    for name, op, env, p, shapes in runs:
        rec = done.get(name)
        if rec is None or rec.get("env") != env or rec.get("params") != p:
            if budget is not None:
                secs = backend_ops_seconds(op, shapes)
                budget.fits(secs, f"test-backend-ops {name} (about {secs:.0f} s)", worded=True)
            log = log_dir / f"test-backend-ops-{name.replace(' ', '-').replace('(', '').replace(')', '')}.log"
            rec = confirm.backend_ops_check(bin_dir, op, env, log, backend=backend, params=p) | {"op": name}
            store.add_gate("test-backend-ops", name, rec)
        out.append(rec)
    return out


def outcome_text(outcome: ConfirmOutcome) -> str:
    """The command's summary: each entry's fate, unexplained slower points, the files written."""
    conf, out = outcome.conf, outcome.out
    lines = [f"{'kept' if f.kept else 'reported'}: {f.text}: {f.why}" for f in conf.fates]
    if not conf.fates:
        lines.append("the table has no entry to confirm")
    lines += [f"slower beyond noise: {where}" for where in confirm.unexplained_slower(conf.points)]
    lines.append(
        f"e2e: {out / 'e2e.md'}\nPR: {out / 'PR.md'}" + (f"\npatch: {out / 'upstream.patch'}" if outcome.patch else "")
    )
    return "\n".join(lines)

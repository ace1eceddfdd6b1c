"""``tuner sweep confirm``, ``tuner sweep export`` and ``tuner sweep merge``: the sweep's table confirmed end
to end on model shapes, exported as a result folder, and exported tables joined into one (docs/sweep.md).
Registered on the ``sweep`` group by sweep_cmd."""

from __future__ import annotations

__all__ = ["confirm_cmd", "export_cmd", "merge_cmd"]

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import click

from tuner.cli._params import depths_option, find_bin_dir, output_option, round_limits, rounds_option
from tuner.cli.sweep_common import budget_stop, default_build, measure_options, time_budget_option
from tuner.errors import UsageError
from tuner.targets.defaults import DEFAULT_QUANT


@click.command("confirm")
@click.argument("sweep_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--mmq",
    "mmq_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Output directory of `tuner sweep mmq`: its MMQ choices are confirmed too (GGML_TUNER_MMQ_CHOICES).",
)
@click.option(
    "--like",
    "likes",
    multiple=True,
    help="Model shapes, repeatable (default: llama-3.2-1b, llama-3.1-8b, qwen2.5-3b, qwen2.5-7b, gemma-3-4b-shape: "
    "head sizes 64, 128 with GQA 4, 8 and 7, and 256 with GQA 2).",
)
@click.option(
    "--quant",
    default=DEFAULT_QUANT,
    show_default=True,
    help="Type of the random-weight models (the default is `tuner search`'s): Q4_K_M is written directly as random blocks of llama-quantize's "
    "per-tensor types (no llama-quantize); other types are quantized from f16 with llama-quantize (f16: as "
    "synthesized, not quantized).",
)
@click.option(
    "--depths",
    default="0,4096,16384,32768,65536",
    show_default=True,
    callback=depths_option,
    help="KV depths (llama-bench -d): 0 as every short prompt, 4096 below upstream's VEC-to-MMA switch at 8192, "
    "16384 and 32768 where the Hopper decode rules act, 65536 long context; 131072 costs minutes a call on "
    "an 8-12B model. Depths past a model's context length are left out for it.",
)
@click.option(
    "--mmq-like",
    default="llama-3.1-8b",
    show_default=True,
    help="Model shape of the MMQ passes: for each MMQ choice no --like model's weights or pp512 exercise, this "
    "shape quantized to the choice's type (q5_K: Q5_K_M, iq4_xs: IQ4_XS, ...) with llama-quantize, its prompt "
    "one micro-batch at the choice's lowest batch size, at depth 0. 'none': no passes.",
)
@rounds_option()
@click.option(
    "--min-rounds", type=click.IntRange(2, 100), default=3, show_default=True, help="Paired rounds every depth gets."
)
@click.option(
    "--max-rounds",
    type=click.IntRange(2, 100),
    default=None,
    help="Further rounds, up to this many, go only to the depths still open: a decode rule changes the kernel "
    "there and its verdict is neither claimed nor settled (the search confirm's rule); an MMQ pass's one depth "
    "takes them all. Default: --min-rounds (fixed). A rerun with a higher value adds rounds to what is still open.",
)
@click.option(
    "--reps", type=click.IntRange(1, 1000), default=3, show_default=True, help="llama-bench repetitions per call."
)
@measure_options(
    build_help="Build (or bin) directory of a tuner build with the FA rules hook (and the MMQ hook for --mmq). "
    "Default: the sweeps' default build of the sweep's arch.",
    backend_help="Backend test-backend-ops checks the kept table on.",
    storage="confirm.sqlite3",
)
@time_budget_option(
    "model is made, no round (a model's first priced as --dry-run prices it, later ones by its longest so far), "
    "no output-equivalence check and no test-backend-ops run (priced at recorded runs)"
)
@click.option("--dry-run", is_flag=True, help="Print the plan (models, calls, estimated GPU time) and stop.")
@output_option(
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where e2e.md, PR.md, upstream.patch, the logs and the storage go (default: SWEEP_DIR/confirm).",
    in_place=True,
)
def confirm_cmd(
    sweep_dir: Path,
    mmq_dir: Path | None,
    likes: tuple[str, ...],
    quant: str,
    depths: tuple[int, ...],
    mmq_like: str,
    rounds: int | None,
    min_rounds: int,
    max_rounds: int | None,
    reps: int,
    build_dir: Path | None,
    backend: str,
    spec: str | None,
    storage: Path | None,
    time_budget: float | None,
    dry_run: bool,
    out_dir: Path | None,
) -> None:
    """Confirm the sweep's table end to end with llama-bench on model shapes, and write PR.md (resumable).

    Per model: a random-weight model of the shape, quantized; paired interleaved rounds of upstream, its A/A
    twin and the table (the model shape's entries through GGML_TUNER_FA_RULES, MMQ choices through
    GGML_TUNER_MMQ_CHOICES), pp512 and tg128 at each depth; the output-equivalence gate. An entry is kept
    only where its model points are faster beyond noise and none slower; the rest are reported. Writes
    e2e.md, PR.md and upstream.patch (kept entries only) to -o. See docs/sweep.md.

    Example: tuner sweep confirm sweep-sm90 --mmq sweep-mmq-sm90 --rounds 3
    """
    from tuner.rounds.budget import RoundBudget
    from tuner.sweep import confirm
    from tuner.sweep.confirm_report import plan_text, round_seconds

    rounds, max_rounds = round_limits(click.get_current_context(), rounds, min_rounds, max_rounds)

    # the clock starts before anything is loaded: a caller's limit counts from the command's start
    budget = RoundBudget.from_now(time_budget, lambda p, ds: round_seconds(p, ds, reps=reps)) if time_budget else None
    table = confirm.load_table(sweep_dir, mmq_dir)
    likes = likes or confirm.DEFAULT_LIKE
    # an unknown name: its UsageError, exit 2; an MMQ choice counts only where the model's weights have its type
    plans = [confirm.plan_model(table, like, weight_types=confirm.planned_weight_types(like, quant)) for like in likes]
    like_mmq = None if mmq_like.lower() == "none" else mmq_like
    passes = confirm.mmq_passes(table, plans, like_mmq) if like_mmq else []
    text = plan_text(table, plans, depths, rounds=rounds, reps=reps, quant=quant, passes=passes)
    if max_rounds and max_rounds > rounds:
        text += (
            f"  up to {max_rounds} rounds at the depths still open after {rounds} (not in the estimate: "
            "how many stay open is known only then)\n"
        )
    click.echo(text, nl=False)
    if dry_run:
        return
    out = out_dir or sweep_dir / "confirm"
    modes = {confirm.quant_mode(q) for q in (quant, *(p.quant for p in passes))}  # the passes' types too
    tools = ("llama-perplexity",) + (("llama-quantize",) if "quantize" in modes else ())
    if build_dir is None:
        bin_dir = default_build(table.arch.name, spec, extra=tools)
    else:
        bin_dir = find_bin_dir(build_dir)
        missing = [t for t in tools if not (bin_dir / t).is_file()]
        if missing:
            raise UsageError(
                f"{bin_dir} has no {' or '.join(missing)}, which the confirmation needs (the output-equivalence "
                "gate runs llama-perplexity; the models are quantized with llama-quantize). Leave --build out to "
                "use the sweeps' default build with them added, or build them into this one."
            )
    _run_confirm(table, likes, out, Path(bin_dir), depths=depths, rounds=rounds, reps=reps, quant=quant,
                 backend=backend, spec=spec, storage=storage, mmq_like=like_mmq, max_rounds=max_rounds,
                 budget=budget)  # fmt: skip


def _confirm_identity(table: Any, bin_dir: Path, *, quant: str, reps: int) -> dict[str, str]:
    """What one confirm storage's rounds belong to: the build, the models' type, -r and the table itself."""
    from tuner.sweep.confirm import PP, TG, quant_mode, table_id

    return {
        "arch": table.arch.name,
        "build": str(bin_dir.resolve()),
        "quant": quant.upper(),
        "models": quant_mode(quant),
        "reps": str(reps),
        "tests": f"pp{PP},tg{TG}",
        "table": table_id(table),
    }


def _same_device(table: Any, bin_dir: Path, backend: str) -> dict[str, str]:
    """``{"device": ...}`` for the confirm storage; UsageError where the sweeps recorded another device (a table
    swept on one GPU model is confirmed on the same one, or its kernel-level and end-to-end numbers disagree
    for reasons that are not the table's)."""
    from tuner.sweep.store import DEVICE, device_identity

    mine = device_identity(bin_dir, backend)
    dev = mine.get(DEVICE)
    for what, ident in (("tuner sweep run", table.identity), ("tuner sweep mmq", table.mmq_identity)):
        swept = ident.get(DEVICE)
        if dev and swept and swept != dev:
            raise UsageError(
                f"The table's `{what}` samples were measured on {swept}, but this machine measures on {dev}. A "
                "table is confirmed on the device it was swept on; run the confirmation on such a machine, or "
                "sweep this device first."
            )
    return mine


def _run_confirm(
    table: Any,
    likes: tuple[str, ...],
    out: Path,
    bin_dir: Path,
    *,
    depths: tuple[int, ...],
    rounds: int,
    reps: int,
    quant: str,
    backend: str,
    spec: str | None,
    storage: Path | None,
    mmq_like: str | None = None,
    max_rounds: int | None = None,
    budget: Any = None,
) -> None:
    from tuner import source
    from tuner.rounds.live import make_live_measure
    from tuner.sweep import confirm
    from tuner.targets.models import load_gguf_tensors, synth_cached

    src = source.fetch_source(spec) if spec else source.fetch_source()
    identity = {**_confirm_identity(table, bin_dir, quant=quant, reps=reps), **_same_device(table, bin_dir, backend)}
    store = confirm.ConfirmStore(storage or out / "confirm.sqlite3", identity)
    qbin = bin_dir / "llama-quantize"
    mode = confirm.quant_mode(quant)
    qtype = None if mode == "f16" else quant  # f16: the synthesized model as written

    def measure(path: Path, plan: Any) -> Any:
        reps_by = {"pp": reps, "tg": reps}
        log_dir = out / "logs" / plan.like
        return make_live_measure(
            bin_dir, path, pp=plan.pp, tg=confirm.TG, reps=reps_by, log_dir=log_dir, era=src.era, arch=None
        )

    def model_for(like: str, quant: str | None = qtype, direct: bool = mode == "direct") -> Path:
        if budget is not None:
            budget.check(f"making the {like}{f' {quant}' if quant else ''} model")
        return Path(synth_cached(like, source=src, quant=quant, quantize_bin=qbin, direct=direct))

    try:
        with budget_stop(store.path, "PR.md, e2e.md and upstream.patch are"):
            conf = confirm.confirm_models(
                table,
                likes,
                depths=depths,
                rounds=rounds,
                store=store,
                model_for=model_for,
                joint_for=lambda path, plan: cast(Any, measure(path, plan)).joint,  # search.live's both-phases call
                gate=lambda plan, path: confirm.gate_model(
                    plan,
                    path,
                    bin_dir,
                    arch=table.arch,
                    era=src.era,
                    store=store,
                    work_dir=out / "equivalence",
                    before=_check_budget(budget, plan),
                ),
                weight_types_of=lambda path: [t.ggml_type for t in load_gguf_tensors(path)],
                era=src.era,
                mmq_like=mmq_like,
                max_rounds=max_rounds,
                # a pass's type written directly where it can be: no f16, no quantize
                quantized_for=lambda like, q: model_for(like, q, confirm.quant_mode(q) == "direct"),
                budget=budget,
            )
            ops = _backend_ops(conf, bin_dir, backend=backend, store=store, log_dir=out / "logs", budget=budget)
    finally:
        store.close()
    _confirm_emit(table, conf, ops, src, out=out, identity=identity, rounds=rounds)


def _check_budget(budget: Any, plan: Any) -> Callable[[str], None] | None:
    """The gate's ``before``: no output-equivalence check of ``plan``'s model starts that would end past the
    budget (each priced as the dry run prices it)."""
    if budget is None:
        return None
    from tuner.sweep.confirm_report import check_seconds

    secs = check_seconds(plan.base or plan.like)
    return lambda name: budget.fits(secs, f"the {plan.like} output-equivalence check {name} (about {secs:.0f} s)")


def _backend_ops(
    conf: Any, bin_dir: Path, *, backend: str, store: Any, log_dir: Path, budget: Any = None
) -> list[dict[str, Any]]:
    """test-backend-ops FLASH_ATTN_EXT (the kept entries' head sizes and K/V types) and MUL_MAT (every case)
    with the kept entries' env (intervals widened, so every test case of a kept shape runs its kernel;
    FLASH_ATTN_EXT once per kernel a shape has, as the hook's first matching rule wins); stored, so a rerun
    with the same env and cases does not run them again. ``budget``: none starts that would end past it
    (priced at the recorded runs)."""
    import dataclasses

    from tuner.measure.gate import params_for_shapes
    from tuner.plan.fa_rules import rules_env
    from tuner.sweep import confirm, mmq
    from tuner.sweep.confirm_report import backend_ops_seconds
    from tuner.sweep.table import widened_layers

    layers = widened_layers(conf.kept_rules)
    choices = [dataclasses.replace(c, lo=0, hi=None) for c in conf.kept_mmq]
    mmq_env = {mmq.ENV: mmq.mmq_env(dict.fromkeys(choices))} if choices else {}
    fa_envs = [{"GGML_TUNER_FA_RULES": rules_env(dict.fromkeys(ly))} for ly in layers]
    # the cases of the kept entries' head sizes and K/V types (as `tuner validate --gpu`): elsewhere the hook
    # matches nothing and every case runs upstream's selection (on an H100 all 3982 took 129-141 s, the 540 of
    # head size 128 and f16 K/V 17-19 s)
    runs: list[tuple[str, str, dict[str, str], str | None, int | None]] = []
    for i, (env, ly) in enumerate(zip(fa_envs, layers)):
        name = f"FLASH_ATTN_EXT{f' ({i + 1} of {len(fa_envs)})' if len(fa_envs) > 1 else ''}"
        pairs = {(r.D, r.kv) for r in ly}
        p = params_for_shapes(pairs)
        runs.append((name, "FLASH_ATTN_EXT", env, p, len(pairs) if p else None))
    if fa_envs or mmq_env:  # every widened rule in, as before layers existed, so a stored record still matches
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
                budget.fits(secs, f"test-backend-ops {name} (about {secs:.0f} s)")
            log = log_dir / f"test-backend-ops-{name.replace(' ', '-').replace('(', '').replace(')', '')}.log"
            rec = confirm.backend_ops_check(bin_dir, op, env, log, backend=backend, params=p) | {"op": name}
            store.add_gate("test-backend-ops", name, rec)
        out.append(rec)
    return out


def _confirm_emit(
    table: Any, conf: Any, ops: Any, src: Any, *, out: Path, identity: dict[str, str], rounds: int
) -> None:
    """e2e.md, PR.md and upstream.patch (the kept entries only, on the pristine tree) in ``out``; the summary."""
    from tuner.sweep.confirm import kept_patch, unexplained_slower
    from tuner.sweep.confirm_report import e2e_text, pr_text

    patch = kept_patch(src.root, conf, table.arch)
    out.mkdir(parents=True, exist_ok=True)
    (out / "upstream.patch").unlink(missing_ok=True)
    if patch:
        (out / "upstream.patch").write_text(patch)
    (out / "e2e.md").write_text(e2e_text(conf, identity=identity, rounds=rounds))
    (out / "PR.md").write_text(pr_text(table, conf, backend_ops=ops, patch=bool(patch)))
    for f in conf.fates:
        click.echo(f"{'kept' if f.kept else 'reported'}: {f.text}: {f.why}")
    if not conf.fates:
        click.echo("the table has no entry to confirm")
    for where in unexplained_slower(conf.points):
        click.echo(f"slower beyond noise: {where}")
    click.echo(f"e2e: {out / 'e2e.md'}\nPR: {out / 'PR.md'}" + (f"\npatch: {out / 'upstream.patch'}" if patch else ""))


@click.command("export")
@click.argument("confirm_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--sweep",
    "sweep_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Output directory of `tuner sweep run` the confirmation was run on (default: CONFIRM_DIR's parent).",
)
@click.option(
    "--mmq",
    "mmq_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Output directory of `tuner sweep mmq`, where the confirmation was run with --mmq.",
)
@click.option(
    "--source", "spec", default=None, help="llama.cpp source SPEC the patch is rendered on (default: pinned)."
)
@click.option("--measured-on", default=None, help="The device the sweeps ran on, e.g. 'NVIDIA H100 80GB HBM3'.")
@output_option(
    "out_dir",
    type=click.Path(path_type=Path),
    required=True,
    help="Result folder, e.g. results/sm_90/fattn-mmq-table (new, empty or an earlier export; replaced whole).",
)
def export_cmd(
    confirm_dir: Path,
    sweep_dir: Path | None,
    mmq_dir: Path | None,
    spec: str | None,
    measured_on: str | None,
    out_dir: Path,
) -> None:
    """Export a confirmed sweep table as a result folder that `tuner validate` checks.

    Writes upstream.patch (the kept entries), PR.md, e2e.md, report.md, plots/, table.toml (the manifest)
    and evidence/ (the three stores, xz-compressed) to -o, and nothing outside it. See docs/sweep.md.

    Example: tuner sweep export sweep-sm90/confirm --mmq sweep-mmq-sm90 -o results/sm_90/fattn-mmq-table
    """
    from tuner.sweep.export import export_table

    m = export_table(confirm_dir, out_dir, sweep_dir=sweep_dir, mmq_dir=mmq_dir, spec=spec, measured_on=measured_on)
    t = m["table"]
    click.echo(
        f"{len(t['fa_rules'])} FlashAttention entr(ies) and {len(t['mmq_choices'])} MMQ choice(s) kept, "
        f"{len(t['reported'])} reported" + ("" if m["hashes"]["patch_sha256"] else "; no upstream.patch (nothing kept)")
    )
    click.echo(str(out_dir))


@click.command("merge")
@click.argument("tables", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--source", "spec", default=None, help="llama.cpp source SPEC the patch is rendered on (default: the tables')."
)
@output_option(
    "out_dir",
    type=click.Path(path_type=Path),
    required=True,
    help="Result folder, e.g. results/sm_90/hopper-table (new, empty or an earlier merge; replaced whole).",
)
def merge_cmd(tables: tuple[Path, ...], spec: str | None, out_dir: Path) -> None:
    """Merge exported sweep tables into one result folder with one upstream.patch.

    TABLES are folders written by `tuner sweep export`, measured on the same source, arch and device over
    disjoint cells (e.g. a decode sweep and a sweep of query batches 2-8). Writes parts/<name>/ (each table
    whole), upstream.patch (every table's kept entries together), PR.md and table.toml to -o. Each table's
    verdicts stand as its confirmation decided them. See docs/sweep.md.

    Example: tuner sweep merge results/sm_90/fattn-mmq-table results/sm_90/fattn-ne1-table -o results/sm_90/hopper-table
    """
    from tuner.sweep.merge import merge_tables

    m = merge_tables(tables, out_dir, spec=spec)
    t = m["table"]
    click.echo(
        f"{len(m['parts'])} tables merged: {len(t['fa_rules'])} FlashAttention entr(ies) and "
        f"{len(t['mmq_choices'])} MMQ choice(s) kept, {len(t['reported'])} reported"
        + ("" if m["hashes"]["patch_sha256"] else "; no upstream.patch (nothing kept)")
    )
    click.echo(str(out_dir))

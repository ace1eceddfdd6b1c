"""``tuner sweep confirm`` (tuner/sweep/confirm.py) on fake llama-bench timings of known truth: a rule faster
end to end is kept, one without a gain or with a slower point is reported, rounds resume from SQLite, and
PR.md has every model's rows."""

from __future__ import annotations

import dataclasses
import random
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tuner.cli.sweep_cmd import sweep
from tuner.errors import UsageError
from tuner.rounds.joint import Candidate
from tuner.rounds.store import Sample, SampleStore
from tuner.sweep import confirm, live
from tuner.sweep.confirm_report import e2e_text, plan_text, pr_text
from tuner.sweep.grid import AA, DEFAULT, FaShape, plan
from tuner.targets.archs import load_arch

SM90 = load_arch("sm_90")
SHAPE = FaShape(D=64, gqa=4, kv="f16", ne1=1)  # llama-3.2-1b's decode shape
N_KV = (4096, 8192, 16384, 32768)
DEPTHS = (0, 16384, 32768)


def _sweep_dir(
    tmp_path: Path, extra: Sequence[FaShape] = (), *, only: Sequence[FaShape] | None = None, name: str = "sweep"
) -> Path:
    """A sweep storage where MMA is 25% faster than upstream's VEC from n_kv 16384 on (the rule
    ``D64 gqa4 f16 ne1 1, n_kv in [16384, inf) -> MMA``), and slower below; TILE always slower.
    ``only``: these shapes instead of SHAPE and ``extra``; ``name``: the directory under ``tmp_path``."""
    out = tmp_path / name
    shapes = tuple(only) if only is not None else (SHAPE, *extra)
    ident = {"arch": "sm_90", "backend": "CUDA0", "build": "/b", "timer": "t"}
    store = SampleStore(live.TABLE, out / "sweep.sqlite3", ident)
    rng = random.Random(1)
    rows = []
    for c in plan(SM90, n_kv=N_KV):
        if c.shape not in shapes:
            continue
        for r in range(3):
            for cfg in c.configs:
                us = 100.0 * (1 + rng.uniform(-0.002, 0.002))
                if cfg == ("MMA" if c.upstream != "MMA" else "VEC"):  # the other kernel wins a shape at ne1 > 1
                    us *= 0.8 if c.n_kv >= 16384 else 1.3
                elif cfg not in (DEFAULT, AA):
                    us *= 1.5
                rows.append(Sample(key=(c.shape, c.n_kv), config=cfg, round=r, us=us))
    store.add(rows)
    store.close()
    return out


class FakeBench:
    """The live measure's ``joint``: t/s of 100 with 0.2% noise; the table's candidate runs MMA where its
    decode rules cover the depth's n_kv (per the FA rules env), at ``gain`` x the speed (``gain_at``: per
    depth instead). Counts its calls."""

    def __init__(
        self,
        gain: float = 1.0,
        gain_at: Mapping[int, float] | None = None,
        pp_gain: float = 1.0,
        noise: float = 0.002,
        batch_gain: float = 1.0,
    ) -> None:
        self.gain, self.gain_at, self.pp_gain = gain, dict(gain_at or {}), pp_gain  # pp_gain: with MMQ choices
        self.noise = noise
        self.batch, self.batch_gain = 0, batch_gain  # a small-batch pass's Q->ne[1] (set per plan) and its gain
        self.calls = 0
        self.args: list[tuple[str, ...]] = []
        self.rng = random.Random(7)

    def __call__(
        self, cand: Candidate, phases: Sequence[str], depths: Sequence[int], label: str
    ) -> dict[str, dict[int, dict[str, Any]]]:
        from tuner.plan.fa_rules import parse_fa_rules

        self.calls += 1
        self.args.append(tuple(cand.args))
        rules = parse_fa_rules(cand.env.get("GGML_TUNER_FA_RULES", ""))
        out: dict[str, dict[int, dict[str, Any]]] = {}
        for p in phases:
            out[p] = {}
            for d in depths:
                lo, _ = confirm.tg_window(d)
                forced = p == "tg" and any(r.covers(lo) for r in rules)
                g = self.gain_at.get(d, self.gain) if forced else 1.0
                if p == "pp" and "GGML_TUNER_MMQ_CHOICES" in cand.env:
                    g = self.pp_gain
                n_kv = -(-(d + self.batch) // 256) * 256  # a ppN test's n_kv: padded to 256
                nb = [r for r in rules if p == "pp" and r.nb == self.batch and r.covers(n_kv)]
                if nb:
                    forced, g = True, self.batch_gain
                ts = 100.0 * g * (1 + self.rng.uniform(-self.noise, self.noise))
                kernel = nb[0].kernel if nb else "MMA" if forced else ("VEC" if p == "tg" else "MMA")
                out[p][d] = {"ts": ts, "kernel": kernel, "why": "rule" if forced else "default", "error": ""}
        return out


def _run(
    tmp_path: Path,
    bench: FakeBench,
    *,
    likes: Sequence[str] = confirm.DEFAULT_LIKE,
    extra: Sequence[FaShape] = (),
    budget: Any = None,
    round_s: Any = None,
) -> confirm.Confirmed:
    table = confirm.load_table(_sweep_dir(tmp_path, extra))
    store = confirm.ConfirmStore(tmp_path / "out" / "confirm.sqlite3", {"build": "/b"})
    made: list[str] = []
    try:
        return confirm.confirm_models(
            table,
            likes,
            depths=DEPTHS,
            rounds=4,
            store=store,
            model_for=lambda like: made.append(like) or tmp_path / f"{like}.gguf",
            joint_for=lambda path, plan_: setattr(bench, "batch", plan_.batch) or bench,
            gate=lambda plan_, path: {"verdict": "pass", "checks": []},
            weight_types_of=lambda path: ["Q4_K", "Q6_K", "F32"],
            budget=budget,
            round_s=round_s,
        )
    finally:
        store.close()


def test_load_table_recomposes_the_sweeps_rule(tmp_path: Path) -> None:
    table = confirm.load_table(_sweep_dir(tmp_path))
    assert [r.text for r in table.rules] == ["D64 gqa4 f16 ne1 1, n_kv in [16384, inf) -> MMA"]
    assert table.rounds == 3 and len(table.cells) == len(N_KV) and table.with_verdict == len(N_KV)
    p = confirm.plan_model(table, "llama-3.2-1b")
    assert p.env == {"GGML_TUNER_FA_RULES": "decode/D64/gqa4/kvf16:16384-=MMA"}
    assert confirm.plan_model(table, "qwen2.5-7b").env == {}  # GQA 7: no entry of its shape


def test_a_rule_faster_end_to_end_is_kept_and_pr_md_has_every_model(tmp_path: Path) -> None:
    conf = _run(tmp_path, FakeBench(gain=1.10))
    assert [f.kept for f in conf.fates] == [True], conf.fates
    assert "faster end to end" in conf.fates[0].why and "llama-3.2-1b tg128@d16384" in conf.fates[0].why
    assert list(conf.points) == ["llama-3.2-1b"]  # the other three shapes have no entry: not measured
    table = confirm.load_table(tmp_path / "sweep")
    pr = pr_text(table, conf, backend_ops=[{"op": "FLASH_ATTN_EXT", "passed": True, "summary": "ok"}], patch=True)
    for like in confirm.DEFAULT_LIKE:
        assert like in pr
    assert "tg128@d16384" in pr and "pp512@d32768" in pr and "## Kept" in pr and "issues/18865" in pr
    assert pr.startswith("# CUDA: FlashAttention kernel selection for sm_90")  # no MMQ choice in this table
    e2e = e2e_text(conf, identity={"build": "/b"}, rounds=4)
    assert "| t/s upstream | t/s table |" in e2e and "the table does not change this model" in e2e.lower()


def test_no_gain_keeps_nothing_and_renders_no_patch(tmp_path: Path) -> None:
    from tuner.sweep.table import render_table_patch

    conf = _run(tmp_path, FakeBench(gain=1.0))
    assert not conf.kept_rules and "no end-to-end gain beyond noise" in conf.fates[0].why
    assert render_table_patch(tmp_path, conf.kept_rules, SM90) is None


def test_a_slower_point_drops_the_rule(tmp_path: Path) -> None:
    conf = _run(tmp_path, FakeBench(gain=1.10, gain_at={32768: 0.85}))
    assert not conf.kept_rules
    assert "slower end to end beyond noise at llama-3.2-1b tg128@d32768" in conf.fates[0].why
    assert confirm.unexplained_slower(conf.points) == ["llama-3.2-1b tg128@d32768"]


def test_a_second_call_resumes_without_measuring_again(tmp_path: Path) -> None:
    first = FakeBench(gain=1.10)
    _run(tmp_path, first, likes=["llama-3.2-1b"])
    assert first.calls == 3 * 4  # 3 candidates x 4 rounds, pp and tg sharing each call
    again = FakeBench(gain=1.10)
    conf = _run(tmp_path, again, likes=["llama-3.2-1b"])
    assert again.calls == 0 and conf.kept_rules


NE4 = FaShape(D=64, gqa=4, kv="f16", ne1=4)  # the sweep's fake: VEC 25% faster than upstream's MMA from 16384


def test_an_entry_at_a_small_batch_gets_a_pass_of_its_own_and_is_kept_when_faster(tmp_path: Path) -> None:
    bench = FakeBench(gain=1.10, batch_gain=1.10)
    conf = _run(tmp_path, bench, likes=["llama-3.2-1b"], extra=[NE4])
    by = {f.rule.ne1: f for f in conf.fates if f.rule}
    assert by[4].rule is not None and by[4].rule.text == "D64 gqa4 f16 ne1 4, n_kv in [16384, inf) -> VEC"
    one = next(p for p in conf.plans if p.batch)
    # its own env: the shape's batch-4 entry, keyed to that batch; the decode rule is not in it
    assert (one.like, one.base, one.pp, one.phases) == ("llama-3.2-1b-pp4", "llama-3.2-1b", 4, ("pp",))
    assert one.env == {"GGML_TUNER_FA_RULES": "prefill/D64/gqa4/kvf16/nb4:16384-=VEC"}
    assert one.bench_args == ()  # 4 tokens fit llama-bench's micro-batch; a -ub 4 would slow every fill
    assert conf.depths[one.like] == (16384, 32768)  # depth 0 attends at n_kv 256, outside the entry
    assert by[4].kept and "llama-3.2-1b-pp4 pp4@d16384" in by[4].why, by[4].why
    assert by[1].kept
    assert bench.calls == 2 * 3 * 4  # the model and its pass: 3 candidates x 4 rounds each
    assert {q["test"] for q in conf.points[one.like]} == {"pp4"}
    # the gate forces the kernel at its own micro-batch: the batch key dropped, the interval widened
    assert [r.text for r in one.gate_rules] == ["prefill/D64/gqa4/kvf16:0-=VEC"]
    # resumed: nothing measured again, the same decision; the storage records the pass as its own model row
    again = FakeBench(gain=1.10, batch_gain=1.10)
    conf2 = _run(tmp_path, again, likes=["llama-3.2-1b"], extra=[NE4])
    assert again.calls == 0 and [f.kept for f in conf2.fates] == [f.kept for f in conf.fates]
    store = confirm.ConfirmStore(tmp_path / "out" / "confirm.sqlite3", {"build": "/b"})
    try:
        rows = store.models()
    finally:
        store.close()
    assert [(r["like"], r.get("batch"), r["depths"]) for r in rows] == [
        ("llama-3.2-1b", None, [0, 16384, 32768]),
        ("llama-3.2-1b", 4, [16384, 32768]),
    ]


def test_a_small_batch_entry_without_an_end_to_end_gain_is_reported(tmp_path: Path) -> None:
    conf = _run(tmp_path, FakeBench(gain=1.10, batch_gain=1.0), likes=["llama-3.2-1b"], extra=[NE4])
    by = {f.rule.ne1: f for f in conf.fates if f.rule}
    assert not by[4].kept and "no end-to-end gain beyond noise at llama-3.2-1b-pp4 pp4@d16384" in by[4].why
    assert by[1].kept  # the decode rule is judged on its own points


def test_a_small_batch_entry_no_model_reaches_is_reported_with_why(tmp_path: Path) -> None:
    from tuner.sweep.confirm import batch_passes, batch_touches

    table = confirm.load_table(_sweep_dir(tmp_path, extra=[NE4]))
    plans = [confirm.plan_model(table, "llama-3.2-1b")]
    assert batch_passes(plans, (0, 4096)) == []  # pp4 at 0 and 4096 attends at 256 and 4352: below 16384
    fates = {f.rule.ne1: f for f in confirm.decide_rules(table, plans, {}, {}) if f.rule}
    assert not fates[4].kept and "no measured pp4 depth of llama-3.2-1b reaches its n_kv range" in fates[4].why
    other = confirm.decide_rules(table, [confirm.plan_model(table, "qwen2.5-7b")], {}, {})
    assert all("no confirmed model has this shape" in f.why for f in other)
    r = fates[4].rule
    assert r is not None and not batch_touches(r, 16124, 4) and batch_touches(r, 16125, 4)  # n_kv 16128, 16384


def test_dry_run_prints_the_plan_and_its_time(tmp_path: Path) -> None:
    res = CliRunner().invoke(sweep, ["confirm", str(_sweep_dir(tmp_path)), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "1 FlashAttention rule(s)" in res.output and "estimated GPU time" in res.output
    assert "llama-3.2-1b (D64/gqa4/kvf16): 1 decode rule(s); 9 llama-bench calls" in res.output
    assert "qwen2.5-7b (D128/gqa7/kvf16): the table does not change this model" in res.output


def test_a_directory_without_a_sweep_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="holds no sweep.sqlite3"):
        CliRunner().invoke(sweep, ["confirm", str(tmp_path)], standalone_mode=False, catch_exceptions=False)


def test_an_mmq_choice_is_judged_on_the_models_with_its_weight_type(tmp_path: Path) -> None:

    from tuner.sweep.mmq import MmqChoice

    choice = MmqChoice(type="q4_K", lo=256, hi=None, backend="BLAS")
    table = dataclasses.replace(confirm.load_table(_sweep_dir(tmp_path)), rules=(), mmq=(choice,))
    plans = [confirm.plan_model(table, like, weight_types=["Q4_K"]) for like in ("llama-3.2-1b", "llama-3.1-8b")]
    assert plans[0].env == {"GGML_TUNER_MMQ_CHOICES": "q4_K:256..=BLAS"}
    pts = {
        "llama-3.2-1b": [{"model": "llama-3.2-1b", "phase": "pp", "test": "pp512", "depth": 0, "verdict": "faster"}],
        "llama-3.1-8b": [{"model": "llama-3.1-8b", "phase": "tg", "test": "tg128", "depth": 0, "verdict": "slower"}],
    }
    types = {"llama-3.2-1b": ["Q4_K"], "llama-3.1-8b": ["Q4_K"]}
    (fate,) = confirm.decide_rules(table, plans, pts, {}, weight_types=types)
    assert fate.kept and "llama-3.2-1b pp512@d0" in fate.why  # tg multiplies at batch 1: outside the choice
    failed = {"llama-3.2-1b": {"verdict": "fail"}}
    (fate,) = confirm.decide_rules(table, plans, pts, failed, weight_types=types)
    assert not fate.kept and "gate failed on llama-3.2-1b" in fate.why
    conf = confirm.Confirmed(plans=tuple(plans), depths={}, points={}, gates={}, weight_types=types, fates=(fate,))
    assert "FlashAttention kernel and MMQ-vs-cuBLAS selection" in pr_text(table, conf, backend_ops=[], patch=False)


def test_the_plan_prices_a_model_by_its_size_not_only_its_width(tmp_path: Path) -> None:
    """gemma-3-12b-shape is nearest the recorded 8B by width (3840 vs 4096) but has half again its
    parameters: its estimate is the 8B's scaled up, not the 8B's."""
    import re

    extra = (FaShape(D=128, gqa=4, kv="f16", ne1=1), FaShape(D=256, gqa=2, kv="f16", ne1=1))
    likes = ["--like", "llama-3.2-1b", "--like", "llama-3.1-8b", "--like", "gemma-3-12b-shape"]
    res = CliRunner().invoke(sweep, ["confirm", str(_sweep_dir(tmp_path, extra)), "--dry-run", *likes])
    assert res.exit_code == 0, res.output
    mins = dict(re.findall(r"  (\S+) \(D\d+/.*about (\d+) min with the output gate", res.output))
    assert int(mins["gemma-3-12b-shape"]) > int(mins["llama-3.1-8b"]) > int(mins["llama-3.2-1b"]), mins


def test_the_default_head_256_shape_is_priced_below_the_12b(tmp_path: Path) -> None:
    """The default confirms head size 256 on Gemma 3 4B's shape: the same FlashAttention shape as the 12B's
    for well under half its rounds' time."""
    import re

    extra = (FaShape(D=256, gqa=2, kv="f16", ne1=1),)
    res = CliRunner().invoke(sweep, ["confirm", str(_sweep_dir(tmp_path, extra)), "--dry-run"])
    assert res.exit_code == 0, res.output
    mins = dict(re.findall(r"  (\S+) \(D\d+/.*about (\d+) min with the output gate", res.output))
    assert "gemma-3-12b-shape" not in mins, mins
    res = CliRunner().invoke(
        sweep, ["confirm", str(_sweep_dir(tmp_path, extra)), "--dry-run", "--like", "gemma-3-12b-shape"]
    )
    big = dict(re.findall(r"  (\S+) \(D\d+/.*about (\d+) min with the output gate", res.output))
    assert 0 < 2 * int(mins["gemma-3-4b-shape"]) < int(big["gemma-3-12b-shape"]), (mins, big)


def test_a_faster_point_counts_for_a_rule_only_where_its_kernel_ran(tmp_path: Path) -> None:
    """On a backend without the FA log (the CPU build), or where the table's candidate fell back, the
    table ran no rule: a 'faster' there is noise or another cause, and keeps nothing."""
    table = confirm.load_table(_sweep_dir(tmp_path))
    plans = [confirm.plan_model(table, "llama-3.2-1b", weight_types=["Q4_K"])]

    def pts(kernel: str | None) -> dict[str, list[dict[str, Any]]]:
        point = {"model": "llama-3.2-1b", "phase": "tg", "test": "tg128", "depth": 32768, "verdict": "faster"}
        return {"llama-3.2-1b": [{**point, "kernel": kernel}]}

    (ran,) = confirm.decide_rules(table, plans, pts("MMA"), {})
    assert ran.kept and "faster end to end" in ran.why
    for kernel in (None, "VEC"):
        (fate,) = confirm.decide_rules(table, plans, pts(kernel), {})
        assert not fate.kept and "a kernel-level gain only" in fate.why, kernel


def _kld(c: Any, mean: float) -> dict[str, Any]:
    """A gate run's record with the given mean KLD (99% KLD 3x it, a top token flipped at 40x it, in percent)."""
    stats = {"mean_kld": mean, "p99_kld": 3 * mean, "max_kld": 4 * mean, "same_top_pct": 100.0 - 40 * 100 * mean}
    stats |= dict.fromkeys(("mean_kld_unc", "median_kld", "same_top_unc", "ppl_q", "ppl_base"), 0.0)
    return {
        "mode": c.mode,
        "strict": c.strict,
        "deterministic": True,
        "identical_to_upstream": mean == 0,
        "stats": stats,
    }


@pytest.mark.parametrize(("choice_kld", "passes"), [(0.004, True), (0.2, False)])
def test_mmq_choices_are_judged_against_upstreams_cublas_band(tmp_path: Path, choice_kld: float, passes: bool) -> None:
    """A model with MMQ choices gets a prefill band (its choices' types on cuBLAS at every batch size vs upstream's
    MMQ), measured before the checks; the prefill check then passes within twice the band, not by the CPU
    thresholds (1e-5) that cuBLAS's f16 rounding never meets, and fails an order of magnitude beyond it."""
    from tuner.measure.equivalence import DEFAULT_THRESHOLDS

    plan_ = confirm.ModelPlan(
        like="llama-3.2-1b", D=64, gqa=4, kv="f16", context=131072, fa_rules=(), unexercised=(),
        mmq=(confirm.mmq.MmqChoice(type="q4_K", lo=1024, hi=None, backend="BLAS"),),
    )  # fmt: skip
    runs: list[Any] = []

    def run_one(c: Any) -> dict[str, Any]:
        runs.append(c)
        return _kld(c, 0.004 if c.name.startswith("band") else choice_kld)

    store = confirm.ConfirmStore(tmp_path / "confirm.sqlite3", {"build": "/b"})
    try:
        gate = confirm.gate_model(
            plan_, tmp_path / "m.gguf", tmp_path, arch=SM90, era="mma", store=store, work_dir=tmp_path, run_one=run_one
        )
    finally:
        store.close()
    assert [c.name for c in runs] == ["band prefill cuBLAS", "prefill process"]
    band = runs[0]
    assert band.env[confirm.mmq.ENV] == "q4_K:0..=BLAS" and band.mode == "prefill" and not band.strict
    assert runs[1].env[confirm.mmq.ENV] == "q4_K:0..=BLAS"  # the choice widened to every batch: it fires at the gate's
    (check,) = gate["checks"]
    assert check["thresholds"]["mean_kld"] == 0.008 > DEFAULT_THRESHOLDS.mean_kld
    assert gate["verdict"] == ("pass" if passes else "fail") and check["passed"] is passes
    assert [b["name"] for b in gate["band"]] == ["band prefill cuBLAS"]


def test_a_models_small_batch_passes_share_one_prefill_band(tmp_path: Path) -> None:
    """Each pass's gate forces its entries' kernels in prefill with the batch key dropped, judged within the prefill
    kernel band; the band (upstream's own kernels forced on the same model) runs once for all of a model's passes."""
    from tuner.sweep.confirm import batch_plan
    from tuner.sweep.table import TableRule

    entries = tuple(TableRule(D=64, gqa=4, kv="f16", ne1=n, lo=0, hi=4096, kernel="TILE") for n in (2, 4))
    model = confirm.ModelPlan(
        like="llama-3.2-1b", D=64, gqa=4, kv="f16", context=131072, fa_rules=(), unexercised=entries
    )
    runs: list[Any] = []

    def run_one(c: Any) -> dict[str, Any]:
        runs.append(c.name)
        return _kld(c, 0.004)

    def nothing(c: Any) -> dict[str, Any]:
        raise AssertionError(f"{c.name} was stored and must not run again")

    store = confirm.ConfirmStore(tmp_path / "confirm.sqlite3", {"build": "/b"})

    def gate(n: int, run: Any) -> dict[str, Any]:
        plan_ = batch_plan(model, n)
        m = tmp_path / "m.gguf"
        return confirm.gate_model(plan_, m, tmp_path, arch=SM90, era="mma", store=store, work_dir=tmp_path, run_one=run)

    try:
        gates = [gate(2, run_one), gate(4, run_one)]
        again = gate(4, nothing)
    finally:
        store.close()
    bands = ["band prefill VEC", "band prefill TILE", "band prefill MMA"]
    assert runs == [*bands, "prefill prefill/D64/gqa4/kvf16:0-=TILE", "prefill prefill/D64/gqa4/kvf16:0-=TILE"]
    assert all(g["verdict"] == "pass" for g in gates) and again["verdict"] == "pass"  # judged from the store


def test_no_cublas_band_without_choices_or_prefill_check() -> None:
    from tuner.rounds import output_gate as og

    decode = og.GateCheck(
        name="decode x", mode="decode", strict=False, env={}, args=(), upstream_env={}, upstream_args=(), why=""
    )
    choice = confirm.mmq.MmqChoice(type="q8_0", lo=512, hi=None, backend="BLAS")
    assert confirm.cublas_band([decode], (choice,)) == [] and confirm.cublas_band([decode], ()) == []


def test_coverage_says_the_fewest_and_the_most_rounds_a_cell_got(tmp_path: Path) -> None:
    """Rounds past the minimum go only to open cells: PR.md says 3 each, up to 4, not "4 each"."""
    from tuner.sweep.confirm_report import coverage_lines

    out = _sweep_dir(tmp_path)
    store = SampleStore(live.TABLE, out / "sweep.sqlite3", {})
    extra = [s for s in store.samples() if s.round == 2 and s.key[1] == N_KV[0]]
    store.add([dataclasses.replace(s, round=3) for s in extra])  # one cell gets a fourth round
    store.close()
    table = confirm.load_table(out)
    assert (table.min_rounds, table.rounds) == (3, 4)
    assert "3 paired rounds each, up to 4 where a cell's verdict was still open" in coverage_lines(table)[0]
    even = dataclasses.replace(table, min_rounds=4)
    assert "4 paired rounds each;" in coverage_lines(even)[0]


def test_pr_md_lists_the_entries_no_model_exercised_apart(tmp_path: Path) -> None:
    """A rule measured on a model and not kept keeps its why; rules of shapes no confirmed model has go
    into one list after it, each once."""
    other = FaShape(D=128, gqa=2, kv="f16", ne1=1)  # no default model has this shape
    conf = _run(tmp_path, FakeBench(gain=1.0), extra=[other])
    table = confirm.load_table(tmp_path / "sweep")
    pr = pr_text(table, conf, backend_ops=[], patch=False)
    section = pr.split("## Reported, not patched")[1].split("## Patch")[0]
    measured, _, unexercised = section.partition("Not exercised by any confirmed model")
    assert "D64 gqa4 f16" in measured and "no end-to-end gain beyond noise" in measured
    assert "D128 gqa2 f16" in unexercised and "D128 gqa2 f16" not in measured
    assert "no confirmed model" not in section  # said once, in the list's heading


def test_the_plan_uses_the_confirms_own_recording_where_there_is_one(tmp_path: Path) -> None:
    """gemma-3-12b-shape's confirm was recorded (step_costs.toml [confirm]): its calls are priced at that
    figure, with -r 3 counted as the -r 4 llama-bench runs (the warm-up run included)."""
    import re

    from tuner.rounds.budget import load_step_costs

    extra = (FaShape(D=256, gqa=2, kv="f16", ne1=1),)
    res = CliRunner().invoke(
        sweep,
        ["confirm", str(_sweep_dir(tmp_path, extra)), "--dry-run", "--rounds", "3", "--like", "gemma-3-12b-shape"],
    )
    assert res.exit_code == 0, res.output
    own = {r["like"]: r["call_depth_s"] for r in load_step_costs()["confirm"].values()}
    calls_s = 3 * 3 * 5 * own["gemma-3-12b-shape"]  # 3 rounds x 3 calls x 5 depths, at -r 3 + 1 = 4
    mins = dict(re.findall(r"  (\S+) \(D\d+/.*about (\d+) min with the output gate", res.output))
    assert round(calls_s / 60) <= int(mins["gemma-3-12b-shape"]) <= round(calls_s / 60) + 2, (mins, calls_s)
    assert "scaled by -r 4 / 4" in res.output


def test_the_plan_prices_small_batch_passes_from_their_recording(tmp_path: Path) -> None:
    """A small-batch pass is priced at its model's recorded per-call cost ([confirm_batch]) plus its gate: one
    check and, on a model's first pass, its prefill band of three kernels."""
    from tuner.rounds.budget import load_step_costs
    from tuner.sweep.confirm_report import _batch_pass_s

    res = CliRunner().invoke(sweep, ["confirm", str(_sweep_dir(tmp_path, [NE4])), "--dry-run", "--rounds", "3"])
    assert res.exit_code == 0, res.output
    costs = load_step_costs()
    call_s = next(r["call_s"] for r in costs["confirm_batch"].values() if r["like"] == "llama-3.2-1b")
    check_s = next(r["equivalence_check_s"] for r in costs["models"].values() if r["like"] == "llama-3.2-1b")
    want = 9 * call_s * 4 / 4 + 4 * check_s  # 3 rounds x 3 calls at -r 3 + 1; one check and three band runs
    assert _batch_pass_s(costs, "llama-3.2-1b", calls=9, reps=3, band=True) == pytest.approx(want)
    assert _batch_pass_s(costs, "llama-3.2-1b", calls=9, reps=3, band=False) == pytest.approx(want - 3 * check_s)
    line = next(ln for ln in res.output.splitlines() if "small-batch pass llama-3.2-1b-pp4" in ln)
    assert f"about {max(1, round(want / 60))} min with its gate" in line, line
    # a model with no recording of its own: the nearest recorded one's per-call cost, scaled by parameter count
    assert _batch_pass_s(costs, "gemma-3-12b-shape", calls=9, reps=3, band=False) > 9 * max(
        r["call_s"] for r in costs["confirm_batch"].values()
    )


def test_e2e_md_says_how_many_runs_llama_bench_made(tmp_path: Path) -> None:
    """The storage's ``reps`` is the timed repetitions; llama-bench ran one more (the warm-up, discarded)."""
    conf = _run(tmp_path, FakeBench(gain=1.10))
    ident = {"arch": "sm_90", "build": "bin", "quant": "Q4_K_M", "models": "direct", "reps": "3", "table": "ab"}
    text = e2e_text(conf, identity=ident | {"tests": "pp512,tg128"}, rounds=4)
    assert "-r 4 a call: 3 timed repetitions after one discarded as warm-up" in text
    assert "Q4_K_M (blocks written directly)" in text and "- reps:" not in text
    assert "pp512 and tg128 share each depth's fill" in text
    # a table of small-batch entries only: no model's pp512/tg128 rounds ran, and the header does not say they did
    passes_only = e2e_text(dataclasses.replace(conf, points={}), identity=ident | {"tests": "pp512,tg128"}, rounds=4)
    assert "llama-bench pp512 and tg128" not in passes_only and "share each depth's fill" not in passes_only
    assert "(each pass names its test), -r 4 a call" in passes_only
    assert "no model's pp512 and tg128 rounds ran" in passes_only and "rounds per small-batch pass" in passes_only


def test_the_plan_says_which_mmq_choices_no_planned_test_exercises(tmp_path: Path) -> None:
    """At Q4_K_M (written directly) the weight types are known before a model exists: a q5_K choice acts
    on no model, and one from batch 2048 on no pp512; the plan says so, and a model the table then leaves
    alone is not priced."""
    from tuner.sweep.mmq import MmqChoice

    assert {"Q4_K", "Q6_K"} <= set(confirm.planned_weight_types("llama-3.1-8b", "Q4_K_M") or ())
    # Q5_K_M and IQ4_XS (the passes' types) are written directly too; Q4_0 is left to llama-quantize
    assert confirm.planned_weight_types("llama-3.1-8b", "IQ4_XS") == ["F32", "IQ4_XS", "Q5_K", "Q6_K"]
    assert confirm.planned_weight_types("llama-3.1-8b", "Q4_0") is None
    choices = (
        MmqChoice(type="q5_K", lo=2048, hi=None, backend="BLAS"),
        MmqChoice(type="q4_K", lo=256, hi=None, backend="BLAS"),
    )
    table = dataclasses.replace(confirm.load_table(_sweep_dir(tmp_path)), mmq=choices, mmq_identity={"arch": "sm_90"})
    likes = ("llama-3.2-1b", "qwen2.5-7b")
    plans = [
        confirm.plan_model(table, like, weight_types=confirm.planned_weight_types(like, "Q4_K_M")) for like in likes
    ]
    text = plan_text(table, plans, DEPTHS, rounds=3, reps=3, quant="Q4_K_M")
    assert "MMQ q5_K:2048..=BLAS will be reported, not confirmed: no planned model's weights have q5_K" in text
    assert "pp512 multiplies at ne11 = 512, outside its batch range" in text
    assert "MMQ q4_K:256..=BLAS will be reported" not in text  # q4_K weights, and 512 is in its range
    assert "qwen2.5-7b (D128/gqa7/kvf16): 0 decode rule(s), 1 MMQ choice(s)" in text  # q4_K acts on it
    (one,) = confirm.mmq_passes(table, plans, "llama-3.1-8b")  # the q5_K choice: a pass of its own
    assert (one.like, one.quant, one.pp, one.bench_args) == (
        "llama-3.1-8b@q5_k_m-pp2048",
        "Q5_K_M",
        2048,
        ("-ub", "2048", "-b", "2048"),
    )
    text = plan_text(table, plans, DEPTHS, rounds=3, reps=3, quant="Q4_K_M", passes=[one])
    assert "MMQ pass llama-3.1-8b@q5_k_m-pp2048: q5_K:2048..=BLAS on llama-3.1-8b at Q5_K_M" in text
    assert "MMQ q5_K:2048..=BLAS will be reported" not in text


def passing_check(c: Any) -> dict[str, Any]:
    """An equivalence check that passed (run_equivalence's as_dict), for gate records on fake timings."""
    return {
        "verdict": "pass",
        "passed": True,
        "mode": c.mode,
        "strict": c.strict,
        "reasons": [],
        "deterministic": True,
        "stats": {
            "mean_kld": 0.0,
            "p99_kld": 1e-6,
            "max_kld": 1e-6,
            "same_top_pct": 100.0,
            **dict.fromkeys(("mean_kld_unc", "median_kld", "same_top_unc", "ppl_q", "ppl_base"), 0.0),
        },
        "thresholds": {"mean_kld": 1e-5, "p99_kld": 1e-4, "same_top_pct": 98.0},
    }


def test_an_mmq_choice_no_model_exercises_gets_a_pass_of_its_own(tmp_path: Path) -> None:
    """q5_K from batch 2048: the Q4_K_M models have no q5_K weights and pp512 is below 2048, so the confirm
    quantizes --mmq-like to Q5_K_M and runs pp2048 as one micro-batch at depth 0; the choice is kept on
    that pass alone, and recompose decides the same from the storage."""
    from tuner.sweep.mmq import MmqChoice

    choice = MmqChoice(type="q5_K", lo=2048, hi=None, backend="BLAS")
    table = dataclasses.replace(confirm.load_table(_sweep_dir(tmp_path)), mmq=(choice,), mmq_identity={"a": "b"})
    store = confirm.ConfirmStore(tmp_path / "out" / "confirm.sqlite3", {"build": "/b"})
    bench, made = FakeBench(gain=1.10, pp_gain=1.3), []
    try:
        conf = confirm.confirm_models(
            table, ["llama-3.2-1b"], depths=DEPTHS, rounds=3, store=store,
            model_for=lambda like: tmp_path / f"{like}.gguf",
            joint_for=lambda path, plan_: bench,
            gate=lambda p, path: confirm.gate_model(
                p, path, path, arch=SM90, era="mma", store=store, work_dir=tmp_path, run_one=passing_check
            ),
            weight_types_of=lambda path: ["Q5_K", "Q6_K", "F32"] if "q5_k_m" in path.name else ["Q4_K", "Q6_K", "F32"],
            mmq_like="llama-3.1-8b",
            quantized_for=lambda like, q: made.append((like, q)) or tmp_path / f"{like}-{q.lower()}.gguf",
        )  # fmt: skip
        assert made == [("llama-3.1-8b", "Q5_K_M")]
        assert ("-ub", "2048", "-b", "2048") in bench.args and () in bench.args  # the pass, and the 1B's calls
        key = "llama-3.1-8b@q5_k_m-pp2048"
        assert [(p["test"], p["depth"], p["ne11"]) for p in conf.points[key]] == [("pp2048", 0, 2048)]
        fates = {f.text: f for f in conf.fates}
        assert fates["MMQ q5_K:2048..=BLAS"].kept and f"{key} pp2048@d0" in fates["MMQ q5_K:2048..=BLAS"].why
        again = confirm.recompose(table, store)
        assert [(f.text, f.kept, f.why) for f in again.fates] == [(f.text, f.kept, f.why) for f in conf.fates]
        # a rerun on a fresh machine (no models there) makes none: every round and check is stored
        calls, rows = bench.calls, store.models()
        rerun = confirm.confirm_models(
            table, ["llama-3.2-1b"], depths=DEPTHS, rounds=3, store=store,
            model_for=_no_model, joint_for=lambda path, plan_: bench, gate=_no_model, weight_types_of=_no_model,
            mmq_like="llama-3.1-8b", quantized_for=_no_model,
        )  # fmt: skip
        assert bench.calls == calls
        assert [(f.text, f.kept, f.why) for f in rerun.fates] == [(f.text, f.kept, f.why) for f in conf.fates]
        assert store.models() == rows and len(rows) == 2  # the 1B and the pass, recorded as before
    finally:
        store.close()
    pr = pr_text(table, conf, backend_ops=[], patch=True)
    assert "pp2048" in pr and "MMQ q5_K:2048..=BLAS: faster end to end beyond noise" in pr


def _no_model(*args: Any) -> Any:
    raise AssertionError(f"a stored model was made or run again: {args}")


def test_max_rounds_go_only_to_the_open_depths_where_a_rule_acts(tmp_path: Path) -> None:
    """With --max-rounds above --rounds, a depth no rule acts on (d0: upstream's VEC on both sides) keeps the
    minimum, and a rule's depths whose verdict is still open (a 3% gain in 5% noise) take rounds up to the
    maximum; recompose reads the same rounds back, measuring nothing."""
    table = confirm.load_table(_sweep_dir(tmp_path))
    store = confirm.ConfirmStore(tmp_path / "out" / "confirm.sqlite3", {"build": "/b"})
    try:
        conf = confirm.confirm_models(
            table, ["llama-3.2-1b"], depths=DEPTHS, rounds=3, store=store,
            model_for=lambda like: tmp_path / f"{like}.gguf",
            joint_for=lambda path, plan_: FakeBench(gain=1.03, noise=0.05),
            gate=lambda p, path: confirm.gate_model(
                p, path, path, arch=SM90, era="mma", store=store, work_dir=tmp_path, run_one=passing_check
            ),
            weight_types_of=lambda path: ["Q4_K", "Q6_K", "F32"],
            max_rounds=6,
        )  # fmt: skip
        tg = [r for r in store.records("llama-3.2-1b") if r["phase"] == "tg"]
        n = {d: sum(1 for r in tg if str(d) in r["values"].get("upstream", {})) for d in DEPTHS}
        assert n[0] == 3 and n[16384] > 3 and max(n.values()) <= 6, n
        again = confirm.recompose(table, store)
        assert [(f.text, f.kept, f.why) for f in again.fates] == [(f.text, f.kept, f.why) for f in conf.fates]
    finally:
        store.close()


def test_every_mmq_pass_quantization_is_a_type_synth_accepts() -> None:
    """An MMQ pass quantizes with synth_cached(quant=MMQ_QUANT[type]); a name it refuses stops the confirm
    (on the H100, IQ4_XS did, after the f16 synthesis)."""
    from tuner.targets.quant_types import QUANT_TYPES

    assert set(confirm.MMQ_QUANT.values()) <= set(QUANT_TYPES)


def test_backend_ops_runs_each_kept_kernel_of_a_shape() -> None:
    """The H100's kept entries: D256 GQA 2 has TILE in [16384, 65536) and MMA from 65536. Widened in one env the
    hook's first match (TILE) would shadow MMA, so FLASH_ATTN_EXT runs twice; a kernel kept for two ranges of
    one shape is one widened rule."""
    from tuner.plan.fa_rules import rules_env
    from tuner.sweep.table import TableRule, widened_layers

    def e(D: int, gqa: int, lo: int, hi: int | None, kernel: str) -> TableRule:
        return TableRule(D=D, gqa=gqa, kv="f16", ne1=1, lo=lo, hi=hi, kernel=kernel)

    kept = [e(128, 4, 8192, None, "MMA"), e(256, 2, 16384, 65536, "TILE"), e(256, 2, 65536, None, "MMA")]
    assert [rules_env(ly) for ly in widened_layers(kept)] == [
        "decode/D128/gqa4/kvf16:0-=MMA,decode/D256/gqa2/kvf16:0-=TILE",
        "decode/D256/gqa2/kvf16:0-=MMA",
    ]
    twice = [e(64, 4, 1024, 2048, "TILE"), e(64, 4, 65536, 131072, "TILE")]
    assert [rules_env(ly) for ly in widened_layers(twice)] == ["decode/D64/gqa4/kvf16:0-=TILE"]


def test_a_table_swept_on_one_gpu_model_is_confirmed_on_another_of_its_arch_apart(tmp_path: Path, monkeypatch) -> None:
    from tuner.measure import exe
    from tuner.sweep import confirm_stage

    sweep_dir = _sweep_dir(tmp_path)
    with sqlite3.connect(sweep_dir / "sweep.sqlite3") as c:
        c.execute("INSERT INTO meta VALUES ('device', 'NVIDIA H100 80GB HBM3')")
    table = confirm.load_table(sweep_dir, None)
    # another model of the arch: measured, into a store whose identity names it (so never paired with the H100's)
    monkeypatch.setattr(exe, "backend_device", lambda bin_dir, backend: "NVIDIA H200")
    monkeypatch.setattr(confirm_stage, "detect_local_archs", lambda: ["sm_90"])
    assert confirm_stage._same_device(table, tmp_path, "CUDA0") == {"device": "NVIDIA H200"}
    # and its default output goes beside the first model's confirmation, not over it
    monkeypatch.setattr(confirm_stage, "local_gpu_names", lambda: ["NVIDIA H200"])
    plan = confirm_stage.plan_confirm(confirm_stage.ConfirmRequest(sweep_dir=sweep_dir, likes=("llama-3.2-1b",)))
    assert plan.request.out == sweep_dir / "confirm-nvidia-h200" and "is another model than the table" in plan.text
    assert plan.request.storage_path == sweep_dir / "confirm-nvidia-h200" / "confirm.sqlite3"
    monkeypatch.setattr(confirm_stage, "local_gpu_names", lambda: ["NVIDIA H100 80GB HBM3"])
    plan = confirm_stage.plan_confirm(confirm_stage.ConfirmRequest(sweep_dir=sweep_dir, likes=("llama-3.2-1b",)))
    assert plan.request.out == sweep_dir / "confirm" and "another model" not in plan.text
    # a GPU of another arch: the table's patch would not act there
    monkeypatch.setattr(exe, "backend_device", lambda bin_dir, backend: "NVIDIA GeForce RTX 4060 Ti")
    monkeypatch.setattr(confirm_stage, "detect_local_archs", lambda: ["sm_89"])
    with pytest.raises(UsageError, match=r"measured on NVIDIA H100 80GB HBM3 \(sm_90\), but this machine measures"):
        confirm_stage._same_device(table, tmp_path, "CUDA0")


def test_a_time_budget_stops_between_rounds_and_the_rerun_adds_only_the_rest(tmp_path: Path, clock: Any) -> None:
    from tuner.rounds.budget import Budget, BudgetReached

    class Timed(FakeBench):
        def __call__(self, *args: Any, **kw: Any) -> Any:
            clock.now += 10.0
            return super().__call__(*args, **kw)

    first = Timed(gain=1.10)
    # rounds of 3 calls (30 s): two fit in 75 s; a third would end at 90 s, so it does not start
    with pytest.raises(BudgetReached, match="confirm-llama-3.2-1b"):
        _run(tmp_path, first, likes=["llama-3.2-1b"], budget=Budget.counted_from(None, 75), round_s=lambda p, ds: 30.0)
    assert first.calls == 6
    rest = Timed(gain=1.10)
    conf = _run(tmp_path, rest, likes=["llama-3.2-1b"])
    assert rest.calls == 3 * 4 - 6 and conf.kept_rules  # the rounds stored are not measured again


def test_a_budget_shorter_than_the_first_round_measures_nothing(tmp_path: Path, clock: Any) -> None:
    from tuner.rounds.budget import Budget, BudgetReached

    bench = FakeBench(gain=1.10)
    with pytest.raises(BudgetReached):  # the estimate (200 s) does not fit the 100 s left
        _run(
            tmp_path, bench, likes=["llama-3.2-1b"], budget=Budget.counted_from(None, 100), round_s=lambda p, ds: 200.0
        )
    assert bench.calls == 0
    spent = Budget(deadline=999.0)
    with pytest.raises(BudgetReached, match="making the llama-3.2-1b model"):
        spent.check("making the llama-3.2-1b model")


def test_the_round_estimate_is_the_dry_runs_price(tmp_path: Path) -> None:
    from tuner.sweep.confirm_report import round_seconds

    table = confirm.load_table(_sweep_dir(tmp_path))
    p = confirm.plan_model(table, "llama-3.2-1b")
    one = round_seconds(p, DEPTHS, reps=3)
    assert one > 0 and round_seconds(p, DEPTHS[:1], reps=3) == pytest.approx(one / len(DEPTHS))

    def minutes(rounds: int) -> int:
        text = plan_text(table, [p], DEPTHS, rounds=rounds, reps=3, quant="Q4_K_M")
        return int(text.split("estimated GPU time: about ")[1].split(" min")[0])

    # the dry run prices a model as rounds x this, plus its gate: 96 more rounds cost 96 estimates
    assert abs((minutes(100) - minutes(4)) * 60 - 96 * one) <= 60, (minutes(100), minutes(4), one)


def test_the_cli_exits_3_where_the_budget_stopped_it_and_says_how_to_go_on(tmp_path: Path, monkeypatch) -> None:
    import types

    from tuner import source
    from tuner.rounds.budget import BudgetReached
    from tuner.sweep import confirm_stage

    bins = tmp_path / "bin"
    bins.mkdir()
    for exe in ("llama-bench", "llama-perplexity", "llama-quantize"):
        (bins / exe).write_text("")
    seen = {}

    def stopped(*args: Any, budget: Any = None, round_s: Any = None, **kw: Any) -> Any:
        seen["budget"], seen["round_s"] = budget, round_s
        raise BudgetReached("confirm-llama-3.2-1b tg+pp")

    monkeypatch.setattr(source, "fetch_source", lambda *a: types.SimpleNamespace(era="mma", root=tmp_path))
    monkeypatch.setattr(confirm_stage, "_same_device", lambda *a: {})
    monkeypatch.setattr(confirm, "confirm_models", stopped)
    out = tmp_path / "confirm"
    args = ["confirm", str(_sweep_dir(tmp_path)), "--build", str(bins), "--time-budget", "600", "-o", str(out)]
    res = CliRunner().invoke(sweep, args)
    assert res.exit_code == 3, res.output
    assert seen["budget"] is not None and seen["round_s"] is not None
    assert (
        "time budget reached before confirm-llama-3.2-1b" in res.output and "Run the same command again" in res.output
    )
    assert not (out / "PR.md").exists()


def test_no_gate_check_starts_that_would_end_past_the_budget(tmp_path: Path, clock: Any) -> None:
    """On the H100 the budget priced rounds only: a model's gate checks and test-backend-ops ran past it and the
    call's limit cut them. Each check is now priced as the dry run prices it; a stop keeps the checks that ran."""
    from tuner.rounds.budget import Budget, BudgetReached
    from tuner.sweep.confirm_report import check_seconds
    from tuner.sweep.confirm_stage import _check_budget

    plan_ = confirm.plan_model(confirm.load_table(_sweep_dir(tmp_path)), "llama-3.2-1b")
    secs = check_seconds("llama-3.2-1b")
    ran: list[str] = []

    def run_one(c: Any) -> dict[str, Any]:
        clock.now += secs
        ran.append(c.name)
        return _kld(c, 0.0 if c.name == "band decode VEC" else 0.0005)

    store = confirm.ConfirmStore(tmp_path / "confirm.sqlite3", {"build": "/b"})

    def gate(before: Any) -> dict[str, Any]:
        return confirm.gate_model(plan_, tmp_path / "m.gguf", tmp_path, arch=SM90, era="mma", store=store,
                                  work_dir=tmp_path, run_one=run_one, before=before)  # fmt: skip

    try:
        assert secs > 0
        with pytest.raises(BudgetReached, match=r"the llama-3.2-1b output-equivalence check band decode MMA \(about"):
            gate(_check_budget(Budget.counted_from(None, 2.5 * secs), plan_))  # two checks fit, the third does not
        assert ran == ["band decode VEC", "band decode TILE"]
        with pytest.raises(BudgetReached):  # nothing left of a budget shorter than one check: none starts
            gate(_check_budget(Budget.counted_from(None, 0.5 * secs), plan_))
        assert len(ran) == 2
        done = gate(_check_budget(Budget.counted_from(None, 10 * secs), plan_))  # the stored checks are not run again
    finally:
        store.close()
    assert ran[:2] == ["band decode VEC", "band decode TILE"] and ran[2] == "band decode MMA" and len(ran) == 4
    assert done["verdict"] == "pass" and _check_budget(None, plan_) is None


def _kept(tmp_path: Path) -> Any:
    """A confirmation that kept ``D64 gqa4 f16`` MMA from 16384 (the fake sweep's rule, 10% faster end to end)."""
    conf = _run(tmp_path, FakeBench(gain=1.10), likes=["llama-3.2-1b"])
    assert [r.text for r in conf.kept_rules] == ["D64 gqa4 f16 ne1 1, n_kv in [16384, inf) -> MMA"]
    return conf


def test_test_backend_ops_runs_the_kept_shapes_cases_within_the_budget(tmp_path: Path, clock: Any, monkeypatch) -> None:
    """FLASH_ATTN_EXT runs the cases of the kept entries' head sizes and K/V types (`-p`, as validate --gpu), MUL_MAT
    every case; neither starts where its recorded time would end past the budget, and a stored run is not repeated."""
    from tuner.rounds.budget import Budget, BudgetReached
    from tuner.sweep.confirm_report import backend_ops_seconds
    from tuner.sweep.confirm_stage import _backend_ops

    conf = _kept(tmp_path)
    ran: list[tuple[str, str | None]] = []

    def check(bin_dir: Path, op: str, env: Mapping[str, str], log: Path, *, backend: str, params: Any = None) -> Any:
        clock.now += backend_ops_seconds(op, 1 if params else None)
        ran.append((op, params))
        return {"op": op, "passed": True, "summary": "1/1 tests passed", "env": dict(env), "params": params}

    monkeypatch.setattr(confirm, "backend_ops_check", check)
    # recorded on the H100 (tuner/data/step_costs.toml): one shape's FLASH_ATTN_EXT cases, MUL_MAT's, all FA cases
    fa_s, mm_s = backend_ops_seconds("FLASH_ATTN_EXT", 1), backend_ops_seconds("MUL_MAT")
    assert 0 < fa_s < mm_s < backend_ops_seconds("FLASH_ATTN_EXT") == backend_ops_seconds("FLASH_ATTN_EXT", 20)
    store = confirm.ConfirmStore(tmp_path / "ops.sqlite3", {"build": "/b"})
    try:

        def ops(budget_s: float | None) -> list[dict[str, Any]]:
            budget = Budget.counted_from(None, budget_s) if budget_s else None
            return _backend_ops(conf, tmp_path, backend="CUDA0", store=store, log_dir=tmp_path, budget=budget)

        with pytest.raises(BudgetReached, match=r"test-backend-ops FLASH_ATTN_EXT \(about"):
            ops(fa_s - 1)
        assert ran == []
        with pytest.raises(BudgetReached, match=r"test-backend-ops MUL_MAT"):
            ops(fa_s + mm_s / 2)
        assert ran == [("FLASH_ATTN_EXT", "(hsk=64,hsv=64,.*type_K=f16,type_V=f16,)")]
        recs = ops(None)
    finally:
        store.close()
    assert ran[1:] == [("MUL_MAT", None)] and [r["op"] for r in recs] == ["FLASH_ATTN_EXT", "MUL_MAT"]
    text = pr_text(confirm.load_table(_sweep_dir(tmp_path)), conf, backend_ops=recs, patch=True)
    assert "FLASH_ATTN_EXT: PASS (1/1 tests passed; the cases `-p '(hsk=64" in text
    assert "MUL_MAT: PASS (1/1 tests passed; every case)" in text


def test_backend_ops_check_passes_the_case_filter(tmp_path: Path) -> None:
    exe = tmp_path / "test-backend-ops"
    exe.write_text('#!/bin/sh\necho "$@"\necho "  2/2 tests passed"\n')
    exe.chmod(0o755)
    rec = confirm.backend_ops_check(
        tmp_path, "FLASH_ATTN_EXT", {}, tmp_path / "l.log", backend="CUDA0", params="hsk=64"
    )
    assert rec["passed"] and rec["params"] == "hsk=64" and rec["summary"] == "2/2 tests passed"
    assert "test -o FLASH_ATTN_EXT -b CUDA0 -p hsk=64" in (tmp_path / "l.log").read_text()
    plain = confirm.backend_ops_check(tmp_path, "MUL_MAT", {}, tmp_path / "m.log", backend="CUDA0")
    assert plain["params"] is None and "-p" not in (tmp_path / "m.log").read_text().split("\n")[1]

"""``--time-budget`` counts from the command's start: the build llama-quantize needs and the model synthesized
before the study opens are inside it, and no build or round starts that would end past it."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from tests.unit.sweep.conftest import Clock
from tuner.rounds.budget import Budget, BudgetReached
from tuner.rounds.joint import candidates_for, run_joint_rounds
from tuner.search import context as cx
from tuner.search import request as rq
from tuner.search.dryrun import full_build_seconds
from tuner.targets.archs import load_arch
from tuner.targets.target import Target

BUILD_S, MODEL_S, ROUND_S = 290.0, 20.0, 150.0  # the fakes' durations, on the fake clock


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    import time

    c = Clock()
    monkeypatch.setattr(time, "monotonic", c)
    return c


def _slow_build_and_model(monkeypatch: pytest.MonkeyPatch, clock: Clock, tmp_path: Path, *, cached: bool) -> list[str]:
    """resolve_search's steps before the study with fakes: a build of upstream's variant that takes BUILD_S
    (uncached unless ``cached``), a model synthesis that takes MODEL_S. Returns the builds started."""
    import tuner.builder.cmake
    import tuner.plan.render
    import tuner.plan.space
    import tuner.source
    import tuner.targets.models

    built: list[str] = []

    def build(rv: Any, **k: Any) -> Any:
        built.append(rv.short)
        clock.now += 0.0 if cached else BUILD_S  # a cached build is a no-op ninja run
        return types.SimpleNamespace(exe=lambda name: tmp_path / name)

    def synth(like: str, **k: Any) -> Path:
        clock.now += MODEL_S
        return tmp_path / "m.gguf"

    src = types.SimpleNamespace(era="mma", root=tmp_path, spec="fake", source_id="a" * 16)
    monkeypatch.setattr(tuner.source, "fetch_source", lambda spec=None: src)
    monkeypatch.setattr(tuner.plan.space, "load_space", lambda arch, era: types.SimpleNamespace(variants=["mma"]))
    monkeypatch.setattr(tuner.plan.render, "render_variant", lambda *a, **k: types.SimpleNamespace(short="sm_90-mma"))
    monkeypatch.setattr(tuner.builder.cmake, "is_built", lambda rv, targets=(): cached)
    monkeypatch.setattr(tuner.builder.cmake, "build_variant", build)
    monkeypatch.setattr(tuner.targets.models, "synth_cached", synth)
    monkeypatch.setattr(rq, "_context_length", lambda model: None)
    monkeypatch.setattr(rq, "_check_pins", lambda *a, **k: None)
    return built


def _request(budget: float, started: float) -> rq.SearchRequest:
    return rq.SearchRequest(
        target=Target(arch=load_arch("sm_90"), local_archs=("sm_90",)), time_budget=budget, started=started
    )


def test_the_budget_counts_the_build_and_stops_before_a_round_past_it(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, tmp_path: Path
) -> None:
    # On an H200, --time-budget 558 started counting after the build and the model (about 290 s) and was
    # still measuring at 590 s: rounds were judged against a deadline 290 s late.
    built = _slow_build_and_model(monkeypatch, clock, tmp_path, cached=False)
    start = clock.now
    cfg = rq.resolve_search(_request(558.0, start))
    assert built == ["sm_90-mma"] and clock.now == start + BUILD_S + MODEL_S
    deadline = cfg.budget.deadline
    assert deadline == start + 558.0

    ends: list[float] = []

    def joint(cand: Any, phases: Any, depths: Any, label: str) -> Any:
        clock.now += ROUND_S / 2  # two candidates a round
        ends.append(clock.now)
        return {p: {d: {"ts": 100.0, "kernel": None, "why": None, "error": ""} for d in depths} for p in phases}

    with pytest.raises(BudgetReached):
        run_joint_rounds(
            joint,
            {"tg": candidates_for("tg", [])},
            [0],
            [],
            pp_tokens=0,
            min_rounds=3,
            max_rounds=3,
            budget=Budget(deadline),
        )
    assert ends and max(ends) <= start + 558.0  # the round that would have ended past the budget never started


def test_a_build_that_would_end_past_the_budget_is_not_started(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, tmp_path: Path
) -> None:
    budget = full_build_seconds() / 2  # less than the dry run's price of one build
    built = _slow_build_and_model(monkeypatch, clock, tmp_path, cached=False)
    with pytest.raises(BudgetReached, match="the build of sm_90-mma"):
        rq.resolve_search(_request(budget, clock.now))
    assert built == []
    built = _slow_build_and_model(monkeypatch, clock, tmp_path, cached=True)  # cached: no compile to price
    rq.resolve_search(_request(budget, clock.now))
    assert built == ["sm_90-mma"]
    # the pipeline's own builds (other variants, compile-time trials) are priced the same way
    cfg = types.SimpleNamespace(
        source=None, arch="sm_90", target=types.SimpleNamespace(local_archs=(), is_cpu=False), jobs=None
    )
    builds = cx.Builds(cfg, None, Budget(clock.now + budget))  # type: ignore[arg-type]
    monkeypatch.setattr("tuner.builder.cmake.is_built", lambda rv, targets=(): False)
    with pytest.raises(BudgetReached):
        builds.get("mma", {})


def test_a_fresh_studys_first_screen_round_is_priced_and_not_started_past_the_budget(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A new study has no round to judge its first by: it was estimated at 0 s, so a budget shorter than one
    # round still started it (and a machine's time limit would cut it off). It is priced as the dry run prices
    # a screen round, from the recorded per-step costs.
    from tests.conftest import use_render_tree
    from tests.unit.search.test_knob_cli import DATA, run_main
    from tuner.rounds.budget import load_step_costs
    from tuner.search.cost import nearest_recording, screen_round_seconds
    from tuner.targets.models import load_models, synth_model

    use_render_tree(monkeypatch)
    shape = load_models(DATA / "micro_models.toml")["micro"]
    model = synth_model(shape, tmp_path / "micro.gguf", vocab_path=DATA / "vocab-micro.gguf").path
    calls: list[str] = []

    def bench(cand: Any, phase: str, depths: Any, label: str) -> Any:
        calls.append(label)
        return {d: {"ts": 100.0, "kernel": None, "why": None, "error": ""} for d in depths}

    def joint(cand: Any, phases: Any, depths: Any, label: str) -> Any:
        calls.append(label)
        return {p: bench(cand, p, depths, label) for p in phases}

    bench.joint = joint  # shared calls, as the live llama-bench measure
    fake_build = types.SimpleNamespace(build_id="b", bin_dir=tmp_path, meta={})
    monkeypatch.setattr(cx.Builds, "get", lambda self, variant, values: fake_build)
    monkeypatch.setattr(cx, "live_measure", lambda cfg, build: bench)
    depths = [0, 64, 128, 192]
    # the CPU screen: upstream and its A/A twin per phase, both phases in each call
    price = screen_round_seconds(nearest_recording(load_step_costs(), shape.d_model), 2, len(depths))
    args = ["search", "--arch", "cpu", "--model", str(model), "--depths", ",".join(map(str, depths))]
    args += ["--run-dir", str(tmp_path / "run"), "--trials", "0", "--time-budget", f"{price / 2:.1f}"]
    code, err = run_main(monkeypatch, capsys, *args)
    assert code == 3, err
    assert calls == []  # no round started that the budget could not hold
    assert f"screen tg+pp round 1 (about {price:.0f} s" in err, err


def test_once_a_round_ran_the_measured_round_judges_the_next_not_the_price(clock: Clock) -> None:
    from tuner.search.cost import priced_screen_call

    depths = [0, 4096]
    priced = priced_screen_call(2048, depths)
    price = priced["seconds"] * 2  # a round: upstream and its A/A twin
    rounds: list[dict[str, Any]] = []

    def joint(cand: Any, phases: Any, depths: Any, label: str) -> Any:
        clock.now += price / 20  # this machine: a tenth of the recorded price a round
        return {p: {d: {"ts": 100.0, "kernel": None, "why": None, "error": ""} for d in depths} for p in phases}

    cands = {"tg": candidates_for("tg", [])}
    with pytest.raises(BudgetReached, match=r"screen tg round 1 \(about"):  # less than the price left: none starts
        run_joint_rounds(
            joint, cands, depths, rounds, pp_tokens=0, budget=Budget(clock.now + price / 2), prior=[priced]
        )
    assert rounds == []
    start = clock.now
    deadline = start + 1.5 * price
    run_joint_rounds(
        joint, cands, depths, rounds, pp_tokens=0, min_rounds=4, max_rounds=4, budget=Budget(deadline), prior=[priced]
    )
    assert len(rounds) == 4 and clock.now <= start + 1.5 * price  # the price alone would have held back round 2


def test_a_build_that_takes_most_of_the_budget_stops_the_search_inside_it_and_a_rerun_resumes(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The case end to end: `tuner search --time-budget` whose build eats most of the budget exits 3
    # before the budget ends (no round started that would end past it), and the same command resumes: the
    # build is cached, the rounds measured are kept, and the next call adds rounds after them.
    import tuner.builder.cmake
    from tests.conftest import use_render_tree
    from tests.unit.search.test_knob_cli import DATA, run_main
    from tuner.targets.models import load_models, synth_model

    use_render_tree(monkeypatch)
    model = synth_model(
        load_models(DATA / "micro_models.toml")["micro"], tmp_path / "micro.gguf", vocab_path=DATA / "vocab-micro.gguf"
    ).path
    build_s, call_s, budget = 0.9 * full_build_seconds(), 30.0, full_build_seconds() + 60.0
    built: list[float] = []

    def build(rv: Any, **k: Any) -> Any:
        if not built:
            clock.now += build_s  # the first, uncached build: most of the budget
        built.append(clock.now)
        return types.SimpleNamespace(build_id="b", bin_dir=tmp_path, meta={})

    monkeypatch.setattr(tuner.builder.cmake, "build_variant", build)
    monkeypatch.setattr(tuner.builder.cmake, "is_built", lambda rv, targets=(): bool(built))
    labels: list[str] = []

    def bench(cand: Any, phase: str, depths: Any, label: str) -> Any:
        clock.now += call_s
        labels.append(label)
        return {d: {"ts": 100.0, "kernel": None, "why": None, "error": ""} for d in depths}

    monkeypatch.setattr(cx, "live_measure", lambda cfg, b: bench)  # one phase a call: no shared calls
    args = ["search", "--arch", "cpu", "--model", str(model), "--depths", "0,64", "--run-dir", str(tmp_path / "run")]
    args += ["--trials", "0", "--rounds", "6", "--time-budget", f"{budget:.0f}"]
    start = clock.now
    code, err = run_main(monkeypatch, capsys, *args)
    assert code == 3 and "note: time budget reached" in err, err
    assert len(built) == 1 and labels and clock.now <= start + budget  # stopped inside its budget
    first = len(labels)
    start = clock.now
    code, err = run_main(monkeypatch, capsys, *args)  # the same command again: it resumes
    assert code == 3 and "note: time budget reached" in err, err
    assert len(labels) > first and clock.now <= start + budget
    assert labels[first].startswith(f"screen-tg-r{first // 2}-"), labels  # after the stored rounds, not over

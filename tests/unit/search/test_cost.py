"""The search's cost (config.toml's ``[cost]``): stage times and llama-bench calls add up over resumed runs,
and an older study exports only the fields it recorded."""

from __future__ import annotations

import dataclasses

import optuna

from tuner.result.pipeline_report import COST_FIELDS, cost_line
from tuner.search.device_guard import counted as _counted
from tuner.search.pipeline import _timed
from tuner.study.record import outcome_from_attrs
from tuner.study.state import StudyState


def _fake_factory(calls: list):
    """A llama-bench stand-in that logs each call (the count the study must match)."""

    def factory(build):
        def cells(depths):
            return {d: {"ts": 100.0, "kernel": None, "why": None, "error": ""} for d in depths}

        def measure(c, phase, depths, label):
            calls.append(("one", phase))
            return cells(depths)

        def joint(c, phases, depths, label):
            calls.append(("joint", tuple(phases)))
            return {p: cells(depths) for p in phases}

        measure.joint = joint
        measure.info = {"device": "fake"}
        return measure

    return factory


def _one_run(st: StudyState, calls: list, n: int) -> None:
    """One search run's measuring: ``n`` screen calls and one shared call, timed like the pipeline times them."""
    m = _counted(st, _fake_factory(calls))(None)
    assert m.info == {"device": "fake"}  # what the pipeline reads off a measure passes through
    with _timed(st, "total"), _timed(st, "screen"):
        for i in range(n):
            m(None, "tg", [0, 256], f"r{i}")
        m.joint(None, ["tg", "pp"], [0], "j")


def test_calls_and_times_add_up_over_a_resumed_run() -> None:
    study = optuna.create_study(directions=["maximize", "maximize"])
    st = StudyState(study)
    calls: list = []
    _one_run(st, calls, 3)
    first = outcome_from_attrs(st.attrs).cost
    assert first["llama_bench_calls"] == len(calls) == 4
    _one_run(StudyState(study), calls, 2)  # the resumed run: a new process, the same study
    cost = outcome_from_attrs(st.attrs).cost
    assert cost["llama_bench_calls"] == len(calls) == 7
    secs = st.stage_seconds
    assert cost["screen_s"] == round(secs["screen"], 1) and cost["total_s"] >= cost["screen_s"] >= first["screen_s"]
    assert cost["tune_trials"] == 0 and "tune_s" not in cost and "gates_s" not in cost  # stages not run: not 0


def test_an_older_study_exports_only_what_it_recorded() -> None:
    # a study from before the cost table: stage seconds of the stages it timed, no call count, no total
    attrs = {
        "stage_seconds": {
            "build": 310.2,
            "gate": 12.0,
            "screen": 540.5,
            "tune": 0.0,
            "confirm": 200.0,
            "residency": 3.0,
            "equivalence": 40.0,
        }
    }
    cost = outcome_from_attrs(attrs).cost
    assert cost == {
        "build_s": 310.2,
        "gate_s": 12.0,
        "screen_s": 540.5,
        "tune_s": 0.0,
        "confirm_s": 200.0,
        "gates_s": 43.0,
        "tune_trials": 0,
    }
    line = cost_line(outcome_from_attrs(attrs))
    assert "screen_s 540.5" in line and "Not in this study" in line
    assert "model_s, total_s, llama_bench_calls." in line and "\n" not in line
    assert "Recorded by an older tuner" in line  # its stage times may cover only some of its runs
    assert set(cost) | {"model_s", "total_s", "llama_bench_calls"} == set(COST_FIELDS)
    bare = outcome_from_attrs({})  # a study that timed nothing has no stage field at all
    assert set(bare.cost) == {"tune_trials"}


def test_the_plan_takes_a_past_search_cost_of_the_same_arch(tmp_path) -> None:
    from tuner.search.cost import past_cost, past_cost_line

    for name, body in (
        ("a", "[cost]\nscreen_s = 10.0\n"),
        ("b", "[cost]\nscreen_s = 20.0\nllama_bench_calls = 7\n"),
        ("c", "[study]\nname = 'x'\n"),
        ("d", "not toml ["),
    ):
        (tmp_path / "cpu" / name).mkdir(parents=True)
        (tmp_path / "cpu" / name / "config.toml").write_text(body)
    path, cost, _same = past_cost("cpu", tmp_path)
    assert path == tmp_path / "cpu" / "b" / "config.toml" and cost == {"screen_s": 20.0, "llama_bench_calls": 7}
    line = past_cost_line("cpu", tmp_path)
    assert line is not None and "screen_s 20.0, llama_bench_calls 7" in line and str(path) in line
    assert past_cost_line("sm_90", tmp_path) is None  # no stored result of the arch: no line
    (tmp_path / "cpu" / "e").mkdir()
    (tmp_path / "cpu" / "e" / "config.toml").write_text("[cost]\ntune_s = 700.0\ntune_trials = 30\nscreen_s = 1.0\n")
    assert past_cost("cpu", tmp_path)[0].parent.name == "e"  # most fields
    assert past_cost("cpu", tmp_path, trials=0)[0].parent.name == "b"  # a plan without trials: a run without them
    assert past_cost("cpu", tmp_path, trials=30)[0].parent.name == "e"


def test_the_plan_prices_a_model_by_a_past_search_of_the_same_shape(tmp_path) -> None:
    """An 8B plan is priced by the stored 8B search, not by a 1B one with more recorded fields."""
    from tuner.search.cost import past_cost, past_cost_line

    shape_1b = "[model.shape]\nhead_dim = 64\nn_layers = 16\nd_model = 2048\n"
    shape_8b = "[model.shape]\nhead_dim = 128\nn_layers = 32\nd_model = 4096\n"
    for name, body in (
        ("a-1b", "[cost]\nscreen_s = 148.8\nconfirm_s = 259.1\ntotal_s = 700.8\n" + shape_1b),
        ("b-8b", "[cost]\ntotal_s = 1246.6\n" + shape_8b),
    ):
        (tmp_path / "sm_90" / name).mkdir(parents=True)
        (tmp_path / "sm_90" / name / "config.toml").write_text(body)
    want_8b = {"head_dim": 128, "n_layers": 32, "d_model": 4096, "n_heads": 32, "n_kv_heads": 8}
    path, cost, same = past_cost("sm_90", tmp_path, trials=0, shape=want_8b)
    assert path.parent.name == "b-8b" and cost == {"total_s": 1246.6} and same
    line = past_cost_line("sm_90", tmp_path, trials=0, shape=want_8b)
    assert line is not None and "the same model shape" in line and "another model" not in line
    other = {"head_dim": 80, "n_layers": 40, "d_model": 5120}
    path, _cost, same = past_cost("sm_90", tmp_path, trials=0, shape=other)
    assert path.parent.name == "a-1b" and not same  # no stored search of that shape: the fullest record, caveated
    assert "another model" in (past_cost_line("sm_90", tmp_path, shape=other) or "")


def test_a_trial_cut_off_and_asked_again_counts_once() -> None:
    from tuner.study.record import TrialSummary

    def trial(n: int, status: str) -> TrialSummary:
        return TrialSummary(number=n, status=status, objectives=(), params={}, phases=("tg",), reason=None)

    trials = [trial(0, "interrupted"), trial(1, "ok"), trial(2, "infeasible"), trial(3, "failed")]
    out = outcome_from_attrs({}, trials=[])
    out = dataclasses.replace(out, trials=tuple(trials))
    assert out.cost["tune_trials"] == 3  # trial 0 was run again as another number

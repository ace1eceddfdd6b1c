"""What times a tune trial (the FA op alone or llama-bench) and which kernels its gate forces."""

from __future__ import annotations

import optuna
import pytest

from tuner.plan.space import load_space
from tuner.result.pipeline_report import _trials
from tuner.search import tune as tn
from tuner.search.kernel_screen import METHOD_BENCH, METHOD_KERNEL
from tuner.study.record import TrialSummary
from tuner.study.state import StudyState

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def knobs() -> dict[str, list]:
    space = load_space("sm_90", "mma")
    every = tn.tunable_knobs(space, {}, head_dim=128)
    return {
        "mma": tn.tunable_knobs(space, {}, head_dim=128, patterns=("mma.ampere.d128.c8.*",)),
        "tile": [k for k in tn.tunable_knobs(load_space("gfx1151", "mma"), {}) if k.kind == "tile_row"],
        "process": [k for k in every if k.kind not in ("tile_row", "mma_row")],
    }


def test_config_rows_are_timed_at_the_op_level_where_the_screen_was(knobs) -> None:
    rows = knobs["mma"] + knobs["tile"]
    assert knobs["mma"] and knobs["tile"] and knobs["process"]
    assert tn.trial_method(rows, screen_method=METHOD_KERNEL, recorded=None) == METHOD_KERNEL
    # a process knob changes the whole step: llama-bench
    assert tn.trial_method(rows + knobs["process"][:1], screen_method=METHOD_KERNEL, recorded=None) == METHOD_BENCH
    # a llama-bench screen (a CPU, a partial offload): llama-bench
    assert tn.trial_method(rows, screen_method=METHOD_BENCH, recorded=None) == METHOD_BENCH
    assert tn.trial_method([], screen_method=METHOD_KERNEL, recorded=None) == METHOD_BENCH
    # a study keeps the method its trials were measured with
    assert tn.trial_method(rows, screen_method=METHOD_KERNEL, recorded=METHOD_BENCH) == METHOD_BENCH


def test_a_trials_gate_forces_only_the_kernels_its_rows_build(knobs) -> None:
    mma, tile, proc = knobs["mma"][0], knobs["tile"][0], knobs["process"][0]
    assert tn.gate_kernels([mma]) == ["MMA"]
    assert tn.gate_kernels([tile, mma]) == ["TILE", "MMA"]
    assert tn.gate_kernels([mma, proc]) == ["VEC", "TILE", "MMA"]  # a process knob reaches every kernel
    assert tn.gate_kernels([mma, "variant"]) == ["VEC", "TILE", "MMA"]  # so does another build variant
    assert tn.gate_kernels([]) == ["VEC", "TILE", "MMA"]


def test_the_trial_factory_is_recorded_and_kept_by_a_study(knobs) -> None:
    study = optuna.create_study(directions=["maximize", "maximize"])
    st = StudyState(study)
    st.set_screen_method(METHOD_KERNEL)
    op_made = []

    def op():
        op_made.append(1)
        return "op-factory"

    assert tn.trial_factory(st, study, knobs["mma"], "bench-factory", op) == "op-factory"
    assert st.tune_method == METHOD_KERNEL and op_made == [1]
    # a study whose trials were measured before the method was recorded: those were llama-bench's
    old = optuna.create_study(directions=["maximize", "maximize"])
    old.add_trial(optuna.trial.create_trial(values=[1.0, 0.97]))
    st_old = StudyState(old)
    st_old.set_screen_method(METHOD_KERNEL)
    assert tn.trial_factory(st_old, old, knobs["mma"], "bench-factory", op) == "bench-factory"
    assert st_old.tune_method == METHOD_BENCH and op_made == [1]


def test_the_report_names_what_timed_the_trials() -> None:
    t = TrialSummary(number=0, status="ok", objectives=(1.0, 1.03), phases=("tg",), params={"x": 1}, reason="")
    assert "timed at the op level" in _trials([t], METHOD_KERNEL)
    assert "timed with llama-bench" in _trials([t])

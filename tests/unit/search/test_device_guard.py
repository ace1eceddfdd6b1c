"""One study, one device: a study resumed on another GPU model is stopped at its first measurement there,
before anything measured on it is stored; the first device a study sees is what its result names."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import optuna
import pytest

from tuner.errors import UsageError
from tuner.rounds.joint import candidates_for, run_joint_rounds
from tuner.search.device_guard import check_device, counted, device_checked
from tuner.study.state import StudyState

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
DEPTHS = [0, 4096]


def _factory(device: str, calls: list[str]):
    """A measure that reports ``device`` once it has measured (as llama-bench's gpu_info is read), and logs calls."""

    def make(build: Any) -> Any:
        def cells(depths):
            return {d: {"ts": 100.0, "kernel": None, "why": None, "error": ""} for d in depths}

        def measure(c, phase, depths, label):
            calls.append(label)
            measure.info["device"] = device
            return cells(depths)

        def joint(c, phases, depths, label):
            calls.append(label)
            measure.info["device"] = device
            return {p: cells(depths) for p in phases}

        measure.info = {}
        measure.joint = joint
        return measure

    return make


def _rounds(st: StudyState, device: str, recs: list, stored: list, calls: list, n: int) -> None:
    m = counted(st, device_checked(st, _factory(device, calls)))(None)
    cands = {"tg": candidates_for("tg", ["VEC", "TILE"]), "pp": candidates_for("pp", ["TILE"])}
    run_joint_rounds(
        m.joint, cands, DEPTHS, recs, pp_tokens=512, min_rounds=n, max_rounds=n, on_round=stored.append, prior=()
    )


def test_the_first_device_is_recorded_and_another_one_is_refused_with_the_fix() -> None:
    st = StudyState(optuna.create_study(directions=["maximize", "maximize"]))

    check_device(st, SimpleNamespace(info={}))  # nothing measured yet: nothing recorded, nothing refused
    assert st.device is None
    check_device(st, SimpleNamespace(info={"device": H100}))
    check_device(st, SimpleNamespace(info={"device": H100}))  # the same device again: fine
    assert st.device == H100
    with pytest.raises(UsageError) as e:
        check_device(st, SimpleNamespace(info={"device": H200}))
    msg = str(e.value)
    assert H100 in msg and H200 in msg and "--study" in msg and "not stored" in msg
    assert st.device == H100  # the study still names the device its rounds came from


def test_a_study_resumed_on_another_gpu_stores_nothing_measured_there() -> None:
    study = optuna.create_study(directions=["maximize", "maximize"])
    recs: list[dict[str, Any]] = []
    stored: list[dict[str, Any]] = []
    calls: list[str] = []
    _rounds(StudyState(study), H100, recs, stored, calls, 2)  # the first machine: two complete rounds
    assert StudyState(study).device == H100 and len(stored) == 2 * 2  # a record per phase and round
    before = (len(recs), len(stored), len(calls))

    st = StudyState(study)  # resumed in a new process, on an H200
    with pytest.raises(UsageError, match="H200"):
        _rounds(st, H200, recs, stored, calls, 3)
    assert len(calls) == before[2] + 1  # stopped right after its first call there ...
    assert (len(recs), len(stored)) == before[:2]  # ... and no round of it was kept
    assert st.device == H100 and st.llama_bench_calls == before[2] + 1  # the call it made still counts as cost

    _rounds(StudyState(study), H100, recs, stored, calls, 3)  # back on an H100 it goes on
    assert len(stored) == 3 * 2

"""Which arch a search runs for (never another GPU's name on this one, except older NVIDIA code by --ptx-jit); resume details."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.targets import archs
from tuner.errors import UsageError
from tuner.search.study import resolve_arch


@pytest.fixture
def on_h100(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archs, "detect_local_archs", lambda: ["sm_90"])


def test_local_gpu_is_the_default(on_h100: None) -> None:
    assert resolve_arch(None) == "sm_90"
    assert resolve_arch("hopper") == "sm_90"


def test_older_nvidia_target_needs_ptx_jit(on_h100: None) -> None:
    with pytest.raises(UsageError) as e:
        resolve_arch("sm_89")
    assert "add --ptx-jit" in str(e.value) and "--dry-run" in str(e.value)
    assert resolve_arch("sm_89", ptx_jit=True) == "sm_89"


def test_ptx_jit_cannot_run_amd_or_newer_targets(on_h100: None) -> None:
    for target in ("gfx1151", "sm_120"):
        with pytest.raises(UsageError) as e:
            resolve_arch(target, ptx_jit=True)
        assert "tuner never benchmarks one device" in str(e.value) and "--ptx-jit" not in str(e.value)


def test_resumed_study_reuses_the_recorded_gate() -> None:
    # The H100 8B study: trial0 gated the upstream build; a resumed run must not gate it again
    # (60 s of test-backend-ops there). `cfg` is absent, so running the gate would raise.
    from types import SimpleNamespace

    import optuna

    from tuner.search.study import _Searcher, stored_gate

    db = Path(__file__).resolve().parents[3] / "docs" / "h100" / "session3" / "sm90-l8b-study.db"
    study = optuna.load_study(study_name="sm90-llama-3.1-8b-q4km", storage=f"sqlite:///{db}")
    trials = study.get_trials(deepcopy=False)
    first = trials[0].user_attrs
    searcher = SimpleNamespace(_gated={}, study=study)
    g = _Searcher._gate(searcher, SimpleNamespace(build_id=first["build_id"]))  # type: ignore[arg-type]
    assert g["status"] == "pass" and g == first["gate"] and searcher._gated[first["build_id"]] == g
    assert stored_gate(trials, "no-such-build") is None

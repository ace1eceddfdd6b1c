"""Which arch a search runs for (never another GPU's name on this one, except older NVIDIA code by --ptx-jit); resume details."""

from __future__ import annotations

import pytest

from tuner.errors import UsageError
from tuner.targets import archs
from tuner.targets.target import resolve_target


@pytest.fixture
def on_h100(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archs, "detect_local_archs", lambda: ["sm_90"])


def test_local_gpu_is_the_default(on_h100: None) -> None:
    assert resolve_target(None).name == "sm_90"
    assert resolve_target("hopper").name == "sm_90"


def test_older_nvidia_target_needs_ptx_jit(on_h100: None) -> None:
    with pytest.raises(UsageError) as e:
        resolve_target("sm_89")
    assert "add --ptx-jit" in str(e.value) and "--dry-run" in str(e.value)
    assert resolve_target("sm_89", ptx_jit=True).name == "sm_89"


def test_ptx_jit_cannot_run_amd_or_newer_targets(on_h100: None) -> None:
    for target in ("gfx1151", "sm_120"):
        with pytest.raises(UsageError) as e:
            resolve_target(target, ptx_jit=True)
        assert "tuner never benchmarks one device" in str(e.value) and "--ptx-jit" not in str(e.value)

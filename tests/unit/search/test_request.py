"""What a search does where a flag is not given: the model it synthesizes and its weight type."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tuner.search import request as rq
from tuner.targets.archs import load_arch
from tuner.targets.target import Target


def _target(arch: str) -> Target:
    return Target(arch=load_arch(arch), local_archs=() if arch == "cpu" else (arch,))


@pytest.mark.parametrize(
    ("arch", "quant", "made"),
    [
        ("sm_90", None, "Q4_K_M"),  # a GPU's default: the weight type users run
        ("sm_90", "Q8_0", "Q8_0"),
        ("sm_90", "f16", None),  # the synthesized f16 model, no llama-quantize
        ("cpu", None, None),  # the embedded CPU default stays f16 (no quantize build)
        ("cpu", "Q4_K_M", "Q4_K_M"),
    ],
)
def test_the_synthesized_models_weight_type(
    arch: str, quant: str | None, made: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked: dict[str, Any] = {}

    def synth(like: str, *, source: Any, quant: str | None, quantize_bin: Path | None) -> Path:
        asked.update(like=like, quant=quant, quantize_bin=quantize_bin)
        return tmp_path / "m.gguf"

    monkeypatch.setattr("tuner.targets.models.synth_cached", synth)

    def build(target: Any, source: Any, deadline: float | None = None) -> Path:
        time.sleep(0.05)  # the build that llama-quantize needs is counted as the search's build, not the model's
        return tmp_path / "llama-quantize"

    monkeypatch.setattr(rq, "_baseline_build", build)
    req = rq.SearchRequest(target=_target(arch), quant=quant)
    _, built = rq._model(req, source=object())  # type: ignore[arg-type]
    assert (built >= 0.05) == (made is not None) and (built == 0.0) == (made is None)
    assert asked["like"] == req.defaults.like
    assert asked["quant"] == made
    assert (asked["quantize_bin"] is not None) == (made is not None)


def test_a_gpu_search_runs_no_compile_time_trials_unless_asked() -> None:
    assert rq.GPU_DEFAULTS.trials == 0 and rq.GPU_DEFAULTS.quant == "Q4_K_M"
    assert "no compile-time trials (--trials N adds them)" in rq.intro(rq.SearchRequest(target=_target("sm_90")))
    assert "tune 4 Optuna trial(s)" in rq.intro(rq.SearchRequest(target=_target("sm_90"), trials=4))

"""What a search does where a flag is not given: the model it synthesizes and its weight type."""

from __future__ import annotations

import time
import types
from pathlib import Path
from typing import Any

import pytest

from tuner.rounds.budget import Budget
from tuner.search import request as rq
from tuner.targets.archs import load_arch
from tuner.targets.target import Target


def _target(arch: str) -> Target:
    return Target(arch=load_arch(arch), local_archs=() if arch == "cpu" else (arch,))


@pytest.mark.parametrize(
    ("arch", "quant", "made", "direct"),
    [
        ("sm_90", None, "Q4_K_M", False),  # a GPU's default: the weight type users run, made by llama-quantize
        ("sm_90", "Q8_0", "Q8_0", False),
        ("sm_90", "f16", None, False),  # the synthesized f16 model, no llama-quantize
        ("cpu", None, "Q4_K_M", True),  # the embedded CPU default: Q4_K_M blocks written directly, no build first
        ("cpu", "IQ4_XS", "IQ4_XS", True),
        ("cpu", "Q8_0", "Q8_0", False),  # a type synth cannot write needs llama-quantize's build
        ("cpu", "f16", None, False),
    ],
)
def test_the_synthesized_models_weight_type(
    arch: str, quant: str | None, made: str | None, direct: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked: dict[str, Any] = {}

    def synth(like: str, *, source: Any, quant: str | None, quantize_bin: Path | None, direct: bool) -> Path:
        asked.update(like=like, quant=quant, quantize_bin=quantize_bin, direct=direct)
        return tmp_path / "m.gguf"

    monkeypatch.setattr("tuner.targets.models.synth_cached", synth)

    def build(target: Any, source: Any, budget: Any) -> Path:
        time.sleep(0.05)  # the build that llama-quantize needs is counted as the search's build, not the model's
        return tmp_path / "llama-quantize"

    monkeypatch.setattr(rq, "_baseline_build", build)
    req = rq.SearchRequest(target=_target(arch), quant=quant)
    src = types.SimpleNamespace(source_id="0" * 16)
    _, built = rq._model(req, rq.plan_search(req), src, Budget())  # type: ignore[arg-type]
    quantized = made is not None and not direct
    assert (built >= 0.05) == quantized and (built == 0.0) == (not quantized)
    assert asked["like"] == req.defaults.like
    assert asked["quant"] == made and asked["direct"] == direct
    assert (asked["quantize_bin"] is not None) == quantized


def test_a_gpu_search_runs_no_compile_time_trials_unless_asked() -> None:
    assert rq.GPU_DEFAULTS.trials == 0 and rq.GPU_DEFAULTS.quant == "Q4_K_M"
    assert "no compile-time trials (--trials N adds them)" in rq.intro(rq.SearchRequest(target=_target("sm_90")))
    assert "tune 4 Optuna trial(s)" in rq.intro(rq.SearchRequest(target=_target("sm_90"), trials=4))

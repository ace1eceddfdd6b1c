"""model_origin reads the shape and quant from synth_cached's file names when the GGUF is not on this machine."""

from __future__ import annotations

import pytest

from tuner.result.pipeline_export import model_origin
from tuner.study.record import StudyHeader


@pytest.mark.parametrize(
    ("stem", "like", "quant"),
    [
        ("llama-3.2-1b-q4_k_m-s0-01234567", "llama-3.2-1b", "Q4_K_M"),
        ("llama-3.2-1b-q4_k_m-direct-s0-01234567", "llama-3.2-1b", "Q4_K_M"),  # synth_cached(direct=True)
        ("qwen2.5-7b-f16-s0-01234567", "qwen2.5-7b", None),
    ],
)
def test_model_origin_from_a_cached_synth_name(stem: str, like: str, quant: str | None) -> None:
    h = StudyHeader(name="s", model=f"/not/here/{stem}.gguf")
    assert model_origin(h) == {"like": like, "quant": quant, "synthetic": True}

"""One quant-type list: synth's run_quantize accepts and refuses the names of quant_types.QUANT_TYPES."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tuner import _run
from tuner.errors import UsageError
from tuner.targets import models
from tuner.targets.quant_types import QUANT_TYPES, quant_type


def test_synth_checks_names_against_the_one_list() -> None:
    assert not hasattr(models, "QUANT_TYPES")  # no second list beside quant_types.QUANT_TYPES
    assert quant_type is models.quant_type


def _accepts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> str | None:
    """What run_quantize passes to llama-quantize for ``name`` (None: refused as unknown)."""
    exe = tmp_path / "bin" / "llama-quantize"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text("")
    exe.chmod(0o755)
    src = tmp_path / "m.gguf"
    src.write_bytes(b"GGUF" + b"\0" * 64)
    seen: list[str] = []

    def fake(cmd: list[str | os.PathLike[str]], **kw: object) -> _run.RunResult:
        seen.append(os.fspath(cmd[3]))
        Path(cmd[2]).write_bytes(b"q")
        return _run.RunResult(returncode=0, output="", seconds=0.0)

    monkeypatch.setattr(_run, "run", fake)
    try:
        models.run_quantize(src, tmp_path / f"s-{name}.gguf", name, quantize_bin=exe)
    except UsageError as e:
        assert "Unknown quant type" in str(e)
        return None
    return seen[0]


@pytest.mark.parametrize("name", [*QUANT_TYPES, "q4_k_m", "iq4_xs", "f16", "Q2_K_S", "Q4_K_MM", "IQ2_XXS"])
def test_run_quantize_takes_the_one_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    want = name.upper() if name.upper() in QUANT_TYPES else None
    assert _accepts(tmp_path, monkeypatch, name) == want


def test_every_spelling_either_list_took_that_makes_a_file_is_kept() -> None:
    """The builder's former list and synth's former list (Q2_K_S left out: llama-quantize refuses it with
    no importance matrix, so it never made a file through either)."""
    synth = "Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K IQ4_NL IQ4_XS"
    builder = synth + " MXFP4_MOE F16 BF16 F32"
    assert set(builder.split()) | set(synth.split()) == set(QUANT_TYPES)
    with pytest.raises(UsageError, match="Did you mean.*'Q4_K_M'"):
        quant_type("Q4_K_MM")

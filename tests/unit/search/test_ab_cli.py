"""`tuner ab` refuses what it cannot measure, before measuring anything."""

from __future__ import annotations

import os
from pathlib import Path

from click.testing import CliRunner

from tuner.cli import cli


def _fake_build(tmp_path: Path, lib: bytes | None) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "llama-bench"
    exe.write_text("#!/bin/sh\nexit 99\n")  # would fail loudly if it were ever run
    os.chmod(exe, 0o755)
    if lib is not None:
        (bin_dir / "libggml-cuda.so").write_bytes(lib)
    return bin_dir


def test_a_bad_kernel_or_rule_is_refused(tmp_path: Path) -> None:
    b, m = _fake_build(tmp_path, b"...GGML_TUNER_FA_RULES..."), tmp_path / "m.gguf"
    m.write_bytes(b"GGUF")
    for bad in ("decode:0-=WMMA", "decode:x-=MMA", "decode/D0:0-=MMA"):
        res = CliRunner().invoke(cli, ["ab", "--build", str(b), "--model", str(m), "--rules", bad], standalone_mode=False)
        assert res.exception is not None and getattr(res.exception, "exit_code", None) == 2, (bad, res.output)


def test_a_build_without_the_hook_is_refused(tmp_path: Path) -> None:
    b, m = _fake_build(tmp_path, None), tmp_path / "m.gguf"
    m.write_bytes(b"GGUF")
    res = CliRunner().invoke(cli, ["ab", "--build", str(b), "--model", str(m), "--rules", "decode:0-=TILE"], standalone_mode=False)
    assert getattr(res.exception, "exit_code", None) == 2 and "no tuner FA rules hook" in str(res.exception)


def test_depths_must_be_integers(tmp_path: Path) -> None:
    b, m = _fake_build(tmp_path, b"GGML_TUNER_FA_RULES"), tmp_path / "m.gguf"
    m.write_bytes(b"GGUF")
    res = CliRunner().invoke(cli, ["ab", "--build", str(b), "--model", str(m), "--rules", "decode:0-=TILE", "--depths", "0,4k"])
    assert res.exit_code == 2 and "not a comma-separated list of integers" in res.output

"""The dry run's compile checks on a machine whose CUDA toolkit is incomplete."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_a_cuda_dry_run_without_cublas_skips_its_compile_checks_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ggml-cuda links cuBLAS, so CMake's configure fails without it: the dry run says so instead of a failure."""
    from tuner.search import dryrun

    if Path("/usr/local/cuda/include/cublas_v2.h").is_file():
        pytest.skip("this machine's /usr/local/cuda has cuBLAS (the lookup's fallback)")
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    monkeypatch.setattr(dryrun.shutil, "which", lambda name: str(nvcc) if name == "nvcc" else None)
    why = dryrun._skip_reason("nvidia")
    assert why is not None and "cublas_v2.h" in why and str(nvcc) in why
    (tmp_path / "cuda" / "include").mkdir()
    (tmp_path / "cuda" / "include" / "cublas_v2.h").write_text("")
    assert dryrun._skip_reason("nvidia") is None

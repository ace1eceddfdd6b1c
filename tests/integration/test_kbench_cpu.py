"""The kernel-level FA screen on the real CPU build: test-backend-ops perf over a --test-file of the
``tiny`` model's FA shapes (tuner/measure/kernel_bench.py). About 10 s on 2 cores once the build is cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.measure.kernel_bench import force_kernel_env, run_round, shape_for_model
from tuner.targets.models import load_models

pytestmark = pytest.mark.integration


def test_kbench_round_on_cpu_build(cpu_build, tmp_path: Path) -> None:
    if not (cpu_build.bin_dir / "test-backend-ops").is_file():
        pytest.skip(f"the CPU build at {cpu_build.bin_dir} has no test-backend-ops (tuner builds it by default)")
    tiny = load_models()["tiny"]
    shapes = [shape_for_model(tiny, n_kv=256), shape_for_model(tiny, n_kv=512, kv_type="q8_0")]
    cands = {"upstream": {}, "VEC": force_kernel_env("VEC")}
    out = run_round(cpu_build.bin_dir, shapes, cands, log_dir=tmp_path / "logs", timeout=300)
    assert [(k.label, k.shape) for k in out] == [(c, s) for c in cands for s in shapes]
    for k in out:
        assert k.error == "" and k.us_per_run is not None and k.us_per_run > 0 and k.runs > 0, k
        assert k.kernel is None  # the CPU backend has no tuner hook, so no FA log line
        assert Path(k.log_file).read_text().startswith("$ ")

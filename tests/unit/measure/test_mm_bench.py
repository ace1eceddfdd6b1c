"""mm-bench's Python side: its cases file and the parser (its runner, :func:`tuner.measure.mm_bench.run_cases`,
is tested with the MMQ sweep in tests/unit/sweep/test_sweep_mmq_live.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.measure.test_fa_bench import fake_bench_build
from tuner.errors import UsageError
from tuner.measure import mm_bench
from tuner.measure.mm_bench import EXE, SOURCE, MmShape, build_mm_bench, mm_bench_cases, parse_mm_bench_output
from tuner.sweep.mmq import ENV

# Two lines of a run on the CPU build (2 cores: mm-bench -b CPU -n 8 -c 1 -t 2), then failures
RECORDED = """mm-bench backend=CPU iters=8 cache_mb=1 warmup=1
case=0 type=q4_0 m=256 k=256 ne11=8 copies=29 copy_bytes=36864 ops=29 us_per_op=9.414
case=1 type=q8_0 m=256 k=256 ne11=32 copies=16 copy_bytes=69632 ops=16 us_per_op=30.875
case=2 type=q4_K m=4096 k=4096 ne11=16 error=not supported
case=3 type=q6_K m=4096 k=4096 ne11=512 copies=15 copy_bytes=13762560 error=allocation failed
noise case=9
"""


def test_parse_output() -> None:
    got = parse_mm_bench_output(RECORDED)
    assert sorted(got) == [0, 1, 2, 3]
    assert (got[0].us_per_op, got[0].ops, got[0].copies, got[0].copy_bytes) == (9.414, 29, 29, 36864)
    # q8_0: 34 bytes a block of 32, 256 rows of 256 values; 1 MiB over that, plus one
    assert got[1].copy_bytes == 256 * 256 // 32 * 34 and got[1].copies == (1 << 20) // got[1].copy_bytes + 1
    assert got[1].error == "" and got[1].us_per_op == 30.875
    assert got[2].us_per_op is None and got[2].error == "not supported" and got[2].copies == 0
    assert got[3].us_per_op is None and got[3].error == "allocation failed" and got[3].copies == 15


def test_cases_file_has_one_line_a_shape() -> None:
    shapes = [MmShape(type="q4_0", m=256, k=256, ne11=8), MmShape(type="q4_K", m=4096, k=14336, ne11=512)]
    assert mm_bench_cases(shapes) == "q4_0 256 256 8\nq4_K 4096 14336 512\n"


# The stand-in mm-bench: its line says which choice it ran under; BLAS is slower.
FAKE = """\
echo "env=$GGML_TUNER_MMQ_CHOICES"
read -r t m k n < "$4"
us=100.5; case "$GGML_TUNER_MMQ_CHOICES" in *BLAS*) us=150.25;; esac
echo "case=0 type=$t m=$m k=$k ne11=$n copies=2 copy_bytes=9 ops=50 us_per_op=$us"
"""


def test_run_cases_passes_the_choice_and_nothing_else(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One process: the program cached beside the build, the hook's variable as given (the caller's own value
    never leaks into upstream's choice), the command line; bad input refused before anything runs."""
    assert mm_bench.ENV == ENV
    monkeypatch.setenv(ENV, "q4_0:0..=BLAS")
    bin_dir = fake_bench_build(tmp_path, SOURCE, EXE, FAKE)
    assert build_mm_bench(bin_dir).parent.parent == bin_dir.parent / EXE
    shapes = [MmShape(type="q4_K", m=64, k=256, ne11=16)]
    for env, us, log in (({}, 100.5, "up"), ({ENV: "q4_K:0..=BLAS"}, 150.25, "blas")):
        (case,) = mm_bench.run_cases(bin_dir, shapes, env, log_dir=tmp_path / log, backend="CUDA0", cache_mb=4)
        assert case.us_per_op == us and not case.error
        lines = (tmp_path / log / "mm-bench.log").read_text().splitlines()
        assert lines[1] == f"env={env.get(ENV, '')}"
        assert lines[0].endswith(f"-b CUDA0 -f {tmp_path / log / 'mm-bench-cases.txt'} -n 50 -c 4 -T 120")
    with pytest.raises(UsageError):
        mm_bench.run_cases(bin_dir, [MmShape(type="q4_K; rm", m=64, k=256, ne11=16)], {}, log_dir=tmp_path)
    with pytest.raises(UsageError):
        mm_bench.run_cases(bin_dir, shapes, {}, log_dir=tmp_path, backend="CUDA0 x")
    with pytest.raises(UsageError, match="libggml"):
        mm_bench.run_cases(tmp_path, shapes, {}, log_dir=tmp_path)

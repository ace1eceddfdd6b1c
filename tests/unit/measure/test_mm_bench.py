"""mm-bench's Python side: its cases file, the parser, and MmBenchTimer on a stand-in program (the
environment it forces, one sample a call, failures raised with the log, the MMQ sweep driven by it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.measure.test_fa_bench import fake_bench_build
from tuner.errors import TunerError, UsageError
from tuner.measure import mm_bench
from tuner.measure.mm_bench import (
    EXE,
    SOURCE,
    MmBenchTimer,
    MmShape,
    build_mm_bench,
    choice_env,
    mm_bench_cases,
    parse_mm_bench_output,
)
from tuner.sweep.mmq import ENV, MatmulTimer, MmqCell, MmqChoice, mmq_env, run_mmq_sweep

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


@pytest.mark.parametrize("backend", ["MMQ", "BLAS"])
def test_choice_env_is_the_hooks_grammar(backend: str) -> None:
    assert mm_bench.ENV == ENV
    want = mmq_env([MmqChoice(type="q4_K", lo=0, hi=None, backend=backend)])
    assert choice_env("q4_K", backend) == {ENV: want}
    assert choice_env("q4_K", None) == {}
    with pytest.raises(UsageError, match="not one of"):
        choice_env("q4_K", "cuBLAS")


# The stand-in mm-bench: its line says which choice it ran under; BLAS is slower; "crash" in the
# environment exits 3, q6_K is not supported.
FAKE = """\
echo "env=$GGML_TUNER_MMQ_CHOICES"
case "$GGML_TUNER_MMQ_CHOICES" in *crash*) exit 3;; esac
read -r t m k n < "$4"
if [ "$t" = q6_K ]; then echo "case=0 type=$t m=$m k=$k ne11=$n error=not supported"; exit 0; fi
us=100.5; case "$GGML_TUNER_MMQ_CHOICES" in *BLAS*) us=150.25;; esac
echo "case=0 type=$t m=$m k=$k ne11=$n copies=2 copy_bytes=9 ops=50 us_per_op=$us"
"""


def _fake_build(tmp_path: Path) -> Path:
    """A tuner build layout whose cached mm-bench is the stand-in script, so nothing is compiled."""
    return fake_bench_build(tmp_path, SOURCE, EXE, FAKE)


def test_timer_forces_the_backend_and_returns_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "q4_0:0..=BLAS")  # the caller's own value never leaks into upstream's choice
    bin_dir = _fake_build(tmp_path)
    assert build_mm_bench(bin_dir).parent.parent == bin_dir.parent / EXE
    timer = MmBenchTimer(bin_dir, log_dir=tmp_path / "logs", m=64, k=256, ggml_backend="CUDA0", cache_mb=4)
    assert timer("q4_K", 16, None) == [pytest.approx(100.5e-6)]
    assert timer("q4_K", 16, "MMQ") == [pytest.approx(100.5e-6)]
    assert timer("q4_K", 16, "BLAS") == [pytest.approx(150.25e-6)]
    logs = sorted((tmp_path / "logs").glob("*.log"))
    assert [p.name for p in logs] == [
        "mmbench-00001-q4_K-ne16-upstream.log",
        "mmbench-00002-q4_K-ne16-MMQ.log",
        "mmbench-00003-q4_K-ne16-BLAS.log",
    ]
    assert [p.read_text().splitlines()[1] for p in logs] == ["env=", "env=q4_K:0..=MMQ", "env=q4_K:0..=BLAS"]
    assert logs[0].read_text().splitlines()[0].endswith(f"-b CUDA0 -f {logs[0].with_suffix('.txt')} -n 50 -c 4")
    assert logs[0].with_suffix(".txt").read_text() == "q4_K 64 256 16\n"


def test_timer_raises_with_the_log(tmp_path: Path) -> None:
    timer = MmBenchTimer(_fake_build(tmp_path), log_dir=tmp_path / "logs", m=64, k=256)
    with pytest.raises(TunerError, match=r"not supported\); see .*mmbench-00001-q6_K-ne16-MMQ\.log"):
        timer("q6_K", 16, "MMQ")
    with pytest.raises(TunerError, match=r"exit code 3\); see .*mmbench-00002-crash-ne16-MMQ\.log"):
        timer("crash", 16, "MMQ")
    with pytest.raises(UsageError):
        timer("q4_K; rm", 16, None)
    with pytest.raises(UsageError):
        MmBenchTimer(tmp_path, log_dir=tmp_path, ggml_backend="CUDA0 x")
    with pytest.raises(UsageError, match="libggml"):
        MmBenchTimer(tmp_path, log_dir=tmp_path)("q4_K", 16, None)


CROSSOVER = """\
read -r t m k n < "$4"
# 1% jitter from /dev/urandom (the decision rule needs a noise to judge by); cuBLAS 40% faster from ne11 64
j=$(od -An -N1 -tu1 /dev/urandom | tr -d ' ')
us=$((10000 + j * 100 / 255))
case "$GGML_TUNER_MMQ_CHOICES" in *BLAS*) [ "$n" -ge 64 ] && us=$((us * 6 / 10));; esac
echo "case=0 type=$t m=$m k=$k ne11=$n copies=2 copy_bytes=9 ops=50 us_per_op=$us"
"""


def test_timer_drives_the_mmq_sweep(tmp_path: Path) -> None:
    bin_dir = fake_bench_build(tmp_path, SOURCE, EXE, CROSSOVER)
    timer: MatmulTimer = MmBenchTimer(bin_dir, log_dir=tmp_path / "logs", m=64, k=256)
    cells = [MmqCell(type="q4_K", ne11=n) for n in (16, 32, 64, 128)]
    choices = run_mmq_sweep(timer, cells, rounds=4)
    # the forced backend reaches the program through the hook's variable, and the sweep composes the crossover
    assert choices == (MmqChoice(type="q4_K", lo=64, hi=None, backend="BLAS"),)
    assert len(list((tmp_path / "logs").glob("*.log"))) == 4 * 3 * 4  # cells x configs x rounds

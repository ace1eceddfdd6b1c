"""mm-bench (tuner/data/mm_bench.cpp) compiled against the real CPU build and run on the CPU backend: two
small quantized multiplications with positive times, more copies of the weights for a larger cache
size, bad cases refused, and -T ending a case. A few seconds on 2 cores once the build
is cached."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tuner import _run
from tuner.measure.mm_bench import MmShape, build_mm_bench, mm_bench_cases, parse_mm_bench_output

pytestmark = pytest.mark.integration

SHAPES = [MmShape(type="q4_0", m=256, k=256, ne11=8), MmShape(type="q8_0", m=256, k=256, ne11=32)]


def test_mm_bench_on_cpu_build(cpu_shared_bin: Path, tmp_path: Path) -> None:
    exe = build_mm_bench(cpu_shared_bin)
    cases = tmp_path / "cases.txt"
    cases.write_text(mm_bench_cases(SHAPES))
    copies = {}
    for mb in (0, 1):
        res = _run.run([exe, "-b", "CPU", "-f", cases, "-n", "8", "-c", str(mb), "-t", "2"], timeout=120)
        got = parse_mm_bench_output(res.output)
        assert sorted(got) == [0, 1], res.output
        for c in got.values():
            assert c.error == "" and c.us_per_op is not None and math.isfinite(c.us_per_op) and c.us_per_op > 0
            assert c.copies * c.copy_bytes > mb << 20 and c.ops >= max(8, c.copies)
        copies[mb] = [got[i].copies for i in range(len(SHAPES))]
    assert copies[0] == [1, 1]
    assert all(big > 1 for big in copies[1])


def test_mm_bench_refuses_bad_cases(cpu_shared_bin: Path, tmp_path: Path) -> None:
    exe = build_mm_bench(cpu_shared_bin)
    for line, why in (("f32 256 256 8", "quantized ggml type"), ("q4_K 256 100 8", "block size 256")):
        cases = tmp_path / "cases.txt"
        cases.write_text(line + "\n")
        res = _run.run([exe, "-b", "CPU", "-f", cases], timeout=60, check=False)
        assert res.returncode == 2 and why in res.output, res.output


def test_a_case_over_its_time_limit_ends_the_program_with_124(cpu_shared_bin: Path, tmp_path: Path) -> None:
    """-T: the small case runs, the large one (minutes on one CPU thread) is abandoned after 1 s with exit
    code 124 and a message, so a hung case costs its limit and the caller runs the rest in a new process."""
    exe = build_mm_bench(cpu_shared_bin)
    cases = tmp_path / "cases.txt"
    cases.write_text(mm_bench_cases([SHAPES[0], MmShape(type="q8_0", m=4096, k=4096, ne11=4096)]))
    res = _run.run(
        [exe, "-b", "CPU", "-f", cases, "-n", "50", "-c", "0", "-t", "1", "-T", "1"], timeout=60, check=False
    )
    assert res.returncode == 124, res.output
    assert sorted(parse_mm_bench_output(res.output)) == [0] and "case timed out (-T): abandoned" in res.output

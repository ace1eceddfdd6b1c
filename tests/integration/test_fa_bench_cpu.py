"""fa-bench (tuner/data/fa_bench.cpp) compiled against the real CPU build and run on the CPU backend: two of
the ``tiny`` model's FA shapes, positive times, and more copies of the inputs for a larger cache size.
A few seconds on 2 cores once the build is cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner import _run
from tuner.measure.fa_bench import CASE_RE, build_fa_bench, fa_bench_cases, parse_bench_output, run_round_fast
from tuner.measure.kernel_bench import shape_for_model
from tuner.targets.models import load_models

pytestmark = pytest.mark.integration


def test_fa_bench_on_cpu_build(cpu_shared_bin: Path, tmp_path: Path) -> None:
    bin_dir = cpu_shared_bin
    tiny = load_models()["tiny"]
    shapes = [shape_for_model(tiny, n_kv=256), shape_for_model(tiny, n_kv=512, kv_type="q8_0")]
    out = run_round_fast(bin_dir, shapes, {"upstream": {}}, log_dir=tmp_path / "logs", iters=8, cache_mb=1)
    assert [k.shape for k in out] == shapes
    for k in out:
        assert k.error == "" and k.us_per_run is not None and k.us_per_run > 0 and k.runs >= 8, k
        assert k.kernel is None  # the CPU backend has no tuner hook, so no FA log line

    exe = build_fa_bench(bin_dir)  # cached: the same program
    cases = tmp_path / "cases.txt"
    cases.write_text(fa_bench_cases(shapes))
    copies = {}
    for mb in (0, 4):
        res = _run.run([exe, "-b", "CPU", "-f", cases, "-n", "4", "-c", str(mb), "-t", "1"], timeout=300)
        got = parse_bench_output(res.output, CASE_RE)
        assert sorted(got) == [0, 1]
        # two warm-up runs by default: on a CUDA build with graphs the timed run replays the captured graph
        assert " warmup=2" in res.output.splitlines()[0], res.output
        for c in got.values():
            assert c.us_per_op is not None and c.us_per_op > 0 and c.copies * c.copy_bytes > mb << 20
            # its wall time covers at least the timed run (and the warm-ups, the upload: the setup)
            assert c.wall_ms is not None and c.wall_ms * 1000 >= c.ops * c.us_per_op, c
        copies[mb] = [got[i].copies for i in range(len(shapes))]
    assert copies[0] == [1, 1]
    assert all(big > 1 for big in copies[4])


def test_fa_bench_refuses_bad_cases(cpu_shared_bin: Path, tmp_path: Path) -> None:
    exe = build_fa_bench(cpu_shared_bin)
    cases = tmp_path / "cases.txt"
    cases.write_text("64 64 4 3 256 1 f16\n")  # 4 heads over 3 KV heads
    res = _run.run([exe, "-b", "CPU", "-f", cases], timeout=60, check=False)
    assert res.returncode == 2 and "multiple of n_head_kv" in res.output


def test_a_target_adds_ops_to_short_cases_only(cpu_shared_bin: Path, tmp_path: Path) -> None:
    """-m: a case whose ITERS ops take less than the target times enough ops to last it (a count of the
    series 2^k, 3 * 2^k, at least ITERS and one per copy); one whose ops already last it keeps ITERS; -m 0
    times ITERS. Tens of milliseconds a case on the CPU backend."""
    exe = build_fa_bench(cpu_shared_bin)
    tiny = load_models()["tiny"]
    cases = tmp_path / "cases.txt"
    cases.write_text(fa_bench_cases([shape_for_model(tiny, n_kv=256), shape_for_model(tiny, n_kv=4096)]))
    base = [exe, "-b", "CPU", "-f", cases, "-n", "4", "-c", "0", "-t", "1"]
    plain = parse_bench_output(_run.run(base, timeout=120).output, CASE_RE)
    assert [plain[i].ops for i in (0, 1)] == [4, 4]
    target_ms = 15
    res = _run.run([*base, "-m", str(target_ms)], timeout=120)
    assert " target_ms=15" in res.output.splitlines()[0], res.output
    got = parse_bench_output(res.output, CASE_RE)
    for c in got.values():
        assert c.error == "" and c.us_per_op is not None and c.us_per_op > 0
        if c.ops > 4:  # calibrated: on the series, and about the target (timing noise: within a factor 3)
            k = c.ops if c.ops & (c.ops - 1) == 0 else c.ops // 3
            assert k & (k - 1) == 0 and c.ops % k == 0, c.ops
            assert target_ms * 1000 / 3 < c.ops * c.us_per_op < target_ms * 1000 * 3, c
        else:  # four ops already lasted the target
            assert c.ops == 4 and 4 * c.us_per_op >= target_ms * 1000 / 3, c
    assert got[0].ops > 4  # the short decode at n_kv 256 takes tens of microseconds an op
    assert got[0].ops >= got[1].ops
    bad = _run.run([*base, "-m", "-1"], timeout=60, check=False)
    assert bad.returncode == 2 and "-m must be an integer" in bad.output

"""fa-bench's Python side: its cases file, the parser on a recorded CPU run, a round on a stand-in program."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tuner.errors import UsageError
from tuner.measure.fa_bench import (
    CASE_RE,
    EXE,
    MAX_TARGET_MS,
    SOURCE,
    build_fa_bench,
    cached_bench,
    fa_bench_cases,
    parse_bench_output,
    run_round_fast,
)
from tuner.measure.kernel_bench import FaShape, shape_for_model
from tuner.targets.models import load_models

DATA = Path(__file__).resolve().parents[2] / "data" / "fa_bench"
REC = DATA / "cpu-output.txt"
TINY = load_models()["tiny"]
# The shapes of the recorded run (tests/data/fa_bench/README.md)
SHAPES = [
    shape_for_model(TINY, n_kv=256),
    shape_for_model(TINY, n_kv=512, kv_type="q8_0"),
    shape_for_model(TINY, n_kv=256, n_batch=8),
]
CACHE_BYTES = 2 << 20  # the recorded run's -c 2


def _copy_bytes(s: FaShape) -> int:
    """Q (F32) + K + V + mask (F16) of one case, from its shape (block sizes: ggml/src/ggml.c type_traits)."""
    blk, size = {"f16": (1, 2), "q8_0": (32, 34)}[s.kv_type]
    d, h, hk, n, b = s.head_dim, s.n_head, s.n_head_kv, s.n_kv, s.n_batch
    return 4 * d * h * b + 2 * (d * hk // blk * size * n) + 2 * n * b


def test_parse_recorded_cpu_output() -> None:
    got = parse_bench_output(REC.read_text(), CASE_RE)
    assert sorted(got) == list(range(len(SHAPES)))
    for i, s in enumerate(SHAPES):
        c = got[i]
        assert c.error == "" and c.us_per_op is not None and c.us_per_op > 0
        assert c.copy_bytes == _copy_bytes(s)
        # the fewest copies whose total exceeds the cache, and at least one op per copy
        assert c.copies == CACHE_BYTES // c.copy_bytes + 1 and c.copies * c.copy_bytes > CACHE_BYTES
        assert c.ops >= c.copies


def test_parse_errors_and_noise() -> None:
    head = "case=3 hsk=64 hsv=64 nh=8 nhkv=2 nkv=256 nb=1 type=f16"
    text = f"noise\n{head} error=not supported\n{head.replace('=3', '=4', 1)} copies=2 copy_bytes=9 error=graph compute failed\n"
    got = parse_bench_output(text, CASE_RE)
    assert sorted(got) == [3, 4]
    assert got[3].us_per_op is None and got[3].error == "not supported" and got[3].copies == 0
    assert got[4].us_per_op is None and got[4].error == "graph compute failed" and got[4].copies == 2
    assert got[3].wall_ms is None  # an output without wall lines (older programs)


def test_each_case_carries_its_wall_time() -> None:
    head = "case=0 hsk=64 hsv=64 nh=8 nhkv=2 nkv=256 nb=1 type=f16"
    text = f"{head} copies=4 copy_bytes=9 ops=64 us_per_op=20.000\nwall case=0 ms=31.5\nwall case=7 ms=1.0\n"
    got = parse_bench_output(text, CASE_RE)
    assert sorted(got) == [0] and got[0].wall_ms == 31.5  # a wall line of a case without its line is ignored


def test_cases_file_has_one_line_a_shape() -> None:
    lines = fa_bench_cases(SHAPES).splitlines()
    assert len(lines) == len(SHAPES)
    for line, s in zip(lines, SHAPES, strict=True):
        assert line.split() == [
            str(x) for x in (s.head_dim, s.head_dim_v, s.n_head, s.n_head_kv, s.n_kv, s.n_batch)
        ] + [s.kv_type]


def fake_bench_build(tmp_path: Path, source: str, exe_name: str, body: str) -> Path:
    """A tuner build layout (src/ggml/include, artifacts/<id>/bin with libggml*.so) whose cached bench program
    (``exe_name`` built from ``tuner/data/<source>``) is a shell script running ``body``, so nothing is compiled."""
    root = tmp_path / "b"
    bin_dir = root / "artifacts" / "x" / "bin"
    bin_dir.mkdir(parents=True)
    for lib in ("libggml.so", "libggml-base.so"):
        (bin_dir / lib).write_bytes(b"")
    inc = root / "src" / "ggml" / "include"
    inc.mkdir(parents=True)
    for h in ("ggml.h", "ggml-backend.h"):
        (inc / h).write_text("")
    exe = cached_bench(bin_dir, source, exe_name)
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def _fake_build(tmp_path: Path, body: str) -> Path:
    return fake_bench_build(tmp_path, SOURCE, EXE, body)


def test_run_round_fast_maps_cases_kernels_and_failures(tmp_path: Path) -> None:
    fa = "tuner-fa: D=64 DV=64 ne1=1 gqa=4 n_kv=256 type_k=f16 type_v=f16 kernel=$K (rule)"
    body = f'[ "$K" = crash ] && exit 3\necho "{fa}"\ncat "{REC}"\n'
    bin_dir = _fake_build(tmp_path, body)
    assert build_fa_bench(bin_dir) == bin_dir.parent / EXE / build_fa_bench(bin_dir).parent.name / EXE
    out = run_round_fast(
        bin_dir, SHAPES, {"vec": {"K": "VEC"}, "bad": {"K": "crash"}}, log_dir=tmp_path / "logs", timeout=30
    )
    assert [(k.label, k.shape) for k in out] == [(lbl, s) for lbl in ("vec", "bad") for s in SHAPES]
    want = parse_bench_output(REC.read_text(), CASE_RE)
    vec, bad = out[: len(SHAPES)], out[len(SHAPES) :]
    assert [(k.us_per_run, k.runs) for k in vec] == [(want[i].us_per_op, want[i].ops) for i in range(len(SHAPES))]
    assert [k.kernel for k in vec] == ["VEC", None, None]  # the log line names f16 decode at n_kv 256 only
    assert all(k.error == "" and k.backend == "CPU" for k in vec)
    assert all(k.us_per_run is None and "code 3" in k.error for k in bad)
    cmd = (tmp_path / "logs" / "fabench-vec.log").read_text().splitlines()[0]
    assert cmd.endswith(f"-b CPU -f {tmp_path / 'logs' / 'fa-bench-cases.txt'} -n 50 -c 128 -T 120")


def test_run_round_fast_passes_the_target_only_when_asked(tmp_path: Path) -> None:
    """target_ms becomes fa-bench's -m (its calibration); 0, the default, passes nothing, so a CPU run times
    iters ops as before."""
    bin_dir = _fake_build(tmp_path, f'cat "{REC}"\n')
    for target, tail in ((20, " -T 120 -m 20"), (0, " -T 120")):
        log_dir = tmp_path / f"logs{target}"
        out = run_round_fast(bin_dir, SHAPES, {"up": {}}, log_dir=log_dir, target_ms=target)
        assert all(k.error == "" and k.us_per_run is not None for k in out)
        assert (log_dir / "fabench-up.log").read_text().splitlines()[0].endswith(tail)
    for bad in (-1, MAX_TARGET_MS + 1):
        with pytest.raises(UsageError, match="target_ms"):
            run_round_fast(bin_dir, SHAPES, {"up": {}}, log_dir=tmp_path, target_ms=bad)


def test_run_round_fast_rejects_bad_input(tmp_path: Path) -> None:
    bin_dir = _fake_build(tmp_path, "exit 0\n")
    with pytest.raises(UsageError, match="No candidates"):
        run_round_fast(bin_dir, SHAPES, {}, log_dir=tmp_path)
    with pytest.raises(UsageError, match="backend name"):
        run_round_fast(bin_dir, SHAPES, {"a": {}}, log_dir=tmp_path, backend="CUDA0; rm")
    with pytest.raises(UsageError, match="label"):
        run_round_fast(bin_dir, SHAPES, {"a b": {}}, log_dir=tmp_path)
    with pytest.raises(UsageError, match="libggml"):
        run_round_fast(tmp_path, SHAPES, {"a": {}}, log_dir=tmp_path)

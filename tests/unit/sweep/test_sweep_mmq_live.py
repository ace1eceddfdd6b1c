"""The measured MMQ sweep (tuner/sweep/mmq.py) on a fake mm-bench runner: batching (3 processes a
round), rotation, composition over every size, failed samples, resume and the storage's identity."""

from __future__ import annotations

import dataclasses
import math
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.oracles import parse_mmq_choices
from tuner.errors import UsageError
from tuner.measure import mm_bench
from tuner.measure.fa_bench import BenchCase
from tuner.rounds.engine import AA, DEFAULT, pack_groups, round_processes
from tuner.rounds.store import SampleStore
from tuner.sweep import mmq
from tuner.sweep.mmq import MmqChoice, block_size, plan_mmq
from tuner.targets.archs import load_arch
from tuner.targets.models import load_model_shape

SM90 = load_arch("sm_90")
A, B = (4096, 4096), (2048, 8192)
BATCHES = (16, 64, 256, 1024, 2048, 4096)
TYPES = ("q4_K", "q8_0")
# planted truth: cuBLAS faster for q4_K from ne11 256 at A but only from 1024 at B; q8_0 from 64 at both
FROM = {("q4_K", A): 256, ("q4_K", B): 1024, ("q8_0", A): 64, ("q8_0", B): 64}
IDENT = {"arch": "sm_90", "backend": "CUDA0", "build": "/b", "timer": "mm-bench", "iters": "50", "cache_mb": "128"}


def _points(sizes: Sequence[tuple[int, int]] = (A, B)) -> list[mmq.MmqPoint]:
    return mmq.plan_points(plan_mmq(SM90, TYPES, BATCHES), sizes)[0]


class FakeRunCases:
    """run_cases' signature; records each process. ``aa_only``: cuBLAS times as MMQ does (noise only);
    ``fail``: (type, size, ne11, config label, round by call order) whose case prints an error."""

    def __init__(self, *, aa_only: bool = False, fail: set[tuple[Any, ...]] = frozenset(), seed: int = 5) -> None:  # type: ignore[assignment]
        self.calls: list[tuple[str, list[mm_bench.MmShape], Path]] = []
        self.graphs: list[bool] = []
        self.targets: list[int] = []
        self.aa_only, self.fail, self.rng = aa_only, fail, random.Random(seed)

    def __call__(
        self,
        bin_dir: Path,
        shapes: Sequence[mm_bench.MmShape],
        env: Mapping[str, str],
        *,
        log_dir: Path,
        backend: str,
        iters: int,
        cache_mb: int,
        timeout: float,
        cuda_graphs: bool,
        target_ms: int = 0,
    ) -> list[BenchCase]:
        label = log_dir.name
        self.calls.append((label, list(shapes), log_dir))
        self.graphs.append(cuda_graphs)
        self.targets.append(target_ms)
        blas = parse_mmq_choices(env[mm_bench.ENV]) if env else ()
        assert (label == "BLAS") == bool(blas), "only the forced process sets the hook's variable"
        drift = math.exp(self.rng.gauss(0, 0.01))  # per process: cancelled by pairing
        out = []
        for s in shapes:
            forced = any(c.type == s.type and c.covers(s.ne11) and c.backend == "BLAS" for c in blas)
            factor = 1.0
            if forced and not self.aa_only:
                factor = 0.7 if s.ne11 >= FROM[(s.type, (s.m, s.k))] else 1.4
            us = 10.0 * s.ne11 / 16 * factor * drift * math.exp(self.rng.gauss(0, 0.003))
            if (s.type, (s.m, s.k), s.ne11, label, log_dir.parent.name) in self.fail:
                out.append(BenchCase(ops=0, us_per_op=None, copies=1, copy_bytes=1, error="graph compute failed"))
            else:
                out.append(BenchCase(ops=50, us_per_op=us, copies=2, copy_bytes=1 << 20))
        return out


def _run(
    fake: FakeRunCases, store: SampleStore[mmq.MmqKey], points: Sequence[mmq.MmqPoint], rounds: int, **kw: Any
) -> tuple[int, int]:
    return mmq.run_mmq(
        points, limits=(rounds, rounds), store=store, bin_dir=Path("/b"), backend="CUDA0", log_dir=Path("/logs"),
        run_cases=fake, **kw,
    )  # fmt: skip


def _compose(store: SampleStore[mmq.MmqKey], points: Sequence[mmq.MmqPoint], rounds: int) -> mmq.MmqOutcome:
    return mmq.compose_mmq(points, store.samples(), limits=(rounds, rounds))


def test_projection_sizes_are_the_dense_multiplications_of_a_model() -> None:
    # llama-3.1-8b: Q/O 4096x4096, K/V 1024x4096, gate/up 14336x4096, down 4096x14336 (m x k, W [k, m])
    assert mmq.projection_sizes(load_model_shape("llama-3.1-8b")) == [
        (1024, 4096),
        (4096, 4096),
        (4096, 14336),
        (14336, 4096),
    ]
    sizes = mmq.like_sizes(mmq.DEFAULT_LIKE)
    assert len(sizes) == len(set(sizes)) and (896, 896) in sizes and (128, 896) in sizes  # qwen2.5-0.5b
    assert mmq.parse_size("256X512") == (256, 512)
    for bad in ("256", "0x256", "256x", "1x2x3", "256x 4"):
        with pytest.raises(UsageError, match="MxK"):
            mmq.parse_size(bad)


def test_types_whose_block_does_not_divide_k_are_left_out() -> None:
    points, skipped = mmq.plan_points(plan_mmq(SM90, ("q4_0", "q4_K"), (16,)), [(896, 896), (512, 2048)])
    assert block_size("q4_0") == 32 and block_size("q4_K") == 256 and block_size("iq4_xs") == 256
    assert skipped == [("q4_K", 896, 896)]
    assert [(p.type, p.size) for p in points] == [("q4_0", (512, 2048)), ("q4_K", (512, 2048)), ("q4_0", (896, 896))]


def test_three_processes_a_round_over_every_point_order_rotated(tmp_path: Path) -> None:
    points = _points()
    fake = FakeRunCases()
    ran, skipped = _run(fake, SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT), points, 3)
    assert (ran, skipped) == (9, 0) and len(fake.calls) == 9
    for r in range(3):
        calls = fake.calls[3 * r : 3 * r + 3]
        assert [c[0] for c in calls] == [mmq.LABELS[c] for c, _ in round_processes(mmq.MMQ, points, r)]
        assert all(c[2].parent.name == f"r{r}" for c in calls)
        for _, shapes, _ in calls:  # every type x size x ne11 in one cases file
            assert [(s.type, s.m, s.k, s.ne11) for s in shapes] == [(p.type, p.m, p.k, p.ne11) for p in points]
    assert [c for c, _ in round_processes(mmq.MMQ, points, 1)] == [AA, "BLAS", DEFAULT]
    assert mmq.blas_env(["q8_0", "q4_K", "q8_0"]) == {mm_bench.ENV: "q4_K:0..=BLAS,q8_0:0..=BLAS"}


def test_chunks_split_by_whole_sizes_only_when_too_many_cases(tmp_path: Path) -> None:
    points = _points()
    assert len(pack_groups(points, mmq.MMQ.group, mmq.MAX_CASES)) == 1
    chunks = pack_groups(points, mmq.MMQ.group, len(points) // 2)
    assert len(chunks) == 2 and [{p.size for p in ch} for ch in chunks] == [{B}, {A}]
    fake = FakeRunCases()
    assert _run(fake, SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT), points, 2, max_cases=len(points) // 2) == (
        12,
        0,
    )


def test_the_rule_for_a_type_holds_at_every_size(tmp_path: Path) -> None:
    store = SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT)
    points = _points()
    _run(FakeRunCases(), store, points, 5)
    out = _compose(store, points, 5)
    assert not out.no_verdict
    # at size A alone q4_K wins from 256, but B only from 1024: the composed rule starts at 1024
    won = {size: [d.depth for d in out.decisions[("q4_K", size)] if d.winner == "BLAS"] for size in (A, B)}
    assert won == {A: [256, 1024, 2048, 4096], B: [1024, 2048, 4096]}
    assert out.choices == (
        MmqChoice(type="q4_K", lo=1024, hi=None, backend="BLAS"),
        MmqChoice(type="q8_0", lo=64, hi=None, backend="BLAS"),
    )
    q4k = {d.depth: d for d in out.type_decisions["q4_K"]}
    assert q4k[256].winner is None and "2048x8192 (MMQ stays)" in q4k[256].reason
    report = mmq.mmq_report_text(out, points, limits=(5, 5), identity=IDENT, patch=True)
    assert "- `q4_K:1024..=BLAS`" in report and "### q4_K" in report and "| 256 | " in report
    assert "`upstream.patch` adds them" in report and "Points without a verdict" not in report


def test_an_aa_only_grid_composes_nothing(tmp_path: Path) -> None:
    store = SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT)
    points = _points()
    _run(FakeRunCases(aa_only=True), store, points, 5)
    out = _compose(store, points, 5)
    assert out.choices == () and not out.no_verdict and len(out.stats) == 4
    assert "MMQ (upstream's choice) stays" in mmq.no_choice_text(out)


def test_a_failed_sample_leaves_its_point_without_verdict_and_splits_the_interval(tmp_path: Path) -> None:
    store = SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT)
    points = _points()
    _run(FakeRunCases(fail={("q4_K", B, 2048, "BLAS", "r1")}), store, points, 5)
    out = _compose(store, points, 5)
    assert out.no_verdict == {("q4_K", (2048, 8192)): {2048: "BLAS round 2: graph compute failed"}}
    failed = [s for s in store.samples() if not s.ok]
    assert len(failed) == 1 and failed[0].us is None  # stored with its reason, never a time
    assert [c.text for c in out.choices] == ["q4_K:1024..2048=BLAS", "q4_K:4096..=BLAS", "q8_0:64..=BLAS"]
    report = mmq.mmq_report_text(out, points, limits=(5, 5), identity=IDENT, patch=False)
    assert "- q4_K 2048x8192 ne11 2048: BLAS round 2: graph compute failed" in report


def test_rerun_skips_recorded_processes_and_more_rounds_add_only_theirs(tmp_path: Path) -> None:
    points = _points()
    store = SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT)
    assert _run(FakeRunCases(), store, points, 2) == (6, 0)
    store.close()
    store = SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT)
    again = FakeRunCases()
    assert _run(again, store, points, 2) == (0, 6) and again.calls == []
    more = FakeRunCases()
    assert _run(more, store, points, 3) == (3, 6)
    assert {c[2].parent.name for c in more.calls} == {"r2"}
    assert len(store.samples()) == 3 * 3 * len(points)


def test_a_build_without_the_hook_stores_the_forced_config_failed(tmp_path: Path) -> None:
    store = SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT)
    points = _points([A])
    fake = FakeRunCases()
    assert _run(fake, store, points, 2, forced_reason="not run: no hook") == (4, 0)
    assert {c[0] for c in fake.calls} == {"upstream", "AA"}
    out = _compose(store, points, 2)
    assert out.choices == () and out.n_gaps == len(points)
    assert {w for ws in out.no_verdict.values() for w in ws.values()} == {"BLAS round 1: not run: no hook"}


def test_storage_of_another_identity_is_refused(tmp_path: Path) -> None:
    SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT).close()
    with pytest.raises(UsageError, match="another build"):
        SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", {**IDENT, "build": "/elsewhere"})
    with pytest.raises(UsageError, match="iters"):
        SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", {**IDENT, "iters": "20"})


def _bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "libggml.so").write_text("")
    return bin_dir


def test_cli_refuses_a_storage_of_another_build(tmp_path: Path) -> None:
    from tuner.cli.sweep_cmd import sweep

    SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", {**IDENT, "backend": "CPU"}).close()
    args = ["mmq", "--build", str(_bin(tmp_path)), "--backend", "CPU", "--type", "q8_0", "--ne11", "16"]
    args += ["--size", "256x256", "--storage", str(tmp_path / "s.db"), "-o", str(tmp_path / "out")]
    with pytest.raises(UsageError, match="another build") as err:
        CliRunner().invoke(sweep, args, standalone_mode=False, catch_exceptions=False)
    assert err.value.exit_code == 2  # one paragraph, exit 2 through tuner's error handler


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--type", "f16"], "not supported by MMQ"),
        (["--size", "256"], "MxK"),
        (["--like", "llama-9"], "Unknown model"),
        (["--type", "q4_K", "--size", "256x100"], "No point to time"),
        (["--arch", "sm_70"], "Turing"),
    ],
)
def test_cli_refuses_bad_input(tmp_path: Path, args: list[str], why: str) -> None:
    from tuner.cli.sweep_cmd import sweep

    full = ["mmq", "--build", str(_bin(tmp_path)), "-o", str(tmp_path / "out"), *args]
    with pytest.raises(UsageError, match=why):
        CliRunner().invoke(sweep, full, standalone_mode=False, catch_exceptions=False)


def test_cli_runs_the_sweep_through_the_runner_and_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA0 with a fake mm-bench: the hook probe runs once, three processes a round, the report written."""
    from tuner.cli.sweep_cmd import sweep

    fake, probes = FakeRunCases(aa_only=True), []
    monkeypatch.setattr(mm_bench, "run_cases", fake)
    monkeypatch.setattr(mm_bench, "mmq_hook_present", lambda *a, **kw: probes.append(kw) or True)
    out = tmp_path / "out"
    args = ["mmq", "--build", str(_bin(tmp_path)), "--type", "q4_K", "--type", "q8_0", "--ne11", "256"]
    args += ["--ne11", "1024", "--size", "4096x4096", "--size", "2048x8192", "--rounds", "3", "-o", str(out)]
    res = CliRunner().invoke(sweep, args)
    assert res.exit_code == 0, res.output
    assert len(probes) == 1 and len(fake.calls) == 9
    assert "choices (0):" in res.output and "points with a verdict: 8 of 8" in res.output
    assert (out / "report.md").is_file() and (out / "mmq.sqlite3").is_file() and not (out / "upstream.patch").exists()
    assert fake.graphs == [True] * 9  # CUDA graphs on by default, as llama.cpp runs a repeated graph
    assert fake.targets == [20] * 9  # a GPU backend's default: at least 20 ms of ops a case
    report = (out / "report.md").read_text()
    assert "- cuda_graphs: on" in report and "CUDA graphs were on in every process" in report


def test_cli_runs_every_config_without_cuda_graphs_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--no-cuda-graphs: every process (upstream, A/A, cuBLAS) without graphs, recorded in the storage and the
    report; the same storage is then refused with graphs on, and one made before the option (no cuda_graphs
    key: measured with graphs on) resumes with graphs on only."""
    import sqlite3

    from tuner.cli.sweep_cmd import sweep

    fake = FakeRunCases(aa_only=True)
    monkeypatch.setattr(mm_bench, "run_cases", fake)
    monkeypatch.setattr(mm_bench, "mmq_hook_present", lambda *a, **kw: True)
    out = tmp_path / "out"
    args = ["mmq", "--build", str(_bin(tmp_path)), "--type", "q8_0", "--ne11", "256", "--size", "4096x4096"]
    args += ["--rounds", "2", "-o", str(out)]
    res = CliRunner().invoke(sweep, [*args, "--no-cuda-graphs"])
    assert res.exit_code == 0, res.output
    assert sorted({c[0] for c in fake.calls}) == ["AA", "BLAS", "upstream"] and fake.graphs == [False] * 6
    with sqlite3.connect(out / "mmq.sqlite3") as c:
        assert dict(c.execute("SELECT key, value FROM meta").fetchall())["cuda_graphs"] == "off"
    report = (out / "report.md").read_text()
    assert "- cuda_graphs: off" in report and "`GGML_CUDA_DISABLE_GRAPHS=1`" in report
    with pytest.raises(UsageError, match="cuda_graphs"):
        CliRunner().invoke(sweep, args, standalone_mode=False, catch_exceptions=False)

    old = {**IDENT, "build": str((tmp_path / "bin").resolve()), "arch": "sm_90"}
    SampleStore(mmq.MMQ_TABLE, tmp_path / "old.db", old).close()
    with sqlite3.connect(tmp_path / "old.db") as c:  # as a file made before the option
        c.execute("DELETE FROM meta WHERE key = 'cuda_graphs'")
    SampleStore(mmq.MMQ_TABLE, tmp_path / "old.db", {**old, "cuda_graphs": "on"}).close()
    with sqlite3.connect(tmp_path / "old.db") as c:
        c.execute("DELETE FROM meta WHERE key = 'cuda_graphs'")
    with pytest.raises(UsageError, match="cuda_graphs"):
        SampleStore(mmq.MMQ_TABLE, tmp_path / "old.db", {**old, "cuda_graphs": "off"})


def test_run_cases_keeps_what_a_process_timed_before_it_died(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real runner on stand-in programs: printed times and error lines are kept; a process that dies
    keeps the cases it printed, the case it died in fails with the exit code and its log, and a new process
    runs the rest (as a CUDA error in one cuBLAS case did on an H100)."""
    exe = tmp_path / "mm-bench"
    exe.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "print('case=0 type=q8_0 m=256 k=256 ne11=8 copies=1 copy_bytes=1 ops=8 us_per_op=3.5')\n"
        "print('case=1 type=q8_0 m=256 k=256 ne11=16 copies=1 copy_bytes=1 error=graph compute failed')\n"
    )
    exe.chmod(0o755)
    monkeypatch.setattr(mm_bench, "build_mm_bench", lambda *a, **kw: exe)
    shapes = [mm_bench.MmShape(type="q8_0", m=256, k=256, ne11=n) for n in (8, 16, 32)]
    ok = mm_bench.run_cases(tmp_path, shapes, {}, log_dir=tmp_path / "a", iters=7)
    assert ok[0].us_per_op == 3.5 and not ok[0].error
    assert ok[1].us_per_op is None and ok[1].error.startswith("graph compute failed; see ")
    assert ok[2].us_per_op is None and "no result for case 2" in ok[2].error

    # dies (exit 3) in any case with ne11 32, after printing the cases before it
    exe.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "lines = open(sys.argv[sys.argv.index('-f') + 1]).read().split()\n"
        "for i in range(0, len(lines), 4):\n"
        "    t, m, k, n = lines[i:i + 4]\n"
        "    if n == '32':\n"
        "        sys.exit(3)\n"
        "    print(f'case={i // 4} type={t} m={m} k={k} ne11={n} copies=1 copy_bytes=1 ops=8 us_per_op={n}.0')\n"
    )
    shapes = [mm_bench.MmShape(type="q8_0", m=256, k=256, ne11=n) for n in (8, 16, 32, 64, 128)]
    got = mm_bench.run_cases(tmp_path, shapes, {}, log_dir=tmp_path / "b")
    assert [c.us_per_op for c in got] == [8.0, 16.0, None, 64.0, 128.0]
    assert got[2].error == f"mm-bench exited with code 3; see {tmp_path / 'b' / 'mm-bench.log'}"
    assert (tmp_path / "b" / "mm-bench-cases-2.txt").read_text().split()[3::4] == ["64", "128"]

    # a program that dies in every case is started MAX_RESTARTS + 1 times, then the rest is not run
    shapes = [mm_bench.MmShape(type="q8_0", m=256, k=256, ne11=32) for _ in range(mm_bench.MAX_RESTARTS + 3)]
    dead = mm_bench.run_cases(tmp_path, shapes, {}, log_dir=tmp_path / "c")
    assert all(c.us_per_op is None for c in dead)
    assert sum(c.error.startswith("mm-bench exited with code 3") for c in dead) == mm_bench.MAX_RESTARTS + 1
    assert dead[-1].error.startswith(f"not run: mm-bench failed {mm_bench.MAX_RESTARTS + 1} times")
    with pytest.raises(UsageError, match="environment"):
        mm_bench.run_cases(tmp_path, shapes, {mm_bench.ENV: "q8_0:0..=BLAS; rm"}, log_dir=tmp_path / "d")


def test_run_cases_turns_cuda_graphs_off_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cuda_graphs=False sets GGML_CUDA_DISABLE_GRAPHS for the process; True (the default) removes an inherited
    one, so the setting recorded is the one that ran."""
    exe = tmp_path / "mm-bench"
    exe.write_text(
        f"#!{sys.executable}\n"
        "import os\n"
        "us = 2.0 if 'GGML_CUDA_DISABLE_GRAPHS' in os.environ else 1.0\n"
        "print(f'case=0 type=q8_0 m=256 k=256 ne11=8 copies=1 copy_bytes=1 ops=8 us_per_op={us}')\n"
    )
    exe.chmod(0o755)
    monkeypatch.setattr(mm_bench, "build_mm_bench", lambda *a, **kw: exe)
    monkeypatch.setenv(mm_bench.GRAPHS_ENV, "1")
    shapes = [mm_bench.MmShape(type="q8_0", m=256, k=256, ne11=8)]
    on = mm_bench.run_cases(tmp_path, shapes, {}, log_dir=tmp_path / "on")
    off = mm_bench.run_cases(tmp_path, shapes, {}, log_dir=tmp_path / "off", cuda_graphs=False)
    assert (on[0].us_per_op, off[0].us_per_op) == (1.0, 2.0)


def test_run_cases_passes_the_target_and_the_cli_records_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """target_ms reaches mm-bench as -m (none at 0: ITERS ops a case); the CLI's default is 20 on a GPU backend
    and 0 on the CPU, recorded in the storage, and a storage made before the option (ITERS ops) resumes at 0 only."""
    import sqlite3

    from tuner.cli.sweep_cmd import sweep

    exe = tmp_path / "mm-bench"
    exe.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "m = sys.argv[sys.argv.index('-m') + 1] if '-m' in sys.argv else '0'\n"
        "print(f'case=0 type=q8_0 m=256 k=256 ne11=8 copies=1 copy_bytes=1 ops=8 us_per_op={1 + int(m)}')\n"
    )
    exe.chmod(0o755)
    monkeypatch.setattr(mm_bench, "build_mm_bench", lambda *a, **kw: exe)
    shapes = [mm_bench.MmShape(type="q8_0", m=256, k=256, ne11=8)]
    assert mm_bench.run_cases(tmp_path, shapes, {}, log_dir=tmp_path / "a")[0].us_per_op == 1.0
    assert mm_bench.run_cases(tmp_path, shapes, {}, log_dir=tmp_path / "b", target_ms=20)[0].us_per_op == 21.0
    with pytest.raises(UsageError, match="target_ms"):
        mm_bench.run_cases(tmp_path, shapes, {}, log_dir=tmp_path / "c", target_ms=-1)

    fake = FakeRunCases(aa_only=True)
    monkeypatch.setattr(mm_bench, "run_cases", fake)
    monkeypatch.setattr(mm_bench, "mmq_hook_present", lambda *a, **kw: True)
    args = ["mmq", "--build", str(_bin(tmp_path)), "--type", "q8_0", "--ne11", "256", "--size", "4096x4096"]
    res = CliRunner().invoke(sweep, [*args, "--rounds", "2", "--backend", "CPU", "-o", str(tmp_path / "cpu")])
    assert res.exit_code == 0, res.output
    assert fake.targets == [0] * 6  # the CPU backend times ITERS ops a case
    with sqlite3.connect(tmp_path / "cpu" / "mmq.sqlite3") as c:
        assert dict(c.execute("SELECT key, value FROM meta").fetchall())["target_ms"] == "0"
    old = {**IDENT, "build": str((tmp_path / "bin").resolve()), "arch": "sm_90", "target_ms": "0"}
    SampleStore(mmq.MMQ_TABLE, tmp_path / "old.db", old).close()
    with sqlite3.connect(tmp_path / "old.db") as c:  # as a file made before the option
        c.execute("DELETE FROM meta WHERE key = 'target_ms'")
    SampleStore(mmq.MMQ_TABLE, tmp_path / "old.db", old).close()
    with pytest.raises(UsageError, match="target_ms"):
        SampleStore(mmq.MMQ_TABLE, tmp_path / "old.db", {**old, "target_ms": "20"})


def test_a_time_budget_starts_no_round_that_would_end_past_it(tmp_path: Path, clock: Any) -> None:
    from tuner.rounds.budget import Budget, BudgetReached

    class Slow(FakeRunCases):  # every process takes 10 s, about twice the sweep's estimate for 24 cases
        def __call__(self, *args: Any, **kw: Any) -> Any:
            clock.now += 10.0
            return super().__call__(*args, **kw)

    points = _points()
    store = SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT)
    first = Slow()
    # a round (three processes) is started whole or not at all: the first ends at 30 s; the second, priced at
    # the estimate alone (~15 s) would start, but priced at the first round's overrun it would end at 60 s,
    # past the 57 s budget, so it does not start
    with pytest.raises(BudgetReached, match=r"chunk 1 round 2"):
        _run(first, store, points, 3, budget=Budget.counted_from(None, 57))
    assert len(first.calls) == 3 and clock.now - 1000.0 <= 57
    rest = Slow()
    assert _run(rest, store, points, 3) == (6, 3)  # the rerun starts none of the stored processes again
    assert len(store.samples()) == 3 * 3 * len(points)


def test_cli_exits_3_where_the_time_budget_stopped_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Any
) -> None:
    from tuner.cli.sweep_cmd import sweep

    fake = FakeRunCases(aa_only=True)

    def slow(*args: Any, **kw: Any) -> Any:
        clock.now += 30.0
        return fake(*args, **kw)

    monkeypatch.setattr(mm_bench, "run_cases", slow)
    monkeypatch.setattr(mm_bench, "mmq_hook_present", lambda *a, **kw: True)
    out = tmp_path / "out"
    args = ["mmq", "--build", str(_bin(tmp_path)), "--type", "q4_K", "--ne11", "256", "--size", "4096x4096"]
    res = CliRunner().invoke(sweep, [*args, "--rounds", "3", "--time-budget", "100", "-o", str(out)])
    assert res.exit_code == 3, res.output
    assert len(fake.calls) == 3 and "time budget reached before chunk 1 round 2" in res.output
    assert "Run the same command again to go on; report.md and upstream.patch are not written yet" in res.output
    assert (out / "mmq.sqlite3").is_file() and not (out / "report.md").exists()
    res = CliRunner().invoke(sweep, [*args, "--rounds", "3", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert len(fake.calls) == 9 and (out / "report.md").is_file()
    # through tuner's own entry point (click without standalone mode, which returns an Exit instead of raising)
    from tuner import cli

    monkeypatch.setattr(sys, "argv", ["tuner", "sweep", *args, "--rounds", "4", "--time-budget", "1", "-o", str(out)])
    with pytest.raises(SystemExit) as stop:
        cli.main()
    assert stop.value.code == 3


def test_a_size_above_the_noise_ceiling_says_so_in_its_cells(tmp_path: Path) -> None:
    """Size B's processes jitter by tens of percent at small batches (launch-bound on a noisy machine): its A/A
    noise, the median over its batch sizes, is above the ceiling, so it claims nothing even at a batch size
    whose own interval is narrow; the report says why instead of a bare `MMQ`."""

    class Jittery(FakeRunCases):
        def __call__(self, bin_dir: Path, shapes: Sequence[mm_bench.MmShape], *a: Any, **kw: Any) -> Any:
            out = super().__call__(bin_dir, shapes, *a, **kw)
            return [
                dataclasses.replace(c, us_per_op=c.us_per_op * math.exp(self.rng.gauss(0, 0.5)))
                if (s.m, s.k) == B and s.ne11 <= 1024 and c.us_per_op
                else c
                for s, c in zip(shapes, out, strict=True)
            ]

    store = SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT)
    points = _points()
    _run(Jittery(), store, points, 5)
    out = _compose(store, points, 5)
    q8 = {d.depth: d for d in out.decisions[("q8_0", B)]}
    assert q8[4096].winner is None and "ceiling" in q8[4096].reason  # its own ratio is clean: 1/0.7
    assert out.stats[("q8_0", B)][4096].noise_pct < 5
    report = mmq.mmq_report_text(out, points, limits=(5, 5), identity=IDENT, patch=False)
    row = next(line for line in report.splitlines() if line.startswith("| 4096 |") and "2048x8192" in line)
    assert "MMQ (size too noisy)" in row and "2048x8192 (too noisy)" in row
    assert "above the 20% ceiling" in report

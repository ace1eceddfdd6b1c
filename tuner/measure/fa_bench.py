"""``fa-bench``: ``FLASH_ATTN_EXT`` timed at exact shapes on cold K/V, in a fraction of test-backend-ops' time.

``test-backend-ops perf`` (:func:`tuner.measure.kernel_bench.run_round`) repeats each case for at least one
second (``tests/test-backend-ops.cpp``) on one set of inputs, so K/V that fit the GPU's L2 stay there.
``tuner/data/fa_bench.cpp`` builds the same op on ggml's public API (llama.cpp's tensor layout,
:func:`tuner.measure.kernel_bench.fa_test_file`), allocates copies of its inputs that together exceed
``cache_mb`` (128 MB by default: more than an H100's 50 MB L2) and times one graph of ``iters`` ops cycling
through them, after two warm-up runs (the second is where ggml's CUDA backend captures the CUDA graph the
timed run replays, as a model's graph is; ``tuner/data/bench_common.h``).

:func:`build_bench` compiles it (and mm-bench, :mod:`tuner.measure.mm_bench`) once per build with ``$CXX``
(else ``c++``) against the build's ``ggml/include`` and ``libggml*.so``, into ``<bin>/../fa-bench/<source
hash>/``. :func:`run_round_fast` is :func:`~tuner.measure.kernel_bench.run_round` on it, the kernel read back
from the FA log (``GGML_TUNER_FA_LOG=1``; the variable that forces a kernel works here unchanged).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from tuner import _run, log
from tuner.errors import UsageError
from tuner.measure.kernel_bench import FaShape, KernelTime, check_candidates, ggml_h_above, run_candidates
from tuner.paths import package_data

SOURCE = "fa_bench.cpp"
COMMON_HEADER = "bench_common.h"
"""What fa-bench and mm-bench share (command line, backend, timed run), included from beside their source."""
EXE = "fa-bench"
CASE_TIMEOUT_S = 120
"""fa-bench's and mm-bench's ``-T``: seconds one case may take before the program exits 124 (their largest
take seconds), so a hung case costs this much, not the whole call's timeout."""
TARGET_MS = 20
"""fa-bench's ``-m`` for the sweep on a GPU: each case times at least this many milliseconds of ops (0, the
CPU backend's value: ``iters`` ops).

fa-bench calibrates (``tuner/data/bench_common.h`` ``time_case``): where the timed graph of ``iters`` ops
was shorter than the target, it times one of enough ops to last it (2^k or 3 * 2^k ops, at most 16384).
Why 20 ms: the H100's first sweep's A/A pairs strayed ±19-42% where a timed graph lasted about 1 ms
(n_kv ≤ 4096) and ±3-9% at 1.4-13 ms (docs/sweep.md); 20 ms is above every graph measured then and keeps
the timer's jitter (tens of µs) under 0.2% of a run. Each case costs about three runs of it (two warm-ups),
so the sweep's time grows linearly with it (:func:`tuner.sweep.live.fa_bench_case_s`). Why in the program,
not an op count from Python: an op's time depends on the GPU, build and forced kernel (up to 2x), which a
cost model would need for every cell; the price is that two processes may time op counts one step apart."""
MAX_TARGET_MS = 60_000
"""The largest ``-m`` fa-bench and mm-bench take."""

CASE_RE = re.compile(
    r"^case=(?P<case>\d+) hsk=(?P<hsk>\d+) hsv=(?P<hsv>\d+) nh=(?P<nh>\d+) nhkv=(?P<nhkv>\d+) nkv=(?P<nkv>\d+)"
    r" nb=(?P<nb>\d+) type=(?P<type>\w+)(?: copies=(?P<copies>\d+) copy_bytes=(?P<copy_bytes>\d+))?"
    r"(?: ops=(?P<ops>\d+) us_per_op=(?P<us>[0-9.]+)| error=(?P<error>.*))\s*$"
)
"""One case line of fa-bench's output (``tuner/data/fa_bench.cpp``)."""


def _lib_dir(bin_dir: Path, exe_name: str = EXE) -> Path:
    for d in (bin_dir, bin_dir.parent / "lib", bin_dir.parent / "lib64"):
        if (d / "libggml.so").exists() and (d / "libggml-base.so").exists():
            return d
    raise UsageError(
        f"No libggml.so and libggml-base.so in {bin_dir} (or ../lib); {exe_name} links against a build's shared "
        "ggml libraries (tuner's builds put them beside the binaries)."
    )


def cached_bench(bin_dir: Path, source_name: str, exe_name: str) -> Path:
    """Where :func:`build_bench` keeps ``exe_name``: ``<bin>/../<exe_name>/<hash>/<exe_name>``, the hash of
    ``tuner/data/<source_name>`` and the shared header (a change to either is a new program)."""
    digest = hashlib.sha256(package_data(source_name).read_bytes() + package_data(COMMON_HEADER).read_bytes())
    return Path(bin_dir).resolve().parent / exe_name / digest.hexdigest()[:16] / exe_name


def build_bench(
    bin_dir: Path, source_name: str, exe_name: str, *, ggml_h: Path | None = None, timeout: float = 300.0
) -> Path:
    """``tuner/data/<source_name>`` compiled as ``exe_name`` for the build whose binaries and ``libggml*.so``
    are in ``bin_dir``, on first use (at :func:`cached_bench`).

    Raises:
        UsageError: No shared ggml libraries, headers or compiler.
        TunerError: The compiler failed (the message names its log).
    """
    bin_dir = Path(bin_dir).resolve()
    lib = _lib_dir(bin_dir, exe_name)
    inc = Path(ggml_h or ggml_h_above(bin_dir)).resolve().parent
    if not (inc / "ggml-backend.h").is_file():
        raise UsageError(f"{inc} has no ggml-backend.h; {exe_name} needs a ggml tree with the backend API.")
    src = package_data(source_name)
    exe = cached_bench(bin_dir, source_name, exe_name)
    out_dir = exe.parent
    if exe.is_file() and os.access(exe, os.X_OK):
        return exe
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{exe_name}.{os.getpid()}"
    cxx = os.environ.get("CXX") or "c++"
    if (compiler := shutil.which(cxx)) is None:
        raise UsageError(f"No C++ compiler {cxx!r} on PATH to build {exe_name}; install one or set CXX.")
    cmd = [compiler, "-O2", "-std=c++17", f"-I{inc}", str(src), f"-L{lib}", "-lggml", "-lggml-base"]
    cmd += [f"-Wl,-rpath,{lib}", "-o", str(tmp)]
    with log.step(f"Compiling {exe_name} against {lib}"):
        try:
            _run.run(cmd, log_file=out_dir / "compile.log", timeout=timeout, what=f"{exe_name} compile")
            os.replace(tmp, exe)
        finally:
            tmp.unlink(missing_ok=True)
    return exe


def build_fa_bench(bin_dir: Path, *, ggml_h: Path | None = None, timeout: float = 300.0) -> Path:
    """fa-bench for the build in ``bin_dir`` (:func:`build_bench`)."""
    return build_bench(bin_dir, SOURCE, EXE, ggml_h=ggml_h, timeout=timeout)


def bench_cmd(
    exe: Path, backend: str, cases_file: Path, *, iters: int, cache_mb: int, target_ms: int, threads: int | None
) -> list[str]:
    """The command line of fa-bench or mm-bench (``tuner/data/bench_common.h`` reads both)."""
    cmd = [str(exe), "-b", backend, "-f", str(cases_file), "-n", str(iters), "-c", str(cache_mb)]
    cmd += ["-T", str(CASE_TIMEOUT_S)]  # a hung case ends the process in minutes, not at the call's timeout
    if target_ms:
        cmd += ["-m", str(target_ms)]
    if threads is not None:
        cmd += ["-t", str(threads)]
    return cmd


def fa_bench_cases(shapes: Sequence[FaShape]) -> str:
    """fa-bench's cases file for ``shapes``: case ``i`` is line ``i``."""
    return "".join(
        f"{s.head_dim} {s.head_dim_v} {s.n_head} {s.n_head_kv} {s.n_kv} {s.n_batch} {s.kv_type}\n" for s in shapes
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchCase:
    """One case line of a bench program's output (fa-bench, mm-bench)."""

    ops: int = 0
    """Ops timed (0 where the case did not run)."""
    us_per_op: float | None = None
    copies: int = 0
    """Copies of the inputs the ops cycled through (0 where the line does not say)."""
    copy_bytes: int = 0
    """Bytes of one copy (fa-bench: Q, K, V and the mask; mm-bench: the weights)."""
    error: str = ""
    wall_ms: float | None = None
    """The case's whole wall time in the program (allocation, upload, graph builds, every run; None where
    the output has no ``wall`` line): less the timed ops, the setup a sweep's budget pays per case."""


WALL_RE = re.compile(r"^wall case=(?P<case>\d+) ms=(?P<ms>[0-9.]+)\s*$")
"""The line fa-bench and mm-bench print after each case (``bench::main_loop`` in ``tuner/data/bench_common.h``)."""


def parse_bench_output(text: str, case_re: re.Pattern[str]) -> dict[int, BenchCase]:
    """{case index: its :class:`BenchCase`} from a bench program's output, its lines matched by ``case_re``
    (groups ``case``, ``copies``, ``copy_bytes``, ``ops``, ``us``, ``error``); a case that did not run has
    ``us_per_op`` None and ``error`` saying why."""
    out: dict[int, BenchCase] = {}
    walls: dict[int, float] = {}
    for line in text.splitlines():
        if not (m := case_re.match(line.strip())):
            if w := WALL_RE.match(line.strip()):
                walls[int(w["case"])] = float(w["ms"])
            continue
        copies, size = int(m["copies"] or 0), int(m["copy_bytes"] or 0)
        if m["us"] is not None:
            out[int(m["case"])] = BenchCase(ops=int(m["ops"]), us_per_op=float(m["us"]), copies=copies, copy_bytes=size)
        else:
            err = m["error"].strip() or "failed"
            out[int(m["case"])] = BenchCase(copies=copies, copy_bytes=size, error=err)
    return {i: dataclasses.replace(c, wall_ms=walls.get(i)) for i, c in out.items()}


def run_round_fast(
    bin_dir: Path,
    shapes: Sequence[FaShape],
    candidates: Mapping[str, Mapping[str, str]],
    *,
    log_dir: Path,
    backend: str = "CPU",
    ggml_h: Path | None = None,
    timeout: float = 600.0,
    iters: int = 50,
    cache_mb: int = 128,
    threads: int | None = None,
    target_ms: int = 0,
) -> list[KernelTime]:
    """:func:`tuner.measure.kernel_bench.run_round` on fa-bench (compiled beside ``bin_dir`` on first use): a
    process per candidate over every shape; ``runs`` of each :class:`KernelTime` is the ops timed.

    ``iters`` ops are timed per shape (at least one per copy of the inputs, whose copies together exceed
    ``cache_mb`` MiB, so every op reads cold K/V), more where ``target_ms`` (fa-bench's calibration,
    :data:`TARGET_MS`) asks; ``threads``: CPU backend threads (default half the cores, as test-backend-ops).
    """
    envs = check_candidates(shapes, candidates, backend, "a ggml backend name")
    if not 1 <= iters <= 1_000_000 or not 0 <= cache_mb <= 1 << 20:
        raise UsageError(f"fa-bench: iters must be in [1, 1000000] and cache_mb in [0, 1048576] ({iters}, {cache_mb}).")
    if not 0 <= target_ms <= MAX_TARGET_MS:
        raise UsageError(f"fa-bench: target_ms must be in [0, {MAX_TARGET_MS}] ({target_ms}).")
    exe = build_fa_bench(bin_dir, ggml_h=ggml_h)
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    cases_file = log_dir / "fa-bench-cases.txt"
    cases_file.write_text(fa_bench_cases(shapes))
    cmd = bench_cmd(exe, backend, cases_file, iters=iters, cache_mb=cache_mb, target_ms=target_ms, threads=threads)

    def parse(text: str) -> dict[int, tuple[int, float | None, str]]:
        return {i: (c.ops, c.us_per_op, c.error) for i, c in parse_bench_output(text, CASE_RE).items()}

    return run_candidates(cmd, envs, shapes, parse, log_dir=log_dir, backend=backend, timeout=timeout, tool="fa-bench")

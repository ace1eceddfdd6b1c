"""``mm-bench``: a quantized ``MUL_MAT`` timed on cold weights; the live MMQ-vs-cuBLAS timer.

``tuner/data/mm_bench.cpp``, fa-bench's sibling (:mod:`tuner.measure.fa_bench`), times ``ggml_mul_mat(W, X)``
as llama.cpp's graph makes it for a dense projection (quantized ``W`` [k, m] as src0, F32 ``X`` [k, ne11] as
src1, ``ne11`` the batch size) over copies of ``W`` exceeding ``cache_mb``, after two warm-up runs. It does
not choose MMQ or cuBLAS: a CUDA build with tuner's MMQ hook (:func:`tuner.sweep.mmq.patched_mmq_hook`) reads
``GGML_TUNER_MMQ_CHOICES`` (``tuner sweep mmq`` forces cuBLAS with :func:`tuner.sweep.mmq.blas_env`, or
leaves it unset for upstream's choice).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from tuner.errors import UsageError
from tuner.measure.exe import run_tool
from tuner.measure.fa_bench import CASE_TIMEOUT_S, BenchCase, bench_cmd, build_bench, parse_bench_output

SOURCE = "mm_bench.cpp"
EXE = "mm-bench"
ENV = "GGML_TUNER_MMQ_CHOICES"
"""The MMQ hook's environment variable (:data:`tuner.sweep.mmq.ENV`)."""
GRAPHS_ENV = "GGML_CUDA_DISABLE_GRAPHS"
"""Set (to anything), ggml's CUDA backend runs every graph directly instead of capturing it as a CUDA graph:
``ggml_cuda_graph::is_enabled`` in ``ggml/src/ggml-cuda/common.cuh`` tests ``getenv(...) != nullptr``."""

CASE_RE = re.compile(
    r"^case=(?P<case>\d+) type=(?P<type>\w+) m=(?P<m>\d+) k=(?P<k>\d+) ne11=(?P<ne11>\d+)"
    r"(?: copies=(?P<copies>\d+) copy_bytes=(?P<copy_bytes>\d+))?"
    r"(?: ops=(?P<ops>\d+) us_per_op=(?P<us>[0-9.]+)| error=(?P<error>.*))\s*$"
)
"""One case line of mm-bench's output (``tuner/data/mm_bench.cpp``)."""

_TYPE = re.compile(r"[a-z][a-z0-9_]{0,31}", re.IGNORECASE)
MAX_RESTARTS = 8
"""How many times :func:`run_cases` starts mm-bench again after a process died, for the cases after it."""
_ENV_VALUE = re.compile(r"[A-Za-z0-9_:.,=-]{0,4096}")
_HOOK_ABORT = "is not TYPE:LO..HI=MMQ|BLAS"
"""What the MMQ hook prints when it aborts on a value it cannot parse (:data:`tuner.sweep.mmq.ENV`)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class MmShape:
    """One multiplication: weights of quant ``type`` [k, m] by F32 activations [k, ne11]."""

    type: str
    m: int
    k: int
    ne11: int


MmBenchCase = BenchCase


def build_mm_bench(bin_dir: Path, *, ggml_h: Path | None = None, timeout: float = 300.0) -> Path:
    """mm-bench for the build in ``bin_dir`` (:func:`tuner.measure.fa_bench.build_bench`)."""
    return build_bench(bin_dir, SOURCE, EXE, ggml_h=ggml_h, timeout=timeout)


def mm_bench_cases(shapes: Sequence[MmShape]) -> str:
    """mm-bench's cases file for ``shapes``: case ``i`` is line ``i``."""
    return "".join(f"{s.type} {s.m} {s.k} {s.ne11}\n" for s in shapes)


def parse_mm_bench_output(text: str) -> dict[int, BenchCase]:
    """{case index: its :class:`BenchCase`} from mm-bench's output (:data:`CASE_RE`); a case that did not
    run has ``us_per_op`` None and ``error`` saying why."""
    return parse_bench_output(text, CASE_RE)


def _check_run(shapes: Sequence[MmShape], env: Mapping[str, str], backend: str, iters: int, cache_mb: int) -> None:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", backend):
        raise UsageError(f"Backend name {backend!r} is not a ggml backend name such as CUDA0 or CPU.")
    if not 1 <= iters <= 1_000_000 or not 0 <= cache_mb <= 1 << 20:
        raise UsageError(f"mm-bench: iters must be in [1, 1000000] and cache_mb in [0, 1048576] ({iters}, {cache_mb}).")
    for s in shapes:
        if not _TYPE.fullmatch(s.type) or not all(1 <= v <= 1 << 20 for v in (s.m, s.k, s.ne11)):
            raise UsageError(f"mm-bench: bad case {s} (a ggml type name; m, k and ne11 in [1, 1048576]).")
    for key, value in env.items():
        if key != ENV or not _ENV_VALUE.fullmatch(value):
            raise UsageError(f"mm-bench: environment {key}={value!r} is not {ENV} with an entry list.")


def run_cases(
    bin_dir: Path,
    shapes: Sequence[MmShape],
    env: Mapping[str, str],
    *,
    log_dir: Path,
    backend: str = "CPU",
    iters: int = 50,
    cache_mb: int = 128,
    threads: int | None = None,
    ggml_h: Path | None = None,
    timeout: float = 600.0,
    cuda_graphs: bool = True,
    target_ms: int = 0,
) -> list[BenchCase]:
    """One mm-bench process over every shape, ``env`` (:data:`ENV` with the hook's entries, or empty for
    upstream's choice) added to an environment without :data:`ENV`; one :class:`BenchCase` per shape, in order.
    ``cuda_graphs`` False sets :data:`GRAPHS_ENV` (each graph run directly); True removes it, so an inherited
    value cannot turn graphs off unrecorded. ``target_ms`` above 0 (mm-bench's ``-m``): enough ops a case for
    the timed graph to last that long. A case without a time carries its reason and the log's path. A
    process that dies (a CUDA error in one case) or times out keeps the cases it printed; the case it was in
    fails, and a new process (``mm-bench-2.log``...) runs the rest, at most :data:`MAX_RESTARTS` times.

    Raises:
        UsageError: A bad backend name, shape, environment, ``iters`` or ``cache_mb`` (checked before
            anything is written), or mm-bench cannot be built for ``bin_dir``.
    """
    _check_run(shapes, env, backend, iters, cache_mb)
    if not 0 <= target_ms <= 60_000:
        raise UsageError(f"mm-bench: target_ms must be in [0, 60000] (got {target_ms}).")
    exe = build_mm_bench(bin_dir, ggml_h=ggml_h)
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    out: list[BenchCase] = []  # the cases in order, each process's after the one its predecessor died in
    attempt = 0
    while len(out) < len(shapes):
        attempt += 1
        part = f"-{attempt}" if attempt > 1 else ""
        cases_file, log_file = log_dir / f"mm-bench-cases{part}.txt", log_dir / f"mm-bench{part}.log"
        cases_file.write_text(mm_bench_cases(shapes[len(out) :]))
        cmd = bench_cmd(exe, backend, cases_file, iters=iters, cache_mb=cache_mb, target_ms=target_ms, threads=threads)
        log_file.unlink(missing_ok=True)
        base = {k: v for k, v in os.environ.items() if k not in (ENV, GRAPHS_ENV)}
        if not cuda_graphs:
            base[GRAPHS_ENV] = "1"
        rc, error = run_tool(cmd, env, base=base, log_file=log_file, timeout=timeout, what=EXE)
        if not error and rc == 124:
            error = f"mm-bench: the case ran longer than {CASE_TIMEOUT_S} s (-T) and was abandoned; see {log_file}"
        elif not error and rc != 0:
            error = f"mm-bench exited with code {rc}; see {log_file}"
        got = parse_mm_bench_output(log_file.read_text(errors="replace") if log_file.is_file() else "")
        n = len(shapes) - len(out)
        printed = next((i for i in range(n) if i not in got), n)
        out += [_checked_case(got[i], log_file) for i in range(printed)]
        if not error:
            out += [BenchCase(error=f"no result for case {i}; see {log_file}") for i in range(printed, n)]
            break
        if printed < n:  # the case it died in
            out.append(BenchCase(error=error))
        if attempt > MAX_RESTARTS:
            why = f"not run: mm-bench failed {attempt} times in this call (last: {error})"
            out += [BenchCase(error=why) for _ in range(len(out), len(shapes))]
            break
    return out


def _checked_case(c: BenchCase, log_file: Path) -> BenchCase:
    """A printed case as a sample: its time, or None with the reason (an ``error=`` line, a bad time)."""
    if c.us_per_op is None:
        return dataclasses.replace(c, error=f"{c.error}; see {log_file}")
    if not (math.isfinite(c.us_per_op) and c.us_per_op > 0):
        return dataclasses.replace(c, us_per_op=None, error=f"time {c.us_per_op} us; see {log_file}")
    return c


def mmq_hook_present(
    bin_dir: Path, *, log_dir: Path, backend: str, ggml_h: Path | None = None, timeout: float = 120.0
) -> bool:
    """Whether the build's backend reads :data:`ENV` (tuner's MMQ hook in ``mmq.cu``): one small case run
    with a value the hook cannot parse, which makes a hooked build abort naming it at its first quantized
    multiplication; a build without the hook times the case and ignores the variable."""
    _check_run([], {}, backend, 1, 0)
    exe = build_mm_bench(bin_dir, ggml_h=ggml_h)
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    cases_file, log_file = log_dir / "mm-bench-cases.txt", log_dir / "mm-bench.log"
    cases_file.write_text(mm_bench_cases([MmShape(type="q8_0", m=64, k=64, ne11=16)]))
    base = {k: v for k, v in os.environ.items() if k != ENV}
    cmd = [str(exe), "-b", backend, "-f", str(cases_file), "-n", "1", "-c", "0"]
    if run_tool(cmd, {ENV: "tuner-probe"}, base=base, log_file=log_file, timeout=timeout, what=EXE)[1]:
        return False
    return _HOOK_ABORT in (log_file.read_text(errors="replace") if log_file.is_file() else "")

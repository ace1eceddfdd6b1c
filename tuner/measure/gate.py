"""Correctness gate: llama.cpp's test-backend-ops on a candidate build.

``test-backend-ops test -o OP -b BACKEND [-p REGEX]`` evaluates every case of an op on the backend
and on the CPU reference and compares them by NMSE (FA threshold 5e-4). With ``-b CPU`` the CPU
backend is compared against the CPU *reference* implementation, so it does real work there too.

Console format (``tests/test-backend-ops.cpp``; both eras): per case ``  OP(params): OK|FAIL|not supported [..]``,
where ``[OP] ERR = x > y`` / ``[OP] NMSE = x > y`` text can precede the status (and, with ``-j``,
interleave with other lines); a summary ``  N/M tests passed``; era ``mma`` also lists
``Failing tests:``. A backend the binary does not have is printed as ``Skipping`` and counts as
passed, so :func:`run_check` insists that the requested backend actually ran.

:func:`run_gate` runs the check once per FlashAttention kernel the candidate can select, forcing
it through ``GGML_TUNER_FA_RULES="decode:0-=K,prefill:0-=K"`` (design.md runtime hook), so a broken
tile config of a kernel the default heuristics would not pick for the test shapes is still caught.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from tuner import log
from tuner.errors import UsageError, close_matches
from tuner.measure.exe import check_env, find_exe, run_tool
from tuner.measure.kernel_bench import force_kernel_env

KERNELS = ("VEC", "TILE", "MMA")
"""Kernels the era-``mma`` runtime hook can force."""

# ggml type names test-backend-ops prints for type_K/type_V.
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CASE = re.compile(r"(?P<case>[A-Z][A-Z0-9_]*\((?:[^()]|\([^()]*\))*\)): (?P<rest>.*)$")
_SUMMARY = re.compile(r"^\s*(\d+)/(\d+) tests passed")
_BACKEND_INIT = re.compile(r"^Backend (\d+)/(\d+): (\S+)")
_BACKEND_STATUS = re.compile(r"^\s*Backend (\S+): (OK|FAIL)\s*$")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckResult:
    """Outcome of test-backend-ops for one or more ops on one backend."""

    passed: bool
    """True only if the backend ran, at least one case ran, and none failed or crashed."""
    n_ok: int = 0
    n_fail: int = 0
    n_not_supported: int = 0
    failing: tuple[str, ...] = ()
    """Names of failed cases, ``OP(params)``; a crash adds the case being printed when it died."""
    log_file: Path | None
    summary: str
    """One line for people: counts, or what went wrong."""
    backend_ran: bool = True
    returncode: int = 0
    seconds: float = 0.0
    crashed: str = ""
    """The case whose line was open when the process died, if it died."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class GateResult:
    """Outcome of :func:`run_gate`: one CheckResult per forced kernel."""

    passed: bool
    per_kernel: Mapping[str, CheckResult]
    failing: tuple[str, ...]
    """``KERNEL: case`` for every failed case."""
    summary: str
    log_file: Path | None


def parse_check_output(text: str, *, backend: str | None = None) -> CheckResult:
    """Parse test-backend-ops ``test`` console output (ANSI colours stripped) into a CheckResult with
    ``log_file=None`` and ``returncode=0``; with ``backend``, output where it was skipped counts as not run."""
    n_ok = n_fail = n_ns = 0
    failing: dict[str, None] = {}  # ordered, each case once
    summary_counts: list[tuple[int, int]] = []
    devices: list[str] = []
    ran: set[str] = set()
    in_failing = False
    open_case = ""
    lines = _ANSI.sub("", text).splitlines()
    for i, line in enumerate(lines):
        if in_failing:
            if line.startswith("  ") and "(" in line:
                failing[line.strip()] = None
                continue
            in_failing = False
        if line.strip() == "Failing tests:":
            in_failing = True
            continue
        if m := _BACKEND_INIT.match(line):
            devices.append(m.group(3))
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            if not nxt.startswith("Skipping"):
                ran.add(m.group(3))
        elif m := _SUMMARY.match(line):
            summary_counts.append((int(m.group(1)), int(m.group(2))))
        elif not _BACKEND_STATUS.match(line) and (m := _CASE.search(line)):  # "Backend X: OK" is no case
            rest, case = m.group("rest").rstrip(), m.group("case")
            open_case = ""
            if rest.startswith("not supported") or rest.startswith("skipping"):
                n_ns += 1
            elif rest.endswith("FAIL"):
                n_fail += 1
                failing[case] = None
            elif rest.endswith("OK"):
                n_ok += 1
            else:
                open_case = case  # printed, status pending (or the process died here)
    if summary_counts:
        # The summary is authoritative (per-case lines can be garbled by -j interleaving).
        n_ok = sum(p for p, _ in summary_counts)
        n_fail = sum(t - p for p, t in summary_counts)
    backend_ran = bool(ran) if backend is None else backend in ran
    passed = backend_ran and bool(summary_counts) and n_fail == 0 and not failing and (n_ok > 0)
    if not backend_ran:
        summ = f"backend {backend or '?'} did not run (devices: {', '.join(devices) or 'none'})"
    elif not summary_counts:
        summ = f"no summary line: test-backend-ops stopped early ({n_ok} OK, {n_fail} FAIL so far)"
    else:
        summ = f"{n_ok}/{n_ok + n_fail} cases passed, {n_ns} not supported"
        if n_ok + n_fail == 0:
            summ += " (no case matched the filter)"
    return CheckResult(
        passed=passed,
        n_ok=n_ok,
        n_fail=n_fail,
        n_not_supported=n_ns,
        failing=tuple(failing),
        log_file=None,
        summary=summ,
        backend_ran=backend_ran,
        crashed=open_case,
    )


def params_for_model(head_dim: int, kv_type: str | None = None, *, head_dim_v: int | None = None) -> str:
    """A ``-p`` regex selecting FLASH_ATTN_EXT cases of a model's attention shape (K head size ``hsk``, V head
    size ``hsv``, default the same; ``kv_type`` None keeps every KV type).

    Example:
        >>> params_for_model(64)
        'hsk=64,hsv=64,'
    """
    hv = head_dim if head_dim_v is None else head_dim_v
    for name, v in (("head_dim", head_dim), ("head_dim_v", hv)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1024:
            raise UsageError(f"{name} must be an integer in [1, 1024] (got {v!r}).")
    rx = f"hsk={head_dim},hsv={hv},"
    if kv_type is not None:
        if kv_type not in KV_TYPES:
            raise UsageError(
                f"Unknown KV type {kv_type!r}; use one of {', '.join(KV_TYPES)}." + close_matches(kv_type, KV_TYPES)
            )
        rx += f".*type_K={kv_type},type_V={kv_type},"
    return rx


def params_for_shapes(shapes: Iterable[tuple[int | None, str | None]]) -> str | None:
    """A ``-p`` regex selecting the FLASH_ATTN_EXT cases of any of ``shapes`` ((head size, K/V type) pairs, as
    :func:`params_for_model` takes them). None, every case, where there is no shape or one of any head size
    (a rule without ``D`` matches them all).

    Example:
        >>> params_for_shapes([(128, "f16"), (64, None)])
        '(hsk=64,hsv=64,)|(hsk=128,hsv=128,.*type_K=f16,type_V=f16,)'
    """
    pairs = set(shapes)
    sized = [(D, kv) for D, kv in pairs if D is not None]
    if not pairs or len(sized) < len(pairs):
        return None
    return "|".join(f"({params_for_model(D, kv)})" for D, kv in sorted(sized, key=lambda s: (s[0], s[1] or "")))


def run_check(
    bin_dir: Path,
    *,
    ops: Sequence[str] = ("FLASH_ATTN_EXT",),
    backend: str = "CUDA0",
    params: str | None = None,
    env: Mapping[str, str] = {},
    jobs: int | None = None,
    log_dir: Path,
    timeout: float = 3600.0,
    label: str = "check",
) -> CheckResult:
    """Run ``test-backend-ops test`` for each op (name or regex, one call each) on one backend and aggregate;
    ``params`` is the ``-p`` regex (:func:`params_for_model`), ``jobs`` ``-j`` (era ``mma`` only), every op's
    output goes to ``log_dir/<label>.log``. A failing or crashing case is data (``passed=False``).

    Raises:
        UsageError: Bad arguments, a missing binary, or a backend the binary does not have.
    """
    exe = find_exe(Path(bin_dir), "test-backend-ops")
    if not ops:
        raise UsageError("No ops given; pass at least one, e.g. --ops FLASH_ATTN_EXT.")
    for op in ops:
        if not isinstance(op, str) or not op or "," in op or "\0" in op:
            raise UsageError(f"Op {op!r} is invalid; give op names like FLASH_ATTN_EXT, one per --ops.")
    if not _NAME.match(backend):
        raise UsageError(f"Backend {backend!r} is invalid; use a device name like CUDA0, ROCm0 or CPU.")
    if params is not None:
        try:
            re.compile(params)
        except re.error as err:
            raise UsageError(f"--params {params!r} is not a valid regex ({err}).") from err
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= 256):
        raise UsageError(f"jobs must be an integer in [1, 256] (got {jobs!r}).")
    env = check_env(env)
    log_file = Path(log_dir) / f"{label}.log"
    start = time.monotonic()
    flags = (["-p", params] if params is not None else []) + (["-j", str(jobs)] if jobs is not None else [])
    parts: list[CheckResult] = []
    for op in ops:  # one `test-backend-ops test -o OP -b BACKEND FLAGS...` call each
        cmd = [str(exe), "test", "-o", op, "-b", backend, *flags]
        lines: list[str] = []
        rc, why = run_tool(cmd, env, log_file=log_file, timeout=timeout, on_line=lines.append, what="test-backend-ops")
        if why:  # timeout: a failed result (returncode -1), not a crash
            parts.append(CheckResult(passed=False, log_file=log_file, summary=f"{op}: {why}", returncode=-1))
            continue
        part = parse_check_output("\n".join(lines), backend=backend)
        if not part.backend_ran:
            raise UsageError(
                f"test-backend-ops in {bin_dir} has no device {backend!r}: {part.summary}. "
                "Pass --backend with one of those devices, or check the build has that backend."
            )
        if rc != 0 and part.passed:
            part = dataclasses.replace(part, passed=False, summary=part.summary + f", exit code {rc}")
        if rc != 0 and part.crashed and part.crashed not in part.failing:
            part = dataclasses.replace(
                part, failing=part.failing + (part.crashed,), summary=part.summary + f"; died during {part.crashed}"
            )
        parts.append(dataclasses.replace(part, summary=f"{op}: {part.summary}", returncode=rc, log_file=log_file))
    # passes only if every op's call passed; failing cases de-duplicated; the exit code is the last non-zero one
    return CheckResult(
        passed=all(p.passed for p in parts),
        n_ok=sum(p.n_ok for p in parts),
        n_fail=sum(p.n_fail for p in parts),
        n_not_supported=sum(p.n_not_supported for p in parts),
        failing=tuple(dict.fromkeys(f for p in parts for f in p.failing)),
        log_file=log_file,
        summary="; ".join(p.summary for p in parts),
        backend_ran=True,
        returncode=next((p.returncode for p in reversed(parts) if p.returncode), 0),
        seconds=time.monotonic() - start,
        crashed=next((p.crashed for p in parts if p.crashed and p.returncode), ""),
    )


def run_gate(
    bin_dir: Path,
    kernels: Sequence[str] = KERNELS,
    *,
    ops: Sequence[str] = ("FLASH_ATTN_EXT",),
    backend: str = "CUDA0",
    params: str | None = None,
    env: Mapping[str, str] = {},
    jobs: int | None = None,
    log_dir: Path,
    timeout: float = 3600.0,
) -> GateResult:
    """Check a candidate (era ``mma`` patched ``fattn.cu``) once per kernel it can select, forcing each through
    the runtime hook (so ``env`` must not set ``GGML_TUNER_FA_RULES``); the rest as :func:`run_check`. A failed
    GateResult (infeasible) names the kernel and case that failed."""
    for k in kernels:
        if (ku := str(k).upper()) not in KERNELS:
            raise UsageError(f"Unknown kernel {k!r}; use {', '.join(KERNELS)}." + close_matches(ku, KERNELS))
    ks = list(dict.fromkeys(str(k).upper() for k in kernels))
    if not ks:
        raise UsageError("No kernels given; use e.g. --kernels VEC,TILE,MMA.")
    if "GGML_TUNER_FA_RULES" in env:
        raise UsageError("run_gate sets GGML_TUNER_FA_RULES itself (one forced kernel per run); drop it from env.")
    check = functools.partial(
        run_check, bin_dir, ops=ops, backend=backend, params=params, jobs=jobs, log_dir=log_dir, timeout=timeout
    )
    per: dict[str, CheckResult] = {}
    for k in ks:
        with log.step(f"test-backend-ops {','.join(ops)} on {backend}, kernel forced to {k}"):
            per[k] = check(env={**env, **force_kernel_env(k)}, label=f"check-{k}")
    failing = tuple(f"{k}: {c}" for k, r in per.items() for c in r.failing)
    bad = [k for k, r in per.items() if not r.passed]
    if bad:
        first = per[bad[0]]
        where = f", first failing case {first.failing[0]}" if first.failing else f" ({first.summary})"
        summary = f"infeasible: kernel {bad[0]} fails{where}"
    else:
        summary = "; ".join(f"{k}: {r.summary}" for k, r in per.items())
    return GateResult(passed=not bad, per_kernel=per, failing=failing, summary=summary, log_file=per[ks[-1]].log_file)

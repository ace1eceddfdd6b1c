"""This machine's CPUs as a llama-bench run sees them, and CPU masks (``--cpu-mask 0-3``).

A host-paced scenario (docs/knobs.md: the CPU, not the GPU, limits decode) is reproduced by pinning every llama-bench
process to a few cores with ``taskset``: the command line then carries the pin, so a logged or exported command
reproduces it exactly. The threads knob's legal values follow the CPUs a run may use: the mask's, else this process's
affinity (a container's cpuset, or the whole machine).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import platform
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import psutil

from tuner.errors import UsageError

_SYS_CPU = Path("/sys/devices/system/cpu")
_MAX_CPU_ID = 1 << 16


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cpus:
    """The CPUs a llama-bench run may use."""

    ids: tuple[int, ...]
    """CPU ids, ascending: the --cpu-mask's, else this process's affinity."""
    physical: int
    """Physical cores among them (SMT siblings counted once)."""
    masked: bool
    """Whether ``ids`` come from a --cpu-mask (llama-bench is then pinned to them)."""

    @property
    def logical(self) -> int:
        return len(self.ids)


def _available() -> tuple[int, ...]:
    """CPUs this process may run on (what taskset can pin a child to)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def mask_text(ids: Sequence[int]) -> str:
    """``0-3,6``: the shortest taskset -c list for ``ids``."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive ids
    for c in sorted(set(ids)):
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def parse_cpu_mask(text: str, *, available: Sequence[int] | None = None) -> tuple[int, ...]:
    """Parse a CPU list (``0-3``, ``0,2``, ``0-1,4``) and check every CPU is present here.

    UsageError, naming the CPUs there are, for a malformed or empty list or one naming CPUs this machine does
    not have (or this process may not use).
    """
    avail = tuple(available) if available is not None else _available()
    have = mask_text(avail)

    def absent(what: str) -> UsageError:
        return UsageError(
            f"--cpu-mask {text!r} names CPU(s) {what} that this machine does not have (or that this "
            f"process may not use): the CPUs here are {have} ({len(avail)} in all). Pick a subset of "
            f"them, e.g. --cpu-mask {mask_text(avail[:2])}."
        )

    ids: set[int] = set()
    for part in str(text).strip().split(","):
        m = re.fullmatch(r"\s*(\d{1,9})\s*(?:-\s*(\d{1,9})\s*)?", part)
        if not m:
            raise UsageError(
                f"--cpu-mask {text!r} is not a CPU list: give CPU ids and ranges separated by commas, "
                f"e.g. --cpu-mask 0-3 or --cpu-mask 0,2 (this machine's CPUs: {have})."
            )
        lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if hi < lo:
            raise UsageError(
                f"--cpu-mask {text!r}: range {part.strip()!r} is empty; write LOW-HIGH with LOW <= HIGH, "
                f"e.g. 0-3 (this machine's CPUs: {have})."
            )
        if hi >= _MAX_CPU_ID:  # no machine has that many; do not build the range
            raise absent(part.strip())
        ids.update(range(lo, hi + 1))
    missing = sorted(ids - set(avail))
    if missing:
        raise absent(mask_text(missing))
    return tuple(sorted(ids))


def _core_key(cpu: int) -> tuple[str, str] | None:
    topo = _SYS_CPU / f"cpu{cpu}" / "topology"
    try:
        return ((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip())
    except OSError:
        return None


def _physical_cores(ids: Sequence[int]) -> int:
    """Physical cores among ``ids``: distinct (package, core) pairs; without sysfs, the machine's
    physical/logical ratio applied to ``ids`` (psutil)."""
    keys = [_core_key(c) for c in ids]
    if ids and all(k is not None for k in keys):
        return len(set(keys))
    logical, physical = psutil.cpu_count() or len(ids), psutil.cpu_count(logical=False) or len(ids)
    return max(1, round(len(ids) * physical / logical))


def host_cpus(mask: Sequence[int] | None = None) -> Cpus:
    """The CPUs a run may use: ``mask`` (already checked by :func:`parse_cpu_mask`), else this process's affinity."""
    ids = tuple(sorted(set(mask))) if mask else _available()
    return Cpus(ids=ids, physical=_physical_cores(ids), masked=bool(mask))


def check_threads(value: object, cpus: Cpus) -> int:
    """A thread count for llama-bench ``-t``: an integer in 1..the CPUs the run may use, else UsageError
    (more threads than CPUs would only wait on each other)."""
    where = f"--cpu-mask {mask_text(cpus.ids)}" if cpus.masked else "this machine"
    text = str(value).strip()
    if not re.fullmatch(r"-?\d{1,9}", text) or not 1 <= int(text) <= cpus.logical:
        raise UsageError(
            f"llama-bench -t {text!r}: threads must be an integer in 1..{cpus.logical} ({where} has "
            f"{cpus.logical} CPU(s) on {cpus.physical} physical core(s)); more threads than CPUs only makes "
            f"them wait on each other. Use e.g. -t {cpus.physical}."
        )
    return int(text)


def pin_command(mask: Sequence[int] | None) -> list[str]:
    """The argv prefix that pins a child to ``mask`` (``taskset -c 0-1``); ``[]`` without a mask.

    UsageError when a mask is given but ``taskset`` (util-linux) is not installed.
    """
    if not mask:
        return []
    exe = shutil.which("taskset")
    if exe is None:
        raise UsageError(
            "--cpu-mask pins llama-bench with `taskset`, which is not on PATH. Install util-linux "
            "(e.g. apt-get install util-linux) or run without --cpu-mask."
        )
    return [exe, "-c", mask_text(mask)]


def host_has_amx() -> bool:
    try:
        return "amx_int8" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@functools.cache
def host_isa() -> str:
    """This CPU's instruction-set identity: the machine and a digest of its feature flags.

    A ``GGML_NATIVE=ON`` build compiles with ``-march=native``, so its binaries hold this CPU's
    instructions: the build cache keys such builds on this, or a home folder shared between hosts
    (NFS, a VM image restored on another host) runs another CPU's build and dies of SIGILL. Read from
    ``/proc/cpuinfo`` without starting a process, as a cache hit must not.
    """
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.strip() in ("flags", "Features", "isa"):  # x86, Arm, RISC-V
                flags = " ".join(sorted(value.split()))
                break
    except OSError:
        flags = platform.processor()
    return f"{platform.machine()}-{hashlib.sha256(flags.encode()).hexdigest()[:12]}"


def crash_hint(returncode: int, cmd: Sequence[str]) -> str:
    """A known cause for a llama-bench that died of SIGILL or SIGSEGV, or ''."""
    if returncode == -4:
        return (
            " llama-bench was killed by SIGILL (an illegal instruction): the binary uses instructions this CPU "
            "lacks, as a -march=native build made on another CPU does. tuner keys native builds on the CPU, so "
            "a build copied or shared from elsewhere (a carried pack, a shared $TUNER_HOME) is the usual cause: "
            "remove it from $TUNER_HOME/builds/ and rerun to build it here."
        )
    if returncode != -11 or "--repack" in cmd or not host_has_amx():
        return ""
    # A native CPU build on an AMX host repacks quantized weights into the AMX buffer, and upstream's
    # ggml_backend_amx_mul_mat segfaults on some of them (llama.cpp issue 20824).
    return (
        " llama-bench was killed by SIGSEGV on a CPU with AMX: a known llama.cpp crash in the AMX "
        "matrix multiply for quantized weights (llama.cpp issue 20824). Search with an f16 model "
        "(leave out --quant), or check by hand that `llama-bench --repack 0` runs."
    )

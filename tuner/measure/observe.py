"""Observers that sample CPU and GPU utilization while a benchmark runs (is decode host-bound: the CPU
pegged while the GPU idles between tokens?).

An :class:`Observer` is a daemon thread that every ~100 ms records the CPU use of this process's child tree
(psutil CPU-time deltas, percent of one core: 200 = two busy cores) and, through NVML (``pynvml``) or AMD
SMI (``amdsmi``) when importable and a GPU is present, the busiest GPU's utilization and device memory in
use (NaN otherwise; nothing fails). Samples are timestamped, so a caller can split one llama-bench call
into per-test windows (:meth:`Observer.summary`). A caller can also take a sample at an event it sees
(:meth:`Observer.mark`, e.g. llama-bench's ``--progress`` line): a mark reads the CPU time of the tree and
of every thread, so the CPU use *between two marks* is exact, and :meth:`Observer.timed_summary` sums it
over the timed windows only, the busiest thread beside the total. Memory is the peak above the level at
the observer's start, so other processes' allocations are (approximately) not counted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType

import psutil

from tuner import log
from tuner.extras import install_command

logger = logging.getLogger(__name__)

INTERVAL_S = 0.1


@dataclasses.dataclass(frozen=True, kw_only=True)
class Observation:
    """Summary of the samples inside one time window."""

    cpu_util_mean: float = math.nan
    """Mean CPU utilization of the child process tree, percent of one core."""
    cpu_util_max: float = math.nan
    gpu_util_mean: float = math.nan
    """Mean GPU utilization (busiest device per sample), percent; NaN without NVML/AMD SMI."""
    gpu_util_max: float = math.nan
    cpu_core_max: float = math.nan
    """CPU use of the busiest thread of the tree, percent of one core (timed windows only; NaN otherwise)."""
    gpu_mem_mb: float = math.nan
    """Peak device memory above the level at observer start, MiB; NaN without NVML/AMD SMI."""
    n_samples: int = 0
    gpu_source: str = ""
    """``nvml``, ``amdsmi`` or '' (no GPU observer)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mark:
    """A sample taken at a caller's event (:meth:`Observer.mark`)."""

    t: float
    """Monotonic time."""
    tag: str
    cpu_s: float
    """Cumulative CPU seconds of the child tree since the observer started."""
    threads: Mapping[tuple[int, int], float]
    """CPU seconds of every live thread of the tree, by (pid, thread id)."""


@dataclasses.dataclass(frozen=True)
class _GpuProbe:
    """One GPU library's devices (NVML, AMD SMI) and how to read one: its utilization percent and memory used
    in MiB."""

    name: str
    handles: Sequence[object]
    util: Callable[[object], float]
    mem_mib: Callable[[object], float]
    shutdown: Callable[[], object]

    def read(self) -> tuple[float, float]:
        """(utilization percent of the busiest device, total memory used MiB)."""
        return max(self.util(h) for h in self.handles), sum(self.mem_mib(h) for h in self.handles)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.shutdown()


def _nvml_probe(nvml: ModuleType) -> _GpuProbe:
    nvml.nvmlInit()
    if (count := nvml.nvmlDeviceGetCount()) == 0:
        nvml.nvmlShutdown()
        raise RuntimeError("no NVIDIA device")
    return _GpuProbe(
        "nvml",
        [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)],
        lambda h: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu),
        lambda h: float(nvml.nvmlDeviceGetMemoryInfo(h).used) / 2**20,
        lambda: nvml.nvmlShutdown(),
    )


def _amdsmi_probe(amdsmi: ModuleType) -> _GpuProbe:
    amdsmi.amdsmi_init()
    if not (handles := list(amdsmi.amdsmi_get_processor_handles())):
        amdsmi.amdsmi_shut_down()
        raise RuntimeError("no AMD device")
    return _GpuProbe(
        "amdsmi",
        handles,
        lambda h: float(amdsmi.amdsmi_get_gpu_activity(h)["gfx_activity"]),
        lambda h: float(amdsmi.amdsmi_get_gpu_vram_usage(h)["vram_used"]),
        lambda: amdsmi.amdsmi_shut_down(),
    )


@functools.cache  # once per process
def _warn_nvml_missing() -> None:
    if shutil.which("nvidia-smi") is None:  # no NVIDIA driver: nothing to observe anyway
        return
    log.warning(
        "GPU utilization and memory columns stay empty: the NVML bindings (pynvml) are not "
        f"installed. Install them with `{install_command('nvml')}`."
    )


def find_gpu_probe() -> _GpuProbe | None:
    """An NVML or AMD SMI reader when the library imports and sees a device, else None."""
    try:
        import pynvml

        return _nvml_probe(pynvml)
    except ImportError as err:
        logger.debug("NVML observer unavailable: %s", err)
        _warn_nvml_missing()
    except Exception as err:
        logger.debug("NVML observer unavailable: %s", err)
    try:
        import amdsmi

        return _amdsmi_probe(amdsmi)
    except Exception as err:
        logger.debug("AMD SMI observer unavailable: %s", err)
    return None


class Observer:
    """Background sampler; use as a context manager around a subprocess call."""

    def __init__(self, *, interval: float = INTERVAL_S, gpu: bool = True) -> None:
        self.interval = interval
        self._gpu = find_gpu_probe() if gpu else None
        self.gpu_source = self._gpu.name if self._gpu is not None else ""  # as Observation.gpu_source
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # (monotonic time, cpu percent or nan, gpu util or nan, gpu mem MiB or nan)
        self.samples: list[tuple[float, float, float, float]] = []
        self.marks: list[Mark] = []
        self._cpu_seen: dict[tuple[int, float], float] = {}
        self._cpu_total = 0.0
        self._last_t: float | None = None
        self._last_total = 0.0
        self._mem0 = math.nan
        # The sampling thread and the caller's marks share the CPU-time state (reentrant: mark() samples).
        self._lock = threading.RLock()

    def __enter__(self) -> Observer:
        if self._gpu is not None:
            try:
                self._mem0 = self._gpu.read()[1]
            except Exception:
                self._mem0 = math.nan
        self._sample()  # baseline for CPU-time deltas
        self._thread = threading.Thread(target=self._loop, name="tuner-observer", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._sample()
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _cpu_seconds(self, threads: dict[tuple[int, int], float] | None = None) -> float:
        """Total CPU seconds of the live child tree since the last sample; with ``threads``, also fills
        it with the CPU seconds of every thread of the tree."""
        delta = 0.0
        try:
            children = psutil.Process(os.getpid()).children(recursive=True)
        except psutil.Error:
            children = []
        for proc in children:
            if threads is not None:
                with contextlib.suppress(psutil.Error):
                    threads.update({(proc.pid, th.id): th.user_time + th.system_time for th in proc.threads()})
            try:
                with proc.oneshot():
                    # (pid, create_time) survives pid reuse.
                    key = (proc.pid, proc.create_time())
                    times = proc.cpu_times()
            except psutil.Error:
                continue
            total = times.user + times.system
            # A process first seen now: count the CPU time it used since it started.
            delta += total - self._cpu_seen.get(key, 0.0)
            self._cpu_seen[key] = total
        return delta

    def mark(self, tag: str = "") -> float:
        """Take a sample now, with per-thread CPU times, as :attr:`marks` entry; returns its time.

        Cost: one walk of the child tree and its ``/proc/<pid>/task`` entries, paid at the caller's
        events only (3.7 ms against 3.1 ms for an interval sample, 13 threads, on the loaded 2-core
        CI box; two marks per llama-bench repetition)."""
        threads: dict[tuple[int, int], float] = {}
        with self._lock:
            now = self._sample(threads)
            self.marks.append(Mark(t=now, tag=tag, cpu_s=self._cpu_total, threads=threads))
        return now

    def _sample(self, threads: dict[tuple[int, int], float] | None = None) -> float:
        with self._lock:
            now = time.monotonic()
            cpu = math.nan
            self._cpu_total += self._cpu_seconds(threads)
            # A mark's sample carries no CPU percent: it would cut an interval short, and CPU times tick
            # at 10 ms, so the percent of a few-ms interval is noise (the marks' own figures are sums).
            if threads is None:
                if self._last_t is not None and now > self._last_t:
                    cpu = 100.0 * (self._cpu_total - self._last_total) / (now - self._last_t)
                self._last_t, self._last_total = now, self._cpu_total
            util = mem = math.nan
            if self._gpu is not None:
                try:
                    util, mem = self._gpu.read()
                except Exception as err:
                    logger.debug("GPU observer read failed: %s", err)
            self.samples.append((now, cpu, util, mem))
            return now

    def summary(self, t0: float | None = None, t1: float | None = None) -> Observation:
        """Summarize samples with ``t0 < t <= t1`` (monotonic clock; None = unbounded)."""
        return self._summarize([s for s in self.samples if (t0 is None or s[0] > t0) and (t1 is None or s[0] <= t1)])

    def timed_summary(self, windows: Sequence[tuple[Mark, Mark]]) -> Observation:
        """Summarize the time between each pair of marks (start, end), the windows pooled.

        ``cpu_util_mean`` is the tree's CPU seconds inside the windows over their length, exactly;
        ``cpu_core_max`` the same for the busiest thread, which stands for the busiest core: a pegged thread
        is the host-bound symptom (docs/knobs.md's host-paced scenario), and the scheduler migrates it
        between cores, so per-core counters would spread it out (and count other tenants). GPU figures and
        ``cpu_util_max`` come from the samples inside the windows. No windows: everything NaN.
        """
        span = sum(b.t - a.t for a, b in windows)
        if not windows or span <= 0:
            return Observation(gpu_source=self.gpu_source)
        per_thread: dict[tuple[int, int], float] = {}
        for a, b in windows:
            for k, v in b.threads.items():  # a thread born inside the window counts from 0
                per_thread[k] = per_thread.get(k, 0.0) + v - a.threads.get(k, 0.0)
        inside = [s for s in self.samples if any(a.t < s[0] <= b.t for a, b in windows)]
        return dataclasses.replace(
            self._summarize(inside),
            cpu_util_mean=100.0 * sum(b.cpu_s - a.cpu_s for a, b in windows) / span,
            cpu_core_max=100.0 * max(per_thread.values(), default=math.nan) / span,
        )

    def _summarize(self, window: Sequence[tuple[float, float, float, float]]) -> Observation:
        def stats(vals: list[float]) -> tuple[float, float]:
            vals = [v for v in vals if math.isfinite(v)]
            return (sum(vals) / len(vals), max(vals)) if vals else (math.nan, math.nan)

        cpu_mean, cpu_max = stats([s[1] for s in window])
        gpu_mean, gpu_max = stats([s[2] for s in window])
        _, mem_max = stats([s[3] for s in window])
        if math.isfinite(mem_max) and math.isfinite(self._mem0):
            mem_max = max(0.0, mem_max - self._mem0)
        return Observation(
            cpu_util_mean=cpu_mean,
            cpu_util_max=cpu_max,
            gpu_util_mean=gpu_mean,
            gpu_util_max=gpu_max,
            gpu_mem_mb=mem_max,
            n_samples=len(window),
            gpu_source=self.gpu_source,
        )

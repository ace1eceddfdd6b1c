"""Long-run stability: ≥ N generated tokens in one llama.cpp process, t/s drift and memory growth (docs/soak.md).

:func:`run_soak` runs one ``llama-bench -p 0 -n CHUNK -r REPS --progress`` process, so REPS x CHUNK >= N
tokens share one model, context and buffers. Every repetition restarts at depth 0 (llama-bench clears the
KV cache), which keeps the windows comparable: a growing context slows each token by design and would hide
a real degradation. Series: t/s per repetition (llama-bench's ``samples_ts``); the process's RSS, sampled
when llama-bench announces repetition ``i`` (after ``i-1`` finished; the first after one whole repetition,
so lazily touched pages are baseline, not growth); device memory and GPU utilization from ``nvidia-smi``
at the same moments (device totals: per-process numbers are often empty in containers), NaN without it.

:func:`judge_soak` is the rule, with :data:`DEFAULT_TOLERANCES`:

- **degradation** when the median t/s of the last quarter of repetitions (at least 3) is more than 5%
  below the first quarter's *and* the Theil–Sen slope of t/s over tokens has a 95% interval wholly below
  zero. 5% is the size of the wins tuner exports (tg +6.6%/+7.1% on the H100) and about the decode A/A
  noise there (±6.9% at d65536). The slope's interval separates a trend (throttling, fragmentation) from
  one slow repetition on a shared machine (30% dips on a 2-core CI box); Theil–Sen, the median of
  pairwise slopes, is not moved by such outliers;
- **leak** when host RSS (or device memory) of the last quarter of samples exceeds the first quarter's by
  more than 8 MiB. llama.cpp allocates its buffers before the first token and reuses them (CPU RSS
  measured flat to the byte over 12 x 256 tokens); 8 MiB catches 800 bytes per token over a 10k-token soak
  and leaves room for allocator noise (and a 2 MiB-granular CUDA VMM pool growing by a few granules).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from tuner import _run, log
from tuner.errors import TunerError, UsageError
from tuner.measure.bench import PROBE_OWN_FLAGS, check_passthrough_args, parse_bench_jsonl
from tuner.measure.exe import bench_exit_error, check_model, find_exe, run_tool
from tuner.measure.stats import median
from tuner.paths import tuner_home

DEFAULT_CHUNK = 256
"""Tokens per repetition (``-n``): long enough to time well, short enough for many windows."""
MIN_REPS = 6
"""Fewest repetitions: two windows of 3 and a slope with a meaningful interval."""

_REP_LINE = re.compile(r"llama-bench: benchmark \d+/\d+: generation run (\d+)/(\d+)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tolerances:
    """Limits of :func:`judge_soak` (the module docstring says why these values)."""

    max_drop_pct: float = 5.0
    """Largest t/s drop, last window's median vs the first's, in percent."""
    max_host_growth_mib: float = 8.0
    max_device_growth_mib: float = 8.0


DEFAULT_TOLERANCES = Tolerances()


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemSample:
    """Memory after ``rep`` finished repetitions."""

    seconds: float
    rep: int
    host_rss_mib: float
    device_mib: float = math.nan
    gpu_util_pct: float = math.nan


@dataclasses.dataclass(frozen=True, kw_only=True)
class SoakJudgement:
    """The drift and growth numbers and the verdict (:func:`judge_soak`)."""

    passed: bool
    reasons: tuple[str, ...]
    window: int
    first_ts: float
    last_ts: float
    drop_pct: float
    slope_pct_per_1k: float
    """Theil–Sen slope of t/s per 1000 generated tokens, in percent of the first window's median."""
    slope_ci_pct_per_1k: tuple[float, float]
    host_growth_mib: float
    device_growth_mib: float
    """NaN without a device observer."""


def _growth(series: Sequence[float]) -> float:
    vals = [v for v in series if math.isfinite(v)]
    if len(vals) < 2:
        return math.nan
    w = max(1, len(vals) // 4)
    return median(vals[-w:]) - median(vals[:w])


def judge_soak(
    samples_ts: Sequence[float],
    *,
    tokens_per_sample: int,
    host_mib: Sequence[float] = (),
    device_mib: Sequence[float] = (),
    tolerances: Tolerances = DEFAULT_TOLERANCES,
) -> SoakJudgement:
    """Drift of t/s (one sample per repetition of ``tokens_per_sample`` tokens, in order) and growth of the
    memory series (time order), and whether they stay within ``tolerances``."""
    from scipy.stats import theilslopes

    ts = [float(x) for x in samples_ts]
    t, nan = tolerances, math.nan
    why: list[str] = []
    # Too few samples: the numbers stay NaN and that is the only reason (memory growth is not judged either).
    w, first, last, drop, slope, lo, hi, scale = 0, nan, nan, nan, nan, nan, nan, 1.0
    usable = len(ts) >= MIN_REPS and all(math.isfinite(x) and x > 0 for x in ts)
    if not usable:
        why.append(f"{len(ts)} usable t/s samples; at least {MIN_REPS} positive ones are needed to judge drift.")
    else:
        w = max(3, len(ts) // 4)
        first, last = median(ts[:w]), median(ts[-w:])
        drop = 100.0 * (1.0 - last / first)
        slope, _, lo, hi = theilslopes(ts, [(i + 1) * tokens_per_sample for i in range(len(ts))], alpha=0.95)
        scale = 100.0 * 1000.0 / first
        if drop > t.max_drop_pct and hi < 0:
            why.append(
                f"t/s fell {drop:.1f}% from the first {w} repetitions ({first:.2f}) to the last {w} ({last:.2f}), "
                f"more than the {t.max_drop_pct:g}% tolerance, with a steady downward trend "
                f"({slope * scale:+.2f}%/1k tokens, 95% CI {lo * scale:+.2f}..{hi * scale:+.2f})."
            )
    host, dev = _growth(host_mib), _growth(device_mib)
    for what, grown, tol in (("Host", host, t.max_host_growth_mib), ("Device", dev, t.max_device_growth_mib)):
        if usable and grown > tol:
            why.append(f"{what} memory grew {grown:.1f} MiB over the run (tolerance {tol:g} MiB): a leak.")
    return SoakJudgement(
        passed=not why,
        reasons=tuple(why),
        window=w,
        first_ts=first,
        last_ts=last,
        drop_pct=drop,
        slope_pct_per_1k=slope * scale,
        slope_ci_pct_per_1k=(lo * scale, hi * scale),
        host_growth_mib=host,
        device_growth_mib=dev,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class SoakResult:
    """Outcome of :func:`run_soak`; ``passed`` False on drift, a leak, or a failed run."""

    passed: bool
    reasons: tuple[str, ...]
    n_tokens: int
    """Tokens asked for."""
    generated: int
    """Tokens generated in timed repetitions (llama-bench's warm-up token not counted)."""
    chunk: int
    reps: int
    samples_ts: tuple[float, ...]
    memory: tuple[MemSample, ...]
    judgement: SoakJudgement | None
    device_source: str
    """``nvidia-smi`` or '' (no device observer)."""
    log_file: Path
    seconds: float
    error: str = ""

    @property
    def summary(self) -> str:
        j = self.judgement
        verdict = "PASS" if self.passed else "FAIL"
        head = f"{verdict}: {self.generated} tokens in {len(self.samples_ts)} x tg{self.chunk}"
        if j is None or not math.isfinite(j.first_ts):
            return head + (f". {' '.join(self.reasons)}" if self.reasons else "")
        dev = "n/a" if not math.isfinite(j.device_growth_mib) else f"{j.device_growth_mib:+.1f} MiB"
        lo, hi = j.slope_ci_pct_per_1k
        text = (
            f"{head}; t/s {j.first_ts:.2f} -> {j.last_ts:.2f} ({-j.drop_pct:+.1f}%, slope "
            f"{j.slope_pct_per_1k:+.2f}%/1k tokens, 95% CI {lo:+.2f}..{hi:+.2f}); host RSS {j.host_growth_mib:+.1f} MiB; "
            f"device {dev}"
        )
        return text + (f". {' '.join(self.reasons)}" if self.reasons else "")


def plan_chunks(n_tokens: int, chunk: int = DEFAULT_CHUNK) -> tuple[int, int]:
    """``(chunk, reps)`` with ``chunk * reps >= n_tokens`` and at least :data:`MIN_REPS` repetitions."""
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens <= 0:
        raise UsageError(
            f"The soak length must be a positive number of tokens (got {n_tokens!r}); docs/soak.md's "
            "long-run test uses 10000 (`tuner validate --soak 10000`)."
        )
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0:
        raise UsageError(f"The soak chunk must be a positive number of tokens (got {chunk!r}).")
    c = min(chunk, max(8, -(-n_tokens // MIN_REPS)))
    return c, max(MIN_REPS, -(-n_tokens // c))


def _device_sample() -> tuple[float, float]:
    """(memory used MiB summed over GPUs, busiest GPU's utilization %) from nvidia-smi; NaNs when it fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return math.nan, math.nan
    try:
        query = [exe, "--query-gpu=memory.used,utilization.gpu", "--format=csv,noheader,nounits"]
        res = _run.run(query, check=False, timeout=20, what="nvidia-smi")
        rows = [[float(v) for v in ln.split(",")] for ln in res.output.splitlines() if ln.strip()]
        return sum(r[0] for r in rows), max(r[1] for r in rows)
    except (TunerError, ValueError, IndexError):  # a missing driver or odd output: no device numbers
        return math.nan, math.nan


class _Sampler:
    """Called with each llama-bench output line; samples memory at every repetition boundary."""

    def __init__(self, exe: Path, t0: float) -> None:
        self.exe, self.t0 = exe.resolve(), t0
        self.proc: psutil.Process | None = None
        self.samples: list[MemSample] = []
        self.lines: list[str] = []
        self.device = bool(shutil.which("nvidia-smi"))

    def _child(self) -> psutil.Process | None:
        if self.proc is None:
            for p in psutil.Process(os.getpid()).children(recursive=True):
                try:
                    if Path(p.exe()).resolve() == self.exe:
                        self.proc = p
                        break
                except (psutil.Error, OSError):
                    continue
        return self.proc

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        m = _REP_LINE.search(line)
        if not m or int(m.group(1)) < 2:  # the first boundary is after warm-up: pages not yet touched
            return
        proc = self._child()
        try:
            rss = proc.memory_info().rss / 2**20 if proc is not None else math.nan
        except psutil.Error:
            rss = math.nan
        dev, util = _device_sample() if self.device else (math.nan, math.nan)
        t = time.monotonic() - self.t0
        self.samples.append(
            MemSample(seconds=t, rep=int(m.group(1)) - 1, host_rss_mib=rss, device_mib=dev, gpu_util_pct=util)
        )


def run_soak(
    bin_dir: Path,
    model: Path,
    n_tokens: int,
    env: Mapping[str, str] = {},
    args: Sequence[str] = (),
    log_dir: Path | None = None,
    *,
    chunk: int = DEFAULT_CHUNK,
    tolerances: Tolerances = DEFAULT_TOLERANCES,
    timeout: float = 4 * 3600.0,
) -> SoakResult:
    """Generate at least ``n_tokens`` tokens in one llama-bench process with a config's env and arguments (one
    test's worth) and judge drift and growth; ``soak.log`` goes to ``log_dir`` (default
    ``$TUNER_HOME/runs/soak-<time>``), ``timeout`` is for the whole run. A crashed, timed-out or unparsable
    run is a failed result naming its log.

    Raises:
        UsageError: No llama-bench, no model, a bad length or argument.
    """
    c, reps = plan_chunks(n_tokens, chunk)
    exe = find_exe(Path(bin_dir), "llama-bench")
    check_model(model)
    cmd = [str(exe), "-m", str(model), "-p", "0", "-n", str(c), "-r", str(reps), "--progress", "-o", "jsonl"]
    own = "the soak itself (model, -p/-n/-r, -o, --progress)"
    cmd += check_passthrough_args(args, PROBE_OWN_FLAGS, sets=own, instead="give the length as the token count")
    log_dir = tuner_home() / "runs" / time.strftime("soak-%Y%m%d-%H%M%S") if log_dir is None else log_dir
    log_file = Path(log_dir) / "soak.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.unlink(missing_ok=True)
    t0 = time.monotonic()
    sampler = _Sampler(exe, t0)
    with log.step(f"soak: {reps} x tg{c} = {reps * c} tokens in one llama-bench process"):
        rc, err = run_tool(cmd, env, log_file=log_file, timeout=timeout, on_line=sampler, what="llama-bench (soak)")
    if not err and rc != 0:
        err = bench_exit_error(rc, sampler.lines, log_file)
    recs = parse_bench_jsonl("\n".join(sampler.lines))
    if not err and len(recs) != 1:
        err = (
            f"llama-bench printed {len(recs)} results; the soak needs exactly one test (no comma lists in the "
            f"arguments). Log: {log_file}"
        )
    ts = tuple(recs[0]["samples_ts"]) if len(recs) == 1 else ()
    mem = tuple(sampler.samples)
    j = judge_soak(
        ts,
        tokens_per_sample=c,
        host_mib=[m.host_rss_mib for m in mem],
        device_mib=[m.device_mib for m in mem],
        tolerances=tolerances,
    )
    reasons = (f"The soak run failed: {err}",) if err else j.reasons
    return SoakResult(
        passed=not reasons,
        reasons=reasons,
        n_tokens=n_tokens,
        generated=len(ts) * c,
        chunk=c,
        reps=reps,
        samples_ts=ts,
        memory=mem,
        judgement=j,
        device_source="nvidia-smi" if sampler.device else "",
        log_file=log_file,
        seconds=time.monotonic() - t0,
        error=err,
    )

"""Benchmarks you can trust: llama-bench across context depths, with noise control.

:func:`run_bench` runs prompt processing (``-p PP -n 0``) and token generation (``-p 0 -n TG``) at every
depth (``-d``), reads ``-o jsonl`` by field name (both eras' field sets: ``tools/llama-bench/llama-bench.cpp``)
and returns one row per ``(label, test, depth)``. Identical runs drift apart and the first repetition after
llama-bench's own warm-up is often slow, so the first repetition of every call is discarded too
(``warmup_discarded``), and with ``target_ci`` batches (``-r k``, samples pooled) are added until the
bootstrap CI half-width of the median is within ``target_ci`` percent or ``max_reps`` samples are kept
(anchors between candidates: :mod:`tuner.measure.interleave`). A failed call is data: its rows carry
``status="failed"``, ``n=0``, NaN statistics and the error text; nothing is invented.

The frame has one row per (label, test, depth), its columns :data:`COLUMNS`.

Observer columns cover the timed repetitions of each test (prefill and decode separately;
docs/design.md): llama-bench runs with ``--progress``, whose line before each timed repetition and the
JSONL line after the last one are marks (:meth:`tuner.measure.observe.Observer.mark`); the windows
from a ``prompt run i``/``generation run i`` line to the next line are timed, the first repetition's
left out as its sample is. Without progress lines (a binary that prints none) the window is the whole
test inside the call (warm-up, depth fill and, for the first test, model load included).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import functools
import itertools
import json
import logging
import math
import re
import shlex
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner import _run, log
from tuner.errors import TunerError, UsageError
from tuner.measure.exe import check_env, check_model, find_exe, run_tool
from tuner.measure.frames import json_lines, test_phase
from tuner.measure.observe import Observation, Observer
from tuner.measure.stats import summarize_samples as _summarize
from tuner.targets import roofline
from tuner.targets.archs import load_arch
from tuner.targets.host import check_threads, crash_hint, host_cpus, mask_text, parse_cpu_mask, pin_command

if TYPE_CHECKING:
    import pandas as pd

logger = logging.getLogger(__name__)

COLUMNS: tuple[str, ...] = (
    "label",  # variant name given by the caller
    "test",  # llama-bench test name: pp512 (prompt) or tg128 (generation)
    "phase",  # pp or tg
    "depth",  # KV-cache depth -d (tokens, prefilled untimed)
    "n",  # kept samples (repetitions after discarding warm-ups)
    "median_ts",  # median tokens/s of the kept samples
    "mean_ts",  # mean tokens/s
    "stddev_ts",  # sample standard deviation (ddof=1; NaN for n<2)
    "ci_low",  # low end of the seeded percentile-bootstrap CI of the median (confidence, default 95%)
    "ci_high",  # its high end
    "ci_pct",  # CI half-width as % of the median
    "min_ts",  # lowest of the kept samples
    "max_ts",  # highest of the kept samples
    "samples",  # list of kept tokens/s samples, in measurement order
    "n_batches",  # llama-bench calls pooled into this row
    "warmup_discarded",  # repetitions discarded (one per call)
    "status",  # ok or failed
    "error",  # error text for failed (or partly failed) rows, else ''
    "build_commit",  # from llama-bench (llama_commit())
    "backends",  # registered non-CPU backends, e.g. CUDA (CPU on a CPU build)
    "gpu_info",  # GPU description(s)
    "model_filename",  # model path as llama-bench saw it
    "model_size",  # model weight bytes
    "n_params",  # model parameters
    "n_ubatch",  # micro-batch size
    "type_k",  # K-cache type
    "flash_attn",  # -1/0/1 (era rocwmma bools are mapped to 0/1)
    "env",  # JSON object of the environment overrides given to this run
    "cmd",  # command line of the last llama-bench call for this row
    "log_file",  # log of that call (stdout+stderr)
    "cpu_util_mean",  # CPU use of the llama-bench process tree during the test's timed repetitions, % of one core
    "cpu_util_max",  # peak of the 100 ms samples of the same
    "cpu_core_max",  # CPU use of its busiest thread (the busiest core; observe.py says why a thread), % of one core
    "gpu_util_mean",  # mean GPU utilization (NVML/AMD SMI), NaN without a GPU observer
    "gpu_util_max",  # peak of the same
    "gpu_mem_mb",  # peak device memory above the level before the call, MiB (NaN without GPU)
    "bytes_per_token",  # model estimate of bytes read per token at the test's mean depth (tuner.targets.roofline)
    "roofline_tps",  # model estimate: tg = bandwidth / bytes per token; pp = compute peak bound
    "roofline_pct",  # 100 * median_ts / roofline_tps
    "roofline_note",  # how the roofline was obtained, or why it is missing
    "anchor_ratio",  # run_interleaved: reference / local anchor median (applied only if drift_corrected)
    "drift_corrected",  # run_interleaved: True when samples were rescaled by anchor_ratio
    "timestamp",  # UTC time (ISO 8601) the row was finished
)

_META_COLUMNS = COLUMNS[COLUMNS.index("build_commit") : COLUMNS.index("env")]
"""What llama-bench says about the build, the model and the settings (build_commit to flash_attn)."""

DEFAULT_REPS = 5
"""Kept samples per (test, depth) when neither ``reps`` nor ``target_ci`` says otherwise."""

_LLAMA_BENCH_OWN = frozenset(
    {"-m", "--model", "-p", "--n-prompt", "-n", "--n-gen", "-pg", "-r", "--repetitions"}
    | {"-o", "--output", "-oe", "--output-err", "--progress"}
)
# Flags run_bench sets itself; passing them through extra_args would desynchronize the parser.
_OWN_FLAGS = _LLAMA_BENCH_OWN | {"-d", "--n-depth", "-fa", "--flash-attn"}
# Flags a one-process llama-bench probe (soak, residency) sets itself
PROBE_OWN_FLAGS = _LLAMA_BENCH_OWN | {"-v", "--verbose"}
_PROGRESS = "llama-bench: benchmark "
_TIMED_REP = re.compile(r"^(?:prompt|generation) run (\d+)/\d+$")
_MAX_TOKENS = 1 << 20
_MIN_TIMED_S = 0.2


def parse_bench_jsonl(text: str) -> list[dict[str, Any]]:
    """Parse llama-bench ``-o jsonl`` output (either era, log lines mixed in are skipped) by field name: one dict
    per test with ``test, phase, n_prompt, n_gen, n_depth, samples_ts`` (from ``samples_ns`` when missing) and
    the schema's metadata fields (None when absent; ``flash_attn`` an int: era ``rocwmma`` prints a bool)."""
    recs = (_normalize_record(r) for r in json_lines(text) if "n_prompt" in r and "n_gen" in r)
    return [r for r in recs if r is not None]


def _normalize_record(rec: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        n_prompt, n_gen = int(rec["n_prompt"]), int(rec["n_gen"])
        n_depth = int(rec.get("n_depth", 0))
    except (TypeError, ValueError):
        logger.warning("llama-bench row with non-integer n_prompt/n_gen/n_depth skipped: %r", rec)
        return None
    samples = rec.get("samples_ts")
    if samples is None and rec.get("samples_ns") is not None:
        samples = [1e9 * (n_prompt + n_gen) / float(ns) for ns in rec["samples_ns"] if float(ns) > 0]
    samples = [float(x) for x in (samples or [])]
    test, phase = test_phase(n_prompt, n_gen)
    out = {"test": test, "phase": phase, "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": n_depth}
    out |= {"samples_ts": samples, "avg_ts": rec.get("avg_ts"), "stddev_ts": rec.get("stddev_ts")}
    out |= {k: rec.get(k) for k in _META_COLUMNS}
    fa = rec.get("flash_attn")
    return out | {"n_params": rec.get("model_n_params"), "flash_attn": None if fa is None else int(fa)}


def _check_int(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise UsageError(f"{name} must be an integer in [{lo}, {hi}] (got {value!r}).")
    return int(value)


def check_passthrough_args(
    args: Sequence[str], own: Collection[str], *, sets: str, instead: str = "", tool: str = "llama-bench"
) -> tuple[str, ...]:
    """``tool``'s arguments passed through as given: strings without NUL, none of the flags in ``own`` (those the
    caller sets itself, also as ``--flag=value``); ``sets`` names them for the message, ``instead`` the way to go."""
    out = tuple(args)
    for a in out:
        if not isinstance(a, str) or "\0" in a:
            raise UsageError(f"{tool} arguments must be strings without NUL (got {a!r}).")
        if a in own or a.split("=", 1)[0] in own:
            raise UsageError(f"{tool} flag {a} is set by {sets}" + (f"; {instead}" if instead else "") + ".")
    return out


_FA_SPELLING = {"mma": ("on", "off"), "rocwmma": ("1", "0")}
"""(on, off) spelling of ``-fa`` per era: era mma takes on/off, era rocwmma takes 1/0."""


@functools.lru_cache(maxsize=32)
def _fa_values(exe: str, mtime: float) -> tuple[str, str]:
    """The ``-fa`` spelling of the llama-bench at ``exe``, read from its ``--help``."""
    res = _run.run([exe, "--help"], check=False, timeout=60, what="llama-bench --help")
    m = re.search(r"--flash-attn\s+<([^>]*)>", res.output)
    return _FA_SPELLING["mma" if m and "on" in m.group(1).split("|") else "rocwmma"]


def _fa_args(exe: Path, era: str | None, flash_attn: bool | None) -> list[str]:
    if flash_attn is None:
        return []
    if era is not None and era not in _FA_SPELLING:
        raise UsageError(f"Unknown era {era!r}; use 'mma' or 'rocwmma' (or leave it out to detect).")
    on, off = _fa_values(str(exe), exe.stat().st_mtime) if era is None else _FA_SPELLING[era]
    return ["-fa", on if flash_attn else off]


def _roofline(
    phase: str, arch: str | None, bandwidth: float | None, model: Path, *, depth: int, ntok: int, kv_type: str | None
) -> tuple[float, float, str]:
    """(bytes_per_token, roofline t/s, note) for one row from tuner.targets.roofline.estimate (tg: bandwidth /
    bytes per token at the run's mean depth; pp: compute peak); NaNs and a note when unavailable (pp without
    an arch). Raises UsageError for a bad arch/bandwidth."""
    nan = math.nan
    if arch is None and bandwidth is None:
        return nan, nan, "no --arch or --bandwidth given"
    kv = kv_type if kv_type in roofline.KV_TYPES else "f16"
    mid = depth + ntok // 2  # llama-bench's tokens sit between depth and depth + ntok
    bpt = float(roofline.bytes_per_token(model, mid, kv)["total_bytes"])
    if arch is None:
        if phase != "tg":
            return bpt, nan, "prompt-processing roofline needs --arch (compute peaks)"
        assert bandwidth is not None
        return bpt, bandwidth * 1e9 / bpt, f"model estimate: {bandwidth:g} GB/s (given) / bytes per token"
    load_arch(arch)  # an unknown arch is the user's error, not a missing roofline
    try:
        pp, tg = (ntok, 0) if phase == "pp" else (0, ntok)
        rows = roofline.estimate(arch, model, (depth,), pp=pp, tg=tg, kv_type=kv, bandwidth=bandwidth)
    except UsageError as err:
        if bandwidth is not None:
            raise
        # e.g. `cpu`: no bandwidth is known for an arbitrary host; keep the row, without a roofline.
        return bpt, nan, f"no roofline: {err}"
    bound = rows[0].get("bound_tps") if rows else None
    note = f"model estimate: {rows[0].get('limit', '')}" if rows else "model estimate unavailable"
    return bpt, float(bound) if bound else nan, note


@dataclasses.dataclass(kw_only=True)
class _Acc:
    """Mutable accumulator for one (phase, depth) across batches."""

    samples: list[float] = dataclasses.field(default_factory=list)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    obs: list[Observation] = dataclasses.field(default_factory=list)
    n_batches: int = 0
    discarded: int = 0
    error: str = ""
    cmd: str = ""
    log_file: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Call:
    """One llama-bench call as run: its command and log, the timestamped parsed records, the observer, the
    error text ("" when none) and the start time."""

    cmd: list[str]
    log_file: Path
    records: list[tuple[float, dict[str, Any]]]
    obs: Observer | None
    error: str
    t0: float


def _run_call(plan: _BenchPlan, log_file: Path, *, p: int, n: int, depths: Sequence[int], reps: int) -> _Call:
    """One llama-bench call of ``plan``: ``-p p -n n`` at ``depths``, ``reps`` repetitions (the first is dropped)."""
    log.progress(f"  {plan.label}: {test_phase(p, n)[0]} d={','.join(map(str, depths))} -r {reps}")
    ds = ",".join(str(d) for d in depths)
    cmd = [*plan.head, "-p", str(p), "-n", str(n), "-d", ds, "-r", str(reps), "-o", "jsonl", *plan.tail]
    records: list[tuple[float, dict[str, Any]]] = []
    obs = Observer() if plan.observe else None

    def on_line(line: str) -> None:
        if "{" in line and "n_prompt" in line:
            recs = parse_bench_jsonl(line)
            t = obs.mark("result") if obs is not None and recs else time.monotonic()
            records.extend((t, rec) for rec in recs)
        elif obs is not None and line.startswith(_PROGRESS):  # "llama-bench: benchmark 1/2: generation run 3/6"
            obs.mark(line.split(": ", 2)[-1].strip())

    t0 = time.monotonic()
    with obs if obs is not None else contextlib.nullcontext():
        rc, error = run_tool(
            cmd, plan.env, log_file=log_file, timeout=plan.timeout, on_line=on_line, what="llama-bench"
        )
    if not error and rc != 0:
        error = (
            f"llama-bench exited with code {rc}; see {log_file}. "
            f"Last lines: {_run.tail(log_file, 5)}{crash_hint(rc, cmd)}"
        )
    return _Call(cmd=cmd, log_file=log_file, records=records, obs=obs, error=error, t0=t0)


def _finite(vals: Sequence[float], how: str) -> float:
    vals = [v for v in vals if math.isfinite(v)]
    return (max(vals) if how == "max" else sum(vals) / len(vals)) if vals else math.nan


@dataclasses.dataclass(frozen=True, kw_only=True)
class _BenchPlan:
    """run_bench's arguments after checking: what each llama-bench call is built from."""

    head: list[str]
    """``taskset -c LIST`` under a CPU mask (in every logged command), llama-bench, ``-m`` and the model."""
    tail: list[str]
    """What follows ``-o jsonl``: ``-fa``, ``--progress`` (when observing) and the passthrough arguments."""
    model: Path
    log_dir: Path
    depths: tuple[int, ...]
    pp: int
    tg: int
    want: int
    max_reps: int
    target_ci: float | None
    timeout: float
    env: dict[str, str]
    label: str
    arch: str | None
    bandwidth: float | None
    confidence: float
    seed: int
    observe: bool


def _absorb_records(accs: Mapping[tuple[str, int], _Acc], phases: tuple[str, ...], call: _Call) -> set[tuple[str, int]]:
    """Pool one call's records of ``phases`` into the accumulators (first repetition dropped); returns the (phase,
    depth) pairs seen."""
    seen: set[tuple[str, int]] = set()
    obs, t_prev = call.obs, call.t0
    for t_rec, rec in call.records:
        d, ph = rec["n_depth"], rec["phase"]
        acc = accs.get((ph, d))
        if acc is None or (ph, d) in seen or ph not in phases:
            continue
        seen.add((ph, d))
        # The first repetition of each call is discarded (warm-up: often slow).
        acc.samples.extend(rec["samples_ts"][1:])
        acc.discarded += min(1, len(rec["samples_ts"]))
        acc.n_batches += 1
        acc.meta = rec
        acc.cmd, acc.log_file = shlex.join(call.cmd), str(call.log_file)
        if obs is not None:
            acc.obs.append(_test_observation(obs, t_prev, t_rec))
        t_prev = t_rec
    return seen


def _test_observation(obs: Observer, t_prev: float, t_rec: float) -> Observation:
    """One test's observation: its timed repetitions where progress marks show them (the first left out when
    there are more, as its sample is), else its first to last mark, else the window's samples, else its marks.
    The window opens at the previous test's result mark; a call's first test has none, and its window opens
    at its own first mark: before it llama-bench was starting and loading the model, often off the CPU."""
    marks = [m for m in obs.marks if t_prev < m.t <= t_rec]
    reps = [(int(r.group(1)), a, b) for a, b in itertools.pairwise(marks) if (r := _TIMED_REP.match(a.tag))]
    # CPU times tick every 10 ms: windows under ~20 ticks in all (tiny pp64: ~8 ms) read 0% or 200%
    for w in ([(a, b) for i, a, b in reps if i > 1 or len(reps) == 1], [(marks[0], marks[-1])] if marks else []):
        if w and sum(b.t - a.t for a, b in w) >= _MIN_TIMED_S:
            return obs.timed_summary(w)
    if not marks:  # no progress marks (an old binary): the window's samples
        return obs.summary(t_prev, t_rec)
    prev = next((m for m in obs.marks if m.t == t_prev), marks[0])
    if math.isfinite((out := obs.summary(prev.t, t_rec)).cpu_util_mean):
        return out
    # too short for the sampler as well (CI's tg8@d0, idle): the marks' exact CPU since t_prev's mark, tick-coarse;
    # not one tick in it reads 0% of a process that ran: unknown, not idle
    out = obs.timed_summary([(prev, marks[-1])])
    return out if out.cpu_util_mean > 0 else dataclasses.replace(out, cpu_util_mean=math.nan, cpu_core_max=math.nan)


def _still_pending(plan: _BenchPlan, accs: Mapping[int, _Acc], seen: set[int], call: _Call) -> list[int]:
    """Record errors for the depths of ``accs`` (one phase's pending ones) ``call`` missed (not in ``seen``);
    return the depths whose CI is still above target_ci."""
    next_pending = []
    for d, acc in accs.items():
        if d not in seen:
            acc.error = call.error or f"llama-bench printed no result for depth {d}; see {call.log_file}."
            acc.cmd, acc.log_file = shlex.join(call.cmd), str(call.log_file)
            continue
        if call.error and not acc.error:
            acc.error = call.error
        if plan.target_ci is None or len(acc.samples) >= plan.max_reps:
            continue
        st = _summarize(acc.samples, confidence=plan.confidence, seed=plan.seed)
        if not (st["ci_pct"] <= plan.target_ci):
            next_pending.append(d)
    return next_pending


def _measure(plan: _BenchPlan, phases: tuple[str, ...], accs: dict[tuple[str, int], _Acc]) -> str:
    """llama-bench calls for ``phases`` at every depth, in batches until every depth is done; returns the log file.

    Both phases (``-p 512 -n 128 -d ...``, as a user runs it; no ``target_ci``, so one batch) share one call:
    llama-bench keeps the context state of the last depth it filled and restores it for the next test at that
    depth, so both tests share one fill per depth: at 8B and 65536 tokens the fill costs more than the tests."""
    pending = list(plan.depths)
    k = plan.want
    log_file = plan.log_dir / f"{plan.label}-{'+'.join(phases)}.log"
    accs |= {(ph, d): _Acc() for ph in phases for d in plan.depths}
    while pending:
        p, n = (plan.pp if "pp" in phases else 0), (plan.tg if "tg" in phases else 0)
        call = _run_call(plan, log_file, p=p, n=n, depths=pending, reps=k + 1)
        seen = _absorb_records(accs, phases, call)
        still = [
            _still_pending(plan, {d: accs[(ph, d)] for d in pending}, {d for q, d in seen if q == ph}, call)
            for ph in phases
        ]
        pending = [d for d in pending if any(d in s for s in still)]
        if pending:
            room = min(plan.max_reps - len(accs[(ph, d)].samples) for ph in phases for d in pending)
            k = max(2, min(plan.want, room))
    return str(log_file)


def _bench_row(plan: _BenchPlan, phase: str, d: int, acc: _Acc) -> dict[str, Any]:
    st = _summarize(acc.samples, confidence=plan.confidence, seed=plan.seed)
    ntok = plan.pp if phase == "pp" else plan.tg
    meta = acc.meta
    try:
        bpt, roof, note = _roofline(
            phase, plan.arch, plan.bandwidth, plan.model, depth=d, ntok=ntok, kv_type=meta.get("type_k")
        )
    except TunerError as err:  # e.g. an unreadable GGUF: the measurement still stands
        bpt, roof, note = math.nan, math.nan, f"roofline unavailable: {err}"
    return {
        "label": plan.label,
        "test": f"{phase}{ntok}",
        "phase": phase,
        "depth": d,
        **st,
        "n_batches": acc.n_batches,
        "warmup_discarded": acc.discarded,
        "status": "ok" if st["n"] > 0 else "failed",
        "error": acc.error,
        **{k: meta.get(k) for k in _META_COLUMNS},
        "model_filename": meta.get("model_filename", str(plan.model)),
        "env": json.dumps(plan.env, sort_keys=True),
        "cmd": acc.cmd,
        "log_file": acc.log_file,
        "cpu_util_mean": _finite([o.cpu_util_mean for o in acc.obs], "mean"),
        "cpu_util_max": _finite([o.cpu_util_max for o in acc.obs], "max"),
        "cpu_core_max": _finite([o.cpu_core_max for o in acc.obs], "mean"),
        "gpu_util_mean": _finite([o.gpu_util_mean for o in acc.obs], "mean"),
        "gpu_util_max": _finite([o.gpu_util_max for o in acc.obs], "max"),
        "gpu_mem_mb": _finite([o.gpu_mem_mb for o in acc.obs], "max"),
        "bytes_per_token": bpt,
        "roofline_tps": roof,
        "roofline_pct": 100.0 * st["median_ts"] / roof if roof and math.isfinite(roof) else math.nan,
        "roofline_note": note,
        "anchor_ratio": math.nan,
        "drift_corrected": False,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def run_bench(
    bin_dir: Path,
    model: Path,
    *,
    depths: Sequence[int] = (0, 4096, 16384, 32768),
    pp: int = 512,
    tg: int = 128,
    reps: int | None = None,
    target_ci: float | None = None,
    max_reps: int = 20,
    env: Mapping[str, str] = {},
    extra_args: Sequence[str] = (),
    log_dir: Path,
    label: str = "",
    timeout: float = 900.0,
    era: str | None = None,
    flash_attn: bool | None = True,
    arch: str | None = None,
    bandwidth: float | None = None,
    confidence: float = 0.95,
    seed: int = 0,
    observe: bool = True,
    cpus: Sequence[int] | None = None,
) -> pd.DataFrame:
    """Benchmark one build on one model: pp and tg at every depth; a DataFrame of :data:`COLUMNS` whose
    ``attrs`` hold ``log_file`` (the last log) and ``errors``; UsageError for bad arguments or a missing
    llama-bench/model, before anything runs. ``reps``: kept samples per (test, depth) in the first batch
    (default 5; one more per call is discarded); ``label`` defaults to the bin dir's parent name; ``timeout``
    is seconds per call; ``era`` (``mma``: ``-fa on``, ``rocwmma``: ``-fa 1``) None detects it; ``flash_attn`` None
    leaves ``-fa`` out; ``bandwidth`` (GB/s) overrides the arch's roofline; ``cpus`` pins calls (``taskset -c``)."""
    import pandas as pd

    bin_dir, model, log_dir = Path(bin_dir), Path(model), Path(log_dir)
    exe = find_exe(bin_dir, "llama-bench")
    check_model(model)
    depths = tuple(_check_int("depth", d, 0, _MAX_TOKENS) for d in depths)
    if not depths or len(set(depths)) != len(depths):
        raise UsageError(f"depths must be a non-empty list of distinct integers (got {depths!r}).")
    pp = _check_int("pp", pp, 0, _MAX_TOKENS)
    tg = _check_int("tg", tg, 0, _MAX_TOKENS)
    if pp == 0 and tg == 0:
        raise UsageError("pp and tg are both 0, so there is nothing to measure; set --pp or --tg.")
    max_reps = _check_int("max_reps", max_reps, 1, 10000)
    want = min(DEFAULT_REPS if reps is None else _check_int("reps", reps, 1, 10000), max_reps)
    if target_ci is not None and not (isinstance(target_ci, (int, float)) and 0 < target_ci < 100):
        raise UsageError(f"target_ci is a percentage in (0, 100) (got {target_ci!r}); e.g. 2 for ±2%.")
    if timeout <= 0:
        raise UsageError(f"timeout must be positive seconds (got {timeout!r}).")
    if bandwidth is not None and not (isinstance(bandwidth, (int, float)) and 0 < bandwidth < 1e6):
        raise UsageError(f"bandwidth is in GB/s and must be in (0, 1e6) (got {bandwidth!r}).")
    env = check_env(env)
    extra = check_passthrough_args(
        extra_args,
        _OWN_FLAGS,
        sets="tuner bench itself (model, -p/-n/-d/-r, -o, -fa)",
        instead="use the matching option (--pp, --tg, --depths, --reps, --no-fa) instead",
    )
    if cpus:
        parse_cpu_mask(mask_text(cpus))  # present here, or one paragraph naming the CPUs that are
    for i, a in enumerate(extra[:-1]):  # both spellings llama-bench reads, every occurrence
        if a in ("-t", "--threads"):
            check_threads(extra[i + 1], host_cpus(cpus))
    pin = tuple(pin_command(cpus))
    fa = _fa_args(exe, era, flash_attn)
    label = label or bin_dir.parent.name or "bench"
    if not re.match(r"^[\w.@+-]+$", label):
        raise UsageError(f"label {label!r} may only contain letters, digits and . _ @ + -.")
    if arch is not None or bandwidth is not None:
        # Surface an unknown arch or missing bandwidth before spending minutes benchmarking.
        for ph, n in (("pp", pp), ("tg", tg)):
            if n > 0:
                _roofline(ph, arch, bandwidth, model, depth=depths[0], ntok=n, kv_type=None)
    plan = _BenchPlan(
        head=[*pin, str(exe), "-m", str(model)],
        # --progress: the observer's marks, one stderr line per repetition (a few microseconds inside the timed part)
        tail=[*fa, *(["--progress"] if observe else []), *extra],
        model=model,
        log_dir=log_dir,
        depths=depths,
        pp=pp,
        tg=tg,
        want=want,
        max_reps=max_reps,
        target_ci=target_ci,
        timeout=timeout,
        env=env,
        label=label,
        arch=arch,
        bandwidth=bandwidth,
        confidence=confidence,
        seed=seed,
        observe=observe,
    )
    accs: dict[tuple[str, int], _Acc] = {}
    last_log = ""
    if plan.pp > 0 and plan.tg > 0 and plan.target_ci is None:  # one call: both tests share each depth fill
        last_log = _measure(plan, ("pp", "tg"), accs)
    else:
        for phase in (ph for ph, n in (("pp", plan.pp), ("tg", plan.tg)) if n > 0):
            last_log = _measure(plan, (phase,), accs)
    rows = [_bench_row(plan, phase, d, acc) for (phase, d), acc in accs.items()]
    df: pd.DataFrame = pd.DataFrame(rows, columns=list(COLUMNS))  # the constructor is untyped before 3.11
    df.attrs["log_file"] = last_log
    df.attrs["errors"] = [r["error"] for r in rows if r["error"]]
    for r in rows:
        if r["status"] != "ok":
            log.warning(f"{plan.label} {r['test']} @ d{r['depth']} failed: {r['error']}")
    return df

"""MMQ vs cuBLAS: a runtime hook in ``ggml_cuda_should_use_mmq``, its sweep, and its upstream condition.

``ggml_cuda_should_use_mmq`` (``ggml/src/ggml-cuda/mmq.cu`` L318 of llama.cpp 0c1e570) returns true everywhere
with Turing tensor cores. :func:`patched_mmq_hook` adds a table read from :data:`ENV` (``TYPE:LO..HI=MMQ|BLAS``,
the first covering entry decides) before the arch branches; the sweep (:data:`MMQ`) forces cuBLAS through it, and a
batch size goes to cuBLAS for a type only where cuBLAS won at *every* swept size (:func:`compose_mmq`).
:func:`patched_mmq_condition` is the upstream form. See docs/sweep.md.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from tuner.errors import TunerError, UsageError
from tuner.measure import mm_bench
from tuner.measure.paired import NOISE_CEILING_PCT, TOO_NOISY
from tuner.plan.patch import patched_file
from tuner.result.upstream_patch import COMMON, arch_condition, git_diff
from tuner.rounds.budget import Budget
from tuner.rounds.compose import Decision, Shape, rules_from
from tuner.rounds.engine import AA, DEFAULT, Spec, Verdicts, gap_decision, judge, pack_groups, rounds_text, run_rounds
from tuner.rounds.stats import UPSTREAM, CellStats
from tuner.rounds.store import Sample, SampleStore, Table
from tuner.sweep.grid import OFFSET_AMD, amd_mfma, amd_wmma, cc_of, duration_text
from tuner.sweep.table import amd_family_condition
from tuner.targets.archs import Arch
from tuner.targets.models import ModelShape, load_model_shape

MMQ_FILE = "ggml/src/ggml-cuda/mmq.cu"
ENV = "GGML_TUNER_MMQ_CHOICES"
BACKENDS = ("MMQ", "BLAS")
MMQ_TYPES = ("q4_0", "q4_K", "q5_K", "q6_K", "q8_0", "iq4_xs")
"""The quant types swept (ggml_type_name spelling)."""
MMQ_BATCHES = tuple(2**i for i in range(4, 13))
"""``ne11`` 16 to 4096 in octaves: below 16 llama.cpp uses vector kernels."""
MMQ_SUPPORTED = (
    *("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K"),
    *("iq1_s", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq4_xs", "iq4_nl", "mxfp4"),
)
"""Types ``ggml_cuda_should_use_mmq`` supports (its ``mmq_supported`` switch), as ggml_type_name spells them."""
_BLOCK_32 = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "mxfp4")
PROCESS_S = 59.4
"""Measured: an H100 mm-bench process of 540 cases (docs/data/h100-sweep-sm90/mmq-transcript.txt)."""
PROCESS_CASES = 540
START_S = 2.5
"""Estimate: the part of a process that is CUDA start (as for test-backend-ops, docs/sweep.md)."""
OPEN_SHARE = 0.5
"""Assumption: the share of points open after ``min_rounds``; the FlashAttention sweep's 50% (upper side)
as the only MMQ rounds on record (docs/data/h100-mmq-probe/) cover one size."""

_FUNCTION = "bool ggml_cuda_should_use_mmq(enum ggml_type type, int cc, int64_t ne11, int64_t n_experts) {"
_TURING = "    if (turing_mma_available(cc)) {\n        return true;\n    }\n"


@dataclasses.dataclass(frozen=True, order=True, kw_only=True)
class MmqChoice:
    """For quant ``type`` and ``ne11`` in ``[lo, hi)`` (hi None: unbounded), use ``backend`` (MMQ or BLAS)."""

    type: str
    lo: int
    hi: int | None
    backend: str

    @property
    def text(self) -> str:
        """The entry as ``GGML_TUNER_MMQ_CHOICES`` spells it."""
        return f"{self.type}:{self.lo}..{'' if self.hi is None else self.hi}={self.backend}"

    def covers(self, ne11: int) -> bool:
        return self.lo <= ne11 and (self.hi is None or ne11 < self.hi)


def mmq_env(choices: Iterable[MmqChoice]) -> str:
    """The ``GGML_TUNER_MMQ_CHOICES`` value of ``choices`` (comma-joined, no spaces)."""
    return ",".join(c.text for c in choices)


# ------------------------------------------------------------------------------------------------- C++

_HOOK_MANIFEST = "mmq-hook"
"""The opt-in patch manifest ``templates/patches/mma/mmq-hook.toml``: the hook's C++ is its templates."""
_HOOK_TEMPLATE = "patches/mma/mmq-hook.cu.j2"


def _function(root: Path) -> tuple[str, int, int]:
    path = root / MMQ_FILE
    if not path.is_file():
        raise TunerError(f"{root} has no {MMQ_FILE}; the MMQ patch needs the pristine llama.cpp tree.")
    text = path.read_text()
    start = text.find(_FUNCTION)
    end = text.find("\n}\n", start)
    body = text[start:end] if 0 <= start < end else ""
    if _TURING not in body or "ggml_tuner_mmq" in text:
        raise TunerError(
            f"{MMQ_FILE} of {root}: ggml_cuda_should_use_mmq does not have the structure of llama.cpp 0c1e570 "
            "(its Turing branch returning true), or it is already patched."
        )
    return text, start, start + body.index(_TURING)


def patched_mmq_hook(root: Path) -> str:
    """mmq.cu of the pristine tree at ``root`` with the runtime hook: the opt-in manifest ``mmq-hook`` alone."""
    _function(root)  # the structure check, with its message
    return patched_file(root, "mma", _HOOK_MANIFEST, MMQ_FILE)


def patched_mmq_condition(
    root: Path, choices: Sequence[MmqChoice], arch: Arch, cond: str, *, note: str = ""
) -> str | None:
    """mmq.cu with the cuBLAS choices as conditions on ``cond`` (None where none is BLAS); TunerError."""
    amd = getattr(arch, "vendor", None) == "amd"
    if not amd and (getattr(arch, "vendor", None) != "nvidia" or int(getattr(arch, "cc", 0) or 0) < 750):
        raise TunerError(f"The MMQ condition goes before the Turing branch; {arch.name!r} has no Turing tensor cores.")
    blas = sorted(c for c in choices if c.backend == "BLAS")
    if not blas:
        return None
    text, _start, at = _function(root)
    head = note.strip() or f"cuBLAS is faster than MMQ for these types and batch sizes on {arch.name}."
    lines = [*(f"    // {ln}" if ln else "    //" for ln in head.splitlines())]
    lines += [f"    if ({cond} && n_experts == 0) {{", "        switch (type) {"]
    for t in sorted({c.type for c in blas}):
        lines.append(f"            case GGML_TYPE_{t.upper()}:")
        for c in (c for c in blas if c.type == t):
            parts = ([f"ne11 >= {c.lo}"] if c.lo else []) + ([f"ne11 < {c.hi}"] if c.hi is not None else [])
            if parts:
                lines += [
                    f"                if ({' && '.join(parts)}) {{",
                    "                    return false;",
                    "                }",
                ]
            else:
                lines.append("                return false;")
        lines.append("                break;")
    lines += ["            default:", "                break;", "        }", "    }", "", ""]
    return text[:at] + "\n".join(lines) + text[at:]


def render_mmq_patch(root: Path, choices: Sequence[MmqChoice], arch: Arch, *, note: str = "") -> str | None:
    """``upstream.patch`` of the composed choices (:func:`patched_mmq_condition`); None where none is cuBLAS."""
    common = root / COMMON
    if not common.is_file():
        raise TunerError(f"{root} has no {COMMON}; the MMQ patch needs the pristine llama.cpp tree.")
    # AMD: upstream's own family test (GGML_CUDA_CC_IS_RDNA3_5(cc)...), as the FlashAttention table is keyed
    cond = amd_family_condition(arch) if arch.vendor == "amd" else arch_condition(arch, common.read_text())
    new = patched_mmq_condition(root, choices, arch, cond, note=note)
    return None if new is None else git_diff(MMQ_FILE, (root / MMQ_FILE).read_text(), new)


# ----------------------------------------------------------------------------------------------- sweep


@dataclasses.dataclass(frozen=True, kw_only=True)
class MmqCell:
    """One quant type at one batch size; upstream's backend and the other one, forced."""

    type: str
    ne11: int
    upstream: str = "MMQ"

    @property
    def configs(self) -> tuple[str, ...]:
        return (DEFAULT, AA, *(b for b in BACKENDS if b != self.upstream))


def upstream_backend(arch: Arch, type_name: str, ne11: int) -> str:
    """``ggml_cuda_should_use_mmq`` of llama.cpp 0c1e570 (mmq.cu L318-450) for a dense model: MMQ or BLAS."""
    cc = cc_of(arch)
    if getattr(arch, "vendor", None) == "nvidia" and cc >= 750:
        return "MMQ"
    if cc < OFFSET_AMD:
        raise UsageError(
            f"The MMQ sweep models upstream's choice with Turing tensor cores and on AMD; {arch.name!r} is neither."
        )
    gfx = cc - OFFSET_AMD
    if amd_mfma(cc):  # CDNA
        if 0x942 <= gfx < 0x950:  # CDNA3: rocBLAS performs poorly there, MMQ always
            return "MMQ"
        ok = ne11 <= 128 or type_name in ("q4_0", "q4_1", "q5_0", "q5_1")
        return "MMQ" if ok or (ne11 <= 256 and type_name in ("q4_K", "q5_K")) else "BLAS"
    if amd_wmma(cc) and gfx < 0x1200:  # RDNA3 and RDNA3.5 (RDNA4 is MMQ always)
        limit = {"q2_K": 128, "q6_K": 128 if gfx < 0x1150 else 256}
        if type_name in ("iq2_xs", "iq2_s"):
            return "MMQ" if gfx >= 0x1150 or ne11 <= 128 else "BLAS"
        return "MMQ" if ne11 <= limit.get(type_name, ne11) else "BLAS"
    if gfx == 0x900 or gfx in (0x909, 0x90C):  # Vega 10 and the GCN APUs: no native dp4a
        return "BLAS"
    return "MMQ"


def plan_mmq(arch: Arch, types: Iterable[str] = MMQ_TYPES, batches: Iterable[int] = MMQ_BATCHES) -> list[MmqCell]:
    """Every (type, ne11) cell with upstream's backend there (:func:`upstream_backend`)."""
    bad = [t for t in types if t not in MMQ_SUPPORTED]
    if bad:
        raise UsageError(f"Types {bad} are not supported by MMQ ({', '.join(MMQ_SUPPORTED)}).")
    return [MmqCell(type=t, ne11=b, upstream=upstream_backend(arch, t, b)) for t in types for b in sorted(set(batches))]


def block_size(type_name: str) -> int:
    """Values per quantization block of an MMQ type; a weight row (``k``) must be a multiple of it."""
    return 32 if type_name in _BLOCK_32 else 256


def mmq_dry_run_text(
    cells: Sequence[MmqCell],
    *,
    limits: tuple[int, int],
    sizes: Sequence[tuple[int, int]] = ((4096, 4096),),
    chunks: int = 1,
    per_call_s: float | None = None,
    open_share: float = OPEN_SHARE,
) -> str:
    """What ``tuner sweep mmq`` runs for ``cells`` at the weight ``sizes``, with the time estimated from
    :data:`PROCESS_S`: every point gets ``limits[0]`` rounds, then an assumed ``open_share`` of them every further
    round (an upper figure). ``per_call_s`` adds a what-if time per case."""
    lo, hi = limits
    cases = sum(1 for c in cells for _m, k in sizes if k % block_size(c.type) == 0)
    n_configs = len(cells[0].configs) if cells else 3
    procs = n_configs * chunks * lo
    total = cases * n_configs * lo
    more_procs = n_configs * chunks * (hi - lo)
    more = round((hi - lo) * open_share * cases * n_configs)
    per_case = (PROCESS_S - START_S) / PROCESS_CASES
    est = (procs + more_procs) * START_S + (total + more) * per_case
    skipped = sum(1 for t in sorted({c.type for c in cells}) for _m, k in sizes if k % block_size(t))
    head = (
        f"sweep mmq: {n_configs * chunks} processes a round ({n_configs} configs: upstream, its A/A twin, cuBLAS "
        f"forced; {chunks} chunk{'s' if chunks != 1 else ''} of sizes)"
    )
    first = tail = ""
    if hi > lo:
        first = f"{duration_text(procs * START_S + total * per_case)} for the first {lo} rounds; "
        fixed = (procs + more_procs) * START_S + cases * n_configs * hi * per_case
        head += (
            f"; {lo} rounds for every point, up to {hi} for the points whose verdict is still open: {procs} "
            f"processes and {total} cases for the first {lo} rounds, then about {more_procs} processes and {more} "
            f"cases (assumed: {open_share:.0%} of the points still open after {lo} rounds, each to {hi})"
        )
        tail = f"; fixed {hi} rounds would be {cases * n_configs * hi} cases, {duration_text(fixed)}"
    else:
        head += f" x {lo} rounds = {procs} processes, {total} cases"
    text = (
        f"MMQ vs cuBLAS sweep: {len({c.type for c in cells})} types x {len(sizes)} sizes x "
        f"{len({c.ne11 for c in cells})} batch sizes = {cases} cases a config"
        + (f" ({skipped} type/size pairs skipped: k not a multiple of the type's block)" if skipped else "")
        + "\n"
        f"  sizes m x k: {', '.join(f'{m}x{k}' for m, k in sizes)}\n"
        f"{head}; estimated {duration_text(est)} ({first}an estimate: {START_S:g} s a process and {per_case:.3f} s a "
        f"case from an H100 process of the default grid's {PROCESS_CASES} cases at 20 ms that took {PROCESS_S:g} s){tail}\n"
    )
    if per_call_s is not None:
        text += f"time at {per_call_s:g} s per case (what-if): {(total + more) * per_call_s / 60:.1f} min\n"
    return text


# ----------------------------------------------------------------------------------------- measured sweep

DEFAULT_LIKE = ("llama-3.2-1b", "llama-3.1-8b", "qwen2.5-0.5b")
"""The models whose projection sizes the sweep times unless ``--like`` or ``--size`` says otherwise."""
LABELS = {DEFAULT: "upstream", AA: "AA", "BLAS": "BLAS"}
"""Config -> the label of its process and log folder (``A/A`` is no file name)."""
CONFIGS = (DEFAULT, AA, "BLAS")
MAX_CASES = 2000
"""Cases per process above which the points are split, whole sizes at a time, into chunks."""

_SIZE = re.compile(r"([0-9]{1,7})x([0-9]{1,7})")

RunCases = Callable[..., list[mm_bench.MmBenchCase]]
MmqKey = tuple[str, int, int, int]
"""A point's sample key: (type, m, k, ne11)."""
MmqFamily = tuple[str, tuple[int, int]]
"""The points one Holm correction runs over: a type and a size's batch sizes."""


def projection_sizes(shape: ModelShape) -> list[tuple[int, int]]:
    """The (m, k) of a model's dense projections (attention Q, O, K/V; FFN gate/up, down), deduplicated, sorted."""
    q = shape.n_heads * shape.head_dim
    kv = shape.n_kv_heads * shape.head_dim
    d, ff = shape.d_model, shape.d_ff
    return sorted({(q, d), (d, q), (kv, d), (ff, d), (d, ff)})


def like_sizes(names: Iterable[str]) -> list[tuple[int, int]]:
    """The projection sizes of the named models, deduplicated, sorted; UsageError for an unknown name."""
    return sorted({s for n in names for s in projection_sizes(load_model_shape(n))})


def parse_size(text: str) -> tuple[int, int]:
    """``MxK`` (e.g. ``4096x14336``) as (m, k); UsageError unless both are in [1, 1048576]."""
    m = _SIZE.fullmatch(text.strip().lower())
    if not m or not all(1 <= int(v) <= 1 << 20 for v in m.groups()):
        raise UsageError(f"Size {text!r} is not MxK with m and k in [1, 1048576] (e.g. 4096x14336).")
    return int(m.group(1)), int(m.group(2))


@dataclasses.dataclass(frozen=True, order=True, kw_only=True)
class MmqPoint:
    """One quant type, weight size and batch size; upstream's backend there."""

    type: str
    m: int
    k: int
    ne11: int
    upstream: str = "MMQ"

    @property
    def size(self) -> tuple[int, int]:
        return (self.m, self.k)

    @property
    def key(self) -> MmqKey:
        return (self.type, self.m, self.k, self.ne11)

    @property
    def shape(self) -> mm_bench.MmShape:
        return mm_bench.MmShape(type=self.type, m=self.m, k=self.k, ne11=self.ne11)


def plan_points(
    cells: Sequence[MmqCell], sizes: Sequence[tuple[int, int]]
) -> tuple[list[MmqPoint], list[tuple[str, int, int]]]:
    """Every cell at every size, and the (type, m, k) left out (``k`` not a multiple of the block)."""
    points, skipped = [], []
    for m, k in sorted(set(sizes)):
        for c in cells:
            if k % block_size(c.type) == 0:
                points.append(MmqPoint(type=c.type, m=m, k=k, ne11=c.ne11, upstream=c.upstream))
            elif (c.type, m, k) not in skipped:
                skipped.append((c.type, m, k))
    return points, skipped


def stored_points(samples: Iterable[Sample[MmqKey]]) -> list[MmqPoint]:
    """The points a store's samples measured (upstream's backend: MMQ), sorted."""
    return sorted({MmqPoint(type=t, m=m, k=k, ne11=n) for t, m, k, n in (s.key for s in samples)})


def blas_env(types: Iterable[str]) -> dict[str, str]:
    """The environment forcing cuBLAS for every one of ``types`` at every batch size."""
    choices = [MmqChoice(type=t, lo=0, hi=None, backend="BLAS") for t in sorted(set(types))]
    return {mm_bench.ENV: mmq_env(choices)}


def mmq_plan_text(arch: Arch, *, limits: tuple[int, int], per_call_s: float | None = None) -> str:
    """`tuner sweep mmq`'s plan at its defaults: every type and batch size at the default models' sizes."""
    cells = plan_mmq(arch)
    sizes = like_sizes(DEFAULT_LIKE)
    chunks = len(pack_groups(plan_points(cells, sizes)[0], MMQ.group, MAX_CASES))
    text = mmq_dry_run_text(cells, limits=limits, sizes=sorted(set(sizes)), chunks=chunks, per_call_s=per_call_s)
    blas = [c for c in cells if c.upstream == "BLAS"]
    if cc_of(arch) < OFFSET_AMD:
        return text
    # on AMD, ggml_cuda_should_use_mmq picks hipBLAS at some points: there MMQ is the config forced
    each = ", ".join(
        f"{t} from {min(c.ne11 for c in blas if c.type == t)}" for t in dict.fromkeys(c.type for c in blas)
    )
    return (
        f"upstream on {arch.name} (ggml_cuda_should_use_mmq's AMD rules): MMQ at {len(cells) - len(blas)} of "
        f"{len(cells)} (type, batch) points, hipBLAS at {len(blas)}{f' ({each})' if blas else ''}; the sweep times "
        f"hipBLAS against upstream's MMQ, so those are left out. No {arch.name} was timed here: the times below are "
        "an H100's.\n" + text
    )


MMQ_TABLE = Table[MmqKey](
    name="mm_samples",
    create="CREATE TABLE IF NOT EXISTS mm_samples (type TEXT NOT NULL, m INTEGER NOT NULL, "
    "k INTEGER NOT NULL, ne11 INTEGER NOT NULL, config TEXT NOT NULL, round INTEGER NOT NULL, "
    "us_per_op REAL, error TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (type, m, k, ne11, config, round))",
    columns=("type", "m", "k", "ne11"),
    n_key=4,
    encode=lambda key: key,
    decode=lambda row: (str(row[0]), int(row[1]), int(row[2]), int(row[3])),
    value="us_per_op",
    identity={"schema": "1", "sweep": "mmq"},
    what="an MMQ sweep storage",
    fix="Pass another --storage, or the same build, backend, --iters, --cache-mb and CUDA graph setting.",
    strict=True,
    # files made before these options were measured with graphs on and ITERS ops a case
    legacy={"cuda_graphs": "on", "target_ms": "0"},
)
"""The MMQ sweep's samples (``mmq.sqlite3``); a run of another identity is refused."""

MMQ = Spec[MmqPoint, MmqKey, MmqFamily](
    name="sweep mmq",
    noun="point",
    configs=CONFIGS,
    labels=LABELS,
    key=lambda p: p.key,
    family=lambda p: (p.type, p.size),
    x=lambda p: p.ne11,
    group=lambda p: p.size,
    phase=lambda _: "pp",
    upstream=lambda p: p.upstream,
    configs_of=lambda _: CONFIGS,
    open_share=OPEN_SHARE,
    reason_names=LABELS,
)
"""The points' spec of the round engine: a type and size's batch sizes are one family, chunks keep sizes whole."""


def run_mmq(
    points: Sequence[MmqPoint],
    *,
    limits: tuple[int, int],
    store: SampleStore[MmqKey],
    bin_dir: Path,
    backend: str,
    log_dir: Path,
    run_cases: RunCases | None = None,
    iters: int = 50,
    cache_mb: int = 128,
    max_cases: int = MAX_CASES,
    forced_reason: str = "",
    cuda_graphs: bool = True,
    target_ms: int = 0,
    budget: Budget | None = None,
) -> tuple[int, int]:
    """Measure what ``store`` does not hold yet (:func:`tuner.rounds.engine.run_rounds`), one mm-bench process
    per config and chunk a round. ``forced_reason``: why the forced config cannot run (its samples are stored
    failed); ``target_ms``: mm-bench's ``-m``. Returns (processes run, processes skipped as already recorded)."""
    run = run_cases or mm_bench.run_cases
    env = blas_env(p.type for p in points)

    def measure(ps: Sequence[MmqPoint], cfg: str, r: int, logs: Path) -> list[Sample[MmqKey]]:
        out = run(
            bin_dir, [p.shape for p in ps], {} if cfg in (DEFAULT, AA) else env, log_dir=logs, backend=backend,
            iters=iters, cache_mb=cache_mb, timeout=120.0 + 5.0 * len(ps), cuda_graphs=cuda_graphs,
            target_ms=target_ms,
        )  # fmt: skip
        samples = []
        for p, c in zip(ps, out, strict=True):
            us = c.us_per_op if c.us_per_op is not None and not c.error else None
            bad = us is None or not (math.isfinite(us) and us > 0)
            why = (c.error or f"time {c.us_per_op!r} us is not a positive number") if bad else ""
            samples.append(Sample(key=p.key, config=cfg, round=r, us=us, error=why))
        return samples

    return run_rounds(
        MMQ, points, limits=limits, store=store, measure=measure, log_dir=log_dir, chunk_size=max_cases,
        cost=(START_S, (PROCESS_S - START_S) / PROCESS_CASES), forced_reason=forced_reason, budget=budget,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class MmqOutcome(Verdicts[MmqFamily]):
    """A measured MMQ sweep: the engine's verdicts, per type its batch-size decisions and the composed choices."""

    type_decisions: Mapping[str, Sequence[Decision]]
    choices: tuple[MmqChoice, ...]
    withheld: str = ""
    """Why no choice is composed whatever the verdicts (a backend without the choice), else empty."""


def _type_decision(
    t: str, ne11: int, sizes: Sequence[tuple[int, int]], decisions: Mapping[MmqFamily, Sequence[Decision]]
) -> Decision:
    """cuBLAS wins ``ne11`` for type ``t`` only where it won at every size (module doc)."""
    won: list[Decision] = []
    blocked = []
    for size in sizes:
        d = next((x for x in decisions.get((t, size), ()) if x.depth == ne11), None)
        if d is None or d.winner != "BLAS":
            why = "not measured" if d is None else ("no verdict" if "no verdict" in d.reason else "MMQ stays")
            why = "too noisy" if d is not None and TOO_NOISY in d.reason else why
            blocked.append(f"{size[0]}x{size[1]} ({why})")
        else:
            won.append(d)
    if blocked or not won:
        return gap_decision("pp", ne11, "MMQ", "cuBLAS not faster at every size: " + ", ".join(blocked))
    worst = min(won, key=lambda d: d.effect_pct)
    return dataclasses.replace(
        worst, reason=f"cuBLAS faster at all {len(won)} sizes (smallest gain {worst.effect_pct:+.1f}%)"
    )


def compose_mmq(
    points: Sequence[MmqPoint], samples: Iterable[Sample[MmqKey]], *, limits: tuple[int, int], withhold: str = ""
) -> MmqOutcome:
    """Verdicts and choices from the stored samples; ``withhold``: compose no choice, still report verdicts."""
    v = judge(MMQ, points, samples, limits=limits)
    type_ds: dict[str, list[Decision]] = {}
    choices: list[MmqChoice] = []
    for t in sorted({p.type for p in points}):
        sizes = sorted({p.size for p in points if p.type == t})
        type_ds[t] = [_type_decision(t, n, sizes, v.decisions) for n in sorted({p.ne11 for p in points if p.type == t})]
        if not withhold:
            choices += [
                MmqChoice(type=t, lo=r.lo, hi=r.hi, backend=r.kernel) for r in rules_from(type_ds[t], Shape(kv=None))
            ]
    return MmqOutcome(
        stats=v.stats, no_verdict=v.no_verdict, decisions=v.decisions, type_decisions=type_ds,
        choices=tuple(choices), withheld=withhold,
    )  # fmt: skip


def no_choice_text(outcome: MmqOutcome) -> str:
    """Why nothing was composed, in words."""
    if outcome.withheld:
        return f"withheld: {outcome.withheld}"
    if not outcome.stats:
        return "no point has a verdict"
    return "MMQ (upstream's choice) stays: at no batch size was cuBLAS faster at every size of a type"


def _cell_text(st: CellStats | None, d: Decision | None, why: str | None) -> str:
    """One point in the report: MMQ time / cuBLAS time with its 95% CI, the A/A noise, the verdict."""
    if why is not None:
        return "no verdict"
    e = None if st is None else st.effects.get("BLAS")
    if st is None or e is None:
        return "-"
    ci = f"[{e.ci_low:.3f}, {e.ci_high:.3f}]" if math.isfinite(e.ci_low) else "[n/a]"
    verdict = "cuBLAS" if d is not None and d.winner == "BLAS" else "MMQ"
    if d is not None and d.winner is None and TOO_NOISY in d.reason:
        verdict += " (size too noisy)"  # its own interval may look clear; the size's A/A noise decides (legend)
    return f"{e.ratio:.3f} {ci} ±{st.noise_pct:.1f}% {verdict}"


def _type_table(outcome: MmqOutcome, t: str, points: Sequence[MmqPoint]) -> list[str]:
    sizes = sorted({p.size for p in points if p.type == t})
    lines = [
        f"### {t}",
        "",
        "| ne11 | " + " | ".join(f"{m}x{k}" for m, k in sizes) + " | over all sizes |",
        "|---:|" + "---|" * (len(sizes) + 1),
    ]
    for td in outcome.type_decisions.get(t, ()):
        n = td.depth
        row = []
        for size in sizes:
            st = outcome.stats.get((t, size), {}).get(n)
            d = next((x for x in outcome.decisions.get((t, size), ()) if x.depth == n), None)
            row.append(_cell_text(st, d, outcome.no_verdict.get((t, size), {}).get(n)))
        verdict = "**cuBLAS**" if td.winner == "BLAS" else "MMQ stays"
        lines.append(f"| {n} | " + " | ".join(row) + f" | {verdict}: {td.reason.removeprefix('no verdict: ')} |")
    return [*lines, ""]


_GRAPHS_TEXT = {
    "off": "CUDA graphs were off in every process (`GGML_CUDA_DISABLE_GRAPHS=1`): each case's graph of "
    "multiplications ran directly, kernel by kernel.",
    "on": "CUDA graphs were on in every process, as in llama.cpp's CUDA builds: ggml's CUDA backend captured each "
    "case's graph of multiplications in its second warm-up run and the timed run replayed it.",
}
"""The report's sentence on CUDA graphs, by the identity's ``cuda_graphs`` (none for a store without it)."""


def _rounds_line(outcome: MmqOutcome, limits: tuple[int, int]) -> list[str]:
    """The report's count of points per number of rounds they got (sequential rounds only)."""
    if limits[1] == limits[0]:
        return []
    by_n = Counter(len(c.series[UPSTREAM]) for st in outcome.stats.values() for c in st.values())
    return ["- rounds a point with a verdict got: " + ", ".join(f"{n}: {k} points" for n, k in sorted(by_n.items()))]


def mmq_report_text(
    outcome: MmqOutcome,
    points: Sequence[MmqPoint],
    *,
    limits: tuple[int, int],
    identity: Mapping[str, str],
    skipped: Sequence[tuple[str, int, int]] = (),
    patch: bool,
) -> str:
    """report.md: what was measured, the composed choices, every size's ratio and every point without a verdict."""
    n_gap = outcome.n_gaps
    types = sorted({p.type for p in points})
    sizes = sorted({p.size for p in points})
    not_swept = ", ".join(f"{t} {m}x{k}" for t, m, k in skipped)
    lines = [
        "# MMQ vs cuBLAS sweep",
        "",
        *(f"- {k}: {v}" for k, v in identity.items()),
        f"- points: {len(points)} ({len(types)} types, {len(sizes)} sizes m x k: "
        f"{', '.join(f'{m}x{k}' for m, k in sizes)}; batch sizes {sorted({p.ne11 for p in points})}), "
        f"paired rounds: {rounds_text(limits, 'point')}",
        f"- points with a verdict: {len(points) - n_gap}; without one: {n_gap}",
        *_rounds_line(outcome, limits),
        *([f"- not swept (k not a multiple of the type's block): {not_swept}"] if skipped else []),
        "",
        "Per round, one mm-bench process per config over every point that gets the round: upstream's choice (MMQ), "
        "the same again (the A/A pair) and cuBLAS forced through `GGML_TUNER_MMQ_CHOICES`, in an order rotated from "
        "round to round. "
        + (
            f"Every point gets {limits[0]} rounds; a further round, up to {limits[1]}, goes only to the points whose "
            "verdict is still open (neither claimed nor settled by futility, the search's settle rule), and a "
            "point's p-value is divided by the share of alpha of the round count it stopped at before Holm over "
            "its type and size's batch sizes. "
            if limits[1] > limits[0]
            else ""
        )
        + "A cell below is `MMQ time / cuBLAS time` (above 1: cuBLAS faster) with its 95% CI, the A/A noise and the "
        "verdict there (cuBLAS only where the decision rule, A/A-controlled, calls it faster; `MMQ (size too noisy)` "
        f"where the size's A/A noise, the median over its batch sizes, is above the {NOISE_CEILING_PCT:g}% ceiling, so "
        "none of its batch sizes claims anything, whatever its own interval). A batch size goes "
        "to cuBLAS for a type only where cuBLAS won at every size of that type; consecutive such batch sizes form "
        "one choice, `TYPE:LO..HI=BLAS` (ne11 in [LO, HI)).",
        *(["", _GRAPHS_TEXT[identity["cuda_graphs"]]] if identity.get("cuda_graphs") in _GRAPHS_TEXT else []),
        "",
        "## Composed choices",
        "",
        *([f"- `{c.text}`" for c in outcome.choices] or [f"None: {no_choice_text(outcome)}."]),
        "",
        "`upstream.patch` adds them to `ggml_cuda_should_use_mmq`." if patch else "No `upstream.patch`.",
        "",
        "## Per type and batch size",
        "",
    ]
    for t in types:
        lines += _type_table(outcome, t, points)
    if n_gap:
        lines += ["## Points without a verdict", ""]
        gaps = sorted(outcome.no_verdict.items())
        lines += [f"- {t} {m}x{k} ne11 {n}: {why}" for (t, (m, k)), xs in gaps for n, why in sorted(xs.items())]
    return "\n".join(lines).rstrip("\n") + "\n"

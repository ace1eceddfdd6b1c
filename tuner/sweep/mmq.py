"""MMQ vs cuBLAS: a runtime hook in ``ggml_cuda_should_use_mmq``, its sweep, and its upstream condition.

``ggml_cuda_should_use_mmq(type, cc, ne11, n_experts)`` (``ggml/src/ggml-cuda/mmq.cu`` L318 of
llama.cpp 0c1e570) decides whether a quantized matrix multiplication runs llama.cpp's own MMQ kernels
or dequantizes to cuBLAS. On NVIDIA GPUs with Turing tensor cores it returns true for every supported
type and batch size (``if (turing_mma_available(cc)) return true;``), Hopper included.

* **Hook.** :func:`patched_mmq_hook` adds a table read once from ``GGML_TUNER_MMQ_CHOICES``
  (comma-separated ``TYPE:LO..HI=MMQ|BLAS``: a ggml type name, ``ne11`` in ``[LO, HI)``, HI empty =
  unbounded; the first entry that covers a call decides it) and consults it for dense multiplications
  (``n_experts == 0``) after upstream's own support and shared-memory checks, before the arch
  branches; a call no entry covers keeps upstream's choice, and text that does not parse aborts
  with the entry named. The same hook is how a sweep forces either backend (``q4_K:0..=BLAS``).
* **Sweep.** Per quant type and batch size ``ne11`` (:func:`plan_mmq`), paired rounds of upstream's
  choice, its A/A twin and the other backend forced, composed per type into intervals of batch sizes
  where the other backend is faster, as the FlashAttention sweep composes n_kv intervals; measured and
  composed by :mod:`tuner.sweep.mmq_live` (``tuner sweep mmq``).
* **Upstream form.** :func:`patched_mmq_condition`: for the measured arch (``cc == GGML_CUDA_CC_HOPPER``),
  a ``switch`` on the type returning false (cuBLAS) inside each composed interval, before the
  Turing branch; :func:`match_mmq` is the same lookup in Python.
"""

from __future__ import annotations

__all__ = [
    "BACKENDS",
    "ENV",
    "MMQ_BATCHES",
    "MMQ_FILE",
    "MMQ_SUPPORTED",
    "MMQ_TYPES",
    "OPEN_SHARE",
    "PROCESS_CASES",
    "PROCESS_S",
    "START_S",
    "MmqCell",
    "MmqChoice",
    "block_size",
    "hook_block",
    "match_mmq",
    "mmq_dry_run_text",
    "mmq_env",
    "mmq_harness_source",
    "parse_mmq_choices",
    "patched_mmq_condition",
    "patched_mmq_hook",
    "plan_mmq",
    "render_mmq_patch",
]

import dataclasses
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tuner.errors import TunerError, UsageError, close_matches
from tuner.result.upstream_patch import COMMON, arch_condition, git_diff
from tuner.sweep.grid import AA, DEFAULT, duration_text

MMQ_FILE = "ggml/src/ggml-cuda/mmq.cu"
ENV = "GGML_TUNER_MMQ_CHOICES"
BACKENDS = ("MMQ", "BLAS")
MMQ_TYPES = ("q4_0", "q4_K", "q5_K", "q6_K", "q8_0", "iq4_xs")
"""The quant types swept (ggml_type_name spelling)."""
MMQ_BATCHES = tuple(2**i for i in range(4, 13))
"""``ne11`` from 16 to 4096 in octaves: below 16 llama.cpp multiplies by vector kernels, and cuBLAS's
advantage, where it has one, grows with the batch's order of magnitude."""
MMQ_SUPPORTED = (
    *("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K"),
    *("iq1_s", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq4_xs", "iq4_nl", "mxfp4"),
)
"""Types ``ggml_cuda_should_use_mmq`` supports (its ``mmq_supported`` switch), as ggml_type_name spells them."""
_BLOCK_32 = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "mxfp4")
PROCESS_S = 59.4
"""Measured: seconds of one mm-bench process over the default grid's 540 cases at the default 20 ms target on
an H100 (docs/data/h100-sweep-sm90/mmq-transcript.txt: two full rounds of three processes took 178.7 and
177.8 s); :func:`mmq_dry_run_text` scales it by cases (an estimate; ``--target-ms 0`` runs faster)."""
PROCESS_CASES = 540
START_S = 2.5
"""Estimate: the part of a process that is CUDA start (as for test-backend-ops, docs/sweep.md)."""
OPEN_SHARE = 0.5
"""Assumption: the share of points whose verdict is still open after ``min_rounds`` and that then take every
round up to ``max_rounds``; the plan's estimate of the sequential rounds. The only MMQ-vs-cuBLAS rounds on
record (docs/data/h100-mmq-probe/: 4096 x 4096 only, 3 rounds, two builds rather than the hook), replayed
through the settle rule with limits 3..6, leave 11 of 54 points open (20%; 8 of them at the crossover,
ne11 256 and 512). The default grid's other eleven sizes, most of them far smaller, have no cuBLAS rounds
to replay (the first H100 sweep's cuBLAS process failed: docs/data/h100-sweep-first/), so the plan assumes
the FlashAttention sweep's 50%, an upper-side figure."""

_FUNCTION = "bool ggml_cuda_should_use_mmq(enum ggml_type type, int cc, int64_t ne11, int64_t n_experts) {"
_TURING = "    if (turing_mma_available(cc)) {\n        return true;\n    }\n"
_ENTRY = re.compile(r"([A-Za-z0-9_]+):([0-9]{1,18})\.\.([0-9]{0,18})=(MMQ|BLAS)")
_GRAMMAR = "TYPE:LO..HI=MMQ|BLAS (ne11 in [LO, HI), HI empty = unbounded; e.g. q4_K:1024..=BLAS)"


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


def parse_mmq_choices(text: str) -> tuple[MmqChoice, ...]:
    """``GGML_TUNER_MMQ_CHOICES`` as the hook reads it: comma-separated entries, empty ones skipped, no spaces.

    The hook accepts any ggml type name; this parser only the types MMQ supports (:data:`MMQ_SUPPORTED`).

    Raises:
        UsageError: An entry that does not parse, an unknown type or ``HI <= LO`` (where the hook aborts).
    """
    out = []
    for item in text.split(","):
        if not item:
            continue
        m = _ENTRY.fullmatch(item)
        if not m:
            raise UsageError(f"{ENV} entry {item!r} is not {_GRAMMAR}.")
        if m.group(1) not in MMQ_SUPPORTED:
            raise UsageError(
                f"{ENV} entry {item!r}: {m.group(1)!r} is no type MMQ supports ({', '.join(MMQ_SUPPORTED)})."
                f"{close_matches(m.group(1), MMQ_SUPPORTED)}"
            )
        lo, hi = int(m.group(2)), int(m.group(3)) if m.group(3) else None
        if hi is not None and hi <= lo:
            raise UsageError(f"{ENV} entry {item!r}: HI {hi} must be greater than LO {lo}.")
        out.append(MmqChoice(type=m.group(1), lo=lo, hi=hi, backend=m.group(4)))
    return tuple(out)


def mmq_env(choices: Iterable[MmqChoice]) -> str:
    """The ``GGML_TUNER_MMQ_CHOICES`` value of ``choices`` (comma-joined, no spaces)."""
    return ",".join(c.text for c in choices)


def match_mmq(choices: Sequence[MmqChoice], type_name: str, ne11: int) -> str | None:
    """The backend the first covering entry names, or None where upstream's choice stays."""
    return next((c.backend for c in choices if c.type == type_name and c.covers(ne11)), None)


# ------------------------------------------------------------------------------------------------- C++

_HOOK_MANIFEST = "mmq-hook"
"""The opt-in patch manifest ``templates/patches/mma/mmq-hook.toml`` (hook ``mmq``): the hook's C++ is its
templates, so the sweep's build and :func:`patched_mmq_hook` carry the same text."""
_HOOK_TEMPLATE = "patches/mma/mmq-hook.cu.j2"


def hook_block() -> str:
    """The hook's C++ (parser, table and lookup) as :func:`patched_mmq_hook` puts it before the function."""
    from tuner.plan.patch import render_template

    return render_template(_HOOK_TEMPLATE, {}, what="the MMQ hook")


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
    """mmq.cu of the pristine tree at ``root`` with the runtime hook (module doc): the opt-in manifest
    ``mmq-hook`` alone, as a build with ``render_variant(..., hooks=("mmq",))`` carries it."""
    from tuner.plan.patch import patched_file

    _function(root)  # the structure check, with its message
    return patched_file(root, "mma", _HOOK_MANIFEST, MMQ_FILE)


def patched_mmq_condition(
    root: Path, choices: Sequence[MmqChoice], arch: Any, cond: str, *, note: str = ""
) -> str | None:
    """mmq.cu with the composed choices as upstream-style conditions for ``arch`` (None where none is BLAS).

    ``cond`` is the arch's condition on ``cc`` (:func:`tuner.result.upstream_patch.arch_condition`).
    Only cuBLAS entries become code: on an arch with Turing tensor cores upstream runs MMQ everywhere.

    Raises:
        TunerError: An arch without Turing tensor cores, or a tree of another structure.
    """
    if getattr(arch, "vendor", None) != "nvidia" or int(getattr(arch, "cc", 0) or 0) < 750:
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


def render_mmq_patch(root: Path, choices: Sequence[MmqChoice], arch: Any, *, note: str = "") -> str | None:
    """``upstream.patch`` of the composed choices: a git-format diff of mmq.cu of the pristine tree at
    ``root`` (:func:`patched_mmq_condition`, the arch matched exactly); None where no choice is cuBLAS."""
    common = root / COMMON
    if not common.is_file():
        raise TunerError(f"{root} has no {COMMON}; the MMQ patch needs the pristine llama.cpp tree.")
    new = patched_mmq_condition(root, choices, arch, arch_condition(arch, common.read_text()), note=note)
    return None if new is None else git_diff(MMQ_FILE, (root / MMQ_FILE).read_text(), new)


def mmq_harness_source(patched: str, type_names: Sequence[str]) -> str:
    """A host-only C++ program around the hook of a patched mmq.cu, for comparing it with :func:`match_mmq`.

    ggml's types are stubbed by ``type_names`` (in order, then ``GGML_TYPE_COUNT``), ``GGML_ABORT`` prints
    and exits with status 3. The program reads ``GGML_TUNER_MMQ_CHOICES``, then lines ``TYPE_INDEX NE11``
    from stdin, and prints ``MMQ``, ``BLAS`` or ``NONE`` per line.
    """
    start = patched.find(hook_block().splitlines()[0])
    fn = patched.find("static int ggml_tuner_mmq_choose(", start)
    end = patched.find("\n}\n", fn)
    if start < 0 or fn < 0 or end < 0:
        raise TunerError("The patched mmq.cu has no GGML_TUNER_MMQ_CHOICES hook to extract.")
    enum = ", ".join(f"GGML_TYPE_{t.upper()} = {i}" for i, t in enumerate(type_names))
    names = ", ".join(f'"{t}"' for t in type_names)
    return "\n".join(
        [
            "#include <cstdint>",
            "#include <cstdio>",
            "#include <cstdlib>",
            "#include <string>",
            "#include <vector>",
            f"enum ggml_type {{ {enum}, GGML_TYPE_COUNT }};",
            f"static const char * ggml_type_name(ggml_type t) {{ static const char * n[] = {{{names}}}; return n[t]; }}",
            "#define GGML_ABORT(...) (std::fprintf(stderr, __VA_ARGS__), std::fputc('\\n', stderr), std::exit(3))",
            patched[start : end + 3],
            "int main() {",
            "    int t;",
            "    long long ne11;",
            '    while (std::scanf("%d %lld", &t, &ne11) == 2) {',
            "        const int r = ggml_tuner_mmq_choose((ggml_type) t, ne11);",
            '        std::puts(r == 1 ? "MMQ" : r == 0 ? "BLAS" : "NONE");',
            "    }",
            "    return 0;",
            "}",
            "",
        ]
    )


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


def plan_mmq(arch: Any, types: Iterable[str] = MMQ_TYPES, batches: Iterable[int] = MMQ_BATCHES) -> list[MmqCell]:
    """Every (type, ne11) cell; upstream's backend is MMQ on an NVIDIA arch with Turing tensor cores (module doc)."""
    if getattr(arch, "vendor", None) != "nvidia" or int(getattr(arch, "cc", 0) or 0) < 750:
        raise UsageError(f"The MMQ sweep models upstream's choice with Turing tensor cores; {arch.name!r} has none.")
    bad = [t for t in types if t not in MMQ_SUPPORTED]
    if bad:
        raise UsageError(f"Types {bad} are not supported by MMQ ({', '.join(MMQ_SUPPORTED)}).")
    return [MmqCell(type=t, ne11=b) for t in types for b in sorted(set(batches))]


def block_size(type_name: str) -> int:
    """Values per quantization block of an MMQ type: 32 for the legacy types, iq4_nl and mxfp4, else 256;
    a weight row (``k``) must be a multiple of it."""
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
    """What ``tuner sweep mmq`` runs for ``cells`` at the weight ``sizes`` (m x k): one mm-bench process per
    config, round and chunk of sizes, every case of the chunk still open in it, with the time estimated from
    the H100 sweep's 59.4 s per 540-case process (:data:`PROCESS_S`); ``per_call_s`` adds a what-if time per
    case. ``limits`` (min_rounds, max_rounds): every point gets the minimum, then an assumed ``open_share``
    of the points takes every further round up to the maximum (every chunk's processes counted in every
    further round: an upper figure where a whole chunk settles). A (type, size) pair whose ``k`` is no
    multiple of the type's block is not swept (llama.cpp quantizes such a tensor to another type)."""
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
    first = f"{duration_text(procs * START_S + total * per_case)} for the first {lo} rounds; " if hi > lo else ""
    tail = ""
    if hi > lo:
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

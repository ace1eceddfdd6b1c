"""Kernel-level FlashAttention screen: ``FLASH_ATTN_EXT`` alone, at a model's exact shapes, in seconds.

llama-bench pays a context fill per depth per call (docs/llama-bench-cost.md); this times the op itself,
with no upstream change: ``test-backend-ops perf --test-file FILE`` (``make_test_cases_from_file``, the
format ``tests/test-export-graph-ops.cpp`` writes) builds one ``test_generic_op`` per line from the op's
types, shapes, strides and params, so the file gives the exact tensors of ``build_attn_mha``:

- Q: F32 ``[D, n_batch, n_head, 1]``, the permuted view of ``[D, n_head, n_batch]``;
- K, V: views of the KV cache, ``[D, n_kv, n_head_kv, 1]`` with a row of all KV heads as ``nb1``;
- mask: F16 ``[n_kv, n_batch, 1, 1]``; op params: scale ``1/sqrt(D)``, no ALiBi or softcap,
  F32 accumulation (``ggml_prec_set_acc``), no sparse ``n_kv_max``.

Each candidate runs in its own process (the hook reads ``GGML_TUNER_FA_RULES`` once per process) over every
shape, with ``GGML_TUNER_FA_LOG=1`` so the kernel that ran is read back (:func:`parse_fa_log`; the CPU
backend prints none). Perf mode adds the op to one graph up to 8192 times and repeats the graph for at least
a second, then prints ``N runs - T us/run`` per case. Paired rounds and their statistics are the caller's.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner import log
from tuner.errors import UsageError
from tuner.measure.exe import check_env, find_exe, run_tool
from tuner.plan.fa_rules import FA_RULE_KV_TYPES, FaRule, Phase, rules_env

if TYPE_CHECKING:
    from tuner.targets.models import ModelShape

_BLOCK = {  # ggml type -> (block size, bytes per block): ggml/src/ggml.c type_traits
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
    "q8_0": (32, 34),
    "iq4_nl": (32, 18),
}
assert set(_BLOCK) == set(FA_RULE_KV_TYPES)
_GGML_PREC_F32 = 10  # ggml.h enum ggml_prec
_MAX = 1 << 22


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaShape:
    """One ``FLASH_ATTN_EXT`` call as llama.cpp's graph makes it (module docstring)."""

    head_dim: int
    """K head size D (Q->ne[0])."""
    head_dim_v: int
    """V head size DV."""
    n_head: int
    n_head_kv: int
    n_kv: int
    """K->ne[1]: the cache cells the call reads (llama.cpp pads the used cells to 256)."""
    n_batch: int = 1
    """Q->ne[1]: 1 for decode, the ubatch for prefill."""
    kv_type: str = "f16"

    def __post_init__(self) -> None:
        for name in ("head_dim", "head_dim_v", "n_head", "n_head_kv", "n_kv", "n_batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= _MAX:
                raise UsageError(f"FA shape {name} must be an integer in [1, {_MAX}] (got {v!r}).")
        if self.n_head % self.n_head_kv:
            raise UsageError(f"FA shape: n_head {self.n_head} is not a multiple of n_head_kv {self.n_head_kv}.")
        if self.kv_type not in _BLOCK:
            raise UsageError(f"FA shape kv_type {self.kv_type!r} is not one of {', '.join(_BLOCK)}.")
        blk = _BLOCK[self.kv_type][0]
        if self.head_dim % blk or self.head_dim_v % blk:
            raise UsageError(f"FA shape: head sizes must be multiples of {blk} for K/V type {self.kv_type}.")

    @property
    def gqa(self) -> int:
        return self.n_head // self.n_head_kv

    @property
    def phase(self) -> str:
        """``decode`` or ``prefill``, as the runtime hook's rules name it."""
        return "decode" if self.n_batch == 1 else "prefill"

    @property
    def key(self) -> str:
        """``D64/gqa4/kvf16/nkv4096/nb1``: the rule keys plus n_kv and the batch."""
        return f"D{self.head_dim}/gqa{self.gqa}/kv{self.kv_type}/nkv{self.n_kv}/nb{self.n_batch}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelTime:
    """One candidate's time for one shape in one test-backend-ops call."""

    label: str
    shape: FaShape
    us_per_run: float | None
    """Mean microseconds per op; None when the case did not run (``error`` says why)."""
    runs: int
    kernel: str | None
    """Kernel the FA log names for this shape (None without the log: the CPU backend)."""
    why: str | None
    """``default``, ``rule`` or ``fallback`` (:func:`parse_fa_log`)."""
    backend: str
    error: str = ""
    log_file: str = ""


def shape_for_model(model: ModelShape, *, n_kv: int, n_batch: int = 1, kv_type: str = "f16") -> FaShape:
    """The FA shape of ``model`` at ``n_kv`` cache cells and ``n_batch`` query tokens."""
    d, h, hkv = int(model.head_dim), int(model.n_heads), int(model.n_kv_heads)
    return FaShape(head_dim=d, head_dim_v=d, n_head=h, n_head_kv=hkv, n_kv=n_kv, n_batch=n_batch, kv_type=kv_type)


def force_kernel_env(kernel: str) -> dict[str, str]:
    """The environment that forces ``kernel`` (VEC/TILE/MMA) for every FA call, as the gate does."""
    return {"GGML_TUNER_FA_RULES": rules_env(FaRule(phase=p, lo=0, hi=None, kernel=kernel) for p in Phase)}


def ggml_enums(ggml_h: Path) -> tuple[int, dict[str, int]]:
    """(``GGML_OP_FLASH_ATTN_EXT``'s value, {type name: ``GGML_TYPE_*`` value}) from the tree's ``ggml.h``:
    the test file carries enums as integers, and they move between llama.cpp versions."""
    try:
        text = Path(ggml_h).read_text(errors="replace")
    except OSError as err:
        raise UsageError(f"Cannot read {ggml_h} ({err}); pass the ggml.h of the build's source tree.") from err
    ops = re.search(r"enum\s+ggml_op\s*\{(.*?)\}", text, re.S)
    types = re.search(r"enum\s+ggml_type\s*\{(.*?)\}", text, re.S)
    if not ops or not types:
        raise UsageError(f"{ggml_h} declares no enum ggml_op / enum ggml_type; is it ggml's ggml.h?")
    names = re.findall(r"^\s*(GGML_OP_\w+)", re.sub(r"//[^\n]*", "", ops.group(1)), re.M)
    if "GGML_OP_FLASH_ATTN_EXT" not in names or names[0] != "GGML_OP_NONE":
        raise UsageError(f"{ggml_h}: enum ggml_op has no GGML_OP_FLASH_ATTN_EXT after GGML_OP_NONE.")
    type_ids = {
        m.group(1).lower(): int(m.group(2)) for m in re.finditer(r"GGML_TYPE_(\w+)\s*=\s*(\d+)", types.group(1))
    }
    return names.index("GGML_OP_FLASH_ATTN_EXT"), type_ids


def _row(kv_type: str, n: int) -> int:
    blk, size = _BLOCK[kv_type]
    return n // blk * size


def _kv_src(
    type_id: int, kv_type: str, d: int, n_kv: int, n_head_kv: int
) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """A K or V source of head size ``d``: a view of the KV cache, a row of all KV heads as ``nb1``."""
    strides = (_BLOCK[kv_type][1], _row(kv_type, d * n_head_kv), _row(kv_type, d), _row(kv_type, d * n_head_kv) * n_kv)
    return type_id, (d, n_kv, n_head_kv, 1), strides


def fa_test_file(shapes: Sequence[FaShape], ggml_h: Path) -> str:
    """The ``--test-file`` lines for ``shapes`` (module docstring); case ``i`` is named ``kb<i>_<key>``."""
    op, tid = ggml_enums(ggml_h)
    lines = []
    for i, s in enumerate(shapes):
        if s.kv_type not in tid or "f32" not in tid or "f16" not in tid:
            raise UsageError(f"{ggml_h} has no GGML_TYPE for {s.kv_type}.")
        d, dv, h, hk, n, b = s.head_dim, s.head_dim_v, s.n_head, s.n_head_kv, s.n_kv, s.n_batch
        q = (tid["f32"], (d, b, h, 1), (4, 4 * d * h, 4 * d, 4 * d * h * b))
        k, v = (_kv_src(tid[s.kv_type], s.kv_type, size, n, hk) for size in (d, dv))
        m = (tid["f16"], (n, b, 1, 1), (2, 2 * n, 2 * n * b, 2 * n * b))
        scale = int(struct.unpack("<i", struct.pack("<f", 1.0 / d**0.5))[0])  # the float's bits, as an int32 param
        params = (scale, 0, 0, _GGML_PREC_F32, 0)
        srcs = " ".join(f"{t} {' '.join(map(str, ne))} {' '.join(map(str, nb))}" for t, ne, nb in (q, k, v, m))
        name = f"kb{i}_" + s.key.replace("/", "_")
        lines.append(f"{op} {tid['f32']} {dv} {h} {b} 1 {len(params)} {' '.join(map(str, params))} 4 {srcs} {name}")
    return "".join(line + "\n" for line in lines)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CASE = re.compile(r"^\s*FLASH_ATTN_EXT\(name=kb(\d+)_[^,]*,.*\):\s*(.*)$")
_TIME = re.compile(r"(\d+) runs - +([0-9.]+) us/run")


def parse_perf_output(text: str) -> dict[int, tuple[int, float | None, str]]:
    """{case index: (runs, us per run or None, status text)} from ``test-backend-ops perf`` console
    output of a :func:`fa_test_file` file; a case the backend does not support reads
    ``(0, None, 'not supported')``."""
    out: dict[int, tuple[int, float | None, str]] = {}
    for raw in text.splitlines():
        if not (m := _CASE.match(_ANSI.sub("", raw))):
            continue
        rest = m.group(2).strip()
        t = _TIME.search(rest)
        out[int(m.group(1))] = (int(t.group(1)), float(t.group(2)), "") if t else (0, None, rest or "no time printed")
    return out


def ggml_h_above(bin_dir: Path) -> Path:
    """The build's ``ggml.h``: a tuner build keeps its tree in ``<key>/src`` above ``<key>/build/bin`` and
    ``<key>/artifacts/<candidate>/bin``; the nearest ``src/ggml/include/ggml.h`` (or ``ggml/include``) up."""
    for d in Path(bin_dir).resolve().parents:
        for rel in ("src/ggml/include/ggml.h", "ggml/include/ggml.h"):
            if (d / rel).is_file():
                return d / rel
    raise UsageError(f"No ggml/include/ggml.h above {bin_dir}; pass ggml_h= (the build's llama.cpp tree).")


# The hook may print more fields between n_kv and kernel (type_k=f16 type_v=f16 since rules carry the K/V type).
_FA_LINE = re.compile(
    r"tuner-fa: D=(\d+) DV=(\d+) ne1=(\d+) gqa=(\d+) n_kv=(\d+)((?: [a-z_]+=\S+)*?) kernel=(\w+) \((\w+)\)"
)
_FIELD = re.compile(r" ([a-z_]+)=(\S+)")


def parse_fa_log(text: str) -> list[dict[str, Any]]:
    """The ``tuner-fa:`` lines of a llama-bench log, the tuner build's own record of its FlashAttention choice:
    ``GGML_TUNER_FA_LOG=1`` makes the patched build print one line per distinct shape and kernel
    (``tuner-fa: D=64 DV=64 ne1=1 gqa=4 n_kv=33024 kernel=VEC (default)``): ``default`` is upstream's pick,
    ``rule`` a forced one, ``fallback`` a forced kernel that is illegal there (upstream's choice kept).
    ``type_k`` and ``type_v`` are None where the line has none (a build from before the hook printed them)."""
    out = []
    for m in _FA_LINE.finditer(text):
        extra = dict(_FIELD.findall(m.group(6)))
        sizes = dict(zip(("D", "DV", "ne1", "gqa", "n_kv"), map(int, m.groups()[:5])))
        types = {"type_k": extra.get("type_k"), "type_v": extra.get("type_v")}
        out.append(sizes | types | {"kernel": m.group(7), "why": m.group(8)})
    return out


def kernel_at(lines: Sequence[Mapping[str, Any]], phase: str, depth: int, ntok: int) -> tuple[str | None, str | None]:
    """(kernel, why) of the test at ``depth``: entries of the phase's batch shape whose n_kv lies in
    (depth, depth + ntok + 256] (llama.cpp pads n_kv to 256; the untimed depth fill stays at or below
    ``depth``). A prompt shorter than the micro-batch (``pp2`` after a depth) attends at ``Q->ne[1] = ntok``,
    but the scheduler's graph reservation at the full micro-batch logs a line at the same n_kv: where a line
    has the test's own batch, only those count."""
    hits = [x for x in lines if (x["ne1"] == 1) == (phase == "tg") and depth < x["n_kv"] <= depth + ntok + 256]
    own = [x for x in hits if phase == "pp" and x["ne1"] == ntok]
    hits = own or hits
    if not hits:
        return None, None
    best = max(hits, key=lambda x: x["n_kv"])
    return str(best["kernel"]), str(best["why"])


def fa_log_hit(fa: Sequence[Mapping[str, object]], shape: FaShape) -> Mapping[str, object] | None:
    """The FA log line (:func:`parse_fa_log`) of ``shape``, or None: matched on D, the batch, the GQA ratio and
    n_kv, and the K/V type where the line names it (f16 and q8_0 calls of one size pick different kernels)."""
    key = (shape.head_dim, shape.n_batch, shape.gqa, shape.n_kv)
    hits = (
        x for x in fa if (x["D"], x["ne1"], x["gqa"], x["n_kv"]) == key and x.get("type_k") in (None, shape.kv_type)
    )
    return next(hits, None)


def process_timeout(n_shapes: int) -> float:
    """Seconds a GPU test-backend-ops/fa-bench process of ``n_shapes`` cases may take before it counts as
    hung: 120 s (CUDA initialisation, build of the graphs) plus 10 s a case, about 20 times what such a
    process takes on an H100. A process has hung there once after its CUDA graph warm-up, which the 600-s
    default would have waited out."""
    return 120.0 + 10.0 * n_shapes


def run_round(
    bin_dir: Path,
    shapes: Sequence[FaShape],
    candidates: Mapping[str, Mapping[str, str]],
    *,
    log_dir: Path,
    backend: str = "CPU",
    ggml_h: Path | None = None,
    timeout: float = 600.0,
) -> list[KernelTime]:
    """One round: a ``test-backend-ops perf`` call per candidate (in the given order) over every shape, one
    :class:`KernelTime` per (candidate, shape).

    ``candidates``: label -> environment overrides (:func:`force_kernel_env`, or a rule set's
    ``GGML_TUNER_FA_RULES``); ``{}`` is upstream's choice. ``ggml_h`` defaults to the one beside a tuner
    build's ``build/bin``. A timeout or crash is data (every shape of the call carries it).
    """
    exe = find_exe(Path(bin_dir), "test-backend-ops")
    envs = check_candidates(shapes, candidates, backend, "a test-backend-ops backend name")
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    test_file = log_dir / "fa-shapes.txt"
    test_file.write_text(fa_test_file(shapes, ggml_h or ggml_h_above(bin_dir)))
    cmd = [str(exe), "perf", "-b", backend, "-o", "FLASH_ATTN_EXT", "--test-file", str(test_file)]
    return run_candidates(
        cmd, envs, shapes, parse_perf_output, log_dir=log_dir, backend=backend, timeout=timeout, tool="test-backend-ops"
    )


def check_candidates(
    shapes: Sequence[FaShape], candidates: Mapping[str, Mapping[str, str]], backend: str, backend_kind: str
) -> dict[str, dict[str, str]]:
    """A round's inputs checked (shapes and candidates given, names safe for a file, env values checked):
    label -> environment. ``backend_kind`` names what ``backend`` must be in the error.

    Raises:
        UsageError: no shape or candidate, a bad backend name or candidate label, or a bad env value.
    """
    if not shapes:
        raise UsageError("No FA shapes to time; give at least one.")
    if not candidates:
        raise UsageError("No candidates to time; give at least one (an empty environment is upstream's choice).")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", backend):
        raise UsageError(f"Backend name {backend!r} is not {backend_kind} such as CUDA0 or CPU.")
    envs = {str(lbl): check_env(env) for lbl, env in candidates.items()}
    for lbl in envs:
        if not re.fullmatch(r"[\w.@+-]+", lbl):
            raise UsageError(f"Candidate label {lbl!r} may only contain letters, digits and . _ @ + -.")
    return envs


_TOOLS = {"test-backend-ops": ("kbench", "test-backend-ops perf"), "fa-bench": ("fabench", "fa-bench")}
"""What times a round -> (its logs' prefix, ``<prefix>-<label>.log``; its name in messages)."""


def run_candidates(
    cmd: Sequence[str],
    envs: Mapping[str, Mapping[str, str]],
    shapes: Sequence[FaShape],
    parse: Callable[[str], Mapping[int, tuple[int, float | None, str]]],
    *,
    log_dir: Path,
    backend: str,
    timeout: float,
    tool: str,
) -> list[KernelTime]:
    """``cmd`` of ``tool`` (a key of :data:`_TOOLS`) once per candidate (its env added, the FA log on), in order:
    one :class:`KernelTime` per (candidate, shape), the kernel that ran from the FA log. ``parse``: the tool's
    output -> case index -> (runs, µs per run or None, why not). A crash or timeout is data: every shape of the
    call carries it."""
    log_prefix, what = _TOOLS[tool]
    out: list[KernelTime] = []
    for lbl, env in envs.items():
        log_file = log_dir / f"{log_prefix}-{lbl}.log"
        log_file.unlink(missing_ok=True)
        log.progress(f"  {lbl}: FLASH_ATTN_EXT x{len(shapes)} on {backend} ({tool})")
        rc, error = run_tool(
            list(cmd), {**env, "GGML_TUNER_FA_LOG": "1"}, log_file=log_file, timeout=timeout, what=what
        )
        if not error and rc != 0:
            error = f"{tool} exited with code {rc}; see {log_file}."
        text = log_file.read_text(errors="replace") if log_file.is_file() else ""
        cases = parse(text)
        fa = parse_fa_log(text)
        for i, s in enumerate(shapes):
            runs, us, why_not = cases.get(i, (0, None, error or f"no result for case {i}; see {log_file}"))
            hit = fa_log_hit(fa, s)
            out.append(
                KernelTime(
                    label=lbl,
                    shape=s,
                    us_per_run=us,
                    runs=runs,
                    kernel=None if hit is None else str(hit["kernel"]),
                    why=None if hit is None else str(hit["why"]),
                    backend=backend,
                    error=why_not if us is None else error,
                    log_file=str(log_file),
                )
            )
    return out

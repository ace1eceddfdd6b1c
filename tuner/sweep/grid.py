"""The FlashAttention sweep's grid: shapes, n_kv points, the legal kernels per cell and upstream's choice.

A *shape* is what ``ggml_cuda_get_best_fattn_kernel`` (fattn.cu L541-720 of llama.cpp 0c1e570, docs/selector.md)
decides by besides arch and n_kv (head size, GQA ratio, K/V type, ``Q->ne[1]``); a *cell* is a shape at one n_kv.
There is no q8_0 cell where q8_0's block does not divide the head size: ``llama_init_from_model`` refuses that
cache. See docs/sweep.md ("The grid").
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Iterable, Sequence

from tuner.errors import UsageError
from tuner.plan.fa_rules import Phase
from tuner.rounds.engine import AA, DEFAULT
from tuner.targets.archs import Arch

HEAD_SIZES = (64, 80, 96, 112, 128, 256)
GQA_RATIOS = (1, 2, 4, 6, 8)
KV_TYPES = ("f16", "q8_0")
QUERY_BATCHES = (1, 2, 4, 8)
STRIDE = 256
"""llama.cpp's ``FATTN_KQ_STRIDE``: llama pads n_kv to a multiple of it."""


def pad_kv(n: int) -> int:
    """The n_kv llama attends over when its KV cache holds ``n`` tokens: ``n`` padded to :data:`STRIDE`."""
    return -(-n // STRIDE) * STRIDE


_KERNELS = ("VEC", "TILE", "MMA")
_KV_BLOCK = {"q8_0": 32}
"""Block size of each quantized K/V type of the grid (ggml's type traits); unquantized types are 1."""
_UNQUANTIZED = ("f32", "f16", "bf16")
_TURING = 750
_ADA = 890


def nkv_grid(lo: int = STRIDE, hi: int = 131072) -> tuple[int, ...]:
    """Half-octave n_kv points in ``[lo, hi]``: each power of two and 1.5 times it, multiples of 256 only."""
    powers = [1 << i for i in range(hi.bit_length())]  # every power of two up to hi
    return tuple(sorted({x for p in powers for x in (p, p * 3 // 2) if lo <= x <= hi and x % STRIDE == 0}))


N_KV = nkv_grid()
"""The grid's n_kv extent: half-octaves 256..131072 (18 points)."""
DEFAULT_N_KV = tuple(x for x in N_KV if x & (x - 1) == 0)
"""The octaves 256..131072 unless ``--n-kv`` says otherwise (upstream's thresholds are powers of two)."""
DEFAULT_QUERY_BATCHES = (1,)
"""Decode only unless ``--ne1`` says otherwise: what the confirmation's tg128 checks."""


@dataclasses.dataclass(frozen=True, order=True, kw_only=True)
class FaShape:
    """One attention shape: head size, GQA ratio, K/V type (K and V alike) and query columns ``Q->ne[1]``."""

    D: int
    gqa: int
    kv: str
    ne1: int

    @property
    def phase(self) -> Phase:
        return Phase.DECODE if self.ne1 == 1 else Phase.PREFILL

    @property
    def key(self) -> str:
        """``D64/gqa4/kvf16/ne1_1``: the shape as the sweep's tables name it."""
        return f"D{self.D}/gqa{self.gqa}/kv{self.kv}/ne1_{self.ne1}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cell:
    """A shape at one n_kv, with the kernels that can run there and the one upstream picks."""

    shape: FaShape
    n_kv: int
    upstream: str
    legal: tuple[str, ...]

    @property
    def candidates(self) -> tuple[str, ...]:
        """The forced kernels worth timing: the legal ones other than upstream's (forcing it is the A/A pair)."""
        return tuple(k for k in self.legal if k != self.upstream)

    @property
    def configs(self) -> tuple[str, ...]:
        """What one round times, in its base order: upstream's choice, its A/A twin, each candidate."""
        return (DEFAULT, AA, *self.candidates)


OFFSET_AMD = 0x1000000
"""``GGML_CUDA_CC_OFFSET_AMD``: an AMD device's cc is this plus its gfx number read as hex (gfx1151 -> 0x1151)."""
_RDNA3, _RDNA1, _CDNA1 = OFFSET_AMD + 0x1100, OFFSET_AMD + 0x1010, OFFSET_AMD + 0x908
_GCN_APUS = (OFFSET_AMD + 0x909, OFFSET_AMD + 0x90C)


def cc_of(arch: Arch) -> int:
    """The compute capability ``ggml_cuda_info()`` reports for ``arch`` (common.cuh of llama.cpp 0c1e570)."""
    gfx = getattr(arch, "gfx", None)
    if getattr(arch, "vendor", None) == "amd" and isinstance(gfx, str) and gfx.startswith("gfx"):
        return OFFSET_AMD + int(gfx[3:], 16)
    return int(getattr(arch, "cc", 0) or 0)


def _check_arch(arch: Arch) -> int:
    cc = cc_of(arch)
    if cc >= OFFSET_AMD or (getattr(arch, "vendor", None) == "nvidia" and cc >= _TURING):
        return cc
    raise UsageError(
        f"The FlashAttention sweep models upstream's kernel choice on NVIDIA GPUs with Turing tensor cores "
        f"(cc >= {_TURING}) and on AMD GPUs; {getattr(arch, 'name', arch)!r} is neither. Sweep an sm_75 or newer "
        "arch, or a gfx one."
    )


def amd_wmma(cc: int) -> bool:
    return cc >= _RDNA3  # RDNA3, RDNA3.5, RDNA4: amd_wmma_available


def amd_mfma(cc: int) -> bool:
    return _CDNA1 <= cc < _RDNA1 and cc not in _GCN_APUS  # CDNA: amd_mfma_available


def legal_kernels(arch: Arch, D: int, n_kv: int, gqa: int = 2) -> tuple[str, ...]:
    """The kernels with device code for ``D`` at ``n_kv`` (AMD WMMA needs GQA packing), VEC, TILE, MMA order."""
    cc = _check_arch(arch)
    vec = D <= 256 and D % 64 == 0 and D != 192 and n_kv % STRIDE == 0
    mma = D not in (40, 72)
    if cc >= OFFSET_AMD:  # the hook's AMD rule: WMMA with the GQA optimisation and DKQ <= 256, MFMA on CDNA
        mma = mma and ((amd_wmma(cc) and gqa >= 2 and D <= 256) or amd_mfma(cc))
    return tuple(k for k, ok in zip(_KERNELS, (vec, True, mma)) if ok)


def _gqa_eff(D: int, gqa: int) -> int:
    """fattn.cu's ``gqa_ratio_eff``: the largest power of two dividing GQA, up to ``ncols2_max``."""
    cap = 32 if D == 320 else 16 if D in (576, 192) else 8
    eff = 1
    while gqa % (2 * eff) == 0 and eff < cap:
        eff *= 2
    return eff


def _upstream_amd(cc: int, shape: FaShape, n_kv: int, can_vec: bool) -> str:
    """fattn.cu L667-720 (the branches after Turing and Volta) for the calls llama makes (module doc)."""
    D, gqa, ne1 = shape.D, shape.gqa, shape.ne1
    gqa_opt = gqa >= 2 and n_kv % STRIDE == 0
    cols = ne1 * _gqa_eff(D, gqa)
    if D not in (40, 72):
        if amd_mfma(cc) and ((D <= 64 and cols > 8) or (D <= 128 and cols > 16) or (D <= 256 and cols > 64)):
            return "MMA"
        if amd_mfma(cc) and D > 256 and gqa_opt and cols > 128:
            return "MMA"
        if amd_wmma(cc) and gqa_opt and D <= 256 and cols > (8 if D <= 128 else 16):
            return "MMA"
    if can_vec:
        if shape.kv in _UNQUANTIZED:
            if ne1 == 1 and not gqa_opt:
                return "VEC"
        elif ne1 <= 2:
            return "VEC"
    return "TILE"


def upstream_kernel(arch: Arch, shape: FaShape, n_kv: int) -> str:
    """The kernel ``ggml_cuda_get_best_fattn_kernel`` of llama.cpp 0c1e570 picks for this cell (module doc). Its
    sparse-gather clause (D = 256, GQA > 4) never changes the answer on this grid: VEC already fails there."""
    cc = _check_arch(arch)
    D, gqa, ne1 = shape.D, shape.gqa, shape.ne1
    can_vec = D <= 256 and D % 64 == 0 and D != 192 and n_kv % STRIDE == 0
    if cc >= OFFSET_AMD:
        return _upstream_amd(cc, shape, n_kv, can_vec)
    if D in (40, 72):
        return "TILE"  # the Turing branch excludes them; the fallthrough ends on TILE for a GQA-packed call
    gqa_opt = gqa >= 2 and n_kv % STRIDE == 0
    if can_vec:
        if shape.kv in _UNQUANTIZED:
            if cc >= _ADA and ne1 == 1 and not (gqa > 4 and (D >= 256 or n_kv >= 8192)):
                return "VEC"
        elif ne1 <= (2 if cc >= _ADA else 1):
            return "VEC"
        if not gqa_opt and ne1 == 1:
            return "VEC"
    return "MMA"


def plan(
    arch: Arch,
    *,
    head_sizes: Iterable[int] = HEAD_SIZES,
    gqa_ratios: Iterable[int] = GQA_RATIOS,
    kv_types: Iterable[str] = KV_TYPES,
    query_batches: Iterable[int] = QUERY_BATCHES,
    n_kv: Iterable[int] = N_KV,
) -> list[Cell]:
    """Every cell of the grid, shapes sorted, n_kv ascending; quantized K/V only where its block divides D."""
    points = sorted(set(n_kv))
    bad = [x for x in points if x <= 0 or x % STRIDE]
    if bad:
        raise UsageError(f"n_kv points must be positive multiples of {STRIDE} (llama pads the KV cache to it): {bad}.")
    out = []
    for D, gqa, kv, ne1 in itertools.product(sorted(set(head_sizes)), sorted(set(gqa_ratios)), kv_types, query_batches):
        if D % _KV_BLOCK.get(kv, 1):
            continue  # a shape llama never makes (module doc)
        shape = FaShape(D=D, gqa=gqa, kv=kv, ne1=ne1)
        out += [
            Cell(shape=shape, n_kv=x, upstream=upstream_kernel(arch, shape, x), legal=legal_kernels(arch, D, x, gqa))
            for x in points
        ]
    return out


def duration_text(seconds: float) -> str:
    """``5400`` -> ``1 h 30 min``; ``75`` -> ``1 min 15 s``: the sweeps' plans' estimates."""
    h, rem = divmod(round(seconds), 3600)
    return f"{h} h {rem // 60:02d} min" if h else f"{rem // 60} min {rem % 60:02d} s"


def dry_run_text(
    cells: Sequence[Cell], *, rounds: int, per_call_s: float | None = None, max_rounds: int | None = None
) -> str:
    """What a sweep of ``cells`` would run: shapes, cells, timer calls (``per_call_s``: a what-if)."""
    shapes = sorted({c.shape for c in cells})
    per_round = sum(len(c.configs) for c in cells)
    by_kernels = Counter(c.legal for c in cells)
    changes = sum(len(c.candidates) for c in cells)
    lines = [
        f"FlashAttention sweep: {len(shapes)} shapes x {len(sorted({c.n_kv for c in cells}))} n_kv points "
        f"= {len(cells)} cells",
        f"  head sizes {sorted({s.D for s in shapes})}, GQA {sorted({s.gqa for s in shapes})}, "
        f"K/V {sorted({s.kv for s in shapes})}, Q->ne[1] {sorted({s.ne1 for s in shapes})}",
        f"  n_kv {sorted({c.n_kv for c in cells})}",
        *(f"  {n} cells with legal kernels {'/'.join(k)}" for k, n in sorted(by_kernels.items())),
        f"  {changes} forced kernels that differ from upstream's choice; every cell adds upstream and its A/A pair",
        f"timer calls: {per_round} per round x {rounds} rounds = {per_round * rounds}"
        + (
            f"; at most {per_round * max_rounds} if every cell stayed open to {max_rounds} rounds"
            if max_rounds is not None and max_rounds > rounds
            else ""
        ),
    ]
    if per_call_s is not None:
        lines.append(f"time at {per_call_s:g} s per call (what-if): {duration_text(per_round * rounds * per_call_s)}")
    return "\n".join(lines) + "\n"

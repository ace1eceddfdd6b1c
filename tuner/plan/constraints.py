"""Legality of compile-time candidates, checked before anything is compiled.

The rules mirror the ``static_assert`` conditions and the shared-memory / LDS formulas of the
FlashAttention kernels (``fattn-tile.cuh``, ``fattn-mma-f16.cuh``, ``fattn-wmma-f16.cu`` of llama.cpp 0c1e570
for era ``mma``, of the 2025-08 tree for era ``rocwmma``). Each :class:`Violation` names the rule and where upstream enforces it, so a rejected
candidate reads like the compile error it saves. The table parsers here also give render.py the
upstream rows that untuned fields default to.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

from tuner.targets.archs import load_arch


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArchLimits:
    """The few facts about an arch the constraint rules need (fields as in :class:`tuner.targets.archs.Arch`)."""

    name: str
    vendor: str
    wave_size: int = 32
    smem_static: int = 0
    """Static ``__shared__`` per block (NVIDIA 48 KiB ptxas limit; AMD 64 KiB LDS)."""
    smem_optin: int = 0
    """Dynamic shared memory per block after opt-in (NVIDIA), LDS on AMD."""
    cc: int = 0
    gfx: str | None = None
    family: str = ""
    """The arch database's family: ``RDNA3.5``, ``CDNA3``... (AMD), ``Ada Lovelace``, ``Hopper``... (NVIDIA)."""


def load_arch_limits(name: str) -> ArchLimits:
    """The limits of an arch of the arch database (:func:`tuner.targets.archs.load_arch`; UsageError if unknown).

    This is the one place arch facts enter the constraint rules.
    """
    a = load_arch(name)
    return ArchLimits(
        name=a.name,
        vendor=a.vendor,
        wave_size=int(a.wave_size or 32),
        smem_static=int(a.smem_static or 0),
        smem_optin=int(a.smem_optin or 0),
        cc=int(a.cc or 0),
        gfx=a.gfx,
        family=str(a.family or ""),
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Violation:
    """One broken rule of one candidate."""

    rule: str
    """Short rule id, e.g. ``tile.smem``."""
    message: str
    """Human text with the numbers and the upstream location."""

    def __str__(self) -> str:
        return f"{self.message} [{self.rule}]"


# --------------------------------------------------------------------------- Table rows


@dataclasses.dataclass(frozen=True, kw_only=True)
class TileRow:
    """A ``GGML_CUDA_FATTN_TILE_CONFIG_CASE`` row of fattn-tile.cuh."""

    dkq: int
    dv: int
    ncols: int
    nthreads: int
    occupancy: int
    nbatch_fa: int
    nbatch_K: int

    def render(self) -> str:
        return (
            f"GGML_CUDA_FATTN_TILE_CONFIG_CASE({self.dkq}, {self.dv}, {self.ncols}, {self.nthreads}, "
            f"{self.occupancy}, {self.nbatch_fa}, {self.nbatch_K})"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class MmaRow:
    """A ``GGML_CUDA_FATTN_MMA_CONFIG_CASE`` row of fattn-mma-f16.cuh (``Q_in_reg`` as 0/1)."""

    dkq: int
    dv: int
    ncols: int
    nthreads: int
    occupancy: int
    nbatch_fa: int
    nbatch_K2: int
    nbatch_V2: int
    nbatch_combine: int
    nstages_target: int
    Q_in_reg: int

    def render(self) -> str:
        q = "true" if self.Q_in_reg else "false"
        return (
            f"GGML_CUDA_FATTN_MMA_CONFIG_CASE({self.dkq}, {self.dv}, {self.ncols}, {self.nthreads}, {self.occupancy}, "
            f"{self.nbatch_fa}, {self.nbatch_K2}, {self.nbatch_V2}, {self.nbatch_combine}, {self.nstages_target}, {q});"
        )


def with_fields(row: TileRow | MmaRow, fields: Mapping[str, int]) -> TileRow | MmaRow:
    """``row`` with the named fields set to new values (one of each kind, so each is checked against its class)."""
    if isinstance(row, TileRow):
        return dataclasses.replace(row, **fields)
    return dataclasses.replace(row, **fields)


_TILE_FN = re.compile(
    r"ggml_cuda_fattn_tile_get_config_(\w+)\(const int DKQ, const int DV, const int ncols\) \{(.*?)\n\}", re.S
)
_MMA_FN = re.compile(
    r"ggml_cuda_fattn_mma_get_config_(\w+)\(const int DKQ, const int DV, const int ncols\) \{(.*?)\n\}", re.S
)
_TILE_CASE = re.compile(r"^\s*GGML_CUDA_FATTN_TILE_CONFIG_CASE\(([^)]*)\)", re.M)
_MMA_CASE = re.compile(r"^\s*GGML_CUDA_FATTN_MMA_CONFIG_CASE\(([^)]*)\)", re.M)


def parse_tile_tables(text: str) -> dict[str, dict[tuple[int, int, int], TileRow]]:
    """Parse every tile table of fattn-tile.cuh: table -> (DKQ, DV, ncols) -> first row (first match wins)."""
    out: dict[str, dict[tuple[int, int, int], TileRow]] = {}
    for name, body in _TILE_FN.findall(text):
        rows: dict[tuple[int, int, int], TileRow] = {}
        for args in _TILE_CASE.findall(body):
            v = [int(x) for x in args.split(",")]
            row = TileRow(dkq=v[0], dv=v[1], ncols=v[2], nthreads=v[3], occupancy=v[4], nbatch_fa=v[5], nbatch_K=v[6])
            rows.setdefault((row.dkq, row.dv, row.ncols), row)
        out[name] = rows
    return out


def parse_mma_tables(text: str) -> dict[str, dict[tuple[int, int, int], MmaRow]]:
    """Parse every MMA table of fattn-mma-f16.cuh: table -> (DKQ, DV, ncols) -> first row."""
    out: dict[str, dict[tuple[int, int, int], MmaRow]] = {}
    for name, body in _MMA_FN.findall(text):
        rows: dict[tuple[int, int, int], MmaRow] = {}
        for args in _MMA_CASE.findall(body):
            parts = [x.strip() for x in args.split(",")]
            if any(p.startswith(("DKQ", "DV")) for p in parts):
                continue  # the macro definition itself
            v = [int(x) for x in parts[:10]] + [1 if parts[10] == "true" else 0]
            row = MmaRow(**dict(zip((f.name for f in dataclasses.fields(MmaRow)), v)))
            rows.setdefault((row.dkq, row.dv, row.ncols), row)
        out[name] = rows
    return out


# --------------------------------------------------------------------------- Rules

_TILE_LOC = "fattn-tile.cuh"
_MMA_LOC = "fattn-mma-f16.cuh"


def _v(rule: str, message: str) -> Violation:
    return Violation(rule=rule, message=message)


def check_tile_row(arch: ArchLimits, table: str, row: TileRow) -> list[Violation]:
    """Rules of the tile kernel for one row (fattn-tile.cuh L10-19, L495-1000)."""
    out: list[Violation] = []
    r = row
    tag = f"tile {table} ({r.dkq},{r.dv},ncols {r.ncols})"
    for field, hi in (("nthreads", 512), ("occupancy", 8), ("nbatch_fa", 256), ("nbatch_K", 256)):
        val = getattr(r, field)
        if not 1 <= val <= hi:
            out.append(_v(f"tile.{field}", f"{tag}: {field}={val} outside 1..{hi} ({_TILE_LOC} L14-17 static_assert)"))
    if out:
        return out
    warp = 32  # the tile kernel hard-codes warp_size = 32, also on wave64 AMD (L847)
    if r.nthreads % warp:
        return [_v("tile.nthreads", f"{tag}: nthreads={r.nthreads} not a multiple of 32 ({_TILE_LOC} L845)")]
    nwarps = r.nthreads // warp
    ncols = r.ncols
    if (ncols > nwarps and ncols % nwarps) or (nwarps > ncols and nwarps % ncols):
        msg = f"{tag}: ncols {ncols} and nwarps {nwarps} must divide each other ({_TILE_LOC} L873)"
        out.append(_v("tile.cpw_np", msg))
        return out
    cpw = ncols // nwarps if ncols > nwarps else 1
    np_ = nwarps // ncols if nwarps > ncols else 1
    if r.nbatch_fa % (np_ * warp):
        out.append(_v("tile.nbatch_fa", f"{tag}: nbatch_fa {r.nbatch_fa} % (np {np_} * 32) != 0 ({_TILE_LOC} L874)"))
    fp16 = table != "nvidia_fp32"
    cpy_ne = 4 if (arch.vendor == "amd" or arch.cc >= 700) else 2
    # an fp16 table holds K as half2 (nbatch_K/2 a row) and Q, KQ as half (2 B); an fp32 one all as float (4 B)
    k_row, k_name, line, size = (r.nbatch_K // 2, "(nbatch_K/2)", 506, 2) if fp16 else (r.nbatch_K, "nbatch_K", 512, 4)
    if k_row % cpy_ne:
        out.append(_v("tile.nbatch_K", f"{tag}: {k_name} % {cpy_ne} != 0 ({_TILE_LOC} L{line})"))
    kq_cs = min(cpw, (2 if fp16 else 1) * cpy_ne)
    if cpw % kq_cs:
        out.append(_v("tile.KQ_cs", f"{tag}: columns per warp {cpw} % KQ_cs {kq_cs} != 0 ({_TILE_LOC} L595)"))
    if r.dv > r.dkq:
        out.append(_v("tile.DV", f"{tag}: DV > DKQ ({_TILE_LOC} L713)"))
    if not (r.dv % r.nbatch_K == 0 or (r.nbatch_K % 3 == 0 and r.dv % (r.nbatch_K * 2 // 3) == 0)):
        msg = f"{tag}: DV {r.dv} not divisible by nbatch_K {r.nbatch_K} (or 2/3 of it) ({_TILE_LOC} L714-715)"
        out.append(_v("tile.nbatch_K_DV", msg))
    else:
        nbatch_v = (r.nbatch_K if r.dv % r.nbatch_K == 0 else r.nbatch_K * 2 // 3) * r.nbatch_fa // r.dv
        if nbatch_v <= 0 or r.nbatch_fa % nbatch_v or nbatch_v % np_:
            msg = f"{tag}: nbatch_V {nbatch_v} must divide nbatch_fa {r.nbatch_fa} and be a multiple of np {np_} ({_TILE_LOC} L716-718)"
            out.append(_v("tile.nbatch_V", msg))
    dvp = (r.dv + 63) // 64 * 64
    if np_ > 1 and r.nbatch_fa * r.nbatch_K < nwarps * dvp:
        msg = f"{tag}: nbatch_fa*nbatch_K {r.nbatch_fa * r.nbatch_K} < nwarps*DVp {nwarps * dvp} ({_TILE_LOC} L988)"
        out.append(_v("tile.combine", msg))
    smem = ncols * r.dkq * size + (r.nbatch_fa * (k_row + cpy_ne) + dvp - r.dv) * 4 + ncols * r.nbatch_fa * size
    if np_ > 1:
        smem += nwarps * 4
    limit, what = (arch.smem_static, "static smem") if arch.vendor == "nvidia" else (arch.smem_optin, "LDS")
    if limit and smem > limit:
        msg = f"{tag}: tile smem {smem} B > {limit} B {what} on {arch.name} ({_TILE_LOC} L884-894)"
        out.append(_v("tile.smem", msg))
    return out


def mma_smem_bytes(arch: ArchLimits, row: MmaRow, ncols2: int) -> int:
    """Dynamic shared memory of one MMA kernel instance (fattn-mma-f16.cuh host code, L2030-2051)."""
    r = row
    ncols1 = max(1, r.ncols // ncols2)
    turing = arch.vendor == "nvidia" and arch.cc >= 750
    swizzled = turing and r.nbatch_K2 >= 32 and r.nbatch_V2 >= 32 and r.nbatch_K2 % 32 == 0 and r.nbatch_V2 % 32 == 0
    stride_k = r.nbatch_K2 if swizzled else r.nbatch_K2 + 4
    stride_v = stride_k if r.dkq == 576 else (r.nbatch_V2 if swizzled else r.nbatch_V2 + 4)
    kv1 = r.nbatch_fa * max(stride_k, stride_v) * 4
    kv2 = r.nbatch_fa * (stride_k + stride_v) * 4
    q = r.ncols * (r.dkq // 2 + 4) * 4
    mask = ncols1 * (r.nbatch_fa // 2 + 4) * 4
    nwarps = r.nthreads // (arch.wave_size or 32)
    combine = nwarps * min(r.ncols, 16) * (r.nbatch_combine + 4) * 4
    cp_async = arch.vendor == "nvidia" and arch.cc >= 800
    nstages = r.nstages_target if (cp_async and ncols2 >= 2) else 0
    kv = kv1 if nstages <= 1 else kv2
    return max(combine, max(q, kv + mask) if r.Q_in_reg else q + kv + mask)


def check_mma_row(arch: ArchLimits, table: str, row: MmaRow, *, ncols2: int | None = None) -> list[Violation]:
    """Rules of the MMA kernel for one row (fattn-mma-f16.cuh L25-36, L640, L1010, L1251, L1517).

    ``ncols2``: the instance's ncols2 (GQA packing); ``None`` checks every ncols2 that divides ncols.
    """
    out: list[Violation] = []
    r = row
    tag = f"mma {table} ({r.dkq},{r.dv},ncols {r.ncols})"
    for field, mult, hi, line in (
        ("nthreads", 32, 512, 28),
        ("nbatch_fa", 32, 256, 30),
        ("nbatch_K2", 4, 512, 31),
        ("nbatch_V2", 4, 256, 32),
        ("nbatch_combine", 4, 128, 33),
    ):
        val = getattr(r, field)
        if val <= 0 or val % mult or val > hi:
            msg = (
                f"{tag}: {field}={val} must be a positive multiple of {mult} <= {hi} ({_MMA_LOC} L{line} static_assert)"
            )
            out.append(_v(f"mma.{field}", msg))
    if not 1 <= r.occupancy <= 8:
        out.append(_v("mma.occupancy", f"{tag}: occupancy={r.occupancy} outside 1..8 ({_MMA_LOC} L29)"))
    if not 1 <= r.nstages_target <= 2:
        out.append(_v("mma.nstages", f"{tag}: nstages_target={r.nstages_target} outside 1..2 ({_MMA_LOC} L34)"))
    if r.Q_in_reg not in (0, 1):
        out.append(_v("mma.Q_in_reg", f"{tag}: Q_in_reg={r.Q_in_reg} must be 0 or 1"))
    if out:
        return out
    if r.nstages_target == 2 and r.nbatch_K2 != r.dkq // 2:
        msg = f"{tag}: nstages 2 needs nbatch_K2 == DKQ/2 = {r.dkq // 2}, got {r.nbatch_K2} ({_MMA_LOC} L640, L1346)"
        out.append(_v("mma.nstages_K2", msg))
    if r.dkq != 576 and r.dv % (2 * r.nbatch_V2):
        out.append(_v("mma.nbatch_V2", f"{tag}: DV {r.dv} % (2*nbatch_V2 {2 * r.nbatch_V2}) != 0 ({_MMA_LOC} L1010)"))
    if (r.dv // 2) % r.nbatch_combine:
        msg = f"{tag}: (DV/2) {r.dv // 2} % nbatch_combine {r.nbatch_combine} != 0 ({_MMA_LOC} L1517)"
        out.append(_v("mma.nbatch_combine", msg))
    nwarps = r.nthreads // (arch.wave_size or 32)
    if nwarps < 1:
        out.append(_v("mma.nwarps", f"{tag}: nthreads {r.nthreads} is less than one wave of {arch.wave_size}"))
        return out
    cols_per_warp = 8 if r.ncols <= 8 else 16
    if cols_per_warp == 8:
        # np warps share a Q column; the KQ tile loop steps np * T_C_KQ::I (16) rows of nbatch_fa, so
        # nbatch_fa must be a multiple of it (else KQ_C has zero size and the loop's static_assert fails)
        np_ = nwarps if cols_per_warp > r.ncols else nwarps * cols_per_warp // r.ncols
        if r.nbatch_fa % (np_ * 16):
            msg = (
                f"{tag}: nbatch_fa {r.nbatch_fa} % (np {np_} * 16) != 0, np = nwarps {nwarps} * cols_per_warp "
                f"{cols_per_warp} / ncols {r.ncols} ({_MMA_LOC} L645, L780)"
            )
            out.append(_v("mma.nbatch_fa", msg))
    candidates = [ncols2] if ncols2 else [c for c in (1, 2, 4, 8, 16, 32) if r.ncols % c == 0]
    for c2 in candidates:
        ncols1 = r.ncols // c2
        if c2 <= cols_per_warp and (nwarps * (cols_per_warp // c2)) % ncols1:
            msg = f"{tag}: nwarps {nwarps} * (cols_per_warp {cols_per_warp} / ncols2 {c2}) % ncols1 {ncols1} != 0 ({_MMA_LOC} L1251)"
            out.append(_v("mma.nwarps", msg))
            break
    # AMD WMMA device code is compiled out for DKQ > 256 (L1870), so those rows never launch there.
    if arch.vendor == "amd" and r.dkq > 256:
        return out
    # Turing device code is compiled out for ncols > 32 (L1864); switch_ncols1 never launches it there.
    if arch.vendor == "nvidia" and arch.cc // 10 == 75 and r.ncols > 32:
        return out
    smem = max(mma_smem_bytes(arch, r, c2) for c2 in candidates)
    limit, what = (arch.smem_optin, "opt-in smem") if arch.vendor == "nvidia" else (arch.smem_optin, "LDS")
    if limit and smem > limit:
        msg = f"{tag}: MMA smem {smem} B > {limit} B {what} on {arch.name} ({_MMA_LOC} L2030-2051)"
        out.append(_v("mma.smem", msg))
    return out


def check_wmma(
    arch: ArchLimits, *, nwarps: int, min_blocks: int, kq_stride: int, head_dims: tuple[int, ...] = (64, 128, 256)
) -> list[Violation]:
    """Rules of the era-rocwmma WMMA kernel (fattn-wmma-f16.cu L25-106 of the 2025-08 tree)."""
    out: list[Violation] = []
    loc = "fattn-wmma-f16.cu"
    wave = arch.wave_size or 32
    if nwarps not in (1, 2, 4, 8, 16):
        out.append(_v("wmma.nwarps", f"wmma: nwarps={nwarps} must be a power of two <= 16 ({loc} L516)"))
        return out
    if nwarps * wave > 1024:
        msg = f"wmma: nwarps {nwarps} * wave {wave} = {nwarps * wave} threads > 1024 ({loc} L25)"
        out.append(_v("wmma.threads", msg))
    if not 1 <= min_blocks <= 8:
        out.append(_v("wmma.min_blocks", f"wmma: launch-bounds min blocks {min_blocks} outside 1..8 ({loc} L25)"))
    if kq_stride not in (64, 128, 256):
        msg = f"wmma: KQ stride {kq_stride} must divide FATTN_KQ_STRIDE=256 (64, 128 or 256) (fattn-common.cuh)"
        out.append(_v("wmma.kq_stride", msg))
        return out
    # frag_m is 32 only for the CUDA half-accumulation ncols=8 instance (Volta); 16 otherwise.
    frag_m = 32 if arch.vendor == "nvidia" else 16
    amd = arch.vendor == "amd"
    rule, what, limit = ("wmma.lds", "LDS", arch.smem_optin) if amd else ("wmma.smem", "static smem", arch.smem_static)
    if kq_stride < 256 and kq_stride % (nwarps * frag_m):
        msg = f"wmma: KQ stride {kq_stride} % (nwarps {nwarps} * frag_m {frag_m}) != 0 for D <= 128 ({loc} L174, tuner static_assert)"
        out.append(_v("wmma.kq_stride_tc", msg))
    for d in head_dims:
        stride = kq_stride if d <= 128 else 256
        if d > stride:
            out.append(_v("wmma.D", f"wmma: D {d} > KQ stride {stride} ({loc} L61)"))
            continue
        # prec F32 (what llama uses): cols_per_block 16, and 32 only for D <= 128 (fattn-wmma-f16.cu L545)
        for ncols in (16, 32) if d <= 128 else (16,):
            lds = wmma_smem_bytes(d, ncols, nwarps=nwarps, kq_stride=stride)
            if arch.vendor in ("amd", "nvidia") and lds > limit:
                msg = f"wmma: D {d} ncols {ncols}: {what} {lds} B > {limit} B on {arch.name} ({loc} L104-128)"
                out.append(_v(rule, msg))
    return out


def wmma_smem_bytes(d: int, ncols: int, *, nwarps: int, kq_stride: int) -> int:
    """Static shared memory of the WMMA kernel with float KQ accumulation (fattn-wmma-f16.cu L78-128)."""
    frag = 16
    vkq_stride = min(_maxpow2(d // frag), nwarps) * frag
    ratio = nwarps * frag // vkq_stride
    kqar = 2  # llama uses GGML_PREC_F32 for FA, so KQ is accumulated in float
    return 2 * max(ncols * (kq_stride + 8) * kqar, ratio * ncols * (d + 8)) + 2 * ncols * (d + 8)


def _maxpow2(x: int) -> int:
    return 2 * _maxpow2(x // 2) if x > 0 and x % 2 == 0 else 1


def check_candidate(
    limits: ArchLimits,
    rows: Iterable[tuple[str, str, TileRow | MmaRow, int]],
    *,
    wmma: Mapping[str, int] | None = None,
    model_shape: Mapping[str, int] | None = None,
) -> list[Violation]:
    """Every violation of one compile-time candidate, given as data, before any compile (empty: legal).

    :func:`tuner.plan.space.check_constraints` turns a search space's knob values into the ``rows``:
    ``(kind, table, row, ncols2)`` per tuned row (``kind`` ``tile_row`` or ``mma_row``, ``ncols2`` 0 when the
    knob does not pin it). ``wmma``: rocWMMA fields when the candidate sets any; ``model_shape``
    (``{"head_dim", ...}``) restricts WMMA checks to the model's D.
    """
    out: list[Violation] = []
    for _kind, table, row, ncols2 in rows:
        if isinstance(row, TileRow):  # the kind names the row's class: tile_row or mma_row
            out += check_tile_row(limits, table, row)
        else:
            out += check_mma_row(limits, table, row, ncols2=ncols2 or None)
    if wmma:
        dims = (int(model_shape["head_dim"]),) if model_shape and "head_dim" in model_shape else (64, 128, 256)
        out += check_wmma(
            limits,
            nwarps=wmma.get("nwarps", 4),
            min_blocks=wmma.get("min_blocks", 1),
            kq_stride=wmma.get("kq_stride", 256),
            head_dims=dims,
        )
    return out

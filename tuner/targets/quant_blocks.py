"""Random ggml quantized blocks, written directly (no f16 file, no llama-quantize).

A synthetic model is timed, not read, so a quantized tensor only needs the right type, size and
finite values: random payload bytes (quants, sub-block scales) with each block's fp16 scale fields
set to a constant chosen so the dequantized weights have about the spread of the f16 path's N(0, 0.02).
Layouts follow llama.cpp's ``ggml/src/ggml-common.h`` (``QK_K`` = 256):

=======  ======================================================  ==========  =====
type     struct                                                  elements    bytes
=======  ======================================================  ==========  =====
Q4_K     ``half d, dmin; uint8 scales[12]; uint8 qs[128]``       256         144
Q5_K     ``half d, dmin; uint8 scales[12], qh[32], qs[128]``     256         176
IQ4_XS   ``half d; uint16 scales_h; uint8 scales_l[4], qs[128]``  256         136
IQ4_NL   ``half d; uint8 qs[16]``                                32          18
Q6_K     ``uint8 ql[128], qh[64]; int8 scales[16]; half d``      256         210
Q5_0     ``half d; uint8 qh[4]; uint8 qs[16]``                   32          22
Q5_1     ``half d, m; uint8 qh[4]; uint8 qs[16]``                32          24
Q8_0     ``half d; int8 qs[32]``                                 32          34
=======  ======================================================  ==========  =====

Spread arithmetic (target rms 0.02; q, sc, m uniform over their bit widths, as random bytes make them;
dequantization as in llama.cpp's ``ggml/src/ggml-quants.c`` ``dequantize_row_*``):

- Q4_K: y = d*sc*q - dmin*m with q in 0..15 (mean 7.5, var 21.25) and 6-bit sc, m in 0..63 (mean 31.5,
  var 341.25). dmin = 7.5*d centres it (E[y] = 7.5*d*31.5 - 7.5*d*31.5 = 0). Var(sc*q) =
  E[sc^2]E[q^2] - (E[sc]E[q])^2 = 1333.5*77.5 - 236.25^2 = 47532; Var(7.5*m) = 56.25*341.25 = 19195;
  rms = d*sqrt(66727) = 258.3*d, so d = 0.02/258.3 = 7.74e-5 and dmin = 5.81e-4 (both normal fp16).
- Q5_K: as Q4_K with q in 0..31 (mean 15.5, var 85.25) and dmin = 15.5*d: Var(sc*q) = 1333.5*325.5 -
  488.25^2 = 195666; Var(15.5*m) = 81985; rms = d*sqrt(277652) = 526.9*d, so d = 3.80e-5 (fp16 subnormal)
  and dmin = 5.88e-4.
- IQ4_XS: y = d*(ls - 32)*k[q] with a 6-bit ls (E[(ls-32)^2] = 341.5) and k the 16 levels of
  ``kvalues_iq4nl`` (E[k^2] = 4548, mean -5.9): rms = d*sqrt(341.5*4548) = 1246.3*d, d = 1.60e-5 (subnormal).
- IQ4_NL: y = d*k[q]: rms = 67.4*d, d = 2.97e-4.
- Q6_K: y = d*s*(q - 32) with q in 0..63 (E[(q-32)^2] = 341.5) and int8 s (E[s^2] = 5461.5):
  rms = d*sqrt(5461.5*341.5) = 1365.7*d, so d = 1.46e-5 (an fp16 subnormal, as llama-quantize's own
  Q6_K scales of N(0, 0.02) weights are; finite, and every kernel widens it to fp32).
- Q5_0: y = d*(q - 16) with q in 0..31 (E[(q-16)^2] = 85.5): rms = 9.25*d, d = 2.16e-3.
- Q5_1: y = d*q + m with q in 0..31 (mean 15.5, var 85.25): m = -15.5*d centres it, rms = 9.23*d,
  d = 2.17e-3, m = -3.36e-2.
- Q8_0: y = d*q with int8 q (E[q^2] = 5461.5): rms = 73.9*d, d = 2.71e-4.
"""

from __future__ import annotations

import dataclasses
import math
from typing import IO

import numpy as np

_RMS = 0.02  # the f16 path's N(0, 0.02)


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """One ggml block type: elements and bytes per block, and its fp16 scale fields (byte offset, value)."""

    elements: int
    nbytes: int
    halves: tuple[tuple[int, float], ...]


def _d_m(elements: int, nbytes: int, var: float, m: float) -> BlockLayout:
    """A block led by fp16 ``d`` and its minimum (``dmin`` or ``m``) ``m * d``; ``var``: the values' variance / d^2."""
    d = _RMS / math.sqrt(var)
    return BlockLayout(elements, nbytes, ((0, d), (2, m * d)))


# ggml-common.h kvalues_iq4nl: the 16 non-uniform levels both IQ4 types index
_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
_IQ4NL_SQ = sum(k * k for k in _IQ4NL) / 16


BLOCK_LAYOUTS: dict[str, BlockLayout] = {
    "Q4_K": _d_m(256, 144, (31.5**2 + 341.25) * (7.5**2 + 21.25) - (31.5 * 7.5) ** 2 + 7.5**2 * 341.25, 7.5),
    # as Q4_K with 5-bit quants (0..31: mean 15.5, variance 85.25); dmin = 15.5 d centres the values
    "Q5_K": _d_m(256, 176, (31.5**2 + 341.25) * (15.5**2 + 85.25) - (31.5 * 15.5) ** 2 + 15.5**2 * 341.25, 15.5),
    # d * (ls - 32) * level, with ls a random 6-bit scale (E[(ls - 32)^2] = 341.5); then scales_h, scales_l[4], qs[128]
    "IQ4_XS": BlockLayout(256, 136, ((0, _RMS / math.sqrt(341.5 * _IQ4NL_SQ)),)),
    "IQ4_NL": BlockLayout(32, 18, ((0, _RMS / math.sqrt(_IQ4NL_SQ)),)),  # d; then qs[16]
    "Q6_K": BlockLayout(256, 210, ((208, _RMS / math.sqrt(5461.5 * 341.5)),)),  # ql, qh, scales; d last
    "Q5_0": BlockLayout(32, 22, ((0, _RMS / math.sqrt(85.5)),)),  # d; then qh[4], qs[16]
    "Q5_1": _d_m(32, 24, 85.25, -15.5),  # d, m; then qh[4], qs[16]
    "Q8_0": BlockLayout(32, 34, ((0, _RMS / math.sqrt(5461.5)),)),  # d; then qs[32]
}
"""The ggml types the direct Q4_K_M, Q5_K_M and IQ4_XS paths write (plan_tensors' types and fallbacks)."""


def write_random_blocks(
    fout: IO[bytes], ggml_type: str, n_elements: int, rng: np.random.Generator, *, chunk_elems: int = 1 << 23
) -> int:
    """Write ``n_elements`` values of random ``ggml_type`` blocks to ``fout``, ``chunk_elems`` at a time (each chunk a
    ``(blocks, block bytes)`` uint8 array: random bytes with the type's fp16 scale fields set).

    Returns the number of bytes written; ValueError for a type without a layout here, or ``n_elements`` not a
    whole number of blocks.
    """
    if ggml_type not in BLOCK_LAYOUTS:
        raise ValueError(f"no random-block writer for ggml type {ggml_type}; known: {', '.join(BLOCK_LAYOUTS)}")
    lay = BLOCK_LAYOUTS[ggml_type]
    if n_elements % lay.elements:
        raise ValueError(f"{n_elements} values are not a whole number of {ggml_type} blocks of {lay.elements}")
    total = n_elements // lay.elements
    per_chunk = max(1, chunk_elems // lay.elements)
    written = 0
    for start in range(0, total, per_chunk):
        n = min(per_chunk, total - start)
        blocks = np.frombuffer(bytearray(rng.bytes(n * lay.nbytes)), dtype=np.uint8).reshape(n, lay.nbytes)
        for offset, value in lay.halves:
            blocks[:, offset : offset + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
        fout.write(blocks.data)  # no copy; works for files and BytesIO alike
        written += blocks.nbytes
    return written

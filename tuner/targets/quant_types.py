"""The llama-quantize types tuner offers: one list for every command that names one (``model synth``, ``search --quant``)."""

from __future__ import annotations

from tuner.errors import UsageError, close_matches

_LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
_K_QUANTS = ("Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K")
QUANT_TYPES = (*_LEGACY, *_K_QUANTS, "IQ4_NL", "IQ4_XS", "MXFP4_MOE", "F16", "BF16", "F32")
"""llama-quantize type names (``tools/quantize/quantize.cpp`` QUANT_OPTIONS of llama-cpp-python 0.3.36's
tree) that make a file from a random-weight model with no importance matrix. Left out: the types that
``src/llama-quant.cpp`` ``tensor_requires_imatrix`` refuses without one (IQ1_*, IQ2_*, IQ3_XXS, and Q2_K_S,
whose Q2_K tensors need it), the other IQ3 mixes, the 1-2-bit and ternary Q1_0, Q2_0, TQ1_0 and TQ2_0,
COPY (no quantization) and the aliases Q3_K, Q4_K, Q5_K (spelled by the _M names they stand for)."""


def quant_type(name: str) -> str:
    """``name`` as llama-quantize spells it (upper case); UsageError with the closest names unless it is one
    of :data:`QUANT_TYPES`."""
    q = name.upper()
    if q not in QUANT_TYPES:
        msg = f"Unknown quant type {name!r}.{close_matches(q, QUANT_TYPES)} Use one of {', '.join(QUANT_TYPES)}."
        raise UsageError(msg)
    return q

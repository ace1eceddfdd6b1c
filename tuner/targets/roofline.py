"""Roofline estimates: an upper bound on llama-bench t/s from an arch's peaks and a model's size.

This is a MODEL ESTIMATE, not a measurement. The method is the roofline model (Williams, Waterman and Patterson,
"Roofline", CACM 52(4), 2009) applied per token: decode (tg) is bound by memory bandwidth over the bytes read per token
(all matmul weights once, plus the KV cache at that depth); prefill (pp) is bound by the math peak over the FLOPs per
token (2 per matmul weight, plus 4 * n_layers * n_heads * head_dim * depth for QK^T and PV). Bytes come from the real
GGUF tensor sizes when a file is given; the KV cache and the LM head are counted. How close measurements get, on the
H100 at depth 0 with Q4_K_M: llama-3.2-1b decoded at 891 t/s against a 4177 t/s bound (21%;
results/sm_90/llama-3.2-1b-q4_k_m), llama-3.1-8b at 270 against 724 (37%; results/sm_90/llama-3.1-8b-q4_k_m).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

from tuner.errors import UsageError, close_matches
from tuner.targets.archs import Arch, Product, load_arch
from tuner.targets.models import GGUFTensor, ModelShape, TensorSpec, load_gguf_shape, load_gguf_tensors, plan_tensors

ESTIMATE_LABEL = "roofline model estimate (upper bound from spec-sheet peaks), not a measurement"

_FLOAT_KV = {"f16": 2.0, "bf16": 2.0, "f32": 4.0}
KV_TYPES = {**_FLOAT_KV, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32, "q4_1": 20 / 32, "q4_0": 18 / 32}
"""KV-cache element types llama-bench accepts (-ctk/-ctv) -> bytes per element (block size / 32)."""

_FLOAT_TYPES = {"F32", "F16", "BF16", "F64"}
_MAX_DEPTH = 1 << 24


def _check_depth(depth: int) -> None:
    if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= _MAX_DEPTH:
        raise UsageError(f"Depth must be an integer between 0 and {_MAX_DEPTH}, got {depth!r}.")


_Tensor = tuple[str, TensorSpec | GGUFTensor]
"""A tensor and its kind (``embd``, ``output``, ``matmul``, ``vector`` or :class:`TensorSpec`'s)."""


def _is_matmul(kind: str, shape: ModelShape) -> bool:
    """A matmul weight of a token's forward pass: the LM head included (``token_embd`` when tied)."""
    return kind in ("matmul", "output") or (kind == "embd" and shape.tied_output)


def _resolve(model: ModelShape | str | os.PathLike[str], weight_type: str) -> tuple[ModelShape, Sequence[_Tensor], str]:
    """(shape, its tensors with their kinds, where the sizes come from)."""
    if isinstance(model, ModelShape):
        tensors = [(t.kind, t) for t in plan_tensors(model, weight_type)]
        return model, tensors, f"shape {model.name} with {weight_type} weights (llama-quantize type rules)"
    path = Path(model)
    try:
        st = path.stat()
    except OSError:
        load_gguf_shape(path)  # raises the UsageError naming the missing file
        raise
    shape, cached = _resolve_gguf(str(path), st.st_mtime_ns, st.st_size)
    return shape, cached, f"GGUF tensor sizes of {path}"


@functools.lru_cache(maxsize=16)
def _resolve_gguf(path_str: str, _mtime_ns: int, _size: int) -> tuple[ModelShape, tuple[_Tensor, ...]]:
    # Keyed on mtime and size so a rewritten file is read again; one header parse per estimate.
    path = Path(path_str)
    shape = load_gguf_shape(path)
    named = {"token_embd.weight": "embd", "output.weight": "output"}
    tensors = [
        (named.get(t.name) or ("matmul" if len(t.ne) >= 2 and t.ne[1] > 1 else "vector"), t)
        for t in load_gguf_tensors(path)
    ]
    if not any(kind == "matmul" and t.n_bytes > 0 for kind, t in tensors):
        # a vocab-only GGUF (models/ggml-vocab-*.gguf) has the metadata and no weights: its bound would be x/0
        raise UsageError(
            f"{path} has no weight tensors (a vocab-only GGUF?); a roofline needs the model's weights. "
            "Pass the model file, or --like NAME for a known shape."
        )
    return shape, tuple(tensors)


class TokenBytes(TypedDict):
    """What :func:`bytes_per_token` returns."""

    weights_bytes: int
    kv_bytes: int
    total_bytes: int
    weights_source: str
    quantized: bool


def bytes_per_token(
    shape_or_gguf: ModelShape | str | os.PathLike[str], depth: int, kv_type: str = "f16", *, weight_type: str = "f16"
) -> TokenBytes:
    """Bytes one generated token reads at KV depth ``depth``.

    Weights: every matmul weight once; the LM head once (``token_embd`` when tied, else
    ``output.weight``); one row of ``token_embd`` for the lookup; every 1-D tensor. KV:
    ``2 * n_layers * n_kv_heads * head_dim * depth * bytes_per_elem``. A GGUF path gives real per-tensor
    sizes; ``weight_type`` applies to a ModelShape only. UsageError for a bad depth, KV type or model.
    """
    _check_depth(depth)
    if kv_type not in KV_TYPES:
        msg = f"Unknown KV type {kv_type!r}.{close_matches(kv_type, KV_TYPES)} Use one of {', '.join(KV_TYPES)}."
        raise UsageError(msg)
    shape, tensors, where = _resolve(shape_or_gguf, weight_type)
    weights = 0
    for kind, t in tensors:
        if kind == "embd":
            row = t.n_bytes // (t.ne[1] if len(t.ne) > 1 else 1)
            # Tied: the LM head matmul reads the whole matrix; the lookup reads one row either way.
            weights += t.n_bytes + row if shape.tied_output else row
        else:
            weights += t.n_bytes
    kv = 2 * shape.n_layers * shape.n_kv_heads * shape.head_dim * depth * KV_TYPES[kv_type]
    quantized = any(t.ggml_type not in _FLOAT_TYPES for kind, t in tensors if _is_matmul(kind, shape))
    total = round(weights + kv)
    return TokenBytes(
        weights_bytes=int(weights), kv_bytes=round(kv), total_bytes=total, weights_source=where, quantized=quantized
    )


def flops_per_token(
    shape_or_gguf: ModelShape | str | os.PathLike[str], depth: int, *, weight_type: str = "f16"
) -> dict[str, Any]:
    """FLOPs one token costs at KV depth ``depth``.

    ``matmul_flops`` = 2 * matmul weights (LM head included, embedding lookup excluded); ``attention_flops`` = 4 *
    n_layers * n_heads * head_dim * depth (QK^T and PV). UsageError for a bad depth or model.
    """
    _check_depth(depth)
    shape, tensors, where = _resolve(shape_or_gguf, weight_type)
    params = sum(t.n_elements for kind, t in tensors if _is_matmul(kind, shape))
    attn = 4 * shape.n_layers * shape.n_heads * shape.head_dim * depth
    return {"matmul_flops": 2 * params, "attention_flops": attn, "total_flops": 2 * params + attn, "source": where}


def _bandwidth(arch: Arch, product: Product, bandwidth: float | None) -> tuple[float, str]:
    if bandwidth is not None:
        if isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float)) or not 0 < bandwidth < 1e6:
            raise UsageError(f"--bandwidth must be a positive number of GB/s below 1e6, got {bandwidth!r}.")
        return float(bandwidth), "--bandwidth"
    if product.bandwidth_gbps is None:
        raise UsageError(
            f"No memory bandwidth is known for {arch.name} ({product.name}). Measure it (for example "
            "with STREAM) and pass --bandwidth GBPS."
        )
    return product.bandwidth_gbps, product.sources.get("bandwidth_gbps", "archs.toml")


def _peaks(arch: Arch, product: Product, quantized: bool) -> tuple[float | None, str, float | None, str]:
    """(matmul peak TFLOPS/TOPS, its label, attention FP16 peak, its label)."""
    fp = product.fp16_tflops if arch.math.get("fast_fp16") else None
    fp_label = "FP16"
    if fp is None:  # P40 (cc 610) and the CPU run the float paths in FP32
        fp, fp_label = product.fp32_tflops, "FP32"
    if (
        quantized
        and product.int8_tops is not None
        and (arch.math.get("dp4a") or any(arch.math.get(k) for k in ("int8_mma", "int8_wmma", "int8_mfma")))
    ):
        return product.int8_tops, "INT8 (MMQ) TOPS", fp, fp_label
    return fp, f"{fp_label} TFLOPS", fp, fp_label


def estimate(
    arch: Arch | str,
    model: ModelShape | str | os.PathLike[str],
    depths: Sequence[int] = (0, 4096, 16384, 32768),
    pp: int = 512,
    tg: int = 128,
    *,
    weight_type: str = "f16",
    kv_type: str = "f16",
    bandwidth: float | None = None,
    product: str | None = None,
) -> list[dict[str, Any]]:
    """Roofline bounds for llama-bench's ``pp<pp> @ d<depth>`` and ``tg<tg> @ d<depth>`` tests.

    tg bound = bandwidth / bytes per token at the mean depth of the run (depth + tg/2).
    pp bound = pp / (matmul FLOPs / matmul peak + attention FLOPs / FP16 peak), at mean depth
    depth + pp/2; the matmul peak is INT8 for quantized weights on archs with an int8 path, else FP16.

    One dict per (test, depth): test, depth, bound_tps, limit (what bounds it), bytes or FLOPs per token, arch, product,
    and ``label`` saying it is an estimate. UsageError for a bad arch, model, depth, pp/tg or unknown bandwidth.
    """
    a = load_arch(arch) if isinstance(arch, str) else arch
    prod = a.product(product)
    for name, val in (("pp", pp), ("tg", tg)):
        if isinstance(val, bool) or not isinstance(val, int) or not 0 <= val <= 1 << 20:
            raise UsageError(f"{name} must be an integer between 0 and 1048576, got {val!r}.")
    bw, bw_src = _bandwidth(a, prod, bandwidth)
    rows: list[dict[str, Any]] = []
    for depth in depths:
        _check_depth(depth)
        base = {"arch": a.name, "product": prod.name, "depth": depth, "label": ESTIMATE_LABEL}
        if pp > 0:
            mid = depth + pp // 2
            f = flops_per_token(model, mid, weight_type=weight_type)
            q = bytes_per_token(model, mid, kv_type, weight_type=weight_type)["quantized"]
            mm_peak, mm_label, fp_peak, fp_label = _peaks(a, prod, q)
            bound: float | None = None
            limit = "compute (peak unknown for this product)"
            if mm_peak is not None and fp_peak is not None:
                bound = 1.0 / (f["matmul_flops"] / (mm_peak * 1e12) + f["attention_flops"] / (fp_peak * 1e12))
                limit = f"compute: matmuls at {mm_peak:g} {mm_label}, attention at {fp_peak:g} {fp_label} TFLOPS"
            rows.append(
                {**base, "test": f"pp{pp}", "bound_tps": bound, "limit": limit, "flops_per_token": f["total_flops"]}
            )
        if tg > 0:
            b = bytes_per_token(model, depth + tg // 2, kv_type, weight_type=weight_type)
            limit = f"memory: {bw:g} GB/s ({bw_src})"
            sizes = {
                "bytes_per_token": b["total_bytes"],
                "weights_bytes": b["weights_bytes"],
                "kv_bytes": b["kv_bytes"],
            }
            rows.append({**base, "test": f"tg{tg}", "bound_tps": bw * 1e9 / b["total_bytes"], "limit": limit, **sizes})
    return rows

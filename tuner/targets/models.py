"""Model shapes and random-weight GGUF models with exactly those shapes.

Random weights keep a dense model's speed (same tensors, types and sizes, so the same kernels and bytes moved), not its
output quality. Shapes live in ``tuner/data/models.toml``; tensor names and ggml shapes follow llama.cpp's loaders (tree
A ``src/models/llama.cpp``, ``src/models/qwen2.cpp``, ``src/llama-model.cpp``). Tokenizer fields are copied from the
vocab-only GGUF in the llama.cpp tree's ``models/`` folder, so llama.cpp loads the file like a converted checkpoint.
A GGUF is read by a fast reader of its header (:func:`parse_gguf`: key/values and tensor infos, never tensor data).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import mmap
import os
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import gguf
import numpy as np

from tuner import _run, log
from tuner._compat import tomllib
from tuner.errors import TunerError, UsageError, close_matches
from tuner.paths import package_data, tuner_home
from tuner.targets.quant_types import quant_type

WEIGHT_TYPES = ("f16", "q8_0", "q4_k_m", "q5_k_m", "iq4_xs")
"""Weight types plan_tensors and synth_model know. f16 and q8_0 are N(0, 0.02) values (q8_0 quantized from
them); q4_k_m, q5_k_m and iq4_xs write random blocks of each tensor's planned type directly
(:func:`write_random_blocks`), not the blocks llama-quantize would make from the f16 file."""

_INT_KEYS = ("n_layers", "d_model", "d_ff", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "context_length")
_CHUNK_ELEMS = 1 << 23  # 8M values per write: bounded memory even for a 1 GB token_embd


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The hyper-parameters that fix a dense llama-style model's tensors."""

    name: str
    arch: str
    """llama.cpp architecture string (``llama``, ``qwen2``)."""
    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_output: bool
    """True: no ``output.weight``; llama.cpp reuses ``token_embd`` as the LM head."""
    qkv_bias: bool = False
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-5
    context_length: int = 4096
    vocab: str = "llama-bpe"
    """Vocab GGUF name in the llama.cpp tree: ``models/ggml-vocab-<vocab>.gguf``."""
    rope_scaling: Mapping[str, Any] | None = None
    source: str = ""

    @property
    def gqa(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads


@dataclasses.dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """One tensor as llama.cpp expects it."""

    name: str
    ne: tuple[int, ...]
    """ggml order: ne[0] is the contiguous (row) dimension."""
    kind: str
    """``embd``, ``matmul``, ``output``, ``norm``, ``bias`` or ``rope``."""
    ggml_type: str
    """``F32``, ``F16``, ``Q8_0``, ``Q4_K``, ... (gguf.GGMLQuantizationType name)."""

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)

    @property
    def n_bytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[self.ggml_type]]
        return self.n_elements // block * size


@dataclasses.dataclass(frozen=True, kw_only=True)
class SynthResult:
    """What ``synth_model`` wrote."""

    path: Path
    shape: ModelShape
    weight_type: str
    n_tensors: int
    n_params: int
    n_bytes: int
    seconds: float


def _model_error(path: Path, name: str, key: str, why: str) -> TunerError:
    return TunerError(f"{path}: model {name!r}, key {key!r}: {why}. Fix the data file.")


def _parse_shape(name: str, raw: Mapping[str, Any], path: Path) -> ModelShape:
    fields = {f.name for f in dataclasses.fields(ModelShape)} - {"name"}
    unknown = set(raw) - fields
    if unknown:
        key = sorted(unknown)[0]
        raise _model_error(path, name, key, f"unknown key{close_matches(key, fields)}")
    for key in (*_INT_KEYS, "arch", "tied_output", "vocab", "source"):
        if key not in raw:
            raise _model_error(path, name, key, "missing")
    for key in _INT_KEYS:
        val = raw[key]
        if isinstance(val, bool) or not isinstance(val, int) or val <= 0:
            raise _model_error(path, name, key, f"expected a positive integer, got {val!r}")
    if raw["n_heads"] % raw["n_kv_heads"]:
        raise _model_error(path, name, "n_kv_heads", "must divide n_heads")
    if raw["head_dim"] % 2:
        raise _model_error(path, name, "head_dim", "must be even (RoPE rotates pairs)")
    for key in ("tied_output", "qkv_bias"):
        if key in raw and not isinstance(raw[key], bool):
            raise _model_error(path, name, key, f"expected true/false, got {raw[key]!r}")
    for key in ("rope_freq_base", "rms_eps"):
        if key in raw and (isinstance(raw[key], bool) or not isinstance(raw[key], (int, float)) or raw[key] <= 0):
            raise _model_error(path, name, key, f"expected a positive number, got {raw[key]!r}")
    rs = raw.get("rope_scaling")
    if rs is not None:
        need = ("type", "factor", "low_freq_factor", "high_freq_factor", "original_context_length")
        if not isinstance(rs, dict) or rs.get("type") != "llama3" or any(k not in rs for k in need):
            raise _model_error(path, name, "rope_scaling", f"expected a llama3 table with {need}")
    vals = dict(raw)
    for key in ("rope_freq_base", "rms_eps"):
        if key in vals:
            vals[key] = float(vals[key])
    return ModelShape(name=name, **vals)


@functools.lru_cache(maxsize=4)
def _load_cached(path: Path) -> tuple[tuple[str, ModelShape], ...]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise TunerError(f"Cannot read the model database {path}: {err}. Reinstall tuner or fix the file.") from err
    return tuple((name, _parse_shape(name, raw, path)) for name, raw in data.items())


def load_models(path: Path | None = None) -> dict[str, ModelShape]:
    """Load and validate the model-shape database (default the packaged ``models.toml``).

    Raises TunerError naming file, model and key when a model lacks a key or has a bad value.
    """
    return dict(_load_cached(path or package_data("models.toml")))


def load_model_shape(name: str) -> ModelShape:
    """One model shape by name (case-insensitive); UsageError suggests the closest for an unknown one."""
    models = load_models()
    key = name.strip().lower()
    if key in models:
        return models[key]
    raise UsageError(
        f"Unknown model {name!r}.{close_matches(key, models)} Known models: {', '.join(models)}. "
        "Pass one of them to --like."
    )


def _fallback(qtype: str, ncols: int) -> str:
    # llama-quant.cpp tensor_type_fallback(): 256-wide types on rows not divisible by 256.
    if qtype in ("Q4_K", "Q5_K", "Q6_K", "IQ4_XS") and ncols % 256:
        return {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL"}[qtype]
    return qtype


def _weight_type(spec_kind: str, name: str, ncols: int, layer: int, shape: ModelShape, weight_type: str) -> str:
    if weight_type == "f16":
        return "F16"
    if weight_type == "q8_0":
        return "Q8_0" if ncols % 32 == 0 else "F16"
    # the llama_tensor_get_type() rules of tree A src/llama-quant.cpp for LLAMA_FTYPE_MOSTLY_Q4_K_M,
    # _Q5_K_M and _IQ4_XS (no imatrix), for the dense llama/qwen2 tensors plan_tensors writes
    if spec_kind == "output" or (spec_kind == "embd" and shape.tied_output):
        return "Q6_K" if ncols % 256 == 0 else "Q8_0"
    if weight_type == "iq4_xs":
        if name.endswith("attn_v.weight") and shape.n_heads // shape.n_kv_heads >= 4:
            return _fallback("Q5_K", ncols)
        if name.endswith("ffn_down.weight") and layer < shape.n_layers // 8:
            return _fallback("Q5_K", ncols)
        return _fallback("IQ4_XS", ncols)
    n = shape.n_layers  # llama-quant.cpp use_more_bits(): first and last eighth plus every third layer between
    more_bits = layer < n // 8 or layer >= 7 * n // 8 or (layer - n // 8) % 3 == 2
    if name.endswith(("attn_v.weight", "ffn_down.weight")) and more_bits:
        return _fallback("Q6_K", ncols)
    return _fallback("Q4_K" if weight_type == "q4_k_m" else "Q5_K", ncols)


def plan_tensors(shape: ModelShape, weight_type: str = "f16") -> list[TensorSpec]:
    """Every tensor llama.cpp loads for ``shape``, in write order, with its storage type.

    1-D tensors (norms, biases, rope factors) stay F32, as convert_hf_to_gguf.py writes them.
    ``q4_k_m`` and ``q5_k_m`` follow llama-quantize's per-tensor rules (Q6_K for the tied/untied LM head and
    for attn_v/ffn_down on "more bits" layers, Q4_K/Q5_K elsewhere, with its fallbacks), ``iq4_xs`` its IQ4_XS
    rules without an imatrix (Q6_K LM head, Q5_K for attn_v at GQA >= 4 and the first eighth's ffn_down), so
    estimates from a shape match the file llama-quantize would write. UsageError for an unknown ``weight_type``.
    """
    if weight_type not in WEIGHT_TYPES:
        msg = f"Unknown weight type {weight_type!r}.{close_matches(weight_type, WEIGHT_TYPES)} Use one of {', '.join(WEIGHT_TYPES)}."
        raise UsageError(msg)
    d, kv = shape.d_model, shape.n_kv_heads * shape.head_dim
    q = shape.n_heads * shape.head_dim
    specs: list[TensorSpec] = []

    def add(name: str, ne: tuple[int, ...], kind: str, layer: int = -1) -> None:
        f32 = kind in ("norm", "bias", "rope")
        gtype = "F32" if f32 else _weight_type(kind, name, ne[0], layer, shape, weight_type)
        specs.append(TensorSpec(name=name, ne=ne, kind=kind, ggml_type=gtype))

    add("token_embd.weight", (d, shape.vocab_size), "embd")
    if shape.rope_scaling is not None:
        add("rope_freqs.weight", (shape.head_dim // 2,), "rope")
    for i in range(shape.n_layers):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", (d,), "norm", i)
        add(b + "attn_q.weight", (d, q), "matmul", i)
        add(b + "attn_k.weight", (d, kv), "matmul", i)
        add(b + "attn_v.weight", (d, kv), "matmul", i)
        if shape.qkv_bias:
            add(b + "attn_q.bias", (q,), "bias", i)
            add(b + "attn_k.bias", (kv,), "bias", i)
            add(b + "attn_v.bias", (kv,), "bias", i)
        add(b + "attn_output.weight", (q, d), "matmul", i)
        add(b + "ffn_norm.weight", (d,), "norm", i)
        add(b + "ffn_gate.weight", (d, shape.d_ff), "matmul", i)
        add(b + "ffn_up.weight", (d, shape.d_ff), "matmul", i)
        add(b + "ffn_down.weight", (shape.d_ff, d), "matmul", i)
    add("output_norm.weight", (d,), "norm")
    if not shape.tied_output:
        add("output.weight", (d, shape.vocab_size), "output")
    return specs


def _llama3_rope_factors(shape: ModelShape) -> np.ndarray:
    # Same formula as convert_hf_to_gguf.py LlamaModel.generate_extra_tensors (rope_type llama3).
    rs = shape.rope_scaling or {}
    dim, base = shape.head_dim, shape.rope_freq_base
    factor = float(rs["factor"])
    lo, hi = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old_ctx = float(rs["original_context_length"])
    low_wl, high_wl = old_ctx / lo, old_ctx / hi
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    out = []
    for f in freqs:
        wl = 2 * math.pi / float(f)
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (old_ctx / wl - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


_RMS = 0.02  # the f16 path's N(0, 0.02)


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """One ggml block type: elements and bytes per block, and its fp16 scale fields (byte offset, value).

    Random ggml quantized blocks, written directly (no f16 file, no llama-quantize).

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


class _StreamedTensor:
    """Duck-typed ndarray for GGUFWriter.write_tensor_data, which only reads ``.nbytes`` and calls ``.tofile``.

    Generating values chunk by chunk there bounds memory (llama-3.1-8b's token_embd is 1 GB in F16).
    ``direct``: quantized tensors are random blocks of their type (:func:`write_random_blocks`), not quantized values.
    """

    def __init__(self, spec: TensorSpec, rng: np.random.Generator, shape: ModelShape, *, direct: bool = False) -> None:
        self.spec, self.rng, self.shape, self.direct = spec, rng, shape, direct
        self.nbytes = spec.n_bytes

    def tofile(self, fout: IO[bytes]) -> None:
        spec = self.spec
        if spec.kind == "norm":
            np.ones(spec.ne, dtype=np.float32).tofile(fout)
        elif spec.kind == "rope":
            _llama3_rope_factors(self.shape).tofile(fout)
        elif spec.kind == "bias":
            (self.rng.standard_normal(spec.n_elements, dtype=np.float32) * 0.02).tofile(fout)
        elif self.direct and spec.ggml_type in BLOCK_LAYOUTS:
            write_random_blocks(fout, spec.ggml_type, spec.n_elements, self.rng, chunk_elems=_CHUNK_ELEMS)
        else:
            ncols, nrows = spec.ne[0], math.prod(spec.ne[1:])
            rows = max(1, _CHUNK_ELEMS // ncols)
            for start in range(0, nrows, rows):
                block = self.rng.standard_normal((min(rows, nrows - start), ncols), dtype=np.float32)
                block *= 0.02
                if spec.ggml_type == "F16":
                    block.astype(np.float16).tofile(fout)
                else:
                    gguf.quants.quantize(block, gguf.GGMLQuantizationType[spec.ggml_type]).tofile(fout)


def find_vocab(source_root: Path, name: str) -> Path | None:
    """The vocab-only GGUF ``models/ggml-vocab-<name>.gguf`` of a llama.cpp tree, or None."""
    path = Path(source_root) / "models" / f"ggml-vocab-{name}.gguf"
    return path if path.is_file() else None


def _add_metadata(writer: gguf.GGUFWriter, shape: ModelShape, weight_type: str, vocab_path: Path) -> None:
    a = shape.arch
    writer.add_name(f"tuner-random-{shape.name}")
    writer.add_description("random weights (tuner model synth): same speed as the dense model, no output quality")
    writer.add_uint32(f"{a}.context_length", shape.context_length)
    writer.add_uint32(f"{a}.embedding_length", shape.d_model)
    writer.add_uint32(f"{a}.block_count", shape.n_layers)
    writer.add_uint32(f"{a}.feed_forward_length", shape.d_ff)
    writer.add_uint32(f"{a}.attention.head_count", shape.n_heads)
    writer.add_uint32(f"{a}.attention.head_count_kv", shape.n_kv_heads)
    writer.add_uint32(f"{a}.attention.key_length", shape.head_dim)
    writer.add_uint32(f"{a}.attention.value_length", shape.head_dim)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", shape.rms_eps)
    writer.add_float32(f"{a}.rope.freq_base", shape.rope_freq_base)
    writer.add_uint32(f"{a}.rope.dimension_count", shape.head_dim)
    writer.add_uint32(f"{a}.vocab_size", shape.vocab_size)
    ftype = {"f16": "MOSTLY_F16", "q8_0": "MOSTLY_Q8_0", "q4_k_m": "MOSTLY_Q4_K_M", "q5_k_m": "MOSTLY_Q5_K_M",
             "iq4_xs": "MOSTLY_IQ4_XS"}[weight_type]  # fmt: skip
    writer.add_file_type(int(gguf.LlamaFileType[ftype]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    try:
        kv, _ = parse_gguf(vocab_path)
    except (OSError, ValueError, KeyError, struct.error) as err:
        msg = f"Cannot read the vocab GGUF {vocab_path}: {err}. Pass a vocab-only GGUF from llama.cpp's models/ folder."
        raise UsageError(msg) from err
    tokens = kv.get("tokenizer.ggml.tokens")
    if tokens is None:
        msg = f"{vocab_path} has no tokenizer.ggml.tokens; it is not a vocab GGUF. Use models/ggml-vocab-{shape.vocab}.gguf."
        raise UsageError(msg)
    if len(tokens[2]) != shape.vocab_size:
        raise UsageError(
            f"{vocab_path} has {len(tokens[2])} tokens but {shape.name} needs vocab_size {shape.vocab_size}. "
            f"Use models/ggml-vocab-{shape.vocab}.gguf."
        )
    for key, (vtype, sub, val) in kv.items():
        if key.startswith("tokenizer."):
            sub_type = None if sub is None else gguf.GGUFValueType(sub)
            writer.add_key_value(key, val, gguf.GGUFValueType(vtype), sub_type=sub_type)


def _write_tensors(
    writer: Any,  # a GGUFWriter, handed a _StreamedTensor where its types say ndarray
    specs: Sequence[TensorSpec],
    shape: ModelShape,
    *,
    seed: int,
    direct: bool,
    on_tensor: Callable[[int, int, str], None] | None,
    tmp: Path,
    out: Path,
) -> None:
    """Write header, key/values and tensors to ``tmp`` (tensors streamed one at a time), then rename to ``out``."""
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, spec in enumerate(specs):
            if on_tensor:
                on_tensor(i, len(specs), spec.name)
            rng = np.random.default_rng([seed, i])
            writer.write_tensor_data(_StreamedTensor(spec, rng, shape, direct=direct))
        writer.close()
        os.replace(tmp, out)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        msg = f"Writing {out} failed: {err}. Check free disk space ({shape.name} needs about {sum(s.n_bytes for s in specs) / 1e9:.2f} GB)."
        raise TunerError(msg) from err


def synth_model(
    shape: ModelShape,
    out: Path,
    *,
    vocab_path: Path,
    weight_type: str = "f16",
    seed: int = 0,
    on_tensor: Callable[[int, int, str], None] | None = None,
) -> SynthResult:
    """Write a random-weight GGUF with ``shape``'s exact tensors and metadata (tokenizer from ``vocab_path``).

    Weights are N(0, 0.02), norms 1, biases N(0, 0.02) in F32; values are a pure function of
    ``seed`` and the tensor's index. ``q4_k_m``, ``q5_k_m`` and ``iq4_xs`` write each weight in its planned
    type (plan_tensors: llama-quantize's choices) as random blocks whose scales give about the same spread
    (:func:`write_random_blocks`), with no f16 file and no llama-quantize: a different file from quantizing
    the f16 one, with the same tensors, types and sizes (other quants: quantize the f16 file with run_quantize).
    Tensors are written one at a time (big ones in chunks), so memory stays far below the file size; the file
    appears under its final name only when complete. ``on_tensor(index, count, name)`` reports progress.

    Raises UsageError for a bad weight type or seed or a vocab that does not fit the shape, TunerError when
    the file cannot be written.
    """
    if weight_type not in WEIGHT_TYPES:
        msg = f"synth writes {', '.join(WEIGHT_TYPES)} weights, not {weight_type!r}. For other quants, synth f16 and quantize it with llama-quantize (--quant TYPE --quantize-with PATH)."
        raise UsageError(msg)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise UsageError(f"Seed must be an integer in [0, 2^63), got {seed!r}.")
    start = time.monotonic()
    specs = plan_tensors(shape, weight_type)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    writer = gguf.GGUFWriter(tmp, shape.arch)
    _add_metadata(writer, shape, weight_type, vocab_path)
    # one tensor-info entry per planned tensor: F32/F16 as arrays, quantized as raw bytes
    for spec in specs:
        gtype = gguf.GGMLQuantizationType[spec.ggml_type]
        np_shape = tuple(reversed(spec.ne))
        if spec.ggml_type in ("F32", "F16"):
            writer.add_tensor_info(
                spec.name, np_shape, np.dtype(np.float32 if spec.ggml_type == "F32" else np.float16), spec.n_bytes
            )
        else:
            byte_shape = gguf.quant_shape_to_byte_shape(np_shape, gtype)
            writer.add_tensor_info(spec.name, byte_shape, np.dtype(np.uint8), spec.n_bytes, raw_dtype=gtype)
    direct = weight_type in DIRECT_WEIGHT_TYPES
    _write_tensors(writer, specs, shape, seed=seed, direct=direct, on_tensor=on_tensor, tmp=tmp, out=out)
    return SynthResult(
        path=out,
        shape=shape,
        weight_type=weight_type,
        n_tensors=len(specs),
        n_params=sum(s.n_elements for s in specs),
        n_bytes=out.stat().st_size,
        seconds=time.monotonic() - start,
    )


def run_quantize(src: Path, dst: Path, quant: str, *, quantize_bin: Path, log_file: Path | None = None) -> Path:
    """Quantize ``src`` into ``dst`` with a ``llama-quantize`` binary.

    Raises UsageError for an unknown quant type or missing binary, TunerError (with the log's tail) if it fails.
    """
    q = quant_type(quant)
    exe = Path(quantize_bin)
    if not exe.is_file() or not os.access(exe, os.X_OK):
        msg = f"llama-quantize not found or not executable at {exe}. Build it (tuner build) and pass its path to --quantize-with."
        raise UsageError(msg)
    _run.run([exe, src, dst, q], log_file=log_file, timeout=3600, what="llama-quantize")
    return Path(dst)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GGUFTensor:
    """A tensor read from a GGUF file."""

    name: str
    ne: tuple[int, ...]
    ggml_type: str
    n_elements: int
    n_bytes: int


_SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


MAX_ARRAY_ITEMS = 1 << 24
"""Most array entries a header may hold in all (the largest vocabularies have about 262k tokens, each with
a score and a type): a hostile header that claims more is refused before its entries are read into lists."""

_MAX_DIMS = 4  # GGML_MAX_DIMS


def parse_gguf(path: Path, *, tensors: bool = False) -> tuple[dict[str, tuple[int, int | None, Any]], list[GGUFTensor]]:
    """The KV section of a GGUF (v2/v3) as ``key -> (type, array subtype, value)``, and its tensor infos.

    gguf.GGUFReader builds a numpy memmap view per string (about 40 s for the 408k strings of the llama-bpe vocab on 2
    cores); this struct walk over an mmap of the header takes well under a second and never reads tensor data. Every
    count is checked against the bytes left in the file (and :data:`MAX_ARRAY_ITEMS`) before anything is read, so a
    hostile header costs no more memory than the file's size allows. ValueError for a non-GGUF or a header that does not
    fit its file (naming the key or tensor).
    """
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ValueError("bad magic (not a GGUF file)")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old")
        off, size, items = 24, len(buf), 0
        where = "the header"

        def fits(n: int, each: int, what: str) -> None:
            if n * each > size - off:
                raise ValueError(f"{where}: {what} of {n} entries does not fit the {size - off} bytes left in the file")

        def string() -> str:
            nonlocal off
            (n,) = struct.unpack_from("<Q", buf, off)
            fits(n, 1, "a string")
            s = buf[off + 8 : off + 8 + n].decode("utf-8", errors="surrogateescape")
            off += 8 + n
            return s

        def scalar(t: int) -> Any:
            nonlocal off
            if t == 8:
                return string()
            if t not in _SCALAR_FMT:
                raise ValueError(f"{where}: unknown value type {t}")
            fmt = _SCALAR_FMT[t]
            (v,) = struct.unpack_from(fmt, buf, off)
            off += struct.calcsize(fmt)
            return v

        kv: dict[str, tuple[int, int | None, Any]] = {}
        fits(n_kv, 12, "a key/value section")  # a key's length and a type at least
        try:
            for _ in range(n_kv):
                key = string()
                where = f"key {key!r}"
                (t,) = struct.unpack_from("<I", buf, off)
                off += 4
                if t != 9:
                    kv[key] = (t, None, scalar(t))
                    continue
                sub, n = struct.unpack_from("<IQ", buf, off)
                off += 12
                items += n
                if items > MAX_ARRAY_ITEMS:
                    raise ValueError(f"{where}: arrays of more than {MAX_ARRAY_ITEMS} entries in all")
                if sub in _SCALAR_FMT:
                    fmt = _SCALAR_FMT[sub]
                    each = struct.calcsize(fmt)
                    fits(n, each, "an array")
                    # struct (not np.frombuffer) so no buffer export outlives the mmap
                    kv[key] = (t, sub, list(struct.unpack_from(f"<{n}{fmt[1:]}", buf, off)) if n else [])
                    off += n * each
                elif sub == 8:
                    fits(n, 8, "an array of strings")
                    kv[key] = (t, sub, [string() for _ in range(n)])
                else:
                    raise ValueError(f"{where}: nested arrays are not supported")
            infos: list[GGUFTensor] = []
            if tensors:
                where = "the tensor infos"
                fits(n_tensors, 24, "a tensor list")  # a name's length, n_dims, type and offset at least
                for _ in range(n_tensors):
                    name = string()
                    where = f"tensor {name!r}"
                    (n_dims,) = struct.unpack_from("<I", buf, off)
                    if n_dims > _MAX_DIMS:
                        raise ValueError(f"{where}: {n_dims} dimensions (ggml has at most {_MAX_DIMS})")
                    ne = struct.unpack_from(f"<{n_dims}Q", buf, off + 4)
                    gtype, _offset = struct.unpack_from("<IQ", buf, off + 4 + 8 * n_dims)
                    off += 4 + 8 * n_dims + 12
                    qtype = gguf.GGMLQuantizationType(gtype)
                    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
                    n_el = math.prod(ne)
                    n_bytes = n_el // block * nbytes
                    infos.append(
                        GGUFTensor(name=name, ne=tuple(ne), ggml_type=qtype.name, n_elements=n_el, n_bytes=n_bytes)
                    )
        except (struct.error, KeyError) as err:  # truncated, or a type gguf does not know
            raise ValueError(f"{where}: {err}") from None
        except ValueError as err:
            raise ValueError(str(err) if str(err).startswith(where) else f"{where}: {err}") from None
    return kv, infos


def read_gguf(path: Path) -> tuple[dict[str, tuple[int, int | None, Any]], list[GGUFTensor]]:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"Model file {p} does not exist. Pass a .gguf path, or use --like NAME for a known shape.")
    try:
        return parse_gguf(p, tensors=True)
    except (OSError, ValueError, KeyError, struct.error) as err:  # bad magic, unknown type, truncation
        raise UsageError(f"{p} is not a readable GGUF file ({err}). Pass a llama.cpp GGUF model.") from err


def load_gguf_tensors(path: Path) -> list[GGUFTensor]:
    """Every tensor of a GGUF file with its stored size (header only); UsageError if missing or unreadable."""
    return read_gguf(path)[1]


def load_gguf_shape(path: Path) -> ModelShape:
    """The ModelShape of a dense llama-style GGUF from its metadata; UsageError if unreadable or unusable."""
    kv, tensors = read_gguf(path)

    def get(key: str, default: object = None) -> Any:
        return kv[key][2] if key in kv else default

    def bad(key: str, val: object, want: str) -> UsageError:
        shown = repr(val) if len(repr(val)) <= 60 else repr(val)[:57] + "..."
        return UsageError(
            f"{path}: metadata {key} = {shown} is not {want}; tuner estimates dense llama-style models only, "
            "from metadata as llama.cpp's convert_hf_to_gguf.py writes it. Pass such a GGUF (or --like NAME)."
        )

    def count(key: str, default: int | None = None) -> int:
        """A positive integer key; per-layer arrays (some archs) give their first layer's value."""
        v = get(key, default)
        if isinstance(v, list):
            if not v:
                raise bad(key, v, "a positive integer (an empty per-layer array)")
            v = v[0]
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v < 1 << 31:
            raise bad(key, v, "a positive integer")
        return v

    def positive(key: str, default: float) -> float:
        v = get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
            raise bad(key, v, "a positive finite number")
        return float(v)

    arch = get("general.architecture")
    if not isinstance(arch, str) or not arch:
        if "general.architecture" in kv:
            raise bad("general.architecture", arch, "an architecture name (llama, qwen2...)")
        raise UsageError(f"{path} has no general.architecture; it is not a llama.cpp model GGUF.")
    need = {
        "n_layers": f"{arch}.block_count",
        "d_model": f"{arch}.embedding_length",
        "d_ff": f"{arch}.feed_forward_length",
        "n_heads": f"{arch}.attention.head_count",
    }
    for key in need.values():
        if key not in kv:
            raise UsageError(f"{path}: metadata {key} is missing; tuner estimates dense llama-style models only.")
    vals: dict[str, Any] = {k: count(key) for k, key in need.items()}
    kv_key = f"{arch}.attention.head_count_kv"
    n_kv = count(kv_key, vals["n_heads"])
    if vals["n_heads"] % n_kv:
        raise bad(kv_key, n_kv, f"a divisor of {arch}.attention.head_count ({vals['n_heads']})")
    head_dim = count(f"{arch}.attention.key_length", max(1, vals["d_model"] // vals["n_heads"]))
    names = {t.name: t for t in tensors}
    embd = names.get("token_embd.weight")
    if embd is not None and len(embd.ne) > 1:
        vocab = embd.ne[1]
    else:
        vocab = count(f"{arch}.vocab_size") if f"{arch}.vocab_size" in kv else 0
    return ModelShape(
        name=Path(path).name,
        arch=arch,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        vocab_size=vocab,
        tied_output="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        rope_freq_base=positive(f"{arch}.rope.freq_base", 10000.0),
        rms_eps=positive(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        context_length=count(f"{arch}.context_length", 4096),
        source=f"GGUF metadata of {path}",
        **vals,
    )


def read_shape(path: Path) -> dict[str, int]:
    """Head size, GQA ratio and sizes of a GGUF, as plain ints (for constraints and the gate)."""
    return shape_ints(load_gguf_shape(Path(path)))


def shape_ints(s: ModelShape) -> dict[str, int]:
    """Head size, GQA ratio and sizes of ``s`` as plain ints: what a study's header records (``shape``)."""
    return {
        k: getattr(s, k) for k in ("head_dim", "gqa", "n_layers", "n_heads", "n_kv_heads", "d_model", "context_length")
    }


DIRECT_QUANTS = ("Q4_K_M", "Q5_K_M", "IQ4_XS")
"""Quant types ``synth_cached(direct=True)`` and ``model synth --direct`` write as random blocks."""
DIRECT_WEIGHT_TYPES = tuple(q.lower() for q in DIRECT_QUANTS)


class SourceTree(Protocol):
    """The llama.cpp tree a model is synthesized against (a :class:`tuner.source.Source`)."""

    @property
    def source_id(self) -> str: ...
    @property
    def root(self) -> Path: ...


def synth_cached(
    like: str,
    *,
    source: SourceTree,
    quant: str | None = None,
    quantize_bin: Path | None = None,
    weight_type: str = "f16",
    seed: int = 0,
    direct: bool = False,
) -> Path:
    """A synthesized (and optionally quantized) model under ``$TUNER_HOME/models``, made once.

    The file name carries the shape, type, seed and source id, so a cached file is reused only
    for exactly the same request. ``direct`` (``quant`` one of :data:`DIRECT_QUANTS`): write the
    quantized blocks directly (synth_model's ``q4_k_m``...), with no f16 file and no llama-quantize, as
    ``<shape>-<quant>-direct-s<seed>-<source>.gguf``: a different file from the quantized one, so
    it has its own name and studies that named the quantized file keep their model.

    Raises UsageError for an unknown model, ``quant`` without ``quantize_bin``, or ``direct`` with another quant.
    """
    shape = load_model_shape(like)
    if direct and (quant or "").upper() not in DIRECT_QUANTS:
        raise UsageError(f"direct synthesis writes {', '.join(DIRECT_QUANTS)} only, not {quant!r}.")
    # block types only as direct=True: their own file name, never the quantized one's
    if weight_type not in ("f16", "q8_0"):
        raise UsageError(
            f"synth_cached's weight_type is f16 or q8_0, not {weight_type!r}; for {', '.join(DIRECT_QUANTS)} blocks "
            "pass direct=True."
        )
    models = tuner_home() / "models"
    models.mkdir(parents=True, exist_ok=True)
    wt = str(quant).lower() if direct else weight_type
    base = models / f"{shape.name}-{wt}{'-direct' if direct else ''}-s{seed}-{source.source_id[:8]}.gguf"
    if not base.is_file():
        vocab = find_vocab(source.root, shape.vocab)
        if vocab is None:
            raise UsageError(
                f"the llama.cpp tree {source.root} has no models/ggml-vocab-{shape.vocab}.gguf, which "
                f"{shape.name} copies its tokenizer from. Use a full (untrimmed) source."
            )
        what = f"{str(quant).upper()}, random blocks written directly" if direct else weight_type
        with log.step(f"Synthesizing a random-weight {shape.name} ({what}) -> {base.name}"):
            synth_model(shape, base, vocab_path=vocab, weight_type=wt, seed=seed)
    if not quant or direct:
        return base
    out = base.with_name(base.stem.replace(f"-{weight_type}-", f"-{quant.lower()}-") + ".gguf")
    if out.is_file():
        return out
    if quantize_bin is None:
        raise UsageError(f"--quant {quant} needs a built llama-quantize; build a variant first.")
    with log.step(f"Quantizing {base.name} to {quant}"):
        run_quantize(base, out, quant, quantize_bin=quantize_bin, log_file=models / f"{out.stem}.quantize.log")
    return out

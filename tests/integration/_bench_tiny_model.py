"""A tiny random-weight llama GGUF for benchmark integration tests.

Stand-in for ``tuner model synth --like tiny`` until that lands: 2 layers, d=256, 4 query heads,
1 KV head (head size 64, GQA 4: the decode shape of Llama-3.2-1B), ff 512, F16 weights and the
Llama-3 BPE vocabulary copied from llama.cpp's ``models/ggml-vocab-llama-bpe.gguf``
(knobs.md §7 lists the metadata llama.cpp requires). Swap :func:`make_tiny_llama` for
``tuner.models`` once it exists; callers only need the returned path.
"""

from __future__ import annotations

__all__ = ["VOCAB", "make_tiny_llama"]

from pathlib import Path

import numpy as np

VOCAB = Path(
    "/tmp/sd/x0.3.36/llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf"
)

N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_CTX = 2, 256, 4, 1, 512, 4096


def make_tiny_llama(out: Path, *, vocab: Path = VOCAB, seed: int = 0) -> Path:
    """Write the tiny model to ``out`` (kept if it already exists) and return its path."""
    import gguf

    if out.is_file() and out.stat().st_size > 0:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(vocab)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    tmp = out.with_suffix(".tmp")
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name("tuner-tiny-llama")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, field.contents(), vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(key, field.contents(), vtype)

    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    head = N_EMBD // N_HEAD
    # numpy shapes are (rows, cols) = ggml ne reversed.
    w.add_tensor("token_embd.weight", weight(n_vocab, N_EMBD))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", weight(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_k.weight", weight(N_HEAD_KV * head, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_v.weight", weight(N_HEAD_KV * head, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_output.weight", weight(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weight(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weight(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weight(N_EMBD, N_FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out)
    return out

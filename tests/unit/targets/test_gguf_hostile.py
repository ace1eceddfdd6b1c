"""A GGUF from elsewhere is data: metadata of the wrong type or an impossible shape is exit 2 naming the
key and its value, in `tuner estimate --model` and `tuner search --dry-run --model`, never a crash or a
negative "bound"."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import UsageError
from tuner.targets.models import load_gguf_shape

D_MODEL, N_HEADS, N_KV, N_LAYERS, D_FF, VOCAB = 64, 4, 2, 2, 128, 32

Kv = Callable[[gguf.GGUFWriter], None]


def _model(path: Path, skip: tuple[str, ...] = (), extra: Kv | None = None) -> Path:
    """A small llama-style GGUF: metadata and F32 tensors of the right shapes (zeros), keys in ``skip`` left out
    so that ``extra`` can write them with another type or value."""
    w = gguf.GGUFWriter(path, "llama")
    kvs: dict[str, Kv] = {
        "llama.block_count": lambda w: w.add_uint32("llama.block_count", N_LAYERS),
        "llama.embedding_length": lambda w: w.add_uint32("llama.embedding_length", D_MODEL),
        "llama.feed_forward_length": lambda w: w.add_uint32("llama.feed_forward_length", D_FF),
        "llama.attention.head_count": lambda w: w.add_uint32("llama.attention.head_count", N_HEADS),
        "llama.attention.head_count_kv": lambda w: w.add_uint32("llama.attention.head_count_kv", N_KV),
        "llama.context_length": lambda w: w.add_uint32("llama.context_length", 256),
        "llama.rope.freq_base": lambda w: w.add_float32("llama.rope.freq_base", 10000.0),
        "llama.attention.layer_norm_rms_epsilon": lambda w: w.add_float32(
            "llama.attention.layer_norm_rms_epsilon", 1e-5
        ),
    }
    for key, add in kvs.items():
        if key not in skip:
            add(w)
    if extra is not None:
        extra(w)
    hd = D_MODEL // N_HEADS
    w.add_tensor("token_embd.weight", np.zeros((VOCAB, D_MODEL), dtype=np.float32))
    for i in range(N_LAYERS):
        for name, shape in (
            ("attn_q", (D_MODEL, D_MODEL)),
            ("attn_k", (N_KV * hd, D_MODEL)),
            ("attn_v", (N_KV * hd, D_MODEL)),
            ("attn_output", (D_MODEL, D_MODEL)),
            ("ffn_up", (D_FF, D_MODEL)),
            ("ffn_gate", (D_FF, D_MODEL)),
            ("ffn_down", (D_MODEL, D_FF)),
        ):
            w.add_tensor(f"blk.{i}.{name}.weight", np.zeros(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _refused(*args: str) -> str:
    res = CliRunner().invoke(cli, list(args), standalone_mode=False)
    assert isinstance(res.exception, UsageError) and res.exception.exit_code == 2, (res.exception, res.output)
    return str(res.exception)


def test_the_small_model_is_read(tmp_path: Path) -> None:
    s = load_gguf_shape(_model(tmp_path / "m.gguf"))
    assert (s.n_heads, s.n_kv_heads, s.head_dim, s.gqa, s.vocab_size) == (N_HEADS, N_KV, D_MODEL // N_HEADS, 2, VOCAB)
    res = CliRunner().invoke(cli, ["estimate", "--arch", "sm_90", "--model", str(tmp_path / "m.gguf")])
    assert res.exit_code == 0, res.output


BAD: list[tuple[str, Kv, str]] = [
    ("llama.attention.head_count_kv", lambda w: w.add_uint32("llama.attention.head_count_kv", 0), "0"),
    ("llama.attention.head_count_kv", lambda w: w.add_int32("llama.attention.head_count_kv", -2), "-2"),
    ("llama.attention.head_count_kv", lambda w: w.add_uint32("llama.attention.head_count_kv", 3), "3"),
    ("llama.attention.head_count_kv", lambda w: w.add_string("llama.attention.head_count_kv", "two"), "'two'"),
    ("llama.attention.head_count_kv", lambda w: w.add_array("llama.attention.head_count_kv", [0, 2]), "0"),
    ("llama.attention.head_count", lambda w: w.add_int32("llama.attention.head_count", -4), "-4"),
    ("llama.attention.head_count", lambda w: w.add_float32("llama.attention.head_count", 4.0), "4.0"),
    ("llama.block_count", lambda w: w.add_bool("llama.block_count", True), "True"),
    ("llama.attention.key_length", lambda w: w.add_string("llama.attention.key_length", "16"), "'16'"),
    ("llama.attention.key_length", lambda w: w.add_int32("llama.attention.key_length", -16), "-16"),
    ("llama.rope.freq_base", lambda w: w.add_string("llama.rope.freq_base", "abc"), "'abc'"),
    ("llama.rope.freq_base", lambda w: w.add_float32("llama.rope.freq_base", float("nan")), "nan"),
    (
        "llama.attention.layer_norm_rms_epsilon",
        lambda w: w.add_float32("llama.attention.layer_norm_rms_epsilon", -1.0),
        "-1.0",
    ),
    ("llama.context_length", lambda w: w.add_string("llama.context_length", "4k"), "'4k'"),
    ("llama.context_length", lambda w: w.add_int32("llama.context_length", 0), "0"),
]


@pytest.mark.parametrize(("key", "add", "shown"), BAD, ids=[f"{k.split('.', 1)[1]}={s}" for k, _, s in BAD])
def test_bad_metadata_is_exit_2_naming_key_and_value(tmp_path: Path, key: str, add: Kv, shown: str) -> None:
    m = _model(tmp_path / "m.gguf", skip=(key,), extra=add)
    msg = _refused("estimate", "--arch", "sm_90", "--model", str(m))
    assert f"{key} = {shown} " in msg, msg


def test_search_dry_run_refuses_zero_kv_heads_before_anything_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tuner.source

    def no_fetch(*a: object, **k: object) -> None:
        raise AssertionError("the model's metadata is checked before any source is fetched")

    monkeypatch.setattr(tuner.source, "fetch_source", no_fetch)
    key = "llama.attention.head_count_kv"
    m = _model(tmp_path / "m.gguf", skip=(key,), extra=lambda w: w.add_uint32(key, 0))
    msg = _refused("search", "--dry-run", "--arch", "sm_90", "--model", str(m))
    assert f"{key} = 0 " in msg


def test_general_architecture_of_the_wrong_type(tmp_path: Path) -> None:
    m = _model(tmp_path / "m.gguf", extra=lambda w: w.add_uint32("general.architecture", 5))
    msg = _refused("estimate", "--arch", "sm_90", "--model", str(m))
    assert "general.architecture = 5" in msg


def test_a_gguf_without_weights_has_no_bound(tmp_path: Path) -> None:
    # A vocab-only GGUF (models/ggml-vocab-*.gguf) carries the metadata but no tensors: its bound was x/0.
    m = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(m, "llama")
    for key, val in (
        ("llama.block_count", N_LAYERS),
        ("llama.embedding_length", D_MODEL),
        ("llama.feed_forward_length", D_FF),
        ("llama.attention.head_count", N_HEADS),
    ):
        w.add_uint32(key, val)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    msg = _refused("estimate", "--arch", "sm_90", "--model", str(m), "--depths", "0")
    assert "no weight tensors" in msg


def test_array_lengths_beyond_the_file_are_refused(tmp_path: Path) -> None:
    # An array claiming 2**40 strings in a small file: refused as unreadable, not read into memory.
    key = "tokenizer.ggml.tokens"
    m = _model(tmp_path / "m.gguf", extra=lambda w: w.add_array(key, ["a", "b"]))
    raw = bytearray(m.read_bytes())
    at = raw.index(key.encode()) + len(key) + 4 + 4  # after the key, its type (9) and the item type (8)
    assert struct.unpack_from("<Q", raw, at)[0] == 2
    struct.pack_into("<Q", raw, at, 1 << 40)
    m.write_bytes(bytes(raw))
    msg = _refused("estimate", "--arch", "sm_90", "--model", str(m))
    assert key in msg

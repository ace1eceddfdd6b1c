"""Real runs: synthesize GGUFs and load them with llama.cpp's CPU llama-bench / llama-quantize.

Binaries come from the session's real CPU build (tests/conftest.py ``cpu_build``); the vocab GGUFs
from the pinned llama.cpp tree (``tree_a``).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from click.testing import CliRunner

from tuner import _run
from tuner.cli import cli
from tuner.targets.host import host_has_amx
from tuner.targets.models import find_vocab, load_gguf_tensors, load_model_shape, parse_gguf, plan_tensors
from tuner.targets.roofline import bytes_per_token

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="session")
def _src(tree_a) -> Path:
    return tree_a.root


def _vocab_in(root: Path, name: str) -> Path:
    path = find_vocab(root, name)
    assert path is not None, f"the pinned tree {root} lacks models/ggml-vocab-{name}.gguf"
    return path


def _synth(args: list[str]) -> dict:
    res = CliRunner().invoke(cli, ["model", "synth", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output[res.output.index("{") :])


@pytest.fixture(scope="session")
def tiny_f16(tuner_home: Path, _src: Path) -> Path:
    out = tuner_home / "models" / "tiny-f16-seed0.gguf"
    if not out.is_file():
        _synth(["--like", "tiny", "--vocab", str(_vocab_in(_src, "llama-bpe")), "-o", str(out)])
    return out


def _bench_rows(model: Path, tmp_path: Path, bench: Path, *, quantized: bool = False) -> list[dict]:
    extra = []
    if quantized and host_has_amx():
        # A native build on an AMX host (Sapphire Rapids and newer) puts Q4_K/Q6_K weights in the AMX
        # buffer, and upstream's ggml_backend_amx_mul_mat segfaults on them (llama.cpp issue 20824;
        # reproduced here on the tiny shape). --repack 0 keeps the weights in plain CPU buffers.
        extra = ["--repack", "0"]
    res = _run.run(
        [bench, "-m", model, "-p", "16", "-n", "4", "-r", "1", "-t", "2", *extra, "-o", "jsonl"],
        log_file=tmp_path / "bench.log",
        timeout=300,
        what="llama-bench",
    )
    assert res.returncode == 0
    return [json.loads(line) for line in (tmp_path / "bench.log").read_text().splitlines() if line.startswith("{")]


def test_tiny_loads_in_llama_bench(tiny_f16: Path, tmp_path: Path, cpu_build) -> None:
    shape = load_model_shape("tiny")
    kv, tensors = parse_gguf(tiny_f16, tensors=True)
    assert [t.name for t in tensors] == [t.name for t in plan_tensors(shape)] and len(tensors) == 20
    assert len(kv["tokenizer.ggml.tokens"][2]) == 128256 and kv["tokenizer.ggml.pre"][2] == "llama-bpe"
    rows = _bench_rows(tiny_f16, tmp_path, cpu_build.exe("llama-bench"))
    assert [(row["n_prompt"], row["n_gen"]) for row in rows] == [(16, 0), (0, 4)]  # one row per test
    params = sum(t.n_elements for t in plan_tensors(shape))
    for row in rows:
        assert row["model_n_params"] == params and row["model_type"].startswith("llama")
        assert row["avg_ts"] > 0 and row["type_k"] == "f16"


def test_quantize_path_matches_q4_k_m_plan(tiny_f16: Path, tmp_path: Path, cpu_build, _src: Path) -> None:
    quantize = cpu_build.exe("llama-quantize")
    out = tmp_path / "tiny-q4_k_m.gguf"
    summary = _synth(
        [
            "--like",
            "tiny",
            "--vocab",
            str(_vocab_in(_src, "llama-bpe")),
            "--quant",
            "Q4_K_M",
            "--quantize-with",
            str(quantize),
            "-o",
            str(out),
        ]
    )
    assert summary["type"] == "Q4_K_M" and not out.with_name(out.name + ".f16.gguf").exists()
    real = {t.name: t.ggml_type for t in load_gguf_tensors(out)}
    planned = {t.name: t.ggml_type for t in plan_tensors(load_model_shape("tiny"), "q4_k_m")}
    assert real == planned  # our llama-quantize type rules agree with llama-quantize itself
    shape_est = bytes_per_token(load_model_shape("tiny"), 512, weight_type="q4_k_m")
    assert bytes_per_token(out, 512) == {**shape_est, "weights_source": f"GGUF tensor sizes of {out}"}
    rows = _bench_rows(out, tmp_path, cpu_build.exe("llama-bench"), quantized=True)
    assert len(rows) == 2 and "Q4_K" in rows[0]["model_type"]


def test_qwen_shape_vocab_is_consistent(_src: Path) -> None:
    # The qwen2 vocab file must hold exactly the 151936 tokens the shape's token_embd has.
    vocab = _vocab_in(_src, "qwen2")
    kv, _ = parse_gguf(vocab)
    assert len(kv["tokenizer.ggml.tokens"][2]) == load_model_shape("qwen2.5-0.5b").vocab_size
    assert kv["tokenizer.ggml.pre"][2] == "qwen2"


@pytest.mark.slow
def test_llama_3_2_1b_full_size(tmp_path: Path, _src: Path) -> None:
    out = tmp_path / "llama-3.2-1b-f16.gguf"
    summary = _synth(["--like", "llama-3.2-1b", "--vocab", str(_vocab_in(_src, "llama-bpe")), "-o", str(out)])
    r = gguf.GGUFReader(out)
    assert len(r.tensors) == summary["tensors"] == 147
    assert sum(int(t.n_elements) for t in r.tensors) == summary["params"] == 1_235_814_432
    names = {t.name for t in r.tensors}
    assert "output.weight" not in names and "rope_freqs.weight" in names
    assert r.fields["llama.block_count"].contents() == 16


@pytest.mark.parametrize("name", ["qwen2.5-7b", "gemma-3-12b-shape"])
def test_the_end_to_end_shapes_load_in_llama_bench(name: str, tmp_path: Path, cpu_build, _src: Path) -> None:
    """The GQA-7 Qwen and the head-256 shapes, shrunk to 2 small layers with the same architecture, head
    size and GQA ratio (and, for the head-256 one, query heads x head size unequal to d_model, as in Gemma 3):
    llama.cpp loads them and runs FlashAttention on them."""
    import dataclasses

    from tuner.targets.models import synth_model

    full = load_model_shape(name)
    heads, kv_heads = full.n_heads // 4, max(1, full.n_kv_heads // 4)
    # d_model stays heads x head size where the full model has it so (qwen2 needs it), else not (Gemma 3)
    d_model = heads * full.head_dim if full.d_model == full.n_heads * full.head_dim else full.d_model // 8
    small = dataclasses.replace(
        full, n_layers=2, d_model=d_model, d_ff=full.d_ff // 8, n_heads=heads, n_kv_heads=kv_heads
    )
    assert small.n_heads // small.n_kv_heads == full.n_heads // full.n_kv_heads and small.head_dim == full.head_dim
    out = tmp_path / f"{name}-small.gguf"
    synth_model(small, out, vocab_path=_vocab_in(_src, small.vocab))
    rows = _bench_rows(out, tmp_path, cpu_build.exe("llama-bench"))
    assert [(row["n_prompt"], row["n_gen"]) for row in rows] == [(16, 0), (0, 4)]
    for row in rows:
        assert row["model_n_params"] == sum(t.n_elements for t in plan_tensors(small)) and row["avg_ts"] > 0

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from tuner import _run
from tuner.cli import cli
from tuner.errors import TunerError, UsageError
from tuner.targets.models import (
    find_vocab,
    load_gguf_shape,
    load_gguf_tensors,
    load_model_shape,
    load_models,
    plan_tensors,
    run_quantize,
    synth_model,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "models"
VOCAB = DATA / "vocab-micro.gguf"


@pytest.fixture()
def micro() -> dict:
    return load_models(DATA / "micro_models.toml")


def _fail_on_call(*a: object, **k: object) -> None:
    raise AssertionError("unit tests must not start processes")


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_run, "run", _fail_on_call)


def test_known_shapes_match_published_counts() -> None:
    # llama.cpp src/llama-model.cpp tensor list: 147 tensors / 1,235,814,432 params for Llama-3.2-1B (rope_freqs included).
    spec = plan_tensors(load_model_shape("llama-3.2-1b"))
    assert len(spec) == 147 and sum(t.n_elements for t in spec) == 1_235_814_432
    assert "output.weight" not in {t.name for t in spec}
    # HF parameter counts (+64 rope factors for 8B, which HF does not count).
    assert sum(t.n_elements for t in plan_tensors(load_model_shape("llama-3.1-8b"))) == 8_030_261_248 + 64
    qwen = plan_tensors(load_model_shape("qwen2.5-0.5b"))
    assert sum(t.n_elements for t in qwen) == 494_032_768
    assert {"blk.0.attn_q.bias", "blk.0.attn_k.bias"} <= {t.name for t in qwen}


def test_shape_facts() -> None:
    s = load_model_shape("LLAMA-3.2-1B")
    assert (s.n_layers, s.d_model, s.d_ff, s.n_heads, s.n_kv_heads, s.head_dim, s.vocab_size) == (
        16,
        2048,
        8192,
        32,
        8,
        64,
        128256,
    )
    assert s.tied_output and s.gqa == 4 and s.rope_freq_base == 500000.0
    t = load_model_shape("tiny")
    assert t.head_dim == 64 and t.gqa == 4 and t.d_model == t.n_heads * t.head_dim
    q = load_model_shape("qwen2.5-0.5b")
    assert q.arch == "qwen2" and q.qkv_bias and q.vocab == "qwen2" and q.rms_eps == 1e-6


def test_q4_k_m_plan_matches_llama_quantize_size() -> None:
    # 1B Q4_K_M written by llama-quantize is 762.81 MiB (research/device.md, seed 003 tables).
    total = sum(t.n_bytes for t in plan_tensors(load_model_shape("llama-3.2-1b"), "q4_k_m"))
    assert total == 799_862_912 and round(total / 2**20, 2) == 762.81
    types = {t.name: t.ggml_type for t in plan_tensors(load_model_shape("qwen2.5-0.5b"), "q4_k_m")}
    assert types["token_embd.weight"] == "Q8_0"  # 896 % 256 != 0 -> Q6_K falls back to Q8_0
    assert types["blk.5.attn_q.weight"] == "Q5_0"


def test_unknown_model_and_type() -> None:
    with pytest.raises(UsageError, match="Did you mean.*llama-3.2-1b"):
        load_model_shape("lama-3.2-1b")
    with pytest.raises(UsageError, match="weight type"):
        plan_tensors(load_model_shape("tiny"), "q3")


def test_bad_model_file_names_key() -> None:
    with pytest.raises(TunerError, match=r"model 'broken', key 'd_ff': missing"):
        load_models(DATA / "bad_models.toml")


def test_synth_f16_structure(micro: dict, tmp_path: Path) -> None:
    shape = micro["micro"]
    res = synth_model(shape, tmp_path / "m.gguf", vocab_path=VOCAB, seed=1)
    r = gguf.GGUFReader(res.path)
    names = [t.name for t in r.tensors]
    assert res.n_tensors == len(names) == 1 + 1 + 2 * 9 + 1
    assert "output.weight" not in names and "rope_freqs.weight" in names
    assert r.fields["general.architecture"].contents() == "llama"
    assert r.fields["llama.block_count"].contents() == 2
    assert r.fields["llama.attention.head_count_kv"].contents() == 1
    assert r.fields["general.file_type"].contents() == 1
    assert r.fields["tokenizer.ggml.tokens"].contents()[:2] == ["t0", "t1"]
    assert r.fields["tokenizer.ggml.merges"].contents() == ["t 1", "t 2"]
    by = {t.name: t for t in r.tensors}
    assert list(by["token_embd.weight"].shape) == [64, 64]
    assert list(by["blk.0.attn_k.weight"].shape) == [64, 32]
    assert list(by["blk.1.ffn_down.weight"].shape) == [128, 64]
    assert np.all(by["blk.0.attn_norm.weight"].data == 1.0)
    w = np.asarray(by["blk.0.ffn_up.weight"].data, dtype=np.float32)
    assert w.dtype == np.float32 and 0.015 < w.std() < 0.025 and abs(w.mean()) < 0.005
    rope = np.asarray(by["rope_freqs.weight"].data)
    assert rope[0] == 1.0 and rope[-1] == pytest.approx(32.0)  # llama3 scaling: high freq 1, low freq = factor
    assert sum(t.n_elements for t in plan_tensors(shape)) == res.n_params


def test_synth_deterministic(micro: dict, tmp_path: Path) -> None:
    a = synth_model(micro["micro"], tmp_path / "a.gguf", vocab_path=VOCAB, seed=7).path.read_bytes()
    b = synth_model(micro["micro"], tmp_path / "b.gguf", vocab_path=VOCAB, seed=7).path.read_bytes()
    c = synth_model(micro["micro"], tmp_path / "c.gguf", vocab_path=VOCAB, seed=8).path.read_bytes()
    assert a == b and a != c and len(a) == len(c)


def test_synth_q8_0_qwen(micro: dict, tmp_path: Path) -> None:
    res = synth_model(micro["micro-qwen"], tmp_path / "q.gguf", vocab_path=VOCAB, weight_type="q8_0")
    tensors = {t.name: t for t in load_gguf_tensors(res.path)}
    assert tensors["blk.0.attn_q.weight"].ggml_type == "Q8_0"
    assert tensors["blk.0.attn_q.bias"].ggml_type == "F32" and tensors["blk.0.attn_v.bias"].ne == (32,)
    assert tensors["output.weight"].ne == (64, 64)
    assert tensors["blk.0.ffn_down.weight"].n_bytes == 96 * 64 // 32 * 34
    shape = load_gguf_shape(res.path)
    assert (shape.arch, shape.n_layers, shape.n_kv_heads, shape.head_dim, shape.tied_output, shape.qkv_bias) == (
        "qwen2",
        1,
        1,
        32,
        False,
        True,
    )
    assert gguf.GGUFReader(res.path).fields["general.file_type"].contents() == 7


def test_synth_rejects_bad_input(micro: dict, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="f16, q8_0, q4_k_m, q5_k_m, iq4_xs weights, not 'q4_0'"):
        synth_model(micro["micro"], tmp_path / "x.gguf", vocab_path=VOCAB, weight_type="q4_0")
    with pytest.raises(UsageError, match="needs vocab_size 128256"):
        synth_model(load_model_shape("tiny"), tmp_path / "x.gguf", vocab_path=VOCAB)
    with pytest.raises(UsageError, match="Seed"):
        synth_model(micro["micro"], tmp_path / "x.gguf", vocab_path=VOCAB, seed=-1)
    not_gguf = tmp_path / "v.gguf"
    not_gguf.write_text("hello")
    with pytest.raises(UsageError, match="Cannot read the vocab"):
        synth_model(micro["micro"], tmp_path / "x.gguf", vocab_path=not_gguf)
    assert not (tmp_path / "x.gguf").exists()


def test_find_vocab(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "ggml-vocab-qwen2.gguf").write_bytes(b"GGUF")
    assert find_vocab(tmp_path, "qwen2") == tmp_path / "models" / "ggml-vocab-qwen2.gguf"
    assert find_vocab(tmp_path, "llama-bpe") is None


def test_run_quantize_builds_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    exe = tmp_path / "llama-quantize"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    seen = {}
    monkeypatch.setattr(_run, "run", lambda cmd, **kw: seen.setdefault("cmd", [str(c) for c in cmd]))
    run_quantize(tmp_path / "a.gguf", tmp_path / "b.gguf", "q4_k_m", quantize_bin=exe)
    assert seen["cmd"] == [str(exe), str(tmp_path / "a.gguf"), str(tmp_path / "b.gguf"), "Q4_K_M"]
    with pytest.raises(UsageError, match="Unknown quant type"):
        run_quantize(tmp_path / "a.gguf", tmp_path / "b.gguf", "Q4_K_X", quantize_bin=exe)
    with pytest.raises(UsageError, match="not found"):
        run_quantize(tmp_path / "a.gguf", tmp_path / "b.gguf", "Q8_0", quantize_bin=tmp_path / "nope")


def test_cli_synth_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(
        cli, ["model", "synth", "--like", "lama-3.2-1b", "-o", str(tmp_path / "m.gguf"), "--vocab", str(VOCAB)]
    )
    assert isinstance(res.exception, UsageError) and "llama-3.2-1b" in str(res.exception)
    res = runner.invoke(
        cli, ["model", "synth", "--like", "tiny", "--type", "q4", "-o", str(tmp_path / "m.gguf"), "--vocab", str(VOCAB)]
    )
    assert isinstance(res.exception, UsageError) and "f16 or q8_0" in str(res.exception)
    res = runner.invoke(
        cli,
        [
            "model",
            "synth",
            "--like",
            "tiny",
            "--quant",
            "Q4_K_M",
            "-o",
            str(tmp_path / "m.gguf"),
            "--vocab",
            str(VOCAB),
        ],
    )
    assert isinstance(res.exception, UsageError) and "--quantize-with" in str(res.exception)
    res = runner.invoke(cli, ["model", "synth", "--help"])
    assert "speed, not its output quality" in " ".join(res.output.split())


def test_cli_synth_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tuner.targets.models as models_mod

    monkeypatch.setattr(models_mod, "load_model_shape", lambda name: load_models(DATA / "micro_models.toml")[name])
    out = tmp_path / "m.gguf"
    res = CliRunner().invoke(
        cli, ["model", "synth", "--like", "micro", "-o", str(out), "--vocab", str(VOCAB), "--json"]
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output[res.output.index("{") :])
    assert summary["tensors"] == 21 and summary["bytes"] == out.stat().st_size and summary["tied_output"]


def _k_shape(micro: dict):
    """micro with 256-wide rows, so Q4_K_M has Q4_K and Q6_K tensors next to its Q5_0/Q8_0 fallbacks."""
    import dataclasses

    return dataclasses.replace(micro["micro"], d_model=256)


def test_synth_q4_k_m_direct_writes_the_planned_blocks(micro: dict, tmp_path: Path) -> None:
    shape = _k_shape(micro)
    res = synth_model(shape, tmp_path / "d.gguf", vocab_path=VOCAB, weight_type="q4_k_m", seed=3)
    plan = plan_tensors(shape, "q4_k_m")
    got = [(t.name, t.ggml_type, t.ne, t.n_bytes) for t in load_gguf_tensors(res.path)]
    assert got == [(s.name, s.ggml_type, s.ne, s.n_bytes) for s in plan]
    assert {s.ggml_type for s in plan} == {"F32", "Q4_K", "Q6_K", "Q5_0", "Q8_0"}
    r = gguf.GGUFReader(res.path)
    assert r.fields["general.file_type"].contents() == int(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    for t in r.tensors:
        if t.tensor_type.name == "F32":
            continue
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        assert np.all(np.isfinite(w)) and 0.012 < float(w.std()) < 0.03, t.name
    again = synth_model(shape, tmp_path / "e.gguf", vocab_path=VOCAB, weight_type="q4_k_m", seed=3)
    other = synth_model(shape, tmp_path / "f.gguf", vocab_path=VOCAB, weight_type="q4_k_m", seed=4)
    assert res.path.read_bytes() == again.path.read_bytes() != other.path.read_bytes()
    assert res.n_bytes == other.n_bytes == res.path.stat().st_size


def test_synth_cached_direct_has_its_own_name(micro: dict, tmp_path: Path, monkeypatch, isolated_home: Path) -> None:
    import types

    import tuner.targets.models as models_mod
    from tuner.targets.models import synth_cached

    (tmp_path / "src" / "models").mkdir(parents=True)
    (tmp_path / "src" / "models" / "ggml-vocab-micro.gguf").write_bytes(VOCAB.read_bytes())
    src = types.SimpleNamespace(root=tmp_path / "src", source_id="0123456789abcdef")
    monkeypatch.setattr(models_mod, "load_model_shape", lambda name: _k_shape(micro))
    path = synth_cached("micro", source=src, quant="q4_k_m", direct=True)  # no llama-quantize needed
    assert path == isolated_home / "models" / "micro-q4_k_m-direct-s0-01234567.gguf"
    assert [p.name for p in (isolated_home / "models").iterdir()] == [path.name]  # no f16 file
    assert synth_cached("micro", source=src, quant="Q4_K_M", direct=True) == path  # cached
    with pytest.raises(UsageError, match="writes Q4_K_M, Q5_K_M, IQ4_XS only"):
        synth_cached("micro", source=src, quant="Q8_0", direct=True)
    with pytest.raises(UsageError, match="pass direct=True"):
        synth_cached("micro", source=src, weight_type="q4_k_m")


def test_cli_synth_direct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, micro: dict) -> None:
    import tuner.targets.models as models_mod

    monkeypatch.setattr(models_mod, "load_model_shape", lambda name: _k_shape(micro))
    out = tmp_path / "m.gguf"
    base = ["model", "synth", "--like", "micro", "-o", str(out), "--vocab", str(VOCAB)]
    res = CliRunner().invoke(cli, [*base, "--quant", "Q4_K_M", "--direct", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output[res.output.index("{") :])
    assert summary["type"] == "Q4_K_M" and summary["bytes"] == out.stat().st_size
    assert {t.ggml_type for t in load_gguf_tensors(out)} >= {"Q4_K", "Q6_K"}
    for extra in (
        ["--direct"],
        ["--quant", "Q8_0", "--direct"],
        ["--quant", "Q4_K_M", "--direct", "--quantize-with", "q"],
    ):
        res = CliRunner().invoke(cli, [*base, *extra])
        assert isinstance(res.exception, UsageError) and "--direct writes Q4_K_M" in str(res.exception), extra

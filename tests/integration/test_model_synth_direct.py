"""Direct Q4_K_M synthesis (random blocks, no f16 file, no llama-quantize) against the real CPU build.

(a) the direct file has exactly the tensors, ggml types and sizes llama-quantize writes from the f16
synth of the same shape; (b) llama.cpp loads it, llama-bench runs pp/tg and llama-perplexity gives a
finite perplexity. Binaries: the session's cached CPU build (tests/conftest.py ``cpu_build``, with
llama-perplexity added on demand as test_equivalence_cpu.py does); vocab GGUFs from the pinned tree.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import gguf
import pytest
from click.testing import CliRunner

from tuner import _run
from tuner.builder.cmake import ensure_targets
from tuner.cli import cli
from tuner.targets.host import host_has_amx
from tuner.targets.models import (
    ModelShape,
    find_vocab,
    load_model_shape,
    plan_tensors,
    run_quantize,
    synth_cached,
    synth_model,
)

pytestmark = [pytest.mark.integration]


def _shapes() -> dict[str, ModelShape]:
    tiny = load_model_shape("tiny")
    # rows of 320 are no multiple of 256: llama-quantize's fallbacks (Q4_K -> Q5_0, Q6_K -> Q8_0, the tied
    # LM head Q8_0) appear next to Q4_K and Q6_K (ffn_down's 512-wide rows)
    odd = dataclasses.replace(tiny, name="tiny-320", d_model=320, n_heads=5, n_kv_heads=1)
    # 8 layers, GQA 2: IQ4_XS keeps the first eighth's ffn_down at Q5_K and attn_v at IQ4_XS (GQA < 4)
    deep = dataclasses.replace(tiny, name="tiny-8l", n_layers=8, n_heads=4, n_kv_heads=2)
    return {"tiny": tiny, "tiny-320": odd, "tiny-8l": deep}


# the types llama-quantize gives each shape: tiny has GQA 4 and 2 layers ("more bits" on layer 1); tiny-320's
# rows of 320 fall back (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL)
WANT_TYPES = {
    ("tiny", "Q4_K_M"): {"F32", "Q4_K", "Q6_K"},
    ("tiny-320", "Q4_K_M"): {"F32", "Q4_K", "Q6_K", "Q5_0", "Q8_0"},
    ("tiny", "Q5_K_M"): {"F32", "Q5_K", "Q6_K"},
    ("tiny-320", "Q5_K_M"): {"F32", "Q5_K", "Q6_K", "Q5_1", "Q8_0"},
    ("tiny", "IQ4_XS"): {"F32", "IQ4_XS", "Q5_K", "Q6_K"},
    ("tiny-320", "IQ4_XS"): {"F32", "IQ4_XS", "IQ4_NL", "Q5_1", "Q8_0"},
    ("tiny-8l", "IQ4_XS"): {"F32", "IQ4_XS", "Q5_K", "Q6_K"},
}


def _tensors(path: Path) -> list[tuple[str, str, tuple[int, ...], int]]:
    r = gguf.GGUFReader(path)
    return [(t.name, t.tensor_type.name, tuple(int(n) for n in t.shape), int(t.n_bytes)) for t in r.tensors]


@pytest.mark.parametrize(("name", "quant"), sorted(WANT_TYPES))
def test_direct_file_has_llama_quantizes_types_and_sizes(
    name: str, quant: str, tmp_path: Path, cpu_build, tree_a
) -> None:
    shape = _shapes()[name]
    vocab = find_vocab(tree_a.root, shape.vocab)
    assert vocab is not None
    f16, quantized, direct = tmp_path / "f16.gguf", tmp_path / "quantized.gguf", tmp_path / "direct.gguf"
    synth_model(shape, f16, vocab_path=vocab)
    run_quantize(f16, quantized, quant, quantize_bin=cpu_build.exe("llama-quantize"), log_file=tmp_path / "q.log")
    res = synth_model(shape, direct, vocab_path=vocab, weight_type=quant.lower())
    # the same tensors, types, shapes and byte sizes; llama-quantize writes them in its loader's order (by name
    # within a layer), the direct file in plan_tensors' order, as the f16 synth does
    want = sorted(_tensors(quantized))
    assert sorted(_tensors(direct)) == want
    assert {t[1] for t in want} == WANT_TYPES[(name, quant)]
    assert sorted((s.name, s.ggml_type) for s in plan_tensors(shape, quant.lower())) == [(t[0], t[1]) for t in want]
    assert res.n_bytes == direct.stat().st_size
    r = gguf.GGUFReader(direct)
    assert int(r.fields["general.file_type"].contents()) == int(gguf.LlamaFileType[f"MOSTLY_{quant}"])


# llama-bench's model_type for each type (llama_model_ftype_name in src/llama-model-loader.cpp)
FTYPE_NAMES = {"Q4_K_M": "Q4_K - Medium", "Q5_K_M": "Q5_K - Medium", "IQ4_XS": "IQ4_XS - 4.25 bpw"}


@pytest.fixture(scope="module", params=sorted(FTYPE_NAMES))
def direct_tiny(request: pytest.FixtureRequest, tree_a) -> tuple[str, Path]:
    """The cached direct tiny model of each type, as ``tuner sweep confirm`` makes its models (and its passes')."""
    quant = str(request.param)
    path = synth_cached("tiny", source=tree_a, quant=quant, direct=True)
    assert path.name == f"tiny-{quant.lower()}-direct-s0-{tree_a.source_id[:8]}.gguf"
    return quant, path


def test_direct_model_runs_in_llama_bench_and_perplexity(
    direct_tiny: tuple[str, Path], tmp_path: Path, cpu_build
) -> None:
    quant, direct = direct_tiny
    # A native build on an AMX host puts Q4_K/Q6_K weights in the AMX buffer, whose mul_mat segfaults on them
    # (llama.cpp issue 20824; see test_model_synth.py): keep them in plain CPU buffers there.
    amx = host_has_amx()
    res = _run.run(
        [cpu_build.exe("llama-bench"), "-m", direct, "-p", "16", "-n", "4", "-r", "1", "-t", "2"]
        + (["--repack", "0"] if amx else [])
        + ["-o", "jsonl"],
        log_file=tmp_path / "bench.log",
        timeout=300,
        what="llama-bench",
    )
    assert res.returncode == 0
    rows = [json.loads(line) for line in (tmp_path / "bench.log").read_text().splitlines() if line.startswith("{")]
    assert [(row["n_prompt"], row["n_gen"]) for row in rows] == [(16, 0), (0, 4)]
    for row in rows:
        assert (
            row["model_type"] == f"llama ?B {FTYPE_NAMES[quant]}" and math.isfinite(row["avg_ts"]) and row["avg_ts"] > 0
        )
        assert row["model_size"] == sum(s.n_bytes for s in plan_tensors(load_model_shape("tiny"), quant.lower()))

    ppl = ensure_targets(cpu_build, ["llama-perplexity"]).bin_dir / "llama-perplexity"
    text = tmp_path / "text.txt"
    text.write_text(" ".join(["The quick brown fox jumps over the lazy dog."] * 60))
    res = _run.run(
        [ppl, "-m", direct, "-f", text, "-c", "64", "-b", "64", "-t", "2"] + (["--no-repack"] if amx else []),
        log_file=tmp_path / "ppl.log",
        timeout=300,
        what="llama-perplexity",
    )
    assert res.returncode == 0
    m = re.search(r"Final estimate: PPL = ([^ ]+)", (tmp_path / "ppl.log").read_text())
    assert m is not None
    # random weights: about uniform over the 128256 tokens, and above all finite (no inf/nan logits)
    assert math.isfinite(float(m.group(1))) and 1e3 < float(m.group(1)) < 1e7


def test_cli_direct_writes_q4_k_m_without_llama_quantize(tmp_path: Path, tree_a) -> None:
    vocab = find_vocab(tree_a.root, "llama-bpe")
    out = tmp_path / "tiny-direct.gguf"
    args = ["model", "synth", "--like", "tiny", "--vocab", str(vocab), "--quant", "Q4_K_M", "--direct"]
    res = CliRunner().invoke(cli, [*args, "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output[res.output.index("{") :])
    assert summary["type"] == "Q4_K_M" and summary["bytes"] == out.stat().st_size
    assert not out.with_name(out.name + ".f16.gguf").exists()

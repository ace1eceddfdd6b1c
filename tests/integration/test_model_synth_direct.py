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
from tuner.builder.extra import ensure_targets
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
    return {"tiny": tiny, "tiny-320": odd}


def _tensors(path: Path) -> list[tuple[str, str, tuple[int, ...], int]]:
    r = gguf.GGUFReader(path)
    return [(t.name, t.tensor_type.name, tuple(int(n) for n in t.shape), int(t.n_bytes)) for t in r.tensors]


@pytest.mark.parametrize("name", ["tiny", "tiny-320"])
def test_direct_file_has_llama_quantizes_types_and_sizes(name: str, tmp_path: Path, cpu_build, tree_a) -> None:
    shape = _shapes()[name]
    vocab = find_vocab(tree_a.root, shape.vocab)
    assert vocab is not None
    f16, quantized, direct = tmp_path / "f16.gguf", tmp_path / "quantized.gguf", tmp_path / "direct.gguf"
    synth_model(shape, f16, vocab_path=vocab)
    run_quantize(f16, quantized, "Q4_K_M", quantize_bin=cpu_build.exe("llama-quantize"), log_file=tmp_path / "q.log")
    res = synth_model(shape, direct, vocab_path=vocab, weight_type="q4_k_m")
    # the same tensors, types, shapes and byte sizes; llama-quantize writes them in its loader's order (by name
    # within a layer), the direct file in plan_tensors' order, as the f16 synth does
    want = sorted(_tensors(quantized))
    assert sorted(_tensors(direct)) == want
    types = {t[1] for t in want}
    assert types == ({"F32", "Q4_K", "Q6_K"} if name == "tiny" else {"F32", "Q4_K", "Q6_K", "Q5_0", "Q8_0"})
    assert sorted((s.name, s.ggml_type) for s in plan_tensors(shape, "q4_k_m")) == [(t[0], t[1]) for t in want]
    assert res.n_bytes == direct.stat().st_size
    r = gguf.GGUFReader(direct)
    assert int(r.fields["general.file_type"].contents()) == int(gguf.LlamaFileType.MOSTLY_Q4_K_M)


@pytest.fixture(scope="module")
def direct_tiny(tree_a) -> Path:
    """The cached direct Q4_K_M tiny model, as ``tuner sweep confirm`` makes its models."""
    path = synth_cached("tiny", source=tree_a, quant="Q4_K_M", direct=True)
    assert path.name == f"tiny-q4_k_m-direct-s0-{tree_a.source_id[:8]}.gguf"
    return path


def test_direct_model_runs_in_llama_bench_and_perplexity(direct_tiny: Path, tmp_path: Path, cpu_build) -> None:
    # A native build on an AMX host puts Q4_K/Q6_K weights in the AMX buffer, whose mul_mat segfaults on them
    # (llama.cpp issue 20824; see test_model_synth.py): keep them in plain CPU buffers there.
    amx = host_has_amx()
    res = _run.run(
        [cpu_build.exe("llama-bench"), "-m", direct_tiny, "-p", "16", "-n", "4", "-r", "1", "-t", "2"]
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
        assert row["model_type"] == "llama ?B Q4_K - Medium" and math.isfinite(row["avg_ts"]) and row["avg_ts"] > 0
        assert row["model_size"] == sum(s.n_bytes for s in plan_tensors(load_model_shape("tiny"), "q4_k_m"))

    ppl = ensure_targets(cpu_build, ["llama-perplexity"]).bin_dir / "llama-perplexity"
    text = tmp_path / "text.txt"
    text.write_text(" ".join(["The quick brown fox jumps over the lazy dog."] * 60))
    res = _run.run(
        [ppl, "-m", direct_tiny, "-f", text, "-c", "64", "-b", "64", "-t", "2"] + (["--no-repack"] if amx else []),
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

"""``tuner model synth``: random-weight GGUF models with a real model's exact shapes."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tuner import log
from tuner.cli._params import PATH, SuggestingGroup


@click.group(cls=SuggestingGroup)
def model() -> None:
    """Make test models."""


@model.command("synth")
@click.option(
    "--like",
    required=True,
    help="Model shape to copy (tuner/data/models.toml): llama-3.2-1b, llama-3.1-8b, qwen2.5-0.5b, qwen2.5-3b, qwen2.5-7b, gemma-3-4b-shape, gemma-3-12b-shape or tiny.",
)
@click.option(
    "--type", "weight_type", default="f16", show_default=True, help="Weight type written directly: f16 or q8_0."
)
@click.option("--quant", help="Then quantize with llama-quantize to this type (e.g. Q4_K_M); needs --quantize-with.")
@click.option("--quantize-with", type=PATH, help="Path to a llama-quantize binary (for --quant).")
@click.option(
    "--direct",
    is_flag=True,
    help="With --quant Q4_K_M, Q5_K_M or IQ4_XS: write random blocks of each tensor's type directly (no f16 file, "
    "no llama-quantize; much faster). Same tensors, types and sizes as llama-quantize's file, other values.",
)
@click.option(
    "--source",
    "spec",
    help="llama.cpp source SPEC whose models/ vocab GGUF is copied (default: tuner's default source).",
)
@click.option("--vocab", "vocab_path", type=PATH, help="Use this vocab-only GGUF instead of fetching --source.")
@click.option("-o", "--output", "out", required=True, type=PATH, help="Output .gguf file.")
@click.option("--seed", default=0, show_default=True, type=int, help="Random seed (same seed, same file).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def synth(
    like: str,
    weight_type: str,
    quant: str | None,
    quantize_with: Path | None,
    direct: bool,
    spec: str | None,
    vocab_path: Path | None,
    out: Path,
    seed: int,
    as_json: bool,
) -> None:
    """Write a random-weight GGUF with the exact tensors and metadata of a known model.

    Random weights keep a dense model's speed, not its output quality: every tensor has the real
    name, shape and type, so llama.cpp runs the same kernels over the same bytes, but the text it
    generates is noise. Use it for benchmarks, never for quality checks.

    --quant Q4_K_M (or Q5_K_M, IQ4_XS) --direct skips the f16 file and llama-quantize: each tensor is written as random
    blocks of the type llama-quantize would give it, scaled to the f16 path's spread (see docs/h100.md).
    """
    from tuner.errors import TunerError, UsageError
    from tuner.targets.models import DIRECT_QUANTS, find_vocab, load_model_shape, run_quantize, synth_model

    shape = load_model_shape(like)
    if weight_type not in ("f16", "q8_0"):
        msg = f"--type must be f16 or q8_0, got {weight_type!r}. For K-quants use --quant Q4_K_M --quantize-with PATH, or --quant Q4_K_M --direct."
        raise UsageError(msg)
    direct_type = (quant or "").upper()
    if direct:
        if direct_type not in DIRECT_QUANTS or quantize_with is not None or weight_type != "f16":
            raise UsageError(
                f"--direct writes {', '.join(DIRECT_QUANTS)} blocks itself: pass --quant with one of them, without "
                "--quantize-with or --type."
            )
        weight_type, quant = direct_type.lower(), None
    if quant is not None and quantize_with is None:
        raise UsageError("--quant needs --quantize-with PATH (a llama-quantize binary, e.g. from `tuner build`).")
    if quant is not None and weight_type != "f16":
        raise UsageError("--quant starts from f16 weights; drop --type.")
    if vocab_path is None:
        from tuner.source import DEFAULT_SPEC, fetch_source

        root = fetch_source(spec or DEFAULT_SPEC).root
        vocab_path = find_vocab(root, shape.vocab)
        if vocab_path is None:
            msg = f"{root}/models has no ggml-vocab-{shape.vocab}.gguf. Use a llama.cpp source that ships it, or pass --vocab."
            raise TunerError(msg)
    elif not vocab_path.is_file():
        msg = f"--vocab {vocab_path} does not exist. Pass a vocab-only GGUF from llama.cpp's models/ folder."
        raise UsageError(msg)

    def on_tensor(i: int, n: int, name: str) -> None:
        if i % 16 == 0:
            log.progress(f"    tensor {i + 1}/{n} {name}")

    target = out.with_name(out.name + ".f16.gguf") if quant else out
    with log.step(f"Writing random-weight {shape.name} ({weight_type}) to {target}"):
        res = synth_model(shape, target, vocab_path=vocab_path, weight_type=weight_type, seed=seed, on_tensor=on_tensor)
    size = res.n_bytes
    if quant:
        assert quantize_with is not None
        with log.step(f"Quantizing to {quant.upper()} with {quantize_with}"):
            try:
                run_quantize(
                    target, out, quant, quantize_bin=quantize_with, log_file=out.with_name(out.name + ".quantize.log")
                )
            finally:
                target.unlink(missing_ok=True)
        size = out.stat().st_size
    summary = {
        "path": str(out),
        "like": shape.name,
        "type": quant.upper() if quant else (direct_type if direct else weight_type),
        "tensors": res.n_tensors,
        "params": res.n_params,
        "bytes": size,
        "tied_output": shape.tied_output,
        "seed": seed,
        "note": "random weights: dense-model speed, not output quality",
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(
            f"{out}: {shape.name}, {summary['type']}, {res.n_tensors} tensors, {res.n_params:,} params, "
            f"{size / 2**20:.2f} MiB (random weights: dense-model speed, not output quality)"
        )

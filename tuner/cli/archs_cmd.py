"""``tuner archs`` (list / show the arch database) and ``tuner estimate`` (roofline bounds)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from click.core import ParameterSource

from tuner import log
from tuner.cli._params import PATH, AliasOption, SuggestingGroup, deprecated_option, depths_option
from tuner.targets.defaults import DEFAULT_QUANT


def _fmt_bytes(n: int) -> str:
    return f"{n // 1024} KiB" if n and n % 1024 == 0 else str(n)


@click.group(cls=SuggestingGroup, invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def archs(ctx: click.Context, as_json: bool) -> None:
    """List the GPU archs tuner knows (NVIDIA sm_XY, AMD gfxNNNN, cpu).

    Every figure in the database carries its source; `tuner archs show ARCH` prints them.
    """
    if ctx.invoked_subcommand is not None:
        return
    from tuner.targets.archs import load_archs

    all_archs = load_archs()
    if as_json:
        click.echo(json.dumps([a.to_dict() for a in all_archs.values()], indent=2))
        return
    rows = [
        (
            a.name,
            a.vendor,
            a.family,
            a.wave_size,
            _fmt_bytes(a.smem_static),
            _fmt_bytes(a.smem_optin),
            "; ".join(p.name for p in a.products),
        )
        for a in all_archs.values()
    ]
    click.echo(log.table(["arch", "vendor", "family", "wave", "LDS/smem static", "smem opt-in", "products"], rows))


@archs.command("show")
@click.argument("arch")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show(arch: str, as_json: bool) -> None:
    """Show one arch: limits, math units, llama.cpp kernel paths per era, products, sources.

    ARCH is e.g. sm_89, sm89, 8.9, gfx1151, strix-halo or cpu.
    """
    from tuner.targets.archs import MATH_KEYS, PRODUCT_FIGURES, load_arch

    a = load_arch(arch)
    if as_json:
        click.echo(json.dumps(a.to_dict(), indent=2))
        return
    ident = f"cc {a.cc}" if a.cc is not None else (a.gfx or a.vendor)
    click.echo(f"{a.name} ({ident}): {a.vendor} {a.family}")
    click.echo(
        f"  wave size {a.wave_size}; shared memory/LDS per block: static {a.smem_static} B, opt-in {a.smem_optin} B"
    )
    click.echo(f"  source: {a.source}")
    units = [k for k in MATH_KEYS if a.math.get(k)]
    click.echo(f"  math units: {', '.join(units) or 'none of ' + ', '.join(MATH_KEYS)}")
    click.echo(f"  source: {a.math.get('source', '')}")
    for era, paths in a.kernel_paths.items():
        click.echo(f"  era {era}:")
        for k, v in paths.items():
            if k != "source":
                click.echo(f"    {k}: {v}")
        click.echo(f"    source: {paths.get('source', '')}")
    for p in a.products:
        click.echo(f"  product: {p.name}")
        for key in PRODUCT_FIGURES:
            val = getattr(p, key)
            if val is not None:
                click.echo(f"    {key} = {val:g}   [{p.sources.get(key, '')}]")
        for key, src in p.sources.items():
            if key not in PRODUCT_FIGURES:
                click.echo(f"    {key}: {src}")


def _assumed_product(arch_name: str) -> str | None:
    """The product an estimate without --product uses: this machine's GPU where it is one of the arch's
    (an H200 is sm_90, whose first product is the H100), else the first listed; one line on stderr says
    which and why where the arch has more than one."""
    from tuner.targets.archs import load_arch, local_product

    arch = load_arch(arch_name)
    if len(arch.products) < 2:
        return None
    others = ", ".join(p.name for p in arch.products)
    local = local_product(arch.name)
    if local is not None:
        log.info(
            f"estimate: product {local[0]} (this machine's GPU, {local[1]}); --product picks another of: {others}."
        )
        return local[0]
    log.info(
        f"estimate: product {arch.products[0].name} assumed (the first listed for {arch.name}; no local GPU is "
        f"one of its products); --product picks another of: {others}."
    )
    return None


@click.command()
@click.option("--arch", "arch_name", required=True, help="Arch name (tuner archs lists them).")
@click.option("--model", "model_path", type=PATH, help="A GGUF model: its real tensor sizes are used.")
@click.option(
    "--like",
    help="A known model shape instead of a file (tuner/data/models.toml: llama-3.2-1b, llama-3.1-8b, qwen2.5-0.5b, qwen2.5-3b, qwen2.5-7b, gemma-3-4b-shape, gemma-3-12b-shape, tiny).",
)
@click.option(
    "--depths",
    default="0,4096,16384,32768",
    show_default=True,
    callback=depths_option,
    help="Comma-separated KV depths, as `tuner search --depths`.",
)
@deprecated_option("--depth", "old_depths", "--depths", type=int, multiple=True)
@click.option(
    "--quant",
    "--type",
    "weight_type",
    cls=AliasOption,
    hidden_aliases=("--type",),
    type=click.Choice(["f16", "q8_0", "q4_k_m"], case_sensitive=False),
    help=f"Weight type for --like, as `tuner search --quant` spells it (Q4_K_M or q4_k_m). Default: {DEFAULT_QUANT}, "
    "the search's.",
)
@click.option("--kv-type", default="f16", show_default=True, help="KV-cache type (f16, q8_0, q4_0, ...).")
@click.option("--pp", default=512, show_default=True, type=int, help="Prompt tokens per pp test.")
@click.option("--tg", default=128, show_default=True, type=int, help="Generated tokens per tg test.")
@click.option("--bandwidth", type=float, help="Memory bandwidth in GB/s (overrides the product's; needed for cpu).")
@click.option(
    "--product",
    help="Which product of the arch, by part of its name (default: this machine's GPU where it is one, else the first listed).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON rows (the estimate's label included) instead of a table."
)
def estimate(
    arch_name: str,
    model_path: Path | None,
    like: str | None,
    depths: tuple[int, ...],
    old_depths: tuple[int, ...],
    weight_type: str | None,
    kv_type: str,
    pp: int,
    tg: int,
    bandwidth: float | None,
    product: str | None,
    as_json: bool,
) -> None:
    """Roofline upper bounds for llama-bench pp/tg on an arch: a MODEL ESTIMATE, not a measurement.

    tg is bounded by memory bandwidth / bytes read per token (weights + KV cache at that depth);
    pp by the math peak (INT8 for quantized weights where llama.cpp has an int8 path, else FP16)
    / FLOPs per token. The method and its inputs: tuner/targets/roofline.py.
    """
    from tuner.errors import UsageError
    from tuner.targets.models import ModelShape, load_model_shape
    from tuner.targets.roofline import ESTIMATE_LABEL
    from tuner.targets.roofline import estimate as run_estimate

    one = "Pass exactly one of --model GGUF (a real file) or --like NAME (a known shape)."
    if model_path is not None and like is not None:
        raise UsageError(one)
    if model_path is not None and weight_type is not None:
        raise UsageError("--quant applies to --like only; with --model the GGUF's own tensor types are used.")
    if old_depths:  # they replace the default --depths, or join the ones given
        given = click.get_current_context().get_parameter_source("depths") is not ParameterSource.DEFAULT
        depths = tuple(sorted({*old_depths, *(depths if given else ())}))
    weight_type = (weight_type or DEFAULT_QUANT).lower()
    model: ModelShape | Path
    if like is not None:
        model = load_model_shape(like)
    elif model_path is not None:
        model = model_path
    else:
        raise UsageError(one)
    if product is None:
        product = _assumed_product(arch_name)
    rows = run_estimate(
        arch_name,
        model,
        depths,
        pp=pp,
        tg=tg,
        weight_type=weight_type,
        kv_type=kv_type,
        bandwidth=bandwidth,
        product=product,
    )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    first = rows[0] if rows else {}
    click.echo(f"{ESTIMATE_LABEL}: {first.get('arch')} / {first.get('product')}, model {like or model_path}")
    table = [
        (r["test"], r["depth"], "unknown" if r["bound_tps"] is None else f"{r['bound_tps']:.1f}", r["limit"])
        for r in rows
    ]
    click.echo(log.table(["test", "depth", "bound t/s (estimate)", "bounded by"], table))

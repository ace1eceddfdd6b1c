"""``tuner render``: show or write what one variant (plus knob values) turns into, without compiling."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click

from tuner import log
from tuner.cli._params import PATH
from tuner.errors import UsageError
from tuner.source.spec import DEFAULT_SPEC


@click.command("render")
@click.option("--arch", required=True, help="Target arch (sm_90, sm_89, gfx1151, cpu...).")
@click.option(
    "--source", "spec", default=DEFAULT_SPEC, show_default=True, help="llama.cpp source SPEC (see `tuner source`)."
)
@click.option("--variant", help="Build variant; default: the first of the arch's search space.")
@click.option(
    "--set", "sets", multiple=True, metavar="KNOB=VALUE", help="A knob value (repeatable); checked against the space."
)
@click.option(
    "--baked", is_flag=True, help="Compile the values into the patch (export form) instead of env + per-TU headers."
)
@click.option(
    "--local-arch",
    "local_archs",
    multiple=True,
    metavar="ARCH",
    help="This machine's GPU arch (decides 89-real vs 89-virtual).",
)
@click.option("-o", "--output", type=PATH, help="Directory to write into (default ./render-ARCH-VARIANT).")
@click.option("--dry-run", is_flag=True, help="Print everything to stdout and write nothing.")
def render(
    arch: str,
    spec: str,
    variant: str | None,
    sets: tuple[str, ...],
    baked: bool,
    local_archs: tuple[str, ...],
    output: Path | None,
    dry_run: bool,
) -> None:
    """Render CMake defines, the kernel patch and per-TU headers for one variant.

    Values given with --set are type/range-checked against search_spaces/ARCH.toml and
    constraint-checked; an illegal candidate is rejected (exit 2) before anything compiles.
    Writes cmake-args.txt, CMakeUserPresets.json, tuned.patch, tu/*.h, runtime.env and bench-args.txt.
    """
    from tuner.plan import render as render_mod
    from tuner.plan import space as space_mod
    from tuner.plan.variant import VARIANTS
    from tuner.source import fetch_source

    src = fetch_source(spec)  # the llama.cpp tree for SPEC, fetched or reused
    sp = None
    try:
        sp = space_mod.load_space(arch, src.era)
    except space_mod.SpaceNotFound:
        if sets:
            raise
    if variant is None:
        if sp is None:
            raise UsageError(f"No search space for {arch!r}; pass --variant ({', '.join(VARIANTS)}).")
        variant = sp.variants[0]
    compile_values: dict[str, int] = {}
    runtime = space_mod.RuntimeSettings(env={}, bench_args=())
    if sp is not None:  # without a space there are no --set values (refused above)
        compile_values, runtime_values = space_mod.parse_set_values(sp, sets)
        runtime = space_mod.render_runtime(sp, runtime_values)
    baked_runtime = {k: v for k, v in runtime.env.items() if k.startswith("GGML_TUNER_")} if baked else None
    rv = render_mod.render_variant(
        src,
        arch,
        variant,
        compile_values=compile_values,
        baked_runtime=baked_runtime,
        local_archs=list(local_archs) or None,
    )
    for w in rv.warnings:
        log.warning(w)
    env = {k: v for k, v in runtime.env.items() if not (baked and k.startswith("GGML_TUNER_"))}
    cmake_args = [f"-D{k}={v}" for k, v in rv.defines.items()]
    preset = render_mod.render_preset(rv)
    overrides = {tu: text for tu, text in rv.tu_headers.items() if text}
    if dry_run:
        click.echo(f"# {rv.short} (era {rv.era}, source {rv.source_id})")
        click.echo("# cmake args\n" + " ".join(shlex.quote(a) for a in cmake_args))
        click.echo("# CMakeUserPresets.json\n" + json.dumps(preset, indent=2))
        if rv.tu_headers:
            click.echo(
                f"# per-TU headers: {len(rv.tu_headers)} hooked TUs, {len(overrides)} with overrides "
                "(configure with -DGGML_TUNER_TU_DIR=<dir holding them>)"
            )
            for tu, text in sorted(overrides.items()):
                click.echo(f"## {render_mod.tu_header_name(tu)}  ({tu})\n{text}", nl=False)
        click.echo("# runtime env\n" + "".join(f"{k}={v}\n" for k, v in env.items()), nl=False)
        click.echo("# llama-bench args\n" + " ".join(runtime.bench_args))
        click.echo("# tuned.patch\n" + rv.patch, nl=False)
        return
    out = output or Path(f"render-{arch}-{variant}")
    from tuner.paths import subfolder, write_into

    # Each file renamed over its name: a link already in -o is replaced, never written through.
    out.mkdir(parents=True, exist_ok=True)
    tu_dir = subfolder(out, "tu") if rv.tu_headers else None  # refused before anything is written
    write_into(out, "cmake-args.txt", "\n".join(cmake_args) + "\n")
    write_into(out, "CMakeUserPresets.json", json.dumps(preset, indent=2) + "\n")
    write_into(out, "tuned.patch", rv.patch)
    write_into(out, "runtime.env", "".join(f"{k}={v}\n" for k, v in env.items()))
    write_into(out, "bench-args.txt", " ".join(runtime.bench_args) + "\n")
    if tu_dir is not None:
        for tu, text in rv.tu_headers.items():
            write_into(tu_dir, render_mod.tu_header_name(tu), text)
    log.info(
        f"Wrote {out}: {len(cmake_args)} CMake defines, patch of {len(rv.files)} files, "
        f"{len(overrides)} TU override(s), {len(env)} env var(s)."
    )

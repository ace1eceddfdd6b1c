"""``tuner build`` and ``tuner toolchain``: flags in, stage calls out."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from tuner import log
from tuner.cli._params import DIR, FILE, SuggestingGroup
from tuner.errors import TunerError, UsageError
from tuner.pairs import parse_pairs


def parse_sets(items: Sequence[str]) -> dict[str, int]:
    """``["KNOB=VALUE", ...]`` -> ``{"KNOB": VALUE}``; values are integers (compile-time knobs; ``0x10`` too)."""
    out: dict[str, int] = {}
    for name, value in parse_pairs(items, "--set", "tile_nthreads=128", what="KNOB").items():
        try:
            out[name] = int(value, 0)
        except ValueError:
            raise UsageError(f"--set {name}={value}: the value must be an integer, not {value!r}.") from None
    return out


@click.command("build")
@click.option("--arch", required=True, help="Target from the arch database: cpu, sm_89, sm_90, gfx1151, ...")
@click.option("--source", "spec", help="llama.cpp source SPEC (default: the pinned llama-cpp-python sdist).")
@click.option("--variant", help="Variant family (default: cpu / cuda / hip by arch).")
@click.option("--set", "sets", multiple=True, metavar="KNOB=VALUE", help="Compile-time knob value (repeatable).")
@click.option(
    "--hook",
    "hooks",
    multiple=True,
    metavar="NAME",
    help="Opt-in hook to add to the patch (repeatable): mmq (MMQ or cuBLAS per type and batch from "
    "GGML_TUNER_MMQ_CHOICES; the build `tuner sweep` makes).",
)
@click.option("--targets", help="Comma-separated CMake targets [default: llama-bench,test-backend-ops,llama-quantize].")
@click.option("--jobs", "-j", type=click.IntRange(1, 1024), help="Parallel compile jobs [default: CPU count].")
@click.option(
    "--compile-only",
    is_flag=True,
    help="Configure and compile only the FA translation units the variant touches; no link.",
)
@click.option(
    "--object",
    "objects",
    multiple=True,
    metavar="PATH",
    help="With --compile-only: a TU path relative to the tree (repeatable).",
)
@click.option(
    "--pack",
    "pack_out",
    type=FILE,
    help="Also write the finished build as FILE (an xz tar: binaries, libraries, ggml headers) to carry to "
    "another machine of the same OS and CPU architecture.",
)
@click.option(
    "--from-pack",
    "pack_in",
    type=FILE,
    help="Install FILE (written by --pack with the same source and arguments) as this variant's build "
    "instead of compiling: build where the compilers are, measure where the GPU is.",
)
def build(
    arch: str,
    spec: str | None,
    variant: str | None,
    sets: tuple[str, ...],
    hooks: tuple[str, ...],
    targets: str | None,
    jobs: int | None,
    compile_only: bool,
    objects: tuple[str, ...],
    pack_out: Path | None,
    pack_in: Path | None,
) -> None:
    """Render and build one llama.cpp variant; print where its binaries are.

    A repeated build of the same candidate does no work. For AMD targets use --compile-only (this
    machine cannot run HIP code); it needs `tuner toolchain hip` once.
    """
    from tuner import source
    from tuner.builder import cmake as build_stage
    from tuner.plan import render
    from tuner.targets.archs import detect_local_archs

    if objects and not compile_only:
        raise UsageError("--object only applies with --compile-only.")
    if compile_only and (pack_out or pack_in):
        raise UsageError("--pack and --from-pack carry linked builds; drop --compile-only.")
    if pack_out and pack_in:
        msg = "--pack and --from-pack are the two ends of one carry: pack on one machine, unpack on the other."
        raise UsageError(msg)
    values = parse_sets(sets)
    src = source.fetch_source(spec) if spec else source.fetch_source()
    # Same key as `tuner search` makes: an sm_89 build on a newer GPU is 89-virtual so it runs here.
    local = [] if compile_only else detect_local_archs()
    variant = variant or ("cpu" if arch == "cpu" else "hip" if arch.startswith("gfx") else "cuda")
    rv = render.render_variant(src, arch, variant, compile_values=values, local_archs=local, hooks=hooks)
    for w in rv.warnings:
        log.warning(w)
    tlist = [t.strip() for t in targets.split(",") if t.strip()] if targets else list(build_stage.DEFAULT_TARGETS)
    if pack_in:
        from tuner.builder.carry import unpack_build
        from tuner.builder.cmake import ensure_targets

        with log.step(f"Installing {rv.short} from {pack_in}"):
            b = unpack_build(pack_in, rv)
        ensure_targets(b, tlist)  # names what the pack lacks
    else:
        what = "Compile-checking" if compile_only else "Building"
        with log.step(f"{what} {rv.short} from {src.spec}"):
            b = build_stage.build_variant(
                rv, targets=tlist, jobs=jobs, compile_only=compile_only, objects=list(objects) or None
            )
    carried = b.meta.get("carried")
    cached: object = "yes" if b.cached else "no"
    rebuilt = b.meta.get("rebuilt_count", 0)
    if carried:
        cached = f"carried ({carried['pack']}, built on {carried['built_on']})"
        rebuilt = f"0 here ({b.meta.get('rebuilt_count', '?')} where it was built)"
    rows = [("variant", rv.short), ("build dir", b.build_dir)]
    rows += [("bin dir", "(compile-only: no binaries)" if b.compile_only else b.bin_dir), ("cached", cached)]
    rows += [("seconds", f"{b.seconds:.1f}"), ("rebuilt TUs", rebuilt), ("log", b.log_file)]
    if b.compile_only:
        for obj, archs in (b.meta.get("offload_targets") or {}).items():
            rows.append((f"code objects in {Path(obj).name}", ", ".join(archs)))
    click.echo(log.table(["", ""], rows))
    if pack_out:
        from tuner.builder.carry import pack_build

        with log.step(f"Packing {rv.short} into {pack_out}"):
            path = pack_build(b, rv, pack_out, spec=src.spec)
        log.info(
            f"{path.stat().st_size / 1e6:.1f} MB; on the other machine: `tuner source unpack` the tree, then the same `tuner build` with --from-pack {path.name}"
        )


@click.group("toolchain", cls=SuggestingGroup)
def toolchain() -> None:
    """Set up extra compilers tuner needs (the AMD HIP compile-check toolchain)."""


@toolchain.command("hip")
@click.option("--prefix", type=DIR, help="Where to put it [default: $TUNER_HOME/toolchains/hip].")
@click.option("--check", is_flag=True, help="Also compile a small HIP kernel for gfx1151, gfx1100, gfx1201 and gfx942.")
def toolchain_hip(prefix: Path | None, check: bool) -> None:
    """clang-19 + Debian's ROCm 6.4 headers, to compile-check HIP variants without an AMD GPU.

    Installs clang-19 from Debian bookworm with apt-get (root), unpacks HIP/hipBLAS/rocBLAS -dev
    packages from sid and device libraries from trixie into the prefix through a private APT
    configuration (the system's sources are not touched), and puts cmake<4 in a venv. A second run
    does no work.
    """
    from tuner.builder import hip

    tc, did_work = hip.run_hip_setup(prefix)
    click.echo(
        log.table(
            ["", ""],
            [
                ("prefix", tc.prefix),
                ("status", "set up now" if did_work else "already set up (no work)"),
                ("HIP", tc.hip_version),
                ("compiler", tc.clangxx),
                ("cmake", tc.cmake),
                ("device libraries for", ", ".join(tc.device_archs)),
                ("shell setup", tc.prefix / "env.sh"),
            ],
        )
    )
    if check:
        results = hip.run_hip_check(tc)
        click.echo(log.table(["arch", "compile check"], sorted(results.items())))
        if not results.get("gfx1151", "").startswith("ok"):
            raise TunerError(f"The HIP toolchain in {tc.prefix} cannot compile for gfx1151: {results.get('gfx1151')}.")

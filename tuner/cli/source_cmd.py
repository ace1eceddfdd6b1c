"""``tuner source fetch|info|pack``: get a llama.cpp tree and show what it offers."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tuner import log
from tuner.cli._params import FILE, SuggestingGroup
from tuner.source import DEFAULT_SPEC, fetch_source, pack_source, source_info


@click.group(cls=SuggestingGroup)
def source() -> None:
    """Fetch, describe and pack llama.cpp source trees.

    Trees are cached under $TUNER_HOME/sources by content; fetching the same SPEC again does
    no work.
    """


@source.command()
@click.argument("spec", required=False, default=DEFAULT_SPEC)
@click.option("--refresh", is_flag=True, help="Resolve the SPEC again (a git branch that moved).")
def fetch(spec: str, refresh: bool) -> None:
    """Fetch SPEC's llama.cpp tree and print where it is.

    \b
    SPEC is pypi:llama-cpp-python==X (default pypi:llama-cpp-python==0.3.36),
    git:URL@REF or path:DIR (a local llama.cpp checkout).
    """
    src = fetch_source(spec, refresh=refresh)
    state = "cached" if src.cached else "fetched"
    click.echo(f"{src.root}")
    log.info(f"{src.spec}: {state}, id {src.source_id}, era {src.era}, commit {src.commit or 'unknown'}")


@source.command()
@click.argument("spec", required=False, default=DEFAULT_SPEC)
@click.option("--json", "as_json", is_flag=True, help="Print everything as JSON (options included).")
def info(spec: str, as_json: bool) -> None:
    """Describe SPEC's tree: era, commit, FlashAttention kernels and tables, CMake options.

    Fetches the tree first when it is not cached.

    \b
    SPEC is pypi:llama-cpp-python==X (default pypi:llama-cpp-python==0.3.36),
    git:URL@REF or path:DIR (a local llama.cpp checkout).
    """
    data = source_info(fetch_source(spec))
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    kernels = ", ".join(k for k, v in data["fa_kernels"].items() if v) or "none"
    tools = ", ".join(k for k, v in data["tools"].items() if v) or "none"
    lines = [
        f"spec:       {data['spec']}",
        f"source id:  {data['source_id']}",
        f"root:       {data['root']}",
        f"commit:     {data['commit'] or 'unknown'}",
        f"era:        {data['era']}",
        f"FA kernels: {kernels}",
        f"tools:      {tools}",
        f"options:    {len(data['options'])} declared",
        "",
    ]
    rows = []
    for kind, table in data["config_tables"].items():
        if "rows" in table:
            rows += [(kind, name, n, table["file"]) for name, n in table["rows"].items()]
        elif "specializations" in table:
            rows.append((kind, " ".join(table["specializations"]), len(table["specializations"]), table["file"]))
        else:
            rows += [(kind, "-", "-", f) for f in table["files"]]
    if rows:
        lines += [log.table(["table", "name", "rows", "file"], rows), ""]
    if data["fa_instances"]:
        lines += [log.table(["FA template family", "instances"], sorted(data["fa_instances"].items())), ""]
    gpu = [(n, o["default"], o["help"]) for n, o in data["options"].items() if n.startswith(("GGML_CUDA", "GGML_HIP"))]
    lines.append(log.table(["GPU option", "default", "help"], gpu))
    click.echo("\n".join(lines))


@source.command()
@click.argument("spec", required=False, default=DEFAULT_SPEC)
@click.option("-o", "--output", "out", type=FILE, required=True, help="The .tar.gz to write.")
@click.option("--no-trim", is_flag=True, help="Pack the whole tree, not just what a build needs.")
def pack(spec: str, out: Path, no_trim: bool) -> None:
    """Write SPEC's tree as a tar.gz to carry to another machine.

    By default only what a CPU/CUDA/HIP build of llama-bench, test-backend-ops and
    llama-quantize needs is kept. The archive holds one folder, llama.cpp/.
    """
    src = fetch_source(spec)
    with log.step(f"Packing {src.spec} into {out}"):
        path = pack_source(src, out, trim=not no_trim)
    click.echo(str(path))
    log.info(f"{path.stat().st_size / 1e6:.1f} MB, id {src.source_id}, era {src.era}")


@source.command()
@click.argument("archive", type=FILE)
@click.option(
    "--replace",
    is_flag=True,
    help="Let the pack re-point a SPEC that already resolves to another tree on this machine.",
)
def unpack(archive: Path, replace: bool) -> None:
    """Register a tree written by `tuner source pack` in this machine's cache (no network needed).

    Afterwards the packed SPEC resolves to it, so a study run here is tied to the same pinned source.
    Every entry and field of the pack is checked first; a SPEC that already resolves to another
    tree here is only re-pointed with --replace.
    """
    from tuner.source import unpack_source

    src = unpack_source(archive, replace=replace)
    click.echo(str(src.root))
    log.info(f"{src.spec}: id {src.source_id}, era {src.era}, commit {src.commit}")

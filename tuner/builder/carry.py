"""Carry a finished build to another machine: build where the compilers are, measure where the GPU is.

A CUDA build of llama.cpp takes minutes of a GPU machine's time and needs no GPU; ``tuner build --pack FILE`` writes the
artifact (its ``bin/``: executables and ``lib*.so``, linked with ``$ORIGIN`` rpaths) and the ggml headers tuner's own
benchmarks compile against, and ``tuner build --from-pack FILE`` on the GPU machine installs it into the build cache
under the same variant key, so every later command that asks for that variant (``tuner sweep run``, ``sweep mmq``,
``sweep confirm``) finds it built. The pack is input from elsewhere: its manifest must name the variant the unpacking
machine renders from the same arguments and source (same key, same artifact key), each file is checked against the
sha256 the manifest records, and nothing is written outside that variant's folder in ``$TUNER_HOME/builds``.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import platform
import re
import shutil
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner._hash import file_sha256
from tuner.builder.records import hold_artifact, install_artifact, load_build_record, locked, native_isa, write_json
from tuner.errors import TunerError, UsageError
from tuner.paths import tuner_home
from tuner.plan.variant import Build, RenderedVariant
from tuner.source.pack import anonymous_owner

PACK_FORMAT = "tuner-build-pack/1"
_MANIFEST = "build-pack.json"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
_KEY_RE = re.compile(r"[0-9a-f]{16}")
_MAX_BYTES = 8 << 30  # unpacked; a one-arch CUDA build is a few hundred MB
_MAX_MEMBERS = 10_000
_READ_ERRORS = (tarfile.TarError, EOFError, lzma.LZMAError, OSError, UnicodeDecodeError, ValueError)


def pack_build(build: Build, rv: RenderedVariant, out: Path, *, spec: str) -> Path:
    """Write ``build`` (a finished build of ``rv``) as ``out``, an xz tar to carry to another machine; returns
    ``out``. UsageError for a compile-only build, or one whose artifact or headers are gone."""
    if build.compile_only:
        raise UsageError("--pack needs a linked build; --compile-only builds have no binaries to carry.")
    bin_dir = Path(build.bin_dir)
    inc = bin_dir.parents[2] / "src" / "ggml" / "include"  # <key>/artifacts/<candidate>/bin -> the tree it compiled
    record = load_build_record(bin_dir.parent / "build.json")
    if record is None or not bin_dir.is_dir():
        raise UsageError(f"{bin_dir} is not a finished tuner build; run `tuner build` again.")
    entries: list[tuple[str, Path]] = [(f"bin/{p.name}", p) for p in sorted(bin_dir.iterdir())]
    entries += [(f"include/{p.name}", p) for p in sorted(inc.glob("*.h"))]  # for fa-bench and mm-bench
    manifest = {
        "format": PACK_FORMAT,
        **{k: getattr(rv, k) for k in ("key", "artifact_key", "arch", "source_id")},
        "variant": rv.short,
        "spec": spec,
        "machine": platform.machine(),
        "system": platform.system(),
        "host_isa": native_isa(rv.defines),  # None for a portable build
        "packed": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": {name: file_sha256(p) for name, p in entries if p.is_file() and not p.is_symlink()},
        "record": {k: v for k, v in record.items() if k not in ("log", "carried")},
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(tmp, "w:xz", preset=6) as tar:
            blob = json.dumps(manifest, indent=2, sort_keys=True).encode()
            info = tarfile.TarInfo(_MANIFEST)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
            for name, p in entries:
                tar.add(p, arcname=name, recursive=False, filter=anonymous_owner)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


class _BadPack(Exception):
    """One reason a build pack is refused (becomes the UsageError of :func:`unpack_build`)."""


def _check_members(members: list[tarfile.TarInfo]) -> tuple[tarfile.TarInfo, list[tarfile.TarInfo]]:
    """The manifest entry and the rest; refuse anything but ``build-pack.json``, ``bin/NAME`` (files, or
    links to another plain name in ``bin/``) and ``include/NAME.h`` files."""
    if len(members) > _MAX_MEMBERS:
        raise _BadPack(f"it has {len(members)} entries")
    if sum(m.size for m in members if m.isfile()) > _MAX_BYTES:
        raise _BadPack(f"its files add up to more than {_MAX_BYTES >> 30} GiB")
    manifest, rest, seen = None, [], set()
    for m in members:
        if m.name in seen:
            raise _BadPack(f"entry {m.name!r} appears twice")
        seen.add(m.name)
        if m.name == _MANIFEST and m.isfile():
            manifest = m
            continue
        folder, _, name = m.name.partition("/")
        if folder not in ("bin", "include") or not _NAME_RE.fullmatch(name):
            raise _BadPack(f"entry {m.name!r} is not bin/NAME or include/NAME")
        if folder == "include" and not (m.isfile() and name.endswith(".h")):
            raise _BadPack(f"entry {m.name!r} is not a header file")
        if m.issym() and not _NAME_RE.fullmatch(m.linkname):
            raise _BadPack(f"entry {m.name!r} links to {m.linkname!r}, outside bin/")
        if not (m.isfile() or m.issym()):
            raise _BadPack(f"entry {m.name!r} is neither a file nor a link")
        rest.append(m)
    if manifest is None:
        raise _BadPack(f"it has no {_MANIFEST}")
    return manifest, rest


def _check_manifest(raw: bytes) -> dict[str, Any]:
    try:
        man = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise _BadPack(f"{_MANIFEST} is not valid JSON ({err})") from None
    if not isinstance(man, dict) or man.get("format") != PACK_FORMAT:
        raise _BadPack(f"{_MANIFEST} is not a {PACK_FORMAT} manifest")
    for k in ("key", "artifact_key", "variant", "machine", "system", "spec", "source_id"):
        if not isinstance(man.get(k), str):
            raise _BadPack(f"{_MANIFEST} has no {k}")
    if not (_KEY_RE.fullmatch(man["key"]) and _KEY_RE.fullmatch(man["artifact_key"])):
        raise _BadPack("its keys are not 16 hex digits")
    if not isinstance(man.get("files"), dict) or not isinstance(man.get("record"), dict):
        raise _BadPack(f"{_MANIFEST} has no files or record")
    return man


def _mismatch(man: Mapping[str, object], rv: RenderedVariant) -> str | None:
    """Why the pack is not a build of ``rv`` for this machine, in words; None when it is."""
    if (man["system"], man["machine"]) != (platform.system(), platform.machine()):
        return f"it was built for {man['system']} {man['machine']}, this machine is {platform.system()} {platform.machine()}"
    if (isa := native_isa(rv.defines)) is not None and man.get("host_isa") != isa:
        return (
            "it is a -march=native build (GGML_NATIVE) made on a CPU with other instruction-set features "
            f"({man.get('host_isa') or 'not recorded'}; this CPU is {isa}), whose binaries would die of SIGILL here"
        )
    if man["source_id"] != rv.source_id:
        return (
            f"it was built from source {man['source_id']} ({man['spec']}), this command renders source {rv.source_id}"
        )
    if (man["key"], man["artifact_key"]) != (rv.key, rv.artifact_key):
        return (
            f"it holds {man['variant']}, this command renders {rv.short}: the flags, hooks or knob values differ "
            "(pass the same --arch, --variant, --hook and --set on both machines)"
        )
    return None


def unpack_build(archive: Path, rv: RenderedVariant) -> Build:
    """Install a pack written by :func:`pack_build` as the build of ``rv`` on this machine.

    The artifact goes where :func:`tuner.builder.cmake.build_variant` keeps ``rv``'s build, with a
    ``build.json`` that names the pack and the machine that built it (``carried``); a later
    ``build_variant(rv)`` takes it as cached whatever this machine's compilers are.

    Raises UsageError when ``archive`` is missing, not a build pack, damaged, or not a build of ``rv`` for this
    machine (one paragraph naming what differs); TunerError when a write fails (disk full).
    """
    archive = Path(archive)
    if not archive.is_file():
        msg = f"{archive} does not exist. Write one with `tuner build ... --pack FILE` where the compilers are."
        raise UsageError(msg)
    root = tuner_home() / "builds" / rv.key
    art = root / "artifacts" / rv.artifact_key
    try:
        with tarfile.open(archive, "r:*") as tar:
            man_member, members = _check_members(tar.getmembers())
            fh = tar.extractfile(man_member)
            if fh is None or man_member.size > 1 << 22:
                raise _BadPack(f"{_MANIFEST} is not readable")
            man = _check_manifest(fh.read())
            if why := _mismatch(man, rv):
                raise UsageError(
                    f"{archive} is not a build of {rv.short} for this machine: {why}. Pack the build on a machine "
                    "with the same source and arguments, or build here with `tuner build` (no --from-pack)."
                )
            files = {m.name for m in members if m.isfile()}
            if files != set(man["files"]):
                raise _BadPack("its files are not the ones its manifest lists")
            with locked(root):
                staging = art.with_name(f"{art.name}.partial-{os.getpid()}")
                shutil.rmtree(staging, ignore_errors=True)
                inc = root / "src" / "ggml" / "include"
                try:
                    _extract(tar, members, man["files"], staging)
                    record = {
                        **man["record"],
                        "status": "ok",
                        "carried": {
                            "pack": archive.name,
                            "built_on": f"{man['system']} {man['machine']}",
                            "packed": man.get("packed"),
                            "unpacked": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        },
                    }
                    write_json(staging / "build.json", record)
                    folder = install_artifact(staging, art)  # a new folder: never over one in use
                    hold_artifact(art, lambda d: d)
                    if not (inc / "ggml.h").is_file():
                        inc.mkdir(parents=True, exist_ok=True)
                        for h in (folder / "include").glob("*.h"):
                            shutil.copy2(h, inc / h.name)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
    except _BadPack as err:
        msg = f"{archive} is not a valid tuner build pack: {err}. Write it again with `tuner build ... --pack FILE`."
        raise UsageError(msg) from None
    except _READ_ERRORS as err:
        if isinstance(err, OSError) and err.errno is not None:  # a write failed (a corrupt gzip has no errno)
            raise TunerError(f"Unpacking {archive} into {art} failed: {err}") from err
        msg = f"{archive} could not be read as a build pack ({err}); it may be cut short. Copy it again."
        raise UsageError(msg) from None
    return Build(
        build_id=str(record.get("build_id", "")),
        build_dir=root / "build",
        bin_dir=folder / "bin",
        log_file=archive,
        cached=True,
        seconds=0.0,
        meta=record,
    )


def _extract(tar: tarfile.TarFile, members: list[tarfile.TarInfo], digests: Mapping[str, object], dest: Path) -> None:
    """Write the pack's files under ``dest`` (``bin/``, ``include/``), each checked against its sha256."""
    for sub in ("bin", "include"):
        (dest / sub).mkdir(parents=True, exist_ok=True)
    for m in members:
        target = dest / m.name
        if m.issym():
            os.symlink(m.linkname, target)
            continue
        src = tar.extractfile(m)
        if src is None:
            raise _BadPack(f"entry {m.name!r} is not readable")
        h = hashlib.sha256()
        with open(target, "wb") as out:
            while block := src.read(1 << 20):
                h.update(block)
                out.write(block)
        if h.hexdigest() != digests[m.name]:
            raise _BadPack(f"{m.name} does not match the sha256 its manifest records (damaged in transit?)")
        os.chmod(target, 0o755 if m.name.startswith("bin/") and m.mode & 0o100 else 0o644)

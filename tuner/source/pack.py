"""Carry a fetched tree to another machine: ``pack_source`` writes it as one tar.gz, ``unpack_source``
registers it in that machine's cache under the same SPEC and content id."""

from __future__ import annotations

__all__ = ["pack_source", "unpack_source"]

import io
import json
import os
import shutil
import tarfile
from pathlib import Path

from tuner.errors import UsageError
from tuner.source.fetch import _commit_entry, _index_file, _load_cached, _sources_dir, _staging, _write_json
from tuner.source.spec import Source

# Top-level entries a CPU/CUDA/HIP build of llama-bench, test-backend-ops and llama-quantize
# needs (examples/, pocs/ and app/ are add_subdirectory'd unconditionally: configure fails without).
_PACK_KEEP = ("CMakeLists.txt", "CMakePresets.json", "LICENSE", "cmake", "common", "ggml", "gguf-py",
              "include", "licenses", "src", "tests", "tools", "vendor", "examples", "pocs", "app")
_PACK_MODELS = ("ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf")
# Backends under ggml/src worth carrying; the others (vulkan, sycl, metal, ...) are big and only
# add_subdirectory'd when their option is ON.
_PACK_BACKENDS = ("ggml-cpu", "ggml-cuda", "ggml-hip", "ggml-blas", "ggml-rpc")


def _pack_keep(rel: str, is_dir: bool) -> bool:
    """Whether the trimmed pack keeps the tree entry ``rel`` (a file, or a folder when ``is_dir``)."""
    parts = rel.split("/")
    if parts[0] == "models":
        return len(parts) == 1 or (len(parts) == 2 and parts[1] in _PACK_MODELS)
    if parts[0] not in _PACK_KEEP or ".git" in parts:
        return False
    if parts[:2] == ["ggml", "src"] and len(parts) > 2 and parts[2].startswith("ggml-"):
        if (is_dir or len(parts) > 3) and parts[2] not in _PACK_BACKENDS:
            return False
    if parts[:2] == ["tools", "ui"]:
        return False
    if parts[:2] == ["tools", "server"] and len(parts) > 2 and parts[2].startswith("public"):
        return False
    return True


def pack_source(src: Source, out: Path, *, trim: bool = True) -> Path:
    """Write the tree as ``out`` (a tar.gz with one top folder ``llama.cpp/``) to carry elsewhere.

    Args:
        src: The source to pack.
        out: The archive to write; written to a temporary name first, then renamed.
        trim: Keep only what building llama-bench / test-backend-ops / llama-quantize with the
            CPU, CUDA or HIP backend needs (about a tenth of the tree).

    Returns:
        ``out``.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    root = src.root

    def tar_filter(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        return ti

    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                rel_dir = Path(dirpath).relative_to(root).as_posix()
                rel_dir = "" if rel_dir == "." else rel_dir + "/"
                if trim:
                    dirnames[:] = [d for d in dirnames if _pack_keep(rel_dir + d, True)]
                else:
                    dirnames[:] = [d for d in dirnames if d != ".git"]
                for f in sorted(filenames):
                    rel = rel_dir + f
                    if trim and not _pack_keep(rel, False):
                        continue
                    full = Path(dirpath) / f
                    if full.is_symlink() or not full.is_file():
                        continue
                    tar.add(full, arcname=f"llama.cpp/{rel}", recursive=False, filter=tar_filter)
            # Identity travels with the tree, so `unpack_source` on another machine registers it
            # under the same SPEC and content id (a study's numbers stay tied to the pinned source).
            meta = {**src.meta, "spec": src.spec, "source_id": src.source_id, "commit": src.commit,
                    "era": src.era, "trimmed": trim}
            blob = json.dumps(meta, indent=2, sort_keys=True).encode()
            info = tarfile.TarInfo("source.json")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def unpack_source(archive: Path) -> Source:
    """Register a tree written by :func:`pack_source` in this machine's cache.

    Afterwards ``fetch_source(<the packed SPEC>)`` finds it without any network access (used to
    carry the pinned source to a GPU machine that cannot reach PyPI).

    Raises:
        UsageError: ``archive`` is missing or was not written by ``tuner source pack``.
    """
    archive = Path(archive)
    if not archive.is_file():
        raise UsageError(f"{archive} does not exist. Write one with `tuner source pack SPEC -o FILE`.")
    staging = _staging()
    try:
        with tarfile.open(archive, "r:gz") as tar:
            names = tar.getnames()
            if "source.json" not in names or not any(n.startswith("llama.cpp/") for n in names):
                raise UsageError(
                    f"{archive} is not a tuner source pack (no source.json + llama.cpp/). "
                    "Write one with `tuner source pack SPEC -o FILE`."
                )
            for m in tar.getmembers():
                if m.name != "source.json" and not m.name.startswith("llama.cpp/"):
                    continue
                if m.issym() or m.islnk() or ".." in Path(m.name).parts:
                    continue
                tar.extract(m, staging, filter="data") if hasattr(tarfile, "data_filter") else tar.extract(m, staging)
        meta = json.loads((staging / "source.json").read_text())
        spec, sid = meta["spec"], meta["source_id"]
        if (_sources_dir() / sid / "llama.cpp" / "CMakeLists.txt").is_file():
            shutil.rmtree(staging, ignore_errors=True)
            src = _load_cached(sid, spec)
            assert src is not None
        else:
            meta.pop("fetched_at", None)
            src = _commit_entry(staging, sid, spec, {k: v for k, v in meta.items() if k not in ("spec", "source_id", "era")})
        _write_json(_index_file(spec), {"spec": spec, "source_id": sid})
        return src
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)

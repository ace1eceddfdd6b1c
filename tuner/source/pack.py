"""Carry a fetched tree to another machine: ``pack_source`` writes it as one tar.gz, ``unpack_source``
registers it in that machine's cache under the same SPEC and content id."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import zlib
from collections.abc import Iterable
from pathlib import Path

from tuner._hash import file_sha256
from tuner.errors import TunerError, UsageError
from tuner.source import fetch
from tuner.source.spec import Source, parse_spec
from tuner.source.tree import ERAS, find_era

# Top-level entries a CPU/CUDA/HIP build of llama-bench, test-backend-ops and llama-quantize
# needs (examples/, pocs/ and app/ are add_subdirectory'd unconditionally: configure fails without).
_PACK_FILES = ("CMakeLists.txt", "CMakePresets.json", "LICENSE")
_PACK_DIRS = ("cmake", "common", "ggml", "gguf-py", "include", "licenses", "src", "tests", "tools", "vendor")
_PACK_KEEP = (*_PACK_FILES, *_PACK_DIRS, "examples", "pocs", "app")
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
    return not (parts[:2] == ["tools", "server"] and len(parts) > 2 and parts[2].startswith("public"))


def tree_digest(files: Iterable[tuple[str, Path]]) -> str:
    """sha256 over ``(path in the tree, owner-exec bit, sha256 of the bytes)`` of every file, in path order."""
    h = hashlib.sha256()
    for rel, full in sorted(files):
        x = "x" if full.stat().st_mode & 0o100 else "-"
        h.update(f"{rel}\0{x}\0{file_sha256(full)}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def anonymous_owner(ti: tarfile.TarInfo) -> tarfile.TarInfo:
    """A tar member owned by uid/gid 0 with no user or group name (no packing machine's account travels)."""
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def pack_source(src: Source, out: Path, *, trim: bool = True) -> Path:
    """Write the tree as ``out`` (a tar.gz with one top folder ``llama.cpp/``, written to a temporary name
    first, then renamed) to carry elsewhere; returns ``out``. ``trim``: keep only what building llama-bench /
    test-backend-ops / llama-quantize with the CPU, CUDA or HIP backend needs (about a tenth of the tree).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    root = src.root
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    files: list[tuple[str, Path]] = []
    try:
        with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                rel_dir = Path(dirpath).relative_to(root).as_posix()
                rel_dir = "" if rel_dir == "." else rel_dir + "/"
                dirnames[:] = [d for d in dirnames if (_pack_keep(rel_dir + d, True) if trim else d != ".git")]
                for f in sorted(filenames):
                    rel = rel_dir + f
                    if trim and not _pack_keep(rel, False):
                        continue
                    full = Path(dirpath) / f
                    if full.is_symlink() or not full.is_file():
                        continue
                    tar.add(full, arcname=f"llama.cpp/{rel}", recursive=False, filter=anonymous_owner)
                    files.append((rel, full))
            # Identity travels with the tree, so `unpack_source` on another machine registers it
            # under the same SPEC and content id (a study's numbers stay tied to the pinned source);
            # tree_sha256 lets it check that the files it unpacked are the ones packed here.
            meta = {
                **src.meta,
                "spec": src.spec,
                "source_id": src.source_id,
                "commit": src.commit,
                "era": src.era,
                "trimmed": trim,
                "tree_sha256": tree_digest(files),
            }
            blob = json.dumps(meta, indent=2, sort_keys=True).encode()
            info = tarfile.TarInfo("source.json")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


# What an unpacked source.json may hold. A pack is input from elsewhere: each field decides a path
# under $TUNER_HOME or which tree a SPEC builds, so each is checked before anything is written.
_ID_RE = re.compile(r"[0-9a-f]{16}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_COMMIT_RE = re.compile(r"[0-9a-fA-F]{7,64}")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "spec": str,
    "source_id": str,
    "era": str,
    "commit": (str, type(None)),
    "trimmed": bool,
    "tree_sha256": str,
}
_MAX_META_BYTES = 1 << 20
_MAX_MEMBERS = 500_000
_MAX_BYTES = 4 << 30  # unpacked; a whole llama.cpp tree is well under 1 GB
_FILTER_ERRORS = (tarfile.FilterError,) if hasattr(tarfile, "FilterError") else ()  # Python >= 3.11.4
_READ_ERRORS = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError)


class _BadPack(Exception):
    """One reason a pack is refused (becomes the UsageError of :func:`unpack_source`)."""


# tarfile's own filter (Python >= 3.11.4) refuses the same packs; the checks should leave it nothing to refuse
_REFUSED: tuple[type[Exception], ...] = (_BadPack, *_FILTER_ERRORS)


def _check_members(members: list[tarfile.TarInfo]) -> tarfile.TarInfo:
    """Refuse any entry but regular files and folders under ``llama.cpp/`` and one ``source.json``
    file; return that one. Links, devices, absolute or ``..`` paths and duplicates are refused."""
    if len(members) > _MAX_MEMBERS:
        raise _BadPack(f"it has {len(members)} entries (a llama.cpp tree has far fewer than {_MAX_MEMBERS})")
    if sum(m.size for m in members if m.isfile()) > _MAX_BYTES:
        raise _BadPack(f"its files add up to more than {_MAX_BYTES >> 30} GiB unpacked")
    seen: set[str] = set()
    meta: tarfile.TarInfo | None = None
    for m in members:
        name = m.name
        if any(part in ("", ".", "..") for part in name.split("/")):
            raise _BadPack(f"entry {name!r} has an absolute or '..' path")
        if name in seen:
            raise _BadPack(f"entry {name!r} appears twice")
        seen.add(name)
        if not (m.isfile() or m.isdir()):
            kinds = [(m.issym(), "a symlink"), (m.islnk(), "a hard link"), (m.isfifo(), "a FIFO")]
            kinds.append((m.ischr() or m.isblk(), "a device file"))
            kind = next((k for hit, k in kinds if hit), "a special file")
            raise _BadPack(f"entry {name!r} is {kind}; a pack holds only files and folders")
        if name == "source.json":
            if not m.isfile():
                raise _BadPack("source.json is not a file")
            meta = m
        elif name.split("/")[0] != "llama.cpp":
            raise _BadPack(f"entry {name!r} is outside llama.cpp/")
        # Plain permissions only (no setuid, no group/other write), whatever the tar says.
        m.mode = 0o755 if m.isdir() else (m.mode & 0o755) | 0o600
    files = {m.name for m in members if m.isfile()}
    for name in seen:
        parts = name.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in files:
                raise _BadPack(f"entry {name!r} is inside {'/'.join(parts[:i])!r}, which is a file")
    if meta is None or not any(n.startswith("llama.cpp/") for n in seen):
        raise _BadPack("it has no source.json and llama.cpp/ folder")
    return meta


def _check_meta(raw: bytes) -> tuple[str, str, str, dict[str, object]]:
    """Validate source.json; return the normalized SPEC, the source id, the era and the record to keep."""
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise _BadPack(f"source.json is not valid JSON ({err})") from None
    if not isinstance(meta, dict):
        raise _BadPack("source.json is not a JSON object")
    missing = [k for k in _REQUIRED if k not in meta]
    if missing == ["tree_sha256"]:
        raise _BadPack("source.json has no tree_sha256 (the pack was written by an older tuner)")
    if missing:
        raise _BadPack(f"source.json lacks {', '.join(missing)}")
    for key, value in meta.items():
        want = _REQUIRED.get(key, (str, int, float, bool, type(None)))
        if not isinstance(value, want):
            raise _BadPack(f"source.json field {key!r} is {type(value).__name__}, not the expected kind")
    spec, sid, commit = meta["spec"], meta["source_id"], meta["commit"]
    if not _ID_RE.fullmatch(sid):
        raise _BadPack(f"source_id {sid!r} is not a content id (16 lowercase hex digits)")
    if meta["era"] not in ERAS:
        raise _BadPack(f"era {meta['era']!r} is not one of {', '.join(ERAS)}")
    if not _SHA256_RE.fullmatch(meta["tree_sha256"]):
        raise _BadPack("tree_sha256 is not a sha256 (64 lowercase hex digits)")
    if commit is not None and not _COMMIT_RE.fullmatch(commit):
        raise _BadPack(f"commit {commit!r} is not a git commit")
    scheme, _, rest = spec.partition(":")
    if scheme == "path":
        # Names a folder on the packing machine; here the tree is only registered under its id.
        if not rest.startswith("/") or _CONTROL_RE.search(rest):
            raise _BadPack(f"spec {spec!r} is not 'path:' and an absolute path")
        norm = spec
    else:
        try:
            norm = parse_spec(spec).normalized
        except UsageError as err:
            raise _BadPack(f"its spec is not a valid SPEC ({err})") from None
    # The id is the one fetch_source gives the SPEC: the sdist's sha256 or the git commit, cut to 16.
    if scheme == "pypi":
        sdist_sha = meta.get("sdist_sha256")
        if not isinstance(sdist_sha, str) or not _SHA256_RE.fullmatch(sdist_sha) or sid != sdist_sha[:16]:
            raise _BadPack(f"source_id {sid} is not the sdist's content id (the first 16 digits of sdist_sha256)")
    elif scheme == "git" and (commit is None or len(commit) < 40 or sid != commit[:16].lower()):
        raise _BadPack(f"source_id {sid} is not the content id of git commit {commit!r} (its first 16 digits)")
    keep = {k: v for k, v in meta.items() if k not in ("spec", "source_id", "era", "fetched_at")}
    return norm, sid, meta["era"], keep


def _current_id(norm: str) -> str | None:
    """The source id the SPEC resolves to on this machine now, or None (no index, or it is broken)."""
    try:
        sid = json.loads(fetch.index_file(norm).read_text())["source_id"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return sid if isinstance(sid, str) and _ID_RE.fullmatch(sid) and fetch.load_cached(sid, norm) else None


def unpack_source(archive: Path, *, replace: bool = False) -> Source:
    """Register a tree written by :func:`pack_source` in this machine's cache.

    Afterwards ``fetch_source(<the packed SPEC>)`` finds it without any network access (used to
    carry the pinned source to a GPU machine that cannot reach PyPI). Every entry and every field
    of source.json is checked first; nothing is written outside ``$TUNER_HOME/sources/``. ``replace`` lets
    the pack re-point a SPEC that already resolves to another tree here.

    Raises UsageError when ``archive`` is missing or not a valid tuner source pack (one paragraph naming
    what is wrong) or would re-point a SPEC without ``replace``; TunerError when a write fails (disk full).
    """
    archive = Path(archive)
    if not archive.is_file():
        raise UsageError(f"{archive} does not exist. Write one with `tuner source pack SPEC -o FILE`.")
    staging: Path | None = None
    try:
        with tarfile.open(archive, "r:gz") as tar:
            meta_member = _check_members(tar.getmembers())
            fh = tar.extractfile(meta_member)
            if meta_member.size > _MAX_META_BYTES or fh is None:
                raise _BadPack("source.json is too large")
            norm, sid, era, keep = _check_meta(fh.read())
            current = None if norm.startswith("path:") else _current_id(norm)
            if current is not None and current != sid and not replace:
                raise UsageError(
                    f"{archive} would re-point {norm} from source {current}, which it resolves to on this "
                    f"machine, to {sid}, so every later build of that SPEC would use the packed tree. If "
                    "that is intended, run `tuner source unpack --replace ARCHIVE`; otherwise carry a pack "
                    "written from this machine's tree, or fetch the SPEC here."
                )
            staging = fetch.staging_dir()
            members = [m for m in tar.getmembers() if m.name != "source.json"]
            if hasattr(tarfile, "data_filter"):
                tar.extractall(staging, members=members, filter="data")
            else:  # Python < 3.11.4: paths, types and modes were checked above
                tar.extractall(staging, members=members)
        tree = staging / "llama.cpp"
        if not (tree / "CMakeLists.txt").is_file() or not (tree / "ggml" / "CMakeLists.txt").is_file():
            raise _BadPack("llama.cpp/ is not a llama.cpp tree (CMakeLists.txt or ggml/CMakeLists.txt missing)")
        walk = ((Path(d) / f) for d, _, names in os.walk(tree) for f in names)
        if tree_digest((full.relative_to(tree).as_posix(), full) for full in walk) != keep["tree_sha256"]:
            raise _BadPack("the files in llama.cpp/ do not match the tree_sha256 recorded when it was packed")
        if find_era(tree) != era:
            raise _BadPack(f"source.json says era {era!r}, but the tree is of the other era")
        entry = fetch.sources_dir() / sid
        if (entry / "llama.cpp" / "CMakeLists.txt").is_file():  # unpacked or fetched here before
            src = fetch.load_cached(sid, norm)
            if src is None:
                raise TunerError(
                    f"The cached tree {entry} has no readable source.json. Delete that folder "
                    f"and unpack {archive} again."
                )
            had = src.meta.get("spec")
            if norm.startswith("pypi:") and isinstance(had, str) and had.startswith("pypi:") and had != norm:
                # One sdist is one release: the same id under another version is a forged record.
                raise _BadPack(f"source {sid} is {had} on this machine, not {norm}")
        else:
            src = fetch.commit_entry(staging, sid, norm, keep)
        if not norm.startswith("path:"):
            fetch.write_json(fetch.index_file(norm), {"spec": norm, "source_id": sid})
        return src
    except _REFUSED as err:
        raise UsageError(
            f"{archive} is not a valid tuner source pack: {err}. Write it again with "
            "`tuner source pack SPEC -o FILE` on the machine that has the tree."
        ) from None
    except _READ_ERRORS as err:
        raise UsageError(
            f"{archive} is not a valid tuner source pack: it is not a readable tar.gz ({err}). "
            "Write it again with `tuner source pack SPEC -o FILE` and copy it whole."
        ) from None
    except OSError as err:
        if err.errno in fetch.NO_SPACE:
            raise fetch.no_space_error(err, staging or fetch.sources_dir()) from err
        raise TunerError(
            f"Could not unpack {archive}: {err}. Check that it is readable and that {fetch.sources_dir()} is writable."
        ) from err
    finally:
        if staging is not None and staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
